"""ImportCodes / ImportCodeBatch / the CSV command: all or nothing, duplicates by keyed hash."""
import asyncio
import io
import uuid

import grpc
import pytest

from cuty.codepool.v1 import codepool_pb2 as pb
from cutylib.errors import InvalidArgument
from cutylib.grpc_errors import bad_field, error_reason
from cutylib.testing.ids import new_id

from codepool.cli import import_csv
from codepool_testkit import ADMIN, MARKER, STAFF, make_codes, new_product, stock_of


def stream(product_id: str, codes: list[str], *, per_message: int = 1000, batch_ref: str | None = None):
    batch_ref = batch_ref or "b-" + new_id()

    async def gen():
        for i in range(0, len(codes), per_message):
            yield pb.ImportCodesChunk(product_id=product_id if i == 0 else "", batch_ref=batch_ref if i == 0 else "",
                                      codes=codes[i:i + per_message])
    return gen()


async def codes_of(cp_pool, product_id: str) -> int:
    return await cp_pool.fetchval("SELECT count(*) FROM codes WHERE product_id = $1", uuid.UUID(product_id))


async def test_stream_import_in_many_messages(stub, cp_pool):
    product_id = await new_product(stub)
    codes = make_codes(12_345)
    resp = await stub.ImportCodes(stream(product_id, codes, per_message=777))
    assert (resp.accepted, resp.received, resp.imported, resp.rejected_duplicates) == (True, 12_345, 12_345, 0)
    assert await stock_of(stub, product_id) == (12_345, 0, 0)
    batch = await cp_pool.fetchrow("SELECT received, imported, actor FROM supplier_batches WHERE id = $1",
                                   uuid.UUID(resp.batch_id))
    assert tuple(batch) == (12_345, 12_345, "system")  # the import CLI, in the code pool's pod
    assert await cp_pool.fetchval("SELECT count(*) FROM codes WHERE batch_id = $1", uuid.UUID(resp.batch_id)) == 12_345


async def test_duplicates_within_a_batch_refuse_it_whole(stub, cp_pool):
    product_id = await new_product(stub)
    codes = make_codes(50)
    resp = await stub.ImportCodes(stream(product_id, codes + codes[:3] + codes[:1], per_message=7))
    assert (resp.accepted, resp.imported, resp.rejected_duplicates, resp.received, resp.batch_id) == (False, 0, 4, 54, "")
    assert await codes_of(cp_pool, product_id) == 0
    assert await cp_pool.fetchval("SELECT details->>'rejected_duplicates' FROM audit_log "
                                  "WHERE product_id = $1 AND action = 'import_rejected'", uuid.UUID(product_id)) == "4"


async def test_duplicates_across_batches_refuse_the_later_batch_whole(stub, cp_pool):
    product_id = await new_product(stub)
    first = make_codes(100)
    assert (await stub.ImportCodes(stream(product_id, first))).accepted
    second = make_codes(100) + first[10:15]
    resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b2", codes=second),
                                      metadata=ADMIN)
    assert (resp.accepted, resp.imported, resp.rejected_duplicates) == (False, 0, 5)
    assert await codes_of(cp_pool, product_id) == 100
    # the same code under another product is that product's own
    other = await new_product(stub)
    assert (await stub.ImportCodes(stream(other, first[:5]))).imported == 5


async def test_concurrent_batches_sharing_a_code_accept_exactly_one(stub, cp_pool):
    product_id = await new_product(stub)
    shared = make_codes(1)
    batches = [make_codes(300) + shared for _ in range(5)]
    results = await asyncio.gather(*(stub.ImportCodes(stream(product_id, b, per_message=50))
                                     for b in batches))
    assert sorted(r.accepted for r in results) == [False] * 4 + [True]
    assert await codes_of(cp_pool, product_id) == 301


async def test_a_retried_batch_answers_as_the_first_and_a_reused_ref_is_refused(stub, cp_pool):
    product_id = await new_product(stub)
    codes = make_codes(40)
    first = await stub.ImportCodes(stream(product_id, codes, batch_ref="supplier-7"))
    again = await stub.ImportCodes(stream(product_id, codes, per_message=3, batch_ref="supplier-7"))
    assert (again.batch_id, again.imported, again.accepted) == (first.batch_id, 40, True)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodes(stream(product_id, make_codes(40), batch_ref="supplier-7"))
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert error_reason(e.value) == "batch-ref-taken"
    assert await codes_of(cp_pool, product_id) == 40


