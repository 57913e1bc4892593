"""cutylib.testing.stack.Stack(gateway=True): the gateway process beside the services, for other suites."""
import httpx

from cutylib.testing.stack import Stack


async def test_stack_with_gateway(pg, tmp_path):
    stack = await Stack(pg.dsn, tmp_path, services=("booking",), gateway=True).start()
    try:
        async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=10) as c:
            assert (await c.get("/openapi.json")).status_code == 200
            health = await c.get("/healthz")
            ready = await c.get("/readyz")
        assert health.json()["services"]["booking"] == "SERVING"
        assert health.json()["services"]["payments"] != "SERVING"  # not started in this stack
        # One backend down: /healthz says so for people, but the gateway stays ready (its own
        # ability to serve), so Kubernetes keeps routing the other routes and the PSP's webhooks.
        assert health.status_code == 503 and ready.status_code == 200
        assert stack.relay is None  # webhooks go to the gateway, not the test relay
    finally:
        await stack.stop()
