import pytest

from gateway.descriptors import load_routes


@pytest.fixture(scope="session")
def routes():
    """RPC short name -> Route, straight from build/gen/descriptors.pb."""
    return {r.rpc.rsplit(".", 1)[-1]: r for r in load_routes()}