@pytest.mark.parametrize("bad, field", [
    ("", "codes[1234]"),
    ("   ", "codes[1234]"),
    (MARKER + "x" * 300, "codes[1234]"),
    (" " + MARKER + "-padded", "codes[1234]"),
    (MARKER + "\n-newline", "codes[1234]"),
])
async def test_a_bad_code_anywhere_in_the_stream_imports_nothing(stub, cp_pool, bad, field):
    product_id = await new_product(stub)
    codes = make_codes(2000)
    codes[1234] = bad
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodes(stream(product_id, codes, per_message=100))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field
    assert MARKER not in e.value.details()  # the value is never echoed
    assert await codes_of(cp_pool, product_id) == 0


async def test_exactly_256_characters_is_accepted(stub):
    product_id = await new_product(stub)
    code = (MARKER + "-" + new_id() * 8)[:256]
    resp = await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b", codes=[code]),
                                      metadata=ADMIN)
    assert resp.imported == 1


@pytest.mark.parametrize("mutate, field", [
    (lambda m: setattr(m, "product_id", "nope"), "product_id"),
    (lambda m: setattr(m, "batch_ref", ""), "batch_ref"),
    (lambda m: m.ClearField("codes"), "codes"),
])
async def test_bad_batch_request(stub, mutate, field):
    product_id = await new_product(stub)
    req = pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b", codes=make_codes(3))
    mutate(req)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodeBatch(req, metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad_field(e.value) == field


async def test_unknown_product_is_not_found(stub):
    # NOT_FOUND, as another merchant's product is (issue 14: existence does not leak)
    req = pb.ImportCodeBatchRequest(product_id=str(uuid.uuid4()), batch_ref="b", codes=make_codes(3))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodeBatch(req, metadata=ADMIN)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_later_message_naming_another_product_is_refused(stub, cp_pool):
    product_id, other = await new_product(stub), await new_product(stub)

    async def gen():
        yield pb.ImportCodesChunk(product_id=product_id, batch_ref="b", codes=make_codes(10))
        yield pb.ImportCodesChunk(product_id=other, codes=make_codes(10))
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodes(gen())
    assert bad_field(e.value) == "product_id"
    assert await codes_of(cp_pool, product_id) == 0 and await codes_of(cp_pool, other) == 0


async def test_only_admins_import(stub):
    product_id = await new_product(stub)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="b", codes=make_codes(1)),
                                   metadata=STAFF)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_csv_command_imports_with_a_progress_bar(stub, cp_server, tmp_path):
    product_id = await new_product(stub)
    codes = make_codes(2500)
    path = tmp_path / "codes.csv"
    path.write_text("code,note\n" + "".join(f"{c},\"batch, 7\"\n" for c in codes) + "\n")
    out = io.StringIO()
    resp = await import_csv(f"127.0.0.1:{cp_server.port}", product_id, path, chunk=1000, progress_file=out)
    assert (resp.accepted, resp.imported) == (True, 2500)
    assert "2.50k/2.50k" in out.getvalue() or "2500/2500" in out.getvalue(), out.getvalue()
    assert MARKER not in out.getvalue()
    assert await stock_of(stub, product_id) == (2500, 0, 0)


async def test_csv_command_reports_malformed_lines_and_sends_nothing(stub, cp_server, tmp_path):
    product_id = await new_product(stub)
    good = make_codes(5)
    lines = [good[0], good[1] + ",extra", "", good[2], '""', MARKER + "y" * 300, good[3], '"' + good[4]]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidArgument) as e:
        await import_csv(f"127.0.0.1:{cp_server.port}", product_id, path, progress_file=io.StringIO())
    msg = e.value.message
    assert e.value.field == "line 2"
    assert "line 2: expected 1 column(s), got 2" in msg
    assert "line 5: code is empty" in msg
    assert "line 6: code is longer than 256" in msg
    assert "line 8: malformed CSV" in msg
    assert MARKER not in msg
    assert await stock_of(stub, product_id) == (0, 0, 0)
