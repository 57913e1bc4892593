"""cutylib.backoff.equal_jitter: the one retry wait of the saga, the PSP simulator's webhooks (and,
once it moves over, the outbound webhook worker)."""
import random

from cutylib.backoff import equal_jitter


def test_the_wait_is_between_half_the_step_and_the_step_which_doubles_up_to_the_cap():
    rng = random.Random(7)
    for failures in range(1, 40):
        step = min(30.0, 0.2 * 2 ** (failures - 1))
        samples = [equal_jitter(failures, 0.2, 30, rng) for _ in range(50)]
        assert all(step / 2 <= s <= step for s in samples), failures
        assert len(set(samples)) > 1  # spread: replicas do not retry in step


def test_the_first_failure_waits_about_the_base_and_a_huge_count_stays_finite():
    rng = random.Random(1)
    assert 0.1 <= equal_jitter(1, 0.2, 30, rng) <= 0.2
    assert equal_jitter(0, 0.2, 30, rng) <= 0.2  # below 1 counts as the first
    assert 15 <= equal_jitter(10**6, 0.2, 30, rng) <= 30
