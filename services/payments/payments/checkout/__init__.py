"""The checkout saga (CheckoutService): hold -> charge -> confirm/deliver, with compensations."""
