"""Reporting reads (lists, a salon's agenda) have a small pool of their own (docs/conventions.md,
"Database"): a burst of them cannot take the connections a purchase needs, nor the other way round."""
from __future__ import annotations

import asyncio
import dataclasses

import pytest

from cutylib import db
from cutylib.config import Settings
from cutylib.db import create_pool


async def test_reports_and_requests_never_wait_for_each_others_connections(scratch_db):
    pool = await create_pool(scratch_db, min_size=0, max_size=2, acquire_timeout=0.5, reporting_max_size=1)
    try:
        reports = db.reports(pool)
        assert reports is not pool and reports.get_max_size() == 1
        # Every request connection busy: a report still runs.
        held = [await pool.acquire(), await pool.acquire()]
        assert await reports.fetchval("SELECT 1") == 1
        for c in held:
            await pool.release(c)
        # The report connection busy (a slow list): requests still run, a second report waits its turn.
        slow = await reports.acquire()
        assert await asyncio.gather(pool.fetchval("SELECT 1"), pool.fetchval("SELECT 2")) == [1, 2]
        with pytest.raises(asyncio.TimeoutError):
            await reports.fetchval("SELECT 3")
        await reports.release(slow)
    finally:
        await pool.close()
    assert reports._closed  # closed with the pool it belongs to


async def test_a_pool_without_its_own_reporting_pool_reports_on_itself(scratch_db):
    pool = await create_pool(scratch_db, min_size=0, max_size=2)
    try:
        assert db.reports(pool) is pool
    finally:
        await pool.close()


@pytest.mark.parametrize("service", ["booking", "codepool", "payments"])
async def test_each_service_pool_has_a_reporting_pool(scratch_db, service):
    import importlib
    creator = getattr(importlib.import_module(f"{service}.bootstrap"), f"create_{service}_pool")
    settings = dataclasses.replace(Settings(), db_pool_min=0, db_reporting_pool_max=3)
    pool = await creator(scratch_db, settings)
    try:
        assert db.reports(pool) is not pool and db.reports(pool).get_max_size() == 3
    finally:
        await pool.close()
