"""Disputes (chargebacks) of captured payments (docs/payments.md, "Disputes")."""
