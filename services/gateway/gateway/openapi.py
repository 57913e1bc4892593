"""OpenAPI 3 from the same routes and descriptors the gateway serves, so the document cannot drift
from the behaviour: schemas follow the proto3 JSON mapping (lowerCamelCase, int64 as strings,
enums by name, Timestamps as date-time strings)."""
from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from cutylib import money, validation

from . import contract, sse
from .descriptors import Route, load_file_set, message_comments
from .policy import Access, load_for

_T = FieldDescriptor
_SCALARS = {
    _T.TYPE_STRING: {"type": "string"}, _T.TYPE_BYTES: {"type": "string", "format": "byte"},
    _T.TYPE_BOOL: {"type": "boolean"}, _T.TYPE_DOUBLE: {"type": "number", "format": "double"},
    _T.TYPE_FLOAT: {"type": "number", "format": "float"},
    _T.TYPE_INT32: {"type": "integer", "format": "int32"}, _T.TYPE_SINT32: {"type": "integer", "format": "int32"},
    _T.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    _T.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0},
    _T.TYPE_FIXED32: {"type": "integer", "format": "int64", "minimum": 0},
    # proto3 JSON writes 64-bit integers as strings (JavaScript numbers lose precision past 2^53).
    # 64-bit integers are decimal strings in proto3 JSON; the pattern says so (a format alone admits any string)
    _T.TYPE_INT64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"},
    _T.TYPE_SINT64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"},
    _T.TYPE_SFIXED64: {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"},
    _T.TYPE_UINT64: {"type": "string", "format": "uint64", "pattern": "^[0-9]{1,20}$"},
    _T.TYPE_FIXED64: {"type": "string", "format": "uint64", "pattern": "^[0-9]{1,20}$"},
}
MONEY_CURRENCY = "cuty.common.v1.Money.currency_code"
_WKT = {
    "google.protobuf.Timestamp": {"type": "string", "format": "date-time",
                                  "description": "RFC 3339 with an offset, e.g. 2026-03-08T09:00:00Z"},
    "google.protobuf.Duration": {"type": "string", "example": "1.5s"},
    "google.protobuf.FieldMask": {"type": "string"},
    "google.protobuf.Struct": {"type": "object"}, "google.protobuf.Value": {},
    "google.protobuf.Empty": {"type": "object"},
}
PROBLEM = {
    "type": "object", "description": "RFC 9457 problem details",
    "properties": {
        "type": {"type": "string", "description": "slug: the service's reason (slot-unavailable, out-of-stock, "
                 "idempotency-key-reused, ...) or the status' own (not-found, invalid-argument, ...)"},
        "title": {"type": "string"}, "status": {"type": "integer"}, "detail": {"type": "string"},
        "field": {"type": "string", "description": "the request field at fault (JSON name)"},
        "traceId": {"type": "string"},
        "alternatives": {"type": "array", "items": {"$ref": "#/components/schemas/cuty.booking.v1.Slot"}},
        "heldAlternative": {"$ref": "#/components/schemas/cuty.booking.v1.Hold",
                            "description": "slot-unavailable at checkout: an alternative held for the buyer "
                                           "for a short while; a checkout of its slotId takes it"},
        "available": {"type": "integer"},
    },
    "required": ["type", "title", "status"],
}


# The gateway refuses a missing or malformed Idempotency-Key (app._idempotency_key) before anything
# reaches a service: 400 `idempotency-key-required` naming the header.
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key", "in": "header", "required": True,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x21-\\x7e]([\\x20-\\x7e]*[\\x21-\\x7e])?$",
               "example": "7c1b2f0e-checkout"},
    "description": "One value per intended operation (1..255 printable ASCII characters), reused only to retry it: a "
                   "replay returns the first answer byte for byte; the same key with another body is a 422. Without "
                   "it, or malformed: 400 `idempotency-key-required` / `invalid-argument` with `field: Idempotency-Key`.",
}

# Forwarded headers' own rules: a Last-Event-ID is an event id (checkout/grpc_api._last_event_id).
# An empty Last-Event-ID is no last event (as the EventSource standard has it).
FORWARDED_HEADERS = {"last-event-id": {"type": "string", "pattern": "^([0-9]{1,18})?$", "example": "1841"},
                     "cuty-signature": {"type": "string", "pattern": "^[\\x20-\\x7e]+$"}}

