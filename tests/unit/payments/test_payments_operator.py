"""Who an operator action is recorded as (payments/operator.py): a user from the signed assertion
only; the payments identity's own tooling (`system`) names its human with `cuty-operator`."""
import pytest

from cutylib.errors import InvalidArgument
from cutylib.principal import SYSTEM, Principal
from payments.grpc_api import refund_note
from payments.operator import OPERATOR_KEY, who


def test_system_names_its_operator():
    assert who(SYSTEM, ((OPERATOR_KEY, "alice"),)) == "ops:alice"
    assert who(SYSTEM, ()) == "system"


def test_a_user_is_who_the_assertion_says_whatever_the_metadata():
    assert who(Principal("bob", "admin"), ((OPERATOR_KEY, "mallory"),)) == "admin:bob"
    assert who(Principal("op-1", "operator"), ()) == "operator:op-1"


@pytest.mark.parametrize("name", [" ", "x" * 65, "a\nb", "tab\there"])
def test_bad_operator_names_are_refused(name):
    with pytest.raises(InvalidArgument):
        who(SYSTEM, ((OPERATOR_KEY, name),))


def test_refund_note():
    assert refund_note("ops:alice", "") == "refund requested by ops:alice"
    assert refund_note("ops:alice", " double\n charge ") == "refund requested by ops:alice: double charge"
    assert len(refund_note("system", "x" * 1000)) < 240
