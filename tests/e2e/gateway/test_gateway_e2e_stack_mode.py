"""cutylib.testing.stack.Stack(gateway=True): the gateway process beside the services, for other suites."""
import httpx

from cutylib.testing.stack import Stack


async def test_stack_with_gateway(pg, tmp_path):
    stack = await Stack(pg.dsn, tmp_path, services=("booking",), gateway=True).start()
    try:
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as c:
            assert (await c.get("/openapi.json")).status_code == 200
            health = (await c.get("/healthz")).json()
        assert health["services"]["booking"] == "SERVING"
        assert health["services"]["payments"] != "SERVING"  # not started in this stack
        assert stack.relay is None  # webhooks go to the gateway, not the test relay
    finally:
        await stack.stop()
