"""Cuty PSP simulator: a Stripe-like payment service provider, in memory, over HTTP.

Run it with ``python -m pspsim``; see ``docs/pspsim.md``.
"""

__version__ = "0.1.0"
