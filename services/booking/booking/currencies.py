"""ISO 4217 codes a salon can price a slot in.

The active codes of the ISO 4217 list (2025 edition, incl. ZWG and XCG), minus the ones nobody
pays a haircut in: precious metals (XAU, XAG, XPD, XPT), bond-market and SDR units (XBA..XBD,
XDR, XSU, XUA), fund codes (BOV, CHE, CHW, CLF, COU, MXV, USN, UYI, UYW) and the test/none codes
(XTS, XXX). Updating it is a code change on purpose: an unknown currency is refused, never guessed.
"""
from __future__ import annotations

ISO_4217 = frozenset("""
AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL BSD BTN BWP BYN
BZD CAD CDF CHF CLP CNY COP CRC CUC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL
GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW
KRW KWD KYD KZT LAK LBP LKR LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN
NAD NGN NIO NOK NPR NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK
SGD SHP SLE SLL SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX USD UYU
UZS VED VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG ZWL
""".split())
