"""Per-bucket summaries of the invariant auditor (docs/payments.md, "The invariant auditor"): the
one definition of how a fact is bucketed and fingerprinted, in SQL, so that payments, booking and
the code pool compute the same numbers in their own databases and compare a window of thousands of
facts with a few hundred.

A fact is a row's audited values joined with '|' (`facts`); its key is what the two sides join on
(a hold id, an order id). Its bucket is a 28-bit number from the md5 of its key, modulo the
bucket count the caller asked for; its fingerprint the first 64 bits of the md5 of the fact, as a
signed bigint. A bucket's summary is its count and the sum of its facts' fingerprints modulo 2^64
(order-independent, and a fact present twice counts twice, unlike an XOR). Two sides whose
summaries of a bucket agree hold the same facts in it (up to a 2^-64 collision); a bucket that
disagrees is read row by row."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from cutylib.errors import InvalidArgument

MAX_BUCKETS = 65536  # bucket_count's bound in the contract
MAX_DRILL_BUCKETS = 4096  # buckets a digest page may be filtered by
MOD = 1 << 64


def bucket_sql(key: str, count: str) -> str:
    """SQL: the bucket (0 .. count - 1) of the text expression `key`, `count` an int expression
    (the first 28 bits of its md5: never negative)."""
    return f"(('x0' || substr(md5({key}), 1, 7))::bit(32)::int % {count})"


def fingerprint_sql(*facts: str) -> str:
    """SQL: the signed 64-bit fingerprint of the text expressions `facts`, joined with '|'."""
    joined = ", ".join(f"coalesce(({f})::text, '')" for f in facts)
    return f"('x' || substr(md5(concat_ws('|', {joined})), 1, 16))::bit(64)::bigint"


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


class Tally:
    """A side's summary built from per-row (bucket, fingerprint) pairs computed in SQL."""

    def __init__(self) -> None:
        self.count: dict[int, int] = {}
        self.sum: dict[int, int] = {}

    def add(self, bucket: int, fingerprint: int) -> None:
        self.count[bucket] = self.count.get(bucket, 0) + 1
        self.sum[bucket] = self.sum.get(bucket, 0) + fingerprint  # modulo 2^64 when compared

    def differ(self, other: dict[int, Bucket]) -> set[int]:
        """The buckets where this tally and `other` disagree (count or fingerprint)."""
        out = {b for b, s in other.items()
               if (s.count, s.fingerprint) != (self.count.get(b, 0), self.sum.get(b, 0) % MOD)}
        return out | {b for b in self.count if b not in other}


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


def bucket_of(key: str, count: int) -> int:
    """`bucket_sql` in Python (tests, and a reader checking one fact by hand)."""
    return int(hashlib.md5(key.encode()).hexdigest()[:7], 16) % count


def fingerprint_of(*facts: object) -> int:
    """`fingerprint_sql` in Python, modulo 2^64 (None is '', as coalesce makes it)."""
    joined = "|".join("" if f is None else str(f) for f in facts)
    return int(hashlib.md5(joined.encode()).hexdigest()[:16], 16)
