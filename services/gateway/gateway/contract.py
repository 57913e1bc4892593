"""The request rules of the contracts (the protos' `buf.validate` annotations, which every service
and the gateway enforce with protovalidate: cutylib.validation) as JSON Schema for the OpenAPI
document, so a client generated from it knows what is refused before it asks.

Only rules that JSON Schema says exactly are carried over (lengths, patterns, UUIDs, ranges,
enumerations, item counts, required fields); a field is `required` when leaving it out (its zero
value) breaks its rules, which the validator itself decides. Rules that only the services can check
(does the slot exist, is the time zone in the tz database) stay in the operations' descriptions.
"""
from __future__ import annotations

import functools

from buf.validate import validate_pb2 as pv
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from cutylib import validation

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
# A day (YYYY-MM-DD) as the protos spell its pattern; the services read it as a calendar day.
DAY_PATTERN = "^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_T = FieldDescriptor
_INT64 = {_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64, _T.TYPE_UINT64, _T.TYPE_FIXED64}
_NUMERIC_RULES = ("int32", "int64", "uint32", "uint64", "sint32", "sint64", "fixed32", "fixed64", "sfixed32",
                  "sfixed64", "double", "float")


def rules_of(f: FieldDescriptor) -> pv.FieldRules | None:
    opts = f.GetOptions()
    return opts.Extensions[pv.field] if opts.HasExtension(pv.field) else None


def _ignores_zero(rules: pv.FieldRules) -> bool:
    return rules.ignore == pv.IGNORE_IF_ZERO_VALUE


def scalar(schema: dict, f: FieldDescriptor, rules: pv.FieldRules, *, item: bool = False) -> dict:
    """`schema` (a field's, or an item's of a repeated field) with what `rules` say."""
    out = dict(schema)
    kind = rules.WhichOneof("type")
    optional_zero = _ignores_zero(rules) and not item
    if kind == "string":
        s = rules.string
        if s.uuid:
            if optional_zero:  # "" (not filtered) or a UUID
                out["pattern"] = "^$|" + UUID_PATTERN
            else:
                out["format"], out["pattern"] = "uuid", UUID_PATTERN
        elif s.HasField("pattern"):
            out["pattern"] = s.pattern
            if s.pattern == DAY_PATTERN:  # the pattern admits 2027-02-31; a day is a calendar's
                out["format"] = "date"
        if s.HasField("min_len") and s.min_len and not optional_zero:
            out["minLength"] = s.min_len
        if s.HasField("max_len"):
            out["maxLength"] = s.max_len
        if s.HasField("len"):
            out["minLength"] = out["maxLength"] = s.len
        if getattr(s, "in"):
            out["enum"] = list(getattr(s, "in"))
    elif kind in _NUMERIC_RULES:
        n = getattr(rules, kind)
        low = n.gte if n.HasField("gte") else (n.gt + 1 if n.HasField("gt") else None)
        high = n.lte if n.HasField("lte") else (n.lt - 1 if n.HasField("lt") else None)
        if f.type in _INT64:
            # proto3 JSON writes 64-bit integers as strings, so the range becomes a pattern.
            if low is not None and low >= 0 and high is None:
                out["pattern"] = "^[0-9]{1,18}$"
        else:
            if low is not None:
                out["minimum"] = low
            if high is not None:
                out["maximum"] = high
        if list(getattr(n, "in", ())) and f.type not in _INT64:
            out["enum"] = sorted(getattr(n, "in"))
    elif kind == "enum":
        # the schema lists the enum's names; `in` / `not_in` narrow them (the zero value is
        # still accepted when the rule ignores it)
        e = rules.enum
        allowed = {v.number for v in f.enum_type.values}
        if getattr(e, "in"):
            allowed &= set(getattr(e, "in"))
        allowed -= set(e.not_in)
        if optional_zero:
            allowed.add(0)
        if "enum" in out:
            out["enum"] = [v.name for v in f.enum_type.values if v.number in allowed]
    elif kind == "bytes" and rules.bytes.HasField("max_len"):
        out["maxLength"] = (rules.bytes.max_len + 2) // 3 * 4  # base64 in JSON
    return out


