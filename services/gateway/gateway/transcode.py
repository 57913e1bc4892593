"""HTTP request -> request message, response message -> JSON, for any `Route`.

Standard proto3 JSON mapping (google.protobuf.json_format): both field spellings accepted,
unknown fields and wrong types refused, int64 as strings, enums by name, Timestamps as RFC 3339
with an offset. Every refusal is a `TranscodeError` naming the field (its JSON name) so the
client can point at it; nothing is half-applied because the RPC is never called.
"""
from __future__ import annotations

import calendar
import datetime as dt
import json
import re
from urllib.parse import parse_qsl

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from . import jsonwriter
from .descriptors import Route

_BOOL = {"true": True, "false": False, "1": True, "0": False}
_INTS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT32,
         FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64,
         FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED32,
         FieldDescriptor.TYPE_SFIXED64}
# Well-known types whose JSON form is a string, so they can come from a path or a query value.
_STRING_WKT = {"google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask"}


class TranscodeError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def _field(desc: Descriptor, name: str) -> FieldDescriptor | None:
    """A field by its proto name or its JSON name (both spellings are accepted)."""
    f = desc.fields_by_name.get(name)
    if f is not None:
        return f
    for f in desc.fields:
        if f.json_name == name:
            return f
    return None


def _resolve(desc: Descriptor, dotted: str) -> list[FieldDescriptor]:
    chain = []
    for i, part in enumerate(dotted.split(".")):
        f = _field(desc, part) if desc is not None else None
        if f is None:
            raise TranscodeError(dotted, f"unknown field {dotted!r} for {desc.full_name if desc else 'a scalar'}")
        chain.append(f)
        desc = f.message_type
    return chain


def json_path(chain: list[FieldDescriptor]) -> str:
    return ".".join(f.json_name for f in chain)


def _scalar(f: FieldDescriptor, raw: str, where: str):
    """A path/query string as the JSON value json_format expects for field `f`."""
    if f.type == FieldDescriptor.TYPE_BOOL:
        if raw.lower() not in _BOOL:
            raise TranscodeError(where, f"{where} must be true or false, got {raw!r}")
        return _BOOL[raw.lower()]
    if f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.full_name not in _STRING_WKT:
        raise TranscodeError(where, f"{where} is a message; set its fields as {where}.<field>")
    if f.type == FieldDescriptor.TYPE_ENUM and raw not in f.enum_type.values_by_name:
        # By name, as the document lists them (json_format would also take a number).
        names = ", ".join(v.name for v in f.enum_type.values)
        raise TranscodeError(where, f"{where} must be one of {names}, got {raw[:64]!r}")
    # Numbers, enums, strings, bytes (base64) and string-shaped well-known types are accepted as
    # JSON strings by the proto3 mapping, so json_format validates them for us.
    return raw


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})")


def fast_timestamp(raw: str) -> tuple[int, int] | None:
    """(seconds, nanos) of a strict RFC 3339 timestamp, else None (json_format then decides).

    json_format parses Timestamps with strptime, the slowest step of transcoding a GET; query
    values are nearly always this strict form, so it gets a fast path with the same result.
    """
    m = _RFC3339.fullmatch(raw)
    if m is None:
        return None
    y, mo, d, h, mi, sec, frac, off = m.groups()
    try:
        when = dt.datetime(int(y), int(mo), int(d), int(h), int(mi), int(sec), tzinfo=dt.timezone.utc)
    except ValueError:
        return None
    seconds = calendar.timegm(when.utctimetuple())
    if off != "Z":
        sign = 1 if off[0] == "+" else -1
        seconds -= sign * (int(off[1:3]) * 3600 + int(off[4:6]) * 60)
    if not -62135596800 <= seconds <= 253402300799:
        return None
    return seconds, int((frac or "0").ljust(9, "0"))


def _put(tree: dict, chain: list[FieldDescriptor], value, *, repeated_ok: bool) -> None:
    node = tree
    for f in chain[:-1]:
        node = node.setdefault(f.json_name, {})
        if not isinstance(node, dict):
            raise TranscodeError(json_path(chain), f"{json_path(chain)} conflicts with another parameter")
    leaf = chain[-1]
    if leaf.is_repeated:
        node.setdefault(leaf.json_name, []).append(value)
    elif leaf.json_name in node and not repeated_ok:
        raise TranscodeError(json_path(chain), f"{json_path(chain)} given more than once")
    else:
        node[leaf.json_name] = value


_AT = re.compile(r" at (?:\"?)[A-Za-z0-9_]+\.([A-Za-z0-9_.\[\]]+?)\"?\.*$")
_NO_FIELD = re.compile(r'has no field named "([^"]+)" at "[A-Za-z0-9_]+\.?([^"]*)"')
_NESTED = re.compile(r"Failed to parse (\w+) field")
_NESTED_PREFIX = re.compile(r"Failed to parse \w+ field: ")
_AT_SUFFIX = re.compile(r' at "?[A-Za-z0-9_]+[A-Za-z0-9_.\[\]]*"?\.*$')


def field_of_parse_error(msg: str, prefix: str = "") -> str:
    """Best-effort field path (JSON names) out of a json_format.ParseError message."""
    m = _NO_FIELD.search(msg)
    if m:
        path = ".".join(p for p in (m.group(2), m.group(1)) if p)
    else:
        m = _AT.search(msg.split("\n", 1)[0])
        path = m.group(1) if m else ".".join(_NESTED.findall(msg))
    return ".".join(p for p in (prefix, path) if p)


