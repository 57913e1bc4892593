"""HTTP -> request message and response -> JSON, without I/O."""
import pytest
from google.protobuf import timestamp_pb2

from cuty.booking.v1 import booking_pb2
from cuty.payments.v1 import checkout_pb2
from gateway.transcode import TranscodeError, build_request, field_of_parse_error, to_json


def err(routes, name, path_vars, query, body) -> TranscodeError:
    with pytest.raises(TranscodeError) as e:
        build_request(routes[name], path_vars, query, body)
    return e.value


def test_query_parameters_for_get(routes):
    m = build_request(routes["ListSlots"], {"salon_id": "s1"},
                      "startTime=2026-03-08T09:00:00%2B03:00&available_only=true", b"")
    assert m.salon_id == "s1" and m.available_only is True
    assert m.start_time.ToJsonString() == "2026-03-08T06:00:00Z"


def test_body_star_takes_both_spellings_and_the_path_wins(routes):
    m = build_request(routes["PayCheckout"], {"checkout_id": "c1"}, "",
                      b'{"payment_method": "pm_card_ok", "checkoutId": "someone-elses"}')
    assert (m.checkout_id, m.payment_method) == ("c1", "pm_card_ok")


def test_nested_body_with_int64_as_string_or_number(routes):
    body = (b'{"slots":[{"resourceId":"r1","startTime":"2026-03-08T09:00:00Z","endTime":"2026-03-08T10:00:00Z",'
            b'"price":{"currencyCode":"TRY","amountMinor":"75000"}},{"price":{"amountMinor":5}}]}')
    m = build_request(routes["BatchCreateSlots"], {"salon_id": "s1"}, "", body)
    assert [s.price.amount_minor for s in m.slots] == [75000, 5]


def test_empty_body_is_an_empty_message(routes):
    assert build_request(routes["CancelCheckout"], {"checkout_id": "c1"}, "", b"").checkout_id == "c1"


def test_bytes_body_field_gets_the_raw_body_unchanged(routes):
    raw = b'{"id": "evt_1",  "type":"payment_intent.succeeded"}\n\xff not even json'
    m = build_request(routes["HandlePspWebhook"], {}, "", raw)
    assert m.payload == raw


@pytest.mark.parametrize("body, field", [
    (b'{"slotId": 5}', "slotId"),
    (b'{"quantity": "many"}', "quantity"),
    (b'{"quantity": 1.5}', "quantity"),
    (b'{"quantity": 99999999999}', "quantity"),
    (b'{"customerId": "me"}', "customerId"),  # the customer is the token's sub, never a field
    (b'{"slotId": "a", "slotId": "b"}', "slotId"),
])
def test_wrong_types_unknown_and_duplicate_fields_name_the_field(routes, body, field):
    assert err(routes, "CreateCheckout", {}, "", body).field == field


@pytest.mark.parametrize("body", [b"{bad", b"[1,2]", b'"text"', b"\xff\xfe"])
def test_malformed_json_or_not_an_object(routes, body):
    e = err(routes, "CreateCheckout", {}, "", body)
    assert "JSON" in e.message


def test_timestamp_without_offset_names_the_field(routes):
    body = b'{"slots":[{"resourceId":"r","startTime":"2026-03-08T09:00:00Z"},{"startTime":"2026-03-08T09:00:00"}]}'
    e = err(routes, "BatchCreateSlots", {"salon_id": "s"}, "", body)
    assert e.field == "slots[1].startTime"
    assert "offset" in e.message
    q = err(routes, "ListSlots", {"salon_id": "s"}, "endTime=2026-03-08T09:00:00", b"")
    assert q.field == "endTime"


def test_unknown_nested_field(routes):
    e = err(routes, "BatchCreateSlots", {"salon_id": "s"}, "", b'{"slots":[{"startTme":"x"}]}')
    assert e.field == "slots[0].startTme"