# Page tokens are the service's own (bound to the list's query and signed): nothing a client can
# build, so the schema can only bound their length.
PAGE_TOKEN = ("Opaque: empty for the first page, else exactly a `nextPageToken` this list answered for the "
              "same query. Any other value is a 400 `invalid-argument` with `field: pageToken`.")

REQUEST_TIMEOUT = {
    "name": "Request-Timeout", "in": "header", "required": False,
    # Above 0 and at most 3600 in at most 32 characters (app._request_timeout), as a pattern:
    # 0.001 .. 3599.999..., or 3600(.000).
    "schema": {"type": "string", "pattern": r"^0*(([1-9][0-9]{0,2}|[1-2][0-9]{3}|3[0-5][0-9]{2})(\.[0-9]*)?"
                                            r"|0?\.[0-9]*[1-9][0-9]*|3600(\.0*)?)$", "maxLength": 32,  # the parser's limit
               "example": "2.5"},
    "description": "How long the client will wait, in seconds (a decimal above 0, at most 3600): the call's deadline "
                   "is the lesser of this and the route's own limit (reads 5 s, writes 10 s, writes that may wait on "
                   "the payment provider 15 s), less the time the request already spent in the gateway. Anything "
                   "else is a 400 naming the header.",
}


def _zero(f: FieldDescriptor):
    """The JSON a field without presence shows when unset."""
    if f.is_repeated:
        return {} if f.type == _T.TYPE_MESSAGE and f.message_type.GetOptions().map_entry else []
    if f.type == _T.TYPE_ENUM:
        return f.enum_type.values_by_number[0].name
    if f.type == _T.TYPE_BOOL:
        return False
    if f.type in (_T.TYPE_STRING,):
        return ""
    if f.type == _T.TYPE_BYTES:
        return ""
    if f.type in (_T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_SINT64, _T.TYPE_FIXED64, _T.TYPE_SFIXED64):
        return "0"
    return 0


class _Schemas:
    """Component schemas. An answer's schema is the message as answers carry it; a request's (and
    a message inside one) also says its contract's rules (contract.py), under `<name>.Input` when
    it has any, since the same message in an answer need not keep them (a negative difference)."""

    def __init__(self, comments: dict[str, str]):
        self.comments = comments
        self.defs: dict[str, dict] = {}

    def field(self, f: FieldDescriptor, request: bool = False) -> dict:
        if f.type == _T.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self.field(f.message_type.fields_by_name["value"], request)}
        if f.type == _T.TYPE_MESSAGE:
            one = self.ref(f.message_type, request)
        elif f.type == _T.TYPE_ENUM:
            one = {"type": "string", "enum": [v.name for v in f.enum_type.values]}
        else:
            one = dict(_SCALARS[f.type])
        rules = contract.rules_of(f) if request else None
        if request and f.full_name == MONEY_CURRENCY:
            # The currencies the services accept (cutylib.money.ISO_4217): the pattern alone admits
            # any three letters.
            one["enum"] = sorted(money.ISO_4217)
        if f.is_repeated:
            one = {"type": "array", "items": one}
            if rules is not None:
                one = contract.repeated(one, f, rules)
        elif rules is not None and "$ref" not in one:
            one = contract.scalar(one, f, rules)
        doc = self.comments.get(f.full_name)
        return {**one, "description": doc} if doc and "$ref" not in one else one

    def ref(self, d: Descriptor, request: bool = False) -> dict:
        if d.full_name in _WKT:
            return dict(_WKT[d.full_name])
        request = request and contract.has_rules(d)
        name = d.full_name + (".Input" if request else "")
        if name not in self.defs:
            self.defs[name] = {}  # placeholder first: messages may refer to themselves
            self.defs[name] = self.object(d, request=request)
        return {"$ref": f"#/components/schemas/{name}"}

    def object(self, d: Descriptor, skip: set[str] = frozenset(), request: bool = False) -> dict:
        if request:
            skip = set(skip) | set(contract.forbidden_fields(d))
        out = {"type": "object", "additionalProperties": False,
               "properties": {f.json_name: self.field(f, request) for f in d.fields if f.name not in skip}}
        if request:
            # What the request must carry: the fields whose zero value breaks their rules.
            required = [d.fields_by_name[n].json_name for n in contract.required_fields(d) if n not in skip]
            if required:
                out["required"] = required
            for name, prop in out["properties"].items():
                # proto3 JSON reads null as "not given": said so for the fields a request may leave out
                # (an enumeration lists null too, as OpenAPI 3.0 wants).
                if name not in required:
                    prop["nullable"] = True
                    if "enum" in prop and None not in prop["enum"]:
                        prop["enum"] = [*prop["enum"], None]
            rules = []
            some = [d.fields_by_name[n] for n in validation.at_least_one(d) if n not in skip]
            if some:
                # At least one of them given (a field with presence even as zero, but not null).
                rules.append({"anyOf": [_given(out["properties"], f.json_name, zero=f.has_presence) for f in some]})
            for fields, needed in contract.message_oneofs(d):
                # At most one of them (exactly one when needed); a member given is given in full,
                # and a field at its zero value (an empty id) is not given.
                names = [d.fields_by_name[n].json_name for n in fields]
                for n in names:
                    prop = out["properties"][n]
                    if prop.get("pattern", "").startswith("^$|"):
                        prop["pattern"], prop["format"] = prop["pattern"][3:], "uuid"
                if needed:
                    rules.append({"oneOf": [_given(out["properties"], n) for n in names]})
                else:
                    rules.append({"not": {"anyOf": [{"allOf": [_given(out["properties"], a), _given(out["properties"], b)]}
                                                    for i, a in enumerate(names) for b in names[i + 1:]]}})
            if len(rules) == 1:
                out.update(rules[0])
            elif rules:
                out["allOf"] = rules
        else:
            # Answers carry every field without presence, unset ones at their zero value; so this is
            # said as an extension (and each such field's default) rather than `required`.
            emitted = [f for f in d.fields if f.name not in skip and not f.has_presence]
            for f in emitted:
                prop = out["properties"][f.json_name]
                if "$ref" not in prop:
                    prop["default"] = _zero(f)
            if emitted:
                out["x-cuty-always-in-answers"] = [f.json_name for f in emitted]
        if d.full_name in self.comments:
            out["description"] = self.comments[d.full_name]
        return out


