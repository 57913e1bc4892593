"""Money rules every service applies the same way: amounts are integers in minor units, currencies
ISO 4217 codes (booking's slot prices, the code pool's product prices and payments'
amounts used to check them three different ways).

ISO_4217: the active codes of the ISO 4217 list (2025 edition, incl. ZWG and XCG), minus the ones
nobody pays a haircut or a gift card in: precious metals (XAU, XAG, XPD, XPT), bond-market and SDR
units (XBA..XBD, XDR, XSU, XUA), fund codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI, UYW) and the
test/none codes (XTS, XXX). Updating it is a code change on purpose: an unknown currency is
refused, never guessed.
"""
from __future__ import annotations

from .errors import InvalidArgument

ISO_4217 = frozenset("""
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP BYN
BZD CAD CDF CHF CLP CNY COP CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL
GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW
KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN
NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK
SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU
UZS VED VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG ZWL
""".split())

# ISO 4217 minor units where they are not 2 (JPY has no minor unit, KWD has three).
MINOR_UNITS = {
    **dict.fromkeys("BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX VND VUV XAF XOF XPF".split(), 0),
    **dict.fromkeys("BHD IQD JOD KWD LYD OMR TND".split(), 3),
}

# What a unit of each currency is worth, as an order of magnitude: round(log10(units per euro)),
# where it is not 0 (a lira: about 50 per euro -> 2; a rupiah: about 19,000 -> 4). Orders of
# magnitude, not exchange rates: an entry changes when a currency moves tenfold, and bounds built
# on it (booking's slot price ceiling) stay within a factor of about three of the same worth.
VALUE_MAGNITUDE = {
    **dict.fromkeys("AED BOB BRL BWP BYN CNY CUP CZK DKK ERN GEL GHS GTQ HKD HNL ILS LSL LYD MAD MDL MOP "
                    "MVR MXN MYR NAD NOK PEN PGK PLN QAR RON SAR SBD SCR SEK SLE STN SVC SZL TJS TMT TND "
                    "TTD WST ZAR ZMW".split(), 1),
    **dict.fromkeys("AFN ALL BDT BTN CVE DJF DOP DZD EGP ETB GMD GYD HTG INR ISK JMD JPY KES KGS LRD MKD "
                    "MRU MUR MZN NIO NPR PHP RSD RUB SRD THB TRY TWD UAH UYU VED VES VUV XPF YER ZWG".split(), 2),
    **dict.fromkeys("AMD AOA ARS CDF CLP CRC HUF IQD KMF KPW KRW KZT LKR MWK MMK NGN PKR RWF SDG SOS TZS "
                    "XAF XOF".split(), 3),
    **dict.fromkeys("BIF COP GNF IDR KHR LAK MGA MNT PYG SLL SSP SYP UGX UZS VND ZWL".split(), 4),
    **dict.fromkeys("IRR LBP".split(), 5),
}


def worth_of_euros_minor(currency: str, euros: int) -> int:
    """About `euros` euros' worth of `currency` (an ISO 4217 code), in its minor units, to the
    order of magnitude: a bound, never a price."""
    return euros * 10 ** (VALUE_MAGNITUDE.get(currency, 0) + MINOR_UNITS.get(currency, 2))


def require_currency(field: str, currency: str | None) -> str:
    """`currency` if it is an ISO 4217 code (upper case, as the wire spells it); InvalidArgument
    naming `field` otherwise."""
    if currency not in ISO_4217:
        raise InvalidArgument(field, f"{field} must be an ISO 4217 code like EUR or TRY, got {currency!r}")
    return currency


def require_amount(field: str, amount_minor: object, *, positive: bool = False) -> int:
    """An integer number of minor units, zero or more (`positive`: more than zero)."""
    if not isinstance(amount_minor, int) or isinstance(amount_minor, bool) or amount_minor < (1 if positive else 0):
        raise InvalidArgument(field, f"{field} must be {'a positive' if positive else 'zero or a positive'} "
                                     f"integer (minor units), got {amount_minor!r}")
    return amount_minor


def require_money(field: str, currency: str | None, amount_minor: object, *, positive: bool = False) -> tuple[str, int]:
    """A price or amount named `field` (its parts are `<field>.currency_code`, `<field>.amount_minor`).
    `None` for both means it was not sent at all."""
    if currency is None and amount_minor is None:
        raise InvalidArgument(field, f"{field} is required")
    return (require_currency(f"{field}.currency_code", currency),
            require_amount(f"{field}.amount_minor", amount_minor, positive=positive))
