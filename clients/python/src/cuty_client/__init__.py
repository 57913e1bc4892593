"""cuty-client: a typed async client of Cuty's checkout platform's gRPC API for internal services
(docs/clients.md in the repository)."""
from . import errors
from ._pb.cuty.booking.v1 import booking_pb2
from ._pb.cuty.codepool.v1 import codepool_pb2
from ._pb.cuty.payments.v1 import checkout_pb2
from .client import CutyClient, Retry, Tls
from .errors import (CutyError, DeadlineExceeded, FieldViolation, InvalidArgument, NotFound, OutOfStock,
                     PermissionDenied, SlotTaken, Unauthenticated, Unavailable)

__all__ = ["CutyClient", "Retry", "Tls", "errors", "booking_pb2", "codepool_pb2", "checkout_pb2", "CutyError",
           "DeadlineExceeded", "FieldViolation", "InvalidArgument", "NotFound", "OutOfStock", "PermissionDenied",
           "SlotTaken", "Unauthenticated", "Unavailable"]
