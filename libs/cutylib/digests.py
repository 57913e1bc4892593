"""Per-bucket summaries of the invariant auditor (docs/payments.md, "The invariant auditor"): the
one definition of how a fact is bucketed and fingerprinted, in SQL, so that payments, booking and
the code pool compute the same numbers in their own databases (and the PSP simulator in memory, for
its balance report) and compare a window of thousands of facts with a few hundred.

A fact is a row's audited values joined with '|' (`facts`); its key is what the two sides join on
(a hold id, an order id, a PSP payment intent id). Its bucket is the low 28 bits of the 64-bit hash
of its key, modulo the bucket count the caller asked for; its fingerprint the 64-bit hash of the
fact, as a signed bigint. The hash is PostgreSQL's own `hashtextextended(text, 0)` (lookup3, the hash
of its hash partitions, stable across its versions; `pg_hash` is the same function in Python, for
a side that keeps its facts in memory): about a sixth of the CPU of md5 with the hex text and bit
casts it needs (docs/benchmarks.md), and not a cryptographic hash, which nothing here asks for (a
drift is caught unless its two facts' hashes collide: 2^-64). A bucket's summary is its count and
the sum of its facts' fingerprints modulo 2^64 (order-independent, and a fact present twice counts
twice, unlike an XOR). Two sides whose summaries of a bucket agree hold the same facts in it (up to
a 2^-64 collision); a bucket that disagrees is read row by row."""
from __future__ import annotations

from dataclasses import dataclass

from cutylib.errors import InvalidArgument

MAX_BUCKETS = 65536  # bucket_count's bound in the contract
MAX_DRILL_BUCKETS = 4096  # buckets a digest page may be filtered by
MOD = 1 << 64


KEY_BITS = 0xFFFFFFF  # a key's hash, kept to 28 bits: never negative as an int


def bucket_sql(key: str, count: str) -> str:
    """SQL: the bucket (0 .. count - 1) of the text expression `key`, `count` an int expression."""
    return f"((hashtextextended({key}, 0) & {KEY_BITS})::int % {count})"


def fingerprint_sql(*facts: str) -> str:
    """SQL: the signed 64-bit fingerprint of the text expressions `facts`, joined with '|'."""
    joined = ", ".join(f"coalesce(({f})::text, '')" for f in facts)
    return f"hashtextextended(concat_ws('|', {joined}), 0)"


def summary_sql(rows: str, key: str, *facts: str) -> str:
    """SQL: (bucket, n, fingerprint) per non-empty bucket of the row source `rows` (a FROM ...
    WHERE ... clause), the bucket count its parameter $3."""
    return (f"SELECT {bucket_sql(key, '$3::int')} AS bucket, count(*) AS n, "
            f"sum({fingerprint_sql(*facts)}) AS fingerprint {rows} GROUP BY 1")


def in_buckets_sql(key: str, count: str, buckets: str) -> str:
    """SQL: the condition "no bucket filter (count 0) or `key` in one of `buckets` (int[])"."""
    return f"({count}::int = 0 OR {bucket_sql(key, count + '::int')} = ANY({buckets}::int[]))"


@dataclass(frozen=True)
class Bucket:
    bucket: int
    count: int
    fingerprint: int  # 0 .. 2^64 - 1


def buckets(rows) -> dict[int, Bucket]:
    """The summary rows of `summary_sql` by bucket, fingerprints modulo 2^64."""
    return {r["bucket"]: Bucket(r["bucket"], r["n"], int(r["fingerprint"]) % MOD) for r in rows}


def differ(mine: dict[int, Bucket], theirs: dict[int, Bucket]) -> set[int]:
    """The buckets where two summaries disagree: count or fingerprint, or present on one side only."""
    return {b for b in mine.keys() | theirs.keys() if mine.get(b) != theirs.get(b)}


def require_count(count: int) -> int:
    """A summary's bucket_count: 1 to MAX_BUCKETS, else INVALID_ARGUMENT naming the field."""
    if not 1 <= count <= MAX_BUCKETS:
        raise InvalidArgument("bucket_count", f"bucket_count must be 1 to {MAX_BUCKETS}")
    return count


