"""No plaintext code anywhere in the database or in any log line of the code pool tests.

Runs last in this folder (file order), after every other test has imported, reserved, delivered,
revealed, rotated and listed codes. Every test code carries MARKER, so one search finds any leak.
"""
import pathlib

import asyncpg

from codepool_testkit import ADMIN, MARKER, make_codes, new_product
from cuty.codepool.v1 import codepool_pb2 as pb

# Every column that could hold text or bytes, as text (bytea through its escape form).
COLUMNS = """
SELECT c.table_name, c.column_name, c.data_type
FROM information_schema.columns c JOIN information_schema.tables t USING (table_schema, table_name)
WHERE c.table_schema = 'public' AND t.table_type = 'BASE TABLE'
  AND c.data_type IN ('text', 'character varying', 'character', 'bytea', 'jsonb', 'json', 'ARRAY')
"""


async def test_no_plaintext_in_any_table_or_log(cp_pool, stub, captured_logs, pg):
    # make sure at least these codes went every way a code can go
    product_id = await new_product(stub)
    codes = make_codes(5)
    await stub.ImportCodeBatch(pb.ImportCodeBatchRequest(product_id=product_id, batch_ref="last", codes=codes),
                               metadata=ADMIN)
    listed = await stub.ListCodes(pb.ListCodesRequest(product_id=product_id), metadata=ADMIN)
    assert (await stub.RevealCode(pb.RevealCodeRequest(code_id=listed.codes[0].id), metadata=ADMIN)).value in codes

    searched = 0
    for row in await cp_pool.fetch(COLUMNS):
        table, column = asyncpg.utils._quote_ident(row["table_name"]), asyncpg.utils._quote_ident(row["column_name"])
        as_text = f"encode({column}, 'escape')" if row["data_type"] == "bytea" else f"{column}::text"
        leaks = await cp_pool.fetchval(f"SELECT count(*) FROM {table} WHERE strpos({as_text}, $1) > 0", MARKER)
        assert leaks == 0, f"{MARKER} found in {table}.{column}"
        searched += 1
    assert searched >= 20  # the scan covered the code pool's tables, not an empty schema
    # the folder's earlier files (one worker, file order: tests/conftest.py) left thousands of codes
    filled = await cp_pool.fetchrow(
        "SELECT count(*) AS codes, count(DISTINCT product_id) AS products, min(created_at) AS first_code, "
        "pg_postmaster_start_time() AS server_started, current_database() AS db FROM codes")
    assert filled["codes"] > 1_000, f"the folder's earlier files did not fill this database: {dict(filled)}"

    lines = captured_logs.lines
    assert len(lines) > 100, "log capture saw nothing; the search below would prove nothing"
    assert not [ln for ln in lines if MARKER in ln]
    # the database server's own log too, when the test session owns the server
    if pg.cluster is not None:
        log = pathlib.Path(pg.cluster.datadir.parent / (pg.cluster.datadir.name + ".log"))
        assert MARKER not in log.read_text(errors="replace")
