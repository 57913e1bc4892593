"""`make run` brings a local Prometheus with the alert rules."""
import shutil

import httpx
import pytest

from cutylib.testing.procs import wait_for


async def test_make_run_starts_a_prometheus_that_scrapes_every_process(stack):
    """`make run` starts Prometheus when the binary is there (Debian package prometheus), scraping
    the four metrics ports with the alert rules loaded."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian package prometheus)")
    url = f"http://127.0.0.1:{stack.env['CUTY_PROMETHEUS_PORT']}"
    async with httpx.AsyncClient(base_url=url, timeout=5) as c:
        async def all_up():
            targets = (await c.get("/api/v1/targets")).json()["data"]["activeTargets"]
            up = {t["labels"]["job"] for t in targets if t["health"] == "up"}
            return up >= {"cuty-gateway", "cuty-booking", "cuty-codepool", "cuty-payments"}
        await wait_for(all_up, timeout=60, interval=1, message="Prometheus scraping all four processes")
        rules = (await c.get("/api/v1/rules")).json()["data"]["groups"]
        assert sum(len(g["rules"]) for g in rules) >= 5