def validate_buckets(count: int, chosen) -> list[int]:
    """The drill-down filter of a digest request: `chosen` buckets each below `count` (0: none
    asked, then no bucket may be named); else INVALID_ARGUMENT naming the field."""
    chosen = list(chosen)
    if count == 0 and chosen:
        raise InvalidArgument("bucket_count", "bucket_count is required with buckets")
    if not 0 <= count <= MAX_BUCKETS:
        raise InvalidArgument("bucket_count", f"bucket_count must be 0 to {MAX_BUCKETS}")
    if len(chosen) > MAX_DRILL_BUCKETS:
        raise InvalidArgument("buckets", f"at most {MAX_DRILL_BUCKETS} buckets")
    if any(not 0 <= b < count for b in chosen):
        raise InvalidArgument("buckets", "each bucket must be at least 0 and below bucket_count")
    if count and not chosen:
        raise InvalidArgument("buckets", "buckets is required with bucket_count")
    return sorted(set(chosen))


def key_hash(key: str) -> int:
    """The 28-bit number `bucket_sql` takes modulo the bucket count (a side that keeps its facts in
    memory, the PSP simulator's charges, computes it once per fact, not once per summary)."""
    return pg_hash(key.encode()) & KEY_BITS


def bucket_of(key: str, count: int) -> int:
    """`bucket_sql` in Python (tests, and a reader checking one fact by hand)."""
    return key_hash(key) % count


def fingerprint_of(*facts: object) -> int:
    """`fingerprint_sql` in Python, modulo 2^64 (None is '', as coalesce makes it)."""
    joined = "|".join("" if f is None else str(f) for f in facts)
    return pg_hash(joined.encode())


_M32 = 0xFFFFFFFF


def _rot(x: int, k: int) -> int:
    return ((x << k) | (x >> (32 - k))) & _M32


def _mix(a: int, b: int, c: int) -> tuple[int, int, int]:
    """lookup3's mix: six rounds of x -= z; x ^= rot(z, k); z += y over (a, b, c) turning."""
    for k in (4, 6, 8, 16, 19, 4):
        a = ((a - c) & _M32) ^ _rot(c, k)
        c = (c + b) & _M32
        a, b, c = b, c, a
    return a, b, c  # six turns: the names are back in place


def _final(a: int, b: int, c: int) -> tuple[int, int, int]:
    """lookup3's final: seven rounds of z ^= y; z -= rot(y, k) over (a, b, c) turning."""
    for k in (14, 11, 25, 16, 4, 14, 24):
        c = ((c ^ b) - _rot(b, k)) & _M32
        a, b, c = b, c, a
    return c, a, b  # seven turns: one too many


def pg_hash(data: bytes, seed: int = 0) -> int:
    """PostgreSQL's `hash_bytes_extended` (src/common/hashfn.c: Bob Jenkins' lookup3, little-endian
    words), what `hashtextextended(text, seed)` answers for a deterministic collation, as an
    unsigned 64-bit number (SQL's bigint is the same bits, signed)."""
    n = len(data)
    a = b = c = (0x9E3779B9 + n + 3923095) & _M32
    if seed:
        a = (a + (seed >> 32)) & _M32
        b = (b + (seed & _M32)) & _M32
        a, b, c = _mix(a, b, c)
    i = 0
    while n - i >= 12:
        a = (a + int.from_bytes(data[i:i + 4], "little")) & _M32
        b = (b + int.from_bytes(data[i + 4:i + 8], "little")) & _M32
        c = (c + int.from_bytes(data[i + 8:i + 12], "little")) & _M32
        a, b, c = _mix(a, b, c)
        i += 12
    tail = data[i:] + bytes(12 - (n - i))  # the last 0-11 bytes; c's lowest byte is left out
    a = (a + int.from_bytes(tail[0:4], "little")) & _M32
    b = (b + int.from_bytes(tail[4:8], "little")) & _M32
    c = (c + (int.from_bytes(tail[8:11], "little") << 8)) & _M32
    a, b, c = _final(a, b, c)
    return (b << 32) | c
