"""The auditor's per-bucket summaries (cutylib.digests): two sides' summaries disagree in exactly
the buckets whose count or fingerprint differ, or that only one side has; the drill-down filter of
a digest request is refused, naming the field, when it is not a set of buckets below its count."""
import pytest

from cutylib import digests
from cutylib.errors import InvalidArgument


def summary(*rows):
    return {b: digests.Bucket(b, n, fp) for b, n, fp in rows}


def signed(x: int) -> int:
    """A 64-bit fingerprint as SQL's bigint holds it."""
    return x - (1 << 64) if x >= 1 << 63 else x


def test_two_summaries_disagree_only_where_counts_or_fingerprints_differ():
    facts = {1: [("a", 1), ("b", 2)], 2: [("c", 3)], 3: [("d", 4)]}
    # one side's rows as SQL sums them (signed bigints), the other's summed in memory
    mine = digests.buckets([{"bucket": b, "n": len(rows), "fingerprint": sum(signed(digests.fingerprint_of(*f))
                                                                           for f in rows)}
                            for b, rows in facts.items()])
    same = {b: digests.Bucket(b, len(rows), sum(digests.fingerprint_of(*f) for f in rows) % digests.MOD)
            for b, rows in facts.items()}
    assert mine == same and digests.differ(mine, same) == set()
    other = dict(same)
    other[2] = digests.Bucket(2, 1, digests.fingerprint_of("c", 4))  # a fact changed
    other[5] = digests.Bucket(5, 1, 7)  # a fact only the other side has
    del other[3]  # a fact only this side has
    assert digests.differ(mine, other) == digests.differ(other, mine) == {2, 3, 5}
    other = dict(same)
    other[1] = digests.Bucket(1, 3, same[1].fingerprint)  # one fact more, same sum
    assert digests.differ(mine, other) == {1}


def test_buckets_and_fingerprints_are_stable_and_in_range():
    assert digests.bucket_of("hold-1", 64) == digests.bucket_of("hold-1", 64)
    assert all(0 <= digests.bucket_of(str(i), 1000) < 1000 for i in range(2000))
    assert len({digests.bucket_of(str(i), 64) for i in range(2000)}) == 64
    assert digests.fingerprint_of("a", None, 1) == digests.fingerprint_of("a", "", "1")
    assert digests.fingerprint_of("a|b") == digests.fingerprint_of("a", "b")  # joined with '|', as in SQL


@pytest.mark.parametrize("count,buckets,field", [
    (0, [1], "bucket_count"), (-1, [], "bucket_count"), (digests.MAX_BUCKETS + 1, [1], "bucket_count"),
    (16, [16], "buckets"), (16, [-1], "buckets"), (16, [], "buckets"),
    (digests.MAX_BUCKETS, list(range(digests.MAX_DRILL_BUCKETS + 1)), "buckets")])
def test_a_bad_drill_down_filter_names_its_field(count, buckets, field):
    with pytest.raises(InvalidArgument) as e:
        digests.validate_buckets(count, buckets)
    assert e.value.field == field


def test_a_drill_down_filter_is_its_buckets_once_in_order():
    assert digests.validate_buckets(0, []) == []
    assert digests.validate_buckets(16, [3, 1, 3]) == [1, 3]
    assert digests.require_count(1) == 1
    with pytest.raises(InvalidArgument):
        digests.require_count(0)