def _parse_into(data, msg: Message, prefix: str = "") -> None:
    try:
        json_format.ParseDict(data, msg, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        field = field_of_parse_error(str(e), prefix)
        raise TranscodeError(field, _readable(str(e), field)) from None


def _readable(text: str, field: str) -> str:
    """json_format nests "Failed to parse x field: " per level and appends the type path; keep
    the innermost reason, prefixed by the field's JSON path."""
    inner = _NESTED_PREFIX.split(text)[-1].split("\n", 1)[0]
    inner = _AT_SUFFIX.sub("", inner).rstrip(".")
    if "time data" in inner or "timezone" in inner or "Timestamp" in inner:
        # The stock message for a Timestamp without an offset names a truncated value; say what is expected.
        inner = f"expected an RFC 3339 timestamp with an offset (2026-03-08T09:00:00Z or +03:00) ({inner})"
    return f"{field}: {inner}" if field else inner


def _no_dupes(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise TranscodeError(dup, f"the JSON object has {dup!r} twice")
    return dict(pairs)


def parse_json(body: bytes, where: str = "") -> object:
    try:
        return json.loads(body, object_pairs_hook=_no_dupes)
    except TranscodeError:
        raise
    except (UnicodeDecodeError, ValueError) as e:
        raise TranscodeError(where, f"the request body is not valid JSON: {e}") from None


def build_request(route: Route, path_vars: dict[str, str], query: str, body: bytes) -> Message:
    """The RPC's request message from the matched path, the query string and the body."""
    msg = route.input_type()
    desc = msg.DESCRIPTOR
    if route.body == "":
        tree: dict = {}
        stamps: list[tuple[list[FieldDescriptor], tuple[int, int]]] = []
        for name, raw in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            chain = _resolve(desc, name)
            if chain[0].name in path_vars or ".".join(f.name for f in chain) in path_vars:
                raise TranscodeError(json_path(chain), f"{json_path(chain)} is part of the path")
            leaf = chain[-1]
            fast = (fast_timestamp(raw) if leaf.type == FieldDescriptor.TYPE_MESSAGE and not leaf.is_repeated
                    and leaf.message_type.full_name == "google.protobuf.Timestamp" else None)
            if fast is not None:
                if any(c == chain for c, _ in stamps):
                    raise TranscodeError(json_path(chain), f"{json_path(chain)} given more than once")
                stamps.append((chain, fast))
            else:
                _put(tree, chain, _scalar(leaf, raw, json_path(chain)), repeated_ok=False)
        _parse_into(tree, msg)
        for chain, (seconds, nanos) in stamps:
            target = msg
            for f in chain:
                target = getattr(target, f.name)
            target.seconds, target.nanos = seconds, nanos
    elif route.body == "*":
        if query:
            # body "*" means every field not in the path is in the body (google.api.http rule 2).
            name = ([n for n, _ in parse_qsl(query, keep_blank_values=True)] or [query])[0]
            raise TranscodeError(name, f"this route takes no query parameters, got {name!r}")
        data = parse_json(body) if body.strip() else {}
        if not isinstance(data, dict):
            raise TranscodeError("", f"the request body must be a JSON object, got {type(data).__name__}")
        _parse_into(data, msg)
    else:
        f = desc.fields_by_name[route.body]
        if f.type == FieldDescriptor.TYPE_BYTES and not f.is_repeated:
            # Raw bytes, unchanged: the PSP signs the exact body, any re-encoding breaks the HMAC.
            setattr(msg, f.name, body)
        else:
            data = parse_json(body, f.json_name) if body.strip() else None
            if data is not None:
                _parse_into({f.json_name: data}, msg)
        if query:
            tree = {}
            for name, raw in parse_qsl(query, keep_blank_values=True):
                chain = _resolve(desc, name)
                if chain[0].name == route.body:
                    raise TranscodeError(json_path(chain), f"{json_path(chain)} belongs in the body")
                _put(tree, chain, _scalar(chain[-1], raw, json_path(chain)), repeated_ok=False)
            partial = route.input_type()
            _parse_into(tree, partial)
            msg.MergeFrom(partial)
    for dotted, raw in path_vars.items():
        _set_path_var(msg, dotted, raw)
    return msg


def _set_path_var(msg: Message, dotted: str, raw: str) -> None:
    """The path wins over a body value for the same field: the URL names the resource."""
    chain = _resolve(msg.DESCRIPTOR, dotted)
    target = msg
    for f in chain[:-1]:
        target = getattr(target, f.name)
    leaf = chain[-1]
    partial = type(target)()
    _parse_into({leaf.json_name: _scalar(leaf, raw, json_path(chain))}, partial,
                ".".join(f.json_name for f in chain[:-1]))
    target.ClearField(leaf.name)
    target.MergeFrom(partial)


def to_dict(msg: Message) -> dict:
    return jsonwriter.to_dict(msg)


def dumps(data) -> bytes:
    """Compact, deterministic JSON: the same message gives the same bytes (idempotent replays
    are compared byte for byte). Field order is the descriptor's, so no sorting is needed."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def to_json(msg: Message) -> bytes:
    return dumps(to_dict(msg))
