"""Database error text never reaches a client. Statuses made from database
exceptions carry stable messages; what the database said is logged, with the trace id."""
import json
import logging

import asyncpg
import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider

from cutylib import grpc_errors
from cutylib.telemetry import JsonFormatter

DB_TEXT = "could not serialize access due to concurrent update on relation secret_internal_table"


@pytest.mark.parametrize("exc, code, message", [
    (asyncpg.exceptions.SerializationError(DB_TEXT), grpc.StatusCode.ABORTED, grpc_errors.TRANSACTION_CONFLICT),
    (asyncpg.exceptions.DeadlockDetectedError(DB_TEXT), grpc.StatusCode.ABORTED, grpc_errors.TRANSACTION_CONFLICT),
    (asyncpg.exceptions.TooManyConnectionsError(DB_TEXT), grpc.StatusCode.UNAVAILABLE,
     grpc_errors.DATABASE_UNAVAILABLE),
    (ConnectionResetError(DB_TEXT), grpc.StatusCode.UNAVAILABLE, grpc_errors.DATABASE_UNAVAILABLE),
])
def test_database_errors_answer_a_stable_message_and_log_the_detail_with_the_trace_id(exc, code, message):
    lines: list[str] = []

    class Capture(logging.Handler):  # formats as the services do, while the request's span is current
        def emit(self, record):
            lines.append(JsonFormatter("payments").format(record))

    logger = logging.getLogger("cutylib.grpc_errors")
    handler = Capture(level=logging.WARNING)
    logger.addHandler(handler)
    try:
        with TracerProvider().get_tracer("t").start_as_current_span("rpc") as span:
            status = grpc_errors.status_for_exception(exc)
    finally:
        logger.removeHandler(handler)
    assert status.code == code and status.details == message
    assert "secret_internal_table" not in status.details and type(exc).__name__ not in status.details
    (line,) = [json.loads(x) for x in lines]
    assert DB_TEXT in json.dumps(line)
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
