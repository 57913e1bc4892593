"""cuty-client as installed by `make` (`pip install ./clients/python`): it ships generated modules
of exactly the repository's protos (not a stale copy), under its own package, and imports with
nothing of the platform on the path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = """
import json, cuty_client
from cuty_client._pb.cuty.booking.v1 import booking_pb2
from cuty_client._pb.cuty.codepool.v1 import codepool_pb2, claims_pb2
from cuty_client._pb.cuty.payments.v1 import checkout_pb2
mods = [booking_pb2, codepool_pb2, claims_pb2, checkout_pb2]
print(json.dumps({m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb.hex() for m in mods}))
print(cuty_client.__file__)
"""


def test_installed_package_matches_the_protos_and_stands_alone():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # no build/gen, no cutylib
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd="/", capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shipped, location = out.stdout.splitlines()
    assert "site-packages" in location  # the installed package, not the source folder
    # The platform's own modules (build/gen, from protos/ by `make gen`), in this process.
    from cuty.booking.v1 import booking_pb2
    from cuty.codepool.v1 import claims_pb2, codepool_pb2
    from cuty.payments.v1 import checkout_pb2
    ours = {m.DESCRIPTOR.name: m.DESCRIPTOR.serialized_pb for m in (booking_pb2, codepool_pb2, claims_pb2, checkout_pb2)}
    shipped = json.loads(shipped)
    assert set(shipped) == set(ours)
    for name, hexed in shipped.items():
        assert bytes.fromhex(hexed) == ours[name], f"{name}: cuty-client is stale; run `make gen`"


def test_the_package_builds_with_the_locked_code_generator():
    """The modules a user's build generates need a runtime at least as new as the generator: the
    package pins the generator the repository locks, and asks for that runtime."""
    import pathlib
    import re
    import tomllib

    repo = pathlib.Path(__file__).resolve().parents[3]
    locked = re.search(r"^grpcio-tools==(\S+)", (repo / "requirements-build.lock").read_text(), re.M).group(1)
    project = tomllib.loads((repo / "clients" / "python" / "pyproject.toml").read_text())
    assert f"grpcio-tools=={locked}" in project["build-system"]["requires"]
    assert f"grpcio>={locked}" in project["project"]["dependencies"]
