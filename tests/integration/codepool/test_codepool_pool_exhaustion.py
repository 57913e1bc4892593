"""Issue 10, item 9: stalled imports never starve buyers. An import holds a connection for as long
as its stream lasts; imports are limited and a silent stream is given up, and a request that cannot
get a connection in time fails UNAVAILABLE instead of queueing without end."""
import asyncio

import grpc
import pytest

from codepool.bootstrap import create_server
from cuty.codepool.v1 import codepool_pb2 as pb, codepool_pb2_grpc
from cutylib.config import Settings
from cutylib.db import create_pool
from codepool.grpc_api import CALLERS
from cutylib.testing.trust import acting_channel
from cutylib.grpc_errors import error_reason
from cutylib.testing.ids import new_id
from cutylib.testing.procs import wait_for

from codepool_testkit import ADMIN, STAFF, make_codes, reserve_request, stocked_product

APP = "codepool-exhaustion-" + new_id()[:8]


@pytest.fixture
async def small(codepool_dsn, keyring, monkeypatch):
    """A code pool server on a pool of 6 connections, 2 imports at once, 1.5 s import idle timeout."""
    monkeypatch.setenv("CUTY_CODE_IMPORT_CONCURRENCY", "2")
    monkeypatch.setenv("CUTY_CODE_IMPORT_IDLE_SECONDS", "1.5")
    pool = await create_pool(codepool_dsn, min_size=1, max_size=6, application_name=APP, acquire_timeout=1.0)
    server = await create_server(Settings(), pool, keyring=keyring)
    await server.start()
    async with acting_channel(f"127.0.0.1:{server.port}", "codepool", CALLERS, deadline_seconds=30) as channel:
        yield pool, codepool_pb2_grpc.CodePoolServiceStub(channel)
    await server.stop()
    await pool.close()


async def _in_transaction(cp_pool) -> int:
    return await cp_pool.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 "
                                  "AND state = 'idle in transaction'", APP)


async def test_twenty_stalled_imports_do_not_block_reserve_codes(small, stub, cp_pool):
    pool, mine = small
    product_id, _ = await stocked_product(stub, 5)
    never = asyncio.Event()

    async def stalled_stream():
        yield pb.ImportCodesChunk(product_id=product_id, batch_ref="stall-" + new_id(), codes=make_codes(3))
        await never.wait()  # a supplier upload that hangs after its first message

    calls = [mine.ImportCodes(stalled_stream()) for _ in range(20)]
    imports = asyncio.gather(*calls, return_exceptions=True)
    await wait_for(lambda: _in_transaction(cp_pool), timeout=10, message="imports holding their transactions")
    # Buyers are served at once while the uploads hang.
    got = await asyncio.wait_for(mine.ReserveCodes(reserve_request(product_id, 1)), 2)
    assert got.status == pb.RESERVATION_STATUS_RESERVED
    assert await _in_transaction(cp_pool) <= 2

    results = await asyncio.wait_for(imports, 30)
    assert all(isinstance(r, grpc.aio.AioRpcError) for r in results)
    codes = {(r.code(), error_reason(r)) for r in results}
    assert codes <= {(grpc.StatusCode.ABORTED, "import-stream-idle"), (grpc.StatusCode.UNAVAILABLE, "")}
    assert (grpc.StatusCode.ABORTED, "import-stream-idle") in codes
    assert await cp_pool.fetchval("SELECT count(*) FROM codes WHERE product_id = $1::uuid", product_id) == 5
    async def given_back() -> bool:
        return await _in_transaction(cp_pool) == 0
    await wait_for(given_back, timeout=10, message="connections given back")
    assert pool.get_size() - pool.get_idle_size() == 0


async def test_an_exhausted_pool_answers_unavailable_not_a_queue(small):
    pool, mine = small
    held = [await pool.acquire(timeout=5) for _ in range(6)]  # every connection busy elsewhere
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await asyncio.wait_for(mine.GetStock(pb.GetStockRequest(product_id=new_id()), metadata=STAFF), 5)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        for conn in held:
            await pool.release(conn)
