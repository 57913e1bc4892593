"""`python -m gateway`: HTTP/JSON on CUTY_HTTP_PORT in front of every service's gRPC API."""
from __future__ import annotations

import logging
import sys

import uvicorn

from cutylib import heap
from cutylib.config import Settings
from cutylib.metrics import start_metrics_server
from cutylib.telemetry import init_telemetry

from .app import Gateway
from .httpserver import GatewayHttpProtocol
from .settings import GatewaySettings

log = logging.getLogger("gateway")


def main() -> int:
    # No grpc client instrumentation: the gateway injects traceparent itself (tracing.py); no asyncpg.
    init_telemetry("gateway", instrument_grpc=False, instrument_asyncpg=False)
    Settings.from_env().check_secrets("gateway")  # refuses dev secrets and test hooks under CUTY_ENV=production
    settings = GatewaySettings()
    app = Gateway(settings)
    heap.settle()  # what is built so far lives as long as the process (cutylib/heap.py)
    # Prometheus scrapes a port of its own (CUTY_GATEWAY_METRICS_PORT, 9464), never the public one.
    start_metrics_server("gateway")
    log.info("gateway listening", extra={"port": settings.port, "routes": len(app.routes),
                                         "backends": app.backends.addrs})
    # proxy_headers off: the gateway reads neither the client address nor the scheme of a request
    # (rate limits are per token, logs carry no address), so X-Forwarded-* rewriting is a wasted
    # middleware layer per request.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, lifespan="on", access_log=False,
                            log_config=None, server_header=False, timeout_graceful_shutdown=5, proxy_headers=False,
                            timeout_keep_alive=settings.keepalive_seconds, backlog=2048,
                            http=GatewayHttpProtocol)  # an answer's head and body in one write (httpserver.py)
    uvicorn.Server(config).run()  # handles SIGINT/SIGTERM: stops accepting, drains, runs shutdown
    return 0


if __name__ == "__main__":
    sys.exit(main())
