"""Serving the app with uvicorn: in the foreground (``python -m pspsim``) or in a thread (tests)."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading
import time
from typing import Any

import uvicorn

from .app import create_app
from .logs import log_config
from .settings import Settings


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind now (port 0 picks a free one) so the real port is known before the app is built."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        log_config=log_config(settings.log_level),
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=settings.shutdown_grace_seconds,
    )


def prepare(settings: Settings) -> tuple[uvicorn.Server, socket.socket, Settings]:
    sock = bind_socket(settings.host, settings.port)
    settings = dataclasses.replace(settings, port=sock.getsockname()[1])
    return uvicorn.Server(_uvicorn_config(create_app(settings), settings)), sock, settings


def serve(settings: Settings) -> None:
    """Run until SIGINT/SIGTERM (uvicorn drains in-flight requests, then stops)."""
    server, sock, _ = prepare(settings)
    server.run(sockets=[sock])


class BackgroundServer:
    """An ASGI app served by uvicorn on its own thread and event loop.

    ``with BackgroundServer.for_settings(Settings(port=0)) as srv: srv.url``
    """

    def __init__(self, server: uvicorn.Server, sock: socket.socket, settings: Settings | None = None):
        self.server = server
        self.sock = sock
        self.settings = settings
        host, port = sock.getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        self._thread = threading.Thread(target=self._run, name=f"uvicorn:{port}", daemon=True)
        self._error: BaseException | None = None

    @classmethod
    def for_settings(cls, settings: Settings) -> "BackgroundServer":
        server, sock, settings = prepare(settings)
        return cls(server, sock, settings)

    @classmethod
    def for_app(cls, app: Any, host: str = "127.0.0.1", port: int = 0) -> "BackgroundServer":
        sock = bind_socket(host, port)
        config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="auto",
                                timeout_graceful_shutdown=1)
        return cls(uvicorn.Server(config), sock)

    @property
    def app(self) -> Any:
        return self.server.config.app

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # surfaced by start()
            self._error = exc

    def start(self, timeout: float = 10.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {self._error!r}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
