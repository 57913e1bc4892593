"""The auditor's bucket and fingerprint in SQL (cutylib.digests: PostgreSQL's hashtextextended)
and in Python (`pg_hash`, what the PSP simulator computes for its balance report) are the same
numbers for any text: a side that computes them in memory agrees with one that sums them in SQL."""
import random
import string

import asyncpg

from cutylib import digests


async def test_python_and_sql_bucket_and_fingerprint_every_text_alike(scratch_db):
    rng = random.Random(29)
    texts = ["", "a", "abcd", "hello world!", "ğüşöç €", "0123456789abcdefghijklmnopqrstuvwxyz"]
    texts += ["".join(rng.choices(string.printable + "çğış€", k=rng.randint(0, 90))) for _ in range(400)]
    conn = await asyncpg.connect(scratch_db)
    try:
        rows = await conn.fetch(
            f"SELECT t, hashtextextended(t, 0) AS h, hashtextextended(t, 7) AS h7, {digests.bucket_sql('t', '$2')} AS b, "
            f"{digests.fingerprint_sql('t', 'NULL', '42')} AS fp FROM unnest($1::text[]) AS t", texts, 1000)
    finally:
        await conn.close()
    for r in rows:
        t = r["t"]
        assert digests.pg_hash(t.encode()) == r["h"] % digests.MOD, t
        assert digests.pg_hash(t.encode(), 7) == r["h7"] % digests.MOD, t
        assert digests.bucket_of(t, 1000) == r["b"] and 0 <= r["b"] < 1000, t
        assert digests.fingerprint_of(t, None, 42) == r["fp"] % digests.MOD, t