def _given(properties: dict, name: str, zero: bool = False) -> dict:
    """A schema that holds when the request gives field `name`: present, not null, and (unless
    `zero`: a field with presence) not its zero value, which proto3 cannot tell from "not given"."""
    prop = properties[name]
    kind = prop.get("type", "object" if "$ref" in prop else None)
    given: dict = {"type": kind} if kind else {}
    if not zero and kind == "string":
        given["minLength"] = 1
    elif not zero and kind in ("integer", "number"):
        given["not"] = {"enum": [0]}
    return {"required": [name], "properties": {name: given}}


def _query_params(s: _Schemas, d: Descriptor, skip: set[str], prefix: str = "", depth: int = 0) -> list[dict]:
    out = []
    required = set(contract.required_fields(d)) if not prefix else set()
    for f in d.fields:
        if f.name in skip and not prefix:
            continue
        name = prefix + f.json_name
        if f.type == _T.TYPE_MESSAGE and f.message_type.full_name not in _WKT:
            if not f.is_repeated and depth < 2:
                out += _query_params(s, f.message_type, set(), name + ".", depth + 1)
            continue
        schema = s.field(f, request=True)
        param = {"name": name, "in": "query", "required": f.name in required, "schema": schema}
        if "description" in schema:
            param["description"] = schema.pop("description")
        if f.name == "page_token":
            param["description"] = PAGE_TOKEN
        if f.is_repeated:
            param["style"], param["explode"] = "form", True
        out.append(param)
    return out


