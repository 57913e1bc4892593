"""Money rules every service applies the same way: amounts are integers in minor units, currencies
ISO 4217 codes (issue 11: booking's slot prices, the code pool's product prices and payments'
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