def repeated(schema: dict, f: FieldDescriptor, rules: pv.FieldRules) -> dict:
    """An array schema with its item counts, and its items' own rules."""
    out = dict(schema)
    if rules.WhichOneof("type") != "repeated":
        return out
    r = rules.repeated
    if r.HasField("min_items"):
        out["minItems"] = r.min_items
    if r.HasField("max_items"):
        out["maxItems"] = r.max_items
    if r.unique:
        out["uniqueItems"] = True
    if r.HasField("items") and "items" in out:
        out["items"] = scalar(out["items"], f, r.items, item=True)
    return out


@functools.cache
def required_fields(d: Descriptor) -> tuple[str, ...]:
    """The fields of `d` that a request must carry: those whose zero value breaks their rules
    (asked of the validator with an empty message, so this is exactly what it refuses)."""
    from google.protobuf import message_factory
    empty = message_factory.GetMessageClass(d)()
    names = []
    for path, _ in validation.violations(empty, fields_only=True):  # the message's own rules: message_oneofs
        name = path.split(".", 1)[0].split("[", 1)[0]
        if name and name in d.fields_by_name and name not in names:
            names.append(name)
    return tuple(n for n in (f.name for f in d.fields) if n in names)


@functools.cache
def forbidden_fields(d: Descriptor) -> tuple[str, ...]:
    """The fields of `d` that a request may never carry (a rule refuses them whatever their value:
    staff never choose a payment method), asked of the validator with the field set, so the
    document leaves them out of the request's schema."""
    from google.protobuf import message_factory
    names = []
    for f in d.fields:
        rules = rules_of(f)
        if rules is None or not rules.cel or f.type != _T.TYPE_STRING or f.is_repeated:
            continue
        refused = 0
        for value in ("", "x"):
            m = message_factory.GetMessageClass(d)()
            setattr(m, f.name, value)
            refused += any(path.split(".", 1)[0] == f.name for path, _ in validation.violations(m))
        if refused == 2:
            names.append(f.name)
    return tuple(names)


def has_rules(d: Descriptor, _seen: frozenset = frozenset()) -> bool:
    """Whether any field of `d`, or of a message inside it, carries a rule."""
    if d.full_name in _seen:
        return False
    for f in d.fields:
        if rules_of(f) is not None:
            return True
        if f.type == _T.TYPE_MESSAGE and has_rules(f.message_type, _seen | {d.full_name}):
            return True
    return False


def message_oneofs(d: Descriptor) -> list[tuple[list[str], bool]]:
    """`d`'s rules that at most (required: exactly) one of some fields is set."""
    opts = d.GetOptions()
    if not opts.HasExtension(pv.message):
        return []
    return [(list(o.fields), o.required) for o in opts.Extensions[pv.message].oneof]


