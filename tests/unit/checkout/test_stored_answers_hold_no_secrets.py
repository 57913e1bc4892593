"""What an Idempotency-Key keeps for 24 h holds none of the fields the protos mark `debug_redact`
(client secret, 3-D Secure redirect URL, code values), whatever the answer held."""
from cuty.payments.v1 import checkout_pb2
from gateway.memo import can_carry_secrets, carries_secrets
from payments.checkout.views import without_secrets


def test_a_stored_checkout_answer_carries_no_secret():
    answer = checkout_pb2.Checkout(id="c1")
    answer.payment.id = "p1"
    answer.payment.client_secret = "cs_secret"
    answer.payment.next_action.redirect_url = "https://psp.example/3ds/cs_secret"
    answer.codes.add(id="code-1", value="PLAIN-CODE")
    assert can_carry_secrets(checkout_pb2.Checkout.DESCRIPTOR) and carries_secrets(answer)
    stored = without_secrets(answer)
    assert not carries_secrets(stored)
    assert stored.id == "c1" and stored.payment.id == "p1"  # the rest is kept
    assert carries_secrets(answer)  # the answer itself is untouched


def test_messages_without_marked_fields_are_memoisable():
    from cuty.booking.v1 import booking_pb2
    assert not can_carry_secrets(booking_pb2.ListSlotsResponse.DESCRIPTOR)