def operation(s: _Schemas, r: Route, access: Access) -> dict:
    d = r.input_type.DESCRIPTOR
    path_fields = {v.split(".")[0] for v in r.template.variables}
    params = [{"name": v, "in": "path", "required": True, "schema": _path_schema(s, d, v),
               "example": contract.example(d).get(d.fields_by_name[v].json_name, "") if v in d.fields_by_name else ""}
              for v in r.template.variables]
    op: dict = {"operationId": r.rpc.rsplit(".", 1)[-1], "tags": [r.rpc.rsplit(".", 2)[-2]],
                "summary": r.comment.split("\n")[0] if r.comment else r.rpc, "x-grpc-method": r.grpc_path}
    if r.comment:
        op["description"] = r.comment
    if r.body == "":
        params += _query_params(s, d, path_fields)
    elif r.body == "*":
        body = s.object(d, path_fields, request=True)
        sample = {k: v for k, v in contract.example(d).items()
                  if k not in {d.fields_by_name[n].json_name for n in path_fields if n in d.fields_by_name}}
        # Required when the body must carry something: a field, or one of several.
        needs = bool(body.get("required")) or any(k in body for k in ("oneOf", "anyOf", "allOf"))
        op["requestBody"] = {"required": needs,
                             "content": {"application/json": {"schema": body, "example": sample}}}
    else:
        f = d.fields_by_name[r.body]
        raw = f.type == _T.TYPE_BYTES
        schema = ({"description": "the raw body, passed to the service byte for byte"} if raw else s.field(f, request=True))
        sample = ({"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_3Nf0c2"}}}
                  if raw else contract.example(d).get(f.json_name))
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema, "example": sample}}}
    if access.idempotency_key:
        params.append(IDEMPOTENCY_KEY)
    for header, _ in access.forward_headers:
        params.append({"name": header, "in": "header", "required": False,
                       "schema": dict(FORWARDED_HEADERS.get(header, {"type": "string"}))})
    params.append(REQUEST_TIMEOUT)
    op["parameters"] = params
    op["x-cuty-criticality"] = load_for(r.rpc).criticality
    if access.public:
        op["security"] = []
    else:
        op["security"] = [{"bearerAuth": []}]
        op["x-cuty-roles"] = sorted(access.roles or ())
    ok = {"description": "the resource", "content": {"application/json": {
        "schema": s.ref(r.output_type.DESCRIPTOR), "example": contract.example(r.output_type.DESCRIPTOR)}}}
    if r.server_streaming:
        event = sse.resource_type(r.output_type.DESCRIPTOR)
        ok = {"description": "Server-Sent Events, one per message (`id:` its id, `event:` its type, `data:` the JSON "
                             "of its resource), `: keep-alive` comments between them; reconnect with Last-Event-ID",
              # One event (a stream's schema describes each of its events, as OpenAPI 3.2's itemSchema
              # does): its data is the JSON of the resource, or the problem of the `event: error`
              # that ends the stream.
              "content": {"text/event-stream": {"schema": {
                  "type": "object", "required": ["data"],
                  "properties": {"id": {"type": "string"}, "event": {"type": "string"},
                                 "data": {"type": "string", "contentMediaType": "application/json",
                                          "contentSchema": {"anyOf": [s.ref(event),
                                                                      {"$ref": "#/components/schemas/Problem"}]}}}},
                                                "x-cuty-event-schema": s.ref(event)}}}
    op["responses"] = {
        "200": ok,
        **{str(status): _problem(why) for status, why in problem_responses(r, access)},
        "default": _problem("any other failure (5xx: quote the traceId)"),
    }
    return op


def _path_schema(s: _Schemas, d: Descriptor, variable: str) -> dict:
    """A path variable's schema: its field's, with its rules (a UUID id says so)."""
    f = d.fields_by_name.get(variable)
    if f is None or f.type == _T.TYPE_MESSAGE:
        return {"type": "string"}
    schema = s.field(f, request=True)
    schema.pop("description", None)
    return schema


def _problem(description: str) -> dict:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def problem_responses(r: Route, access: Access) -> list[tuple[int, str]]:
    """The problems a route can answer, from what the gateway and the
    conventions know about it: its input, its policy, its path and its method."""
    out: list[tuple[int, str]] = [(400, "bad input: `field` names the request field at fault (a request field, "
                                        "or a header such as Request-Timeout)"),
                                   (429, "rate limited (per client address; per caller after the token): retry "
                                         "after the Retry-After header")]
    if not access.public:
        out += [(401, "no valid bearer token"), (403, "the token's role may not call this route")]
    elif access.forward_headers:
        out.append((401, "the request's signature is missing, malformed, stale or does not match"))
    if r.template.variables:
        out.append((404, "no such resource, or not the caller's (existence is not leaked)"))
    if r.http_method != "GET":
        out.append((409, "conflicts with the current state (slot-unavailable with alternatives, out-of-stock "
                         "with available, a wrong state, a version conflict, idempotency-key-in-flight)"))
    if access.idempotency_key:
        out[0] = (400, out[0][1] + "; `idempotency-key-required` when the Idempotency-Key header is missing")
        out.append((422, "idempotency-key-reused: the same Idempotency-Key with another body"))
    out += [(413, "the request body is too large"),
            (503, "overloaded: the platform is at capacity and serves purchases already under way first (nothing "
                  "was done; retry after Retry-After); or a service is unavailable: retry"),
            (504, "a service did not answer in time (the route's limit or Request-Timeout): the outcome is unknown, "
                  "retry with the same Idempotency-Key; or the Request-Timeout ran out before the call (nothing "
                  "was done)")]
    return sorted(out)


