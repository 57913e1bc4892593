"""cutylib's server interceptors wrap a method's handler once, and again only when the server
finds another handler for the method."""
import grpc

from cutylib.grpc_metrics import WrappedHandlers


def test_a_handler_is_wrapped_once_per_method():
    wrapped = []

    def wrap(method, handler):
        wrapped.append((method, handler))
        return ("wrapped", method, handler)

    handlers = WrappedHandlers(wrap)
    a = grpc.unary_unary_rpc_method_handler(lambda r, c: r)
    b = grpc.unary_unary_rpc_method_handler(lambda r, c: r)
    first = handlers.get("/s/A", a)
    assert handlers.get("/s/A", a) is first
    assert handlers.get("/s/B", a) == ("wrapped", "/s/B", a)
    assert handlers.get("/s/A", b) == ("wrapped", "/s/A", b)  # another handler: wrapped anew
    assert wrapped == [("/s/A", a), ("/s/B", a), ("/s/A", b)]
