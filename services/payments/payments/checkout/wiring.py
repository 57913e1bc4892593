"""How the checkout saga plugs into the payments server (filled in by the saga work, issue 5)."""


def register(server, settings, pool, core) -> None:
    """Register CheckoutService and the saga workers on `server` (a cutylib GrpcServer)."""