def document(routes: list[Route], access: dict[str, Access]) -> dict:
    try:
        comments = message_comments(load_file_set())
    except Exception:  # noqa: BLE001 - descriptions are optional
        comments = {}
    s = _Schemas(comments)
    from cuty.booking.v1 import booking_pb2
    for d in (booking_pb2.Slot.DESCRIPTOR, booking_pb2.Hold.DESCRIPTOR):
        s.ref(d)  # the Problem's alternatives and heldAlternative refer to them, whichever routes exist
    paths: dict[str, dict] = {}
    for r in sorted(routes, key=lambda r: (r.template.openapi_path, r.http_method)):
        paths.setdefault(r.template.openapi_path, {})[r.http_method.lower()] = operation(s, r, access[r.rpc])
    health = {"type": "object", "properties": {"status": {"type": "string"},
                                               "services": {"type": "object", "additionalProperties": {"type": "string"}}}}
    paths["/healthz"] = {"get": {"operationId": "Healthz", "security": [], "summary": "each service's gRPC health",
                                 "responses": {"200": {"description": "all SERVING", "content": {"application/json": {"schema": health}}},
                                               "503": {"description": "some service is not", "content": {"application/json": {"schema": health}}}}}}
    ready = {"type": "object", "properties": {"status": {"type": "string", "enum": ["SERVING", "NOT_SERVING"]}},
             "required": ["status"]}
    paths["/healthz"]["get"]["description"] = ("Asks each service's gRPC health service (for people and dashboards): "
                                                "200 when all serve, else 503 naming the failing ones.")
    for answer in paths["/healthz"]["get"]["responses"].values():
        answer["content"]["application/json"]["example"] = {"status": "SERVING", "services": {"booking": "SERVING"}}
    paths["/readyz"] = {"get": {"operationId": "Readyz", "security": [], "summary": "the gateway's own readiness",
                                "description": "Whether this gateway can serve (it runs and its channels exist), "
                                               "whatever one service's state: the load balancer's probe.",
                                "responses": {"200": {"description": "ready", "content": {"application/json": {
                                    "schema": ready, "example": {"status": "SERVING"}}}},
                                              "503": {"description": "not ready", "content": {"application/json": {
                                                  "schema": ready, "example": {"status": "NOT_SERVING"}}}}}}}
    paths["/openapi.json"] = {"get": {"operationId": "OpenApi", "security": [], "summary": "this document",
                                      "description": "This OpenAPI 3 document, generated from the protos the gateway "
                                                     "serves (routes, rules, comments) and its policy.",
                                      "responses": {"200": {"description": "OpenAPI 3 document", "content": {
                                          "application/json": {"schema": {"type": "object"},
                                                               "example": {"openapi": "3.0.3"}}}}}}}
    s.defs["Problem"] = PROBLEM
    return {
        "openapi": "3.0.3",
        "info": {"title": "Cuty checkout platform", "version": "v1",
                 "description": "Generated from the protos' google.api.http annotations; JSON is the proto3 JSON "
                                "mapping. Answers carry every field without presence (scalars, enums, lists; "
                                "listed per schema as x-cuty-always-in-answers), zeros, empty strings and false "
                                "included, as grpc-gateway's EmitUnpopulated; an unset message field is left out."},
        # Relative to where the document is served: the gateway that serves it (make run: localhost:8080).
        "servers": [{"url": "/", "description": "this gateway"}],
        "paths": paths,
        "components": {"schemas": dict(sorted(s.defs.items())),
                       "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
    }
