"""A local PostgreSQL cluster from the server binaries: the embedded database of `make run` and the
throwaway cluster of the test suite. initdb/pg_ctl refuse to run as root, so as root they run as
the `postgres` user."""
from __future__ import annotations

import os
import pathlib
import pwd
import random
import shutil
import socket
import subprocess
import time

PG_BIN_CANDIDATES = ("/usr/lib/postgresql/15/bin", "/usr/lib/postgresql/16/bin", "/usr/lib/postgresql/17/bin")
INSTALL_HINT = ("PostgreSQL server binaries (initdb, pg_ctl) not found. Install the Debian package "
                "'postgresql-15' (apt-get install postgresql-15), set CUTY_PG_BIN to their folder, or point "
                "CUTY_DATABASE_URL / CUTY_TEST_DSN at a running server.")


class PostgresUnavailable(RuntimeError):
    pass


def find_pg_bin() -> pathlib.Path:
    candidates = [os.environ.get("CUTY_PG_BIN", "")] + list(PG_BIN_CANDIDATES)
    for c in candidates:
        if c and (pathlib.Path(c) / "initdb").exists():
            return pathlib.Path(c)
    found = shutil.which("initdb")
    if found:
        return pathlib.Path(found).parent
    raise PostgresUnavailable(INSTALL_HINT)


# Ports this process has handed out: never twice, even before their service has bound them.
_HANDED_OUT: set[int] = set()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _worker_slice(lowest: int, highest: int) -> tuple[int, int]:
    """The part of [lowest, highest] that is this test worker's own: under pytest-xdist
    (PYTEST_XDIST_WORKER=gwN of PYTEST_XDIST_WORKER_COUNT) each worker picks from its own slice, so
    two workers never hand out the same port; the whole range otherwise."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 1):
        return lowest, highest
    width = (highest - lowest + 1) // int(count)
    start = lowest + (int(worker[2:]) % int(count)) * width
    return start, start + width - 1


def free_port() -> int:
    """A port nothing listens on now, for a service about to start. Taken *below* the kernel's
    ephemeral range: a port from bind(0) lies inside it, where every outgoing connection picks its
    source port, so one of the suite's many connections could take it between this check and the
    service's bind (seen: a gateway stack whose backend failed to bind for a whole test run)."""
    low, _ = _ephemeral_range()
    lowest, highest = _worker_slice(10000 if low > 12000 else 1024, low - 1)
    for _ in range(500):
        port = random.randint(lowest, highest)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as s:  # a crowded machine: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_settings(max_connections: int, *, fast_unsafe: bool) -> list[str]:
    """The server settings (`name=value`, passed as `-c` flags) of a cluster started here, and of the
    test suite's container (cutylib.testing.postgres), so both behave alike. fast_unsafe: no fsync,
    no synchronous commit, no full-page writes (throwaway data only)."""
    settings = [f"max_connections={max_connections}", "shared_buffers=256MB", "timezone=UTC"]
    if fast_unsafe:
        settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
    return settings


class LocalCluster:
    """initdb once into `datadir`, then start/stop with pg_ctl. Reuses an existing data directory."""

    def __init__(self, datadir: str | os.PathLike, port: int | None = None, *, fast_unsafe: bool = False,
                 max_connections: int = 400):
        self.datadir = pathlib.Path(datadir).absolute()
        self.port = port or free_port()
        self.bin = find_pg_bin()
        self.fast_unsafe = fast_unsafe
        self.max_connections = max_connections
        self._as_postgres = os.geteuid() == 0
        self.sockdir = self.datadir.parent / (self.datadir.name + ".sock")

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)

    def _chown(self, path: pathlib.Path) -> None:
        if self._as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def init(self) -> None:
        if (self.datadir / "PG_VERSION").exists():
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._chown(self.datadir)
        self._reachable()
        r = self._run(str(self.bin / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--locale=C.UTF-8", "--no-sync", check=False)
        if r.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {r.stderr.strip()}")

    def _reachable(self) -> None:
        """postgres must be able to reach its data directory through every parent (checked at every
        start: another process, e.g. a second pytest session, may have tightened a shared temp dir)."""
        if self._as_postgres:
            for parent in self.datadir.parents:
                if parent == pathlib.Path("/"):
                    break
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    os.chmod(parent, mode | 0o001)

    def start(self, timeout: float = 30.0) -> None:
        self.init()
        self._reachable()
        self.sockdir.mkdir(parents=True, exist_ok=True)
        self._chown(self.sockdir)
        opts = [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.sockdir}",
                *(f"-c {s}" for s in server_settings(self.max_connections, fast_unsafe=self.fast_unsafe))]
        log = self.datadir.parent / (self.datadir.name + ".log")
        if not log.exists():
            log.touch()
        self._chown(log)
        r = self._run(str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-l", str(log), "-o", " ".join(opts),
                      "-w", "-t", str(int(timeout)), "start", check=False)
        if r.returncode != 0:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresUnavailable(f"pg_ctl start failed: {r.stderr.strip()} {tail}")
        self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise PostgresUnavailable(f"postgres did not accept connections on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        self._reachable()
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop", check=False)

    def is_running(self) -> bool:
        self._reachable()
        return self._run(str(self.bin / "pg_ctl"), "-D", str(self.datadir), "status", check=False).returncode == 0

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.datadir, ignore_errors=True)
        shutil.rmtree(self.sockdir, ignore_errors=True)
