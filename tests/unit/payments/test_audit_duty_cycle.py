"""The invariant auditor's duty cycle (payments/audit.py DutyCycle): catching up a backlog, it works
at most its share of the wall time, resting after each batch in proportion to the batch; and the
findings of overlapping windows, listed once each (`ops audit`)."""
import pytest

from payments.audit import AuditSettings, DutyCycle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_after_work_it_rests_so_that_it_works_its_share_of_the_time():
    clock = Clock()
    duty = DutyCycle(0.25, clock=clock)
    assert duty.wait() == 0.0  # nothing done yet: no rest
    duty.worked(2.0)
    assert duty.wait() == pytest.approx(6.0)  # 2 s of work in 8 s: a quarter
    clock.now += 4.0
    assert duty.wait() == pytest.approx(2.0)
    clock.now += 2.0
    assert duty.wait() == 0.0


def test_a_short_batch_does_not_cut_a_long_rest_short():
    clock = Clock()
    duty = DutyCycle(0.1, clock=clock)
    duty.worked(1.0)  # rest 9 s
    duty.worked(0.01)  # the rest of this one would end sooner
    assert duty.wait() == pytest.approx(9.0)


def test_a_whole_duty_cycle_never_rests():
    duty = DutyCycle(1.0, clock=Clock())
    duty.worked(30.0)
    assert duty.wait() == 0.0


@pytest.mark.parametrize("value", ["0", "-0.5", "1.5"])
def test_a_duty_cycle_outside_0_to_1_is_refused(monkeypatch, value):
    monkeypatch.setenv("CUTY_AUDIT_DUTY_CYCLE", value)
    with pytest.raises(ValueError, match="duty cycle"):
        AuditSettings.from_env()


def test_the_duty_cycle_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("CUTY_AUDIT_DUTY_CYCLE", "0.5")
    assert AuditSettings.from_env().duty_cycle == 0.5
    monkeypatch.delenv("CUTY_AUDIT_DUTY_CYCLE")
    assert AuditSettings.from_env().duty_cycle == 0.1


def test_a_violation_seen_by_two_overlapping_windows_is_listed_once_with_the_first():
    from datetime import datetime, timedelta, timezone

    from payments.audit import Checked, Finding, distinct

    t = datetime(2026, 12, 3, tzinfo=timezone.utc)
    twice = Finding("code_delivered_twice", "code-1", other_id="order-a,order-b")
    w1 = Checked(t, t + timedelta(minutes=10), findings=[twice, Finding("codes_count_mismatch", "checkout-1")])
    w2 = Checked(t + timedelta(minutes=10), t + timedelta(minutes=20),
                 findings=[twice, Finding("codes_count_mismatch", "checkout-2")])
    assert [(c.start, f.kind, f.subject) for c, f in distinct([w1, w2])] == [
        (w1.start, "code_delivered_twice", "code-1"), (w1.start, "codes_count_mismatch", "checkout-1"),
        (w2.start, "codes_count_mismatch", "checkout-2")]