# Examples ----------------------------------------------------------------------------------------
# Every request and answer in the OpenAPI document carries an example built from its message: a
# value per field that keeps the field's rules (a unit test checks each request example against
# the validator). Strings are by field name where a name says what it holds, else a word.
EXAMPLE_ID = "8f14e45f-ceea-467f-a0e6-6f3a2a1b9c4d"
EXAMPLE_TIME = "2026-03-08T09:00:00Z"
EXAMPLE_END_TIME = "2026-03-08T10:00:00Z"
_EXAMPLE_STRINGS = {
    "name": "Salon Moda", "time_zone": "Europe/Istanbul", "sku": "GC-50", "day": "2026-03-08",
    "payment_method": "pm_card_visa", "reason": "the customer asked", "currency_code": "EUR",
    "url": "https://merchant.example/hooks/cuty", "psp_intent_id": "pi_3Nf0c2", "batch_ref": "batch-2026-03",
    "request_id": "hold-0001", "payment_ref": "pay-0001", "idempotency_key": "7c1b2f0e-checkout",
    "local_start_time": "2026-03-08T12:00:00+03:00", "client_secret": "pi_3Nf0c2_secret_x",
    "redirect_url": "https://psp.example/3ds/pi_3Nf0c2", "masked_value": "****-7A2F", "value": "GIFT-7A2F",
    "order_id": "order-0001", "order_item_id": "order-0001-1", "payment_transaction_id": "pay-0001",
    "page_token": "", "next_page_token": "", "customer_id": "customer-42", "merchant_id": "demo-salons",
    "status": "", "type": "", "secret": "whsec_4f1d", "payload_json": "{}", "error": "", "note": "",
    "opens": "09:00", "closes": "18:00", "start_day": "2026-03-09", "end_day": "2026-03-15",
    "phone": "+4915112345678", "email": "ana@example.com", "reference": "receipt-1042",
    "requested_by": "ana", "checkout_id": EXAMPLE_ID,
}
_EXAMPLE_LISTS = {"codes": ["GIFT-7A2F", "GIFT-91BC"], "events": ["checkout.completed"]}


def example(d: Descriptor, depth: int = 0) -> dict:
    """A JSON example of message `d` (proto3 JSON names), its fields' rules kept."""
    out: dict = {}
    oneofs = [fields[1:] for fields, _ in message_oneofs(d)]
    skip = {n for rest in oneofs for n in rest}  # one member of each "exactly one of" rule
    skip |= set(forbidden_fields(d))
    for f in d.fields:
        if f.name in skip:
            continue
        value = _field_example(f, depth)
        if value is not None:
            out[f.json_name] = value
    return out


def _field_example(f: FieldDescriptor, depth: int):
    rules = rules_of(f)
    if f.is_repeated:
        if f.name in _EXAMPLE_LISTS and f.type == _T.TYPE_STRING:
            return list(_EXAMPLE_LISTS[f.name])
        if f.type == _T.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry and depth < 3:
            return [example(f.message_type, depth + 1)]
        if f.type == _T.TYPE_STRING and rules is not None and rules.repeated.min_items:
            return [EXAMPLE_ID if rules.repeated.items.string.uuid else "text"]  # a list that may not be empty
        return []
    if f.type == _T.TYPE_MESSAGE:
        name = f.message_type.full_name
        if name == "google.protobuf.Timestamp":
            return EXAMPLE_END_TIME if f.name.startswith("end") or f.name == "created_before" else EXAMPLE_TIME
        if name == "google.protobuf.Duration":
            return "1.5s"
        if name.startswith("google.protobuf.") or depth >= 3:
            return None
        if name == "cuty.common.v1.Money":
            return {"currencyCode": "EUR", "amountMinor": "5000"}
        return example(f.message_type, depth + 1)
    if f.type == _T.TYPE_ENUM:
        values = [v for v in f.enum_type.values if v.number != 0]
        return (values[0] if values else f.enum_type.values[0]).name
    if f.type == _T.TYPE_BOOL:
        return False
    if f.type == _T.TYPE_BYTES:
        return ""
    if f.type == _T.TYPE_STRING:
        s = rules.string if rules is not None and rules.WhichOneof("type") == "string" else None
        if s is not None and s.uuid or (f.name == "id" or f.name.endswith("_id")) and f.name not in _EXAMPLE_STRINGS:
            return EXAMPLE_ID
        if s is not None and getattr(s, "in"):
            return getattr(s, "in")[0]
        return _EXAMPLE_STRINGS.get(f.name, "text")
    number = 0
    kind = rules.WhichOneof("type") if rules is not None else None
    if kind in _NUMERIC_RULES:
        n = getattr(rules, kind)
        number = n.gte if n.HasField("gte") else (n.gt + 1 if n.HasField("gt") else 0)
        if getattr(n, "in", None):
            number = getattr(n, "in")[0]
        if f.name == "quantity":
            number = 1
        if f.name == "page_size":
            number = 50
    return str(number) if f.type in _INT64 else number
