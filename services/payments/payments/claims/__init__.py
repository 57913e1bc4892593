"""Resolving claims on delivered codes (docs/payments.md, "Code claims")."""