@pytest.mark.parametrize("query, field", [
    ("availableOnly=maybe", "availableOnly"),
    ("nope=1", "nope"),
    ("salonId=other", "salonId"),  # bound by the path
    ("availableOnly=true&availableOnly=false", "availableOnly"),
])
def test_bad_query_parameters(routes, query, field):
    assert err(routes, "ListSlots", {"salon_id": "s"}, query, b"").field == field


def test_body_star_routes_refuse_query_parameters(routes):
    assert err(routes, "CreateCheckout", {}, "slotId=x", b"{}").field == "slotId"


def test_response_json_is_proto3_mapping_and_deterministic():
    c = checkout_pb2.Checkout(id="c1", kind=checkout_pb2.CHECKOUT_KIND_CODES, state=checkout_pb2.CHECKOUT_STATE_HELD, quantity=2,
                              expire_time=timestamp_pb2.Timestamp(seconds=1772960400))
    c.amount.currency_code, c.amount.amount_minor = "TRY", 10000
    out = to_json(c)
    # every field without presence is written, zeros and empty strings included
    assert out == (b'{"id":"c1","kind":"CHECKOUT_KIND_CODES","state":"CHECKOUT_STATE_HELD","holdId":"","orderId":"",'
                   b'"expireTime":"2026-03-08T09:00:00Z",'
                   b'"amount":{"currencyCode":"TRY","amountMinor":"10000"},"codes":[],"slotId":"","productId":"",'
                   b'"quantity":2,"failureReason":"","merchantId":"","salonId":"","freeCancellationHours":0,'
                   b'"cancellationFeePercent":0,"cancelledBy":"","cancelReason":""}')
    assert to_json(checkout_pb2.Checkout.FromString(c.SerializeToString())) == out


def test_response_keeps_non_ascii_and_injection_strings_verbatim():
    s = booking_pb2.Salon(name="Kuaför 'Ayşe'; DROP TABLE salons;-- <script>")
    assert to_json(s).decode() == ('{"id":"","name":"Kuaför \'Ayşe\'; DROP TABLE salons;-- <script>","timeZone":"",'
                                   '"merchantId":"","freeCancellationHours":0,"cancellationFeePercent":0,"minNoticeMinutes":0,'
                                   '"bookingHorizonDays":0,"timeStepMinutes":0,"noShowFeePercent":0}')


def test_field_of_parse_error_variants():
    assert field_of_parse_error('Message type "X" has no field named "foo" at "Req".\n Available') == "foo"
    assert field_of_parse_error("Failed to parse a field: Failed to parse b field: nope.") == "a.b"
    assert field_of_parse_error("Failed to parse x field: bad at Req.items[2].x.") == "items[2].x"


def test_query_timestamp_fast_path_matches_json_format(routes):
    from google.protobuf.timestamp_pb2 import Timestamp
    from gateway.transcode import fast_timestamp
    for raw in ["2026-03-08T09:00:00Z", "2026-03-08T09:00:00.5+03:00", "0001-01-01T00:00:00Z",
                "9999-12-31T23:59:59.999999999Z", "2026-10-25T01:30:00-04:00", "2026-03-08T09:00:00.000001-00:30"]:
        ref = Timestamp()
        ref.FromJsonString(raw)
        assert fast_timestamp(raw) == (ref.seconds, ref.nanos), raw
        m = build_request(routes["ListSlots"], {"salon_id": "s"}, "startTime=" + raw.replace("+", "%2B"), b"")
        assert (m.start_time.seconds, m.start_time.nanos) == (ref.seconds, ref.nanos)
    assert err(routes, "ListSlots", {"salon_id": "s"}, "startTime=2026-03-08T09:00:00Z&startTime=2026-03-09T09:00:00Z",
               b"").field == "startTime"
    assert err(routes, "ListSlots", {"salon_id": "s"}, "startTime=2026-02-30T09:00:00Z", b"").field == "startTime"
