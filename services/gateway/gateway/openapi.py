"""OpenAPI 3 from the same routes and descriptors the gateway serves, so the document cannot drift
from the behaviour: schemas follow the proto3 JSON mapping (lowerCamelCase, int64 as strings,
enums by name, Timestamps as date-time strings)."""
from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor

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
    _T.TYPE_INT64: {"type": "string", "format": "int64"}, _T.TYPE_SINT64: {"type": "string", "format": "int64"},
    _T.TYPE_SFIXED64: {"type": "string", "format": "int64"},
    _T.TYPE_UINT64: {"type": "string", "format": "uint64"}, _T.TYPE_FIXED64: {"type": "string", "format": "uint64"},
}
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


REQUEST_TIMEOUT = {
    "name": "Request-Timeout", "in": "header", "required": False,
    "schema": {"type": "string", "pattern": r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)$", "example": "2.5"},
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
    def __init__(self, comments: dict[str, str]):
        self.comments = comments
        self.defs: dict[str, dict] = {}

    def field(self, f: FieldDescriptor) -> dict:
        if f.type == _T.TYPE_MESSAGE and f.message_type.GetOptions().map_entry:
            return {"type": "object", "additionalProperties": self.field(f.message_type.fields_by_name["value"])}
        if f.type == _T.TYPE_MESSAGE:
            one = self.ref(f.message_type)
        elif f.type == _T.TYPE_ENUM:
            one = {"type": "string", "enum": [v.name for v in f.enum_type.values]}
        else:
            one = dict(_SCALARS[f.type])
        if f.is_repeated:
            one = {"type": "array", "items": one}
        doc = self.comments.get(f.full_name)
        return {**one, "description": doc} if doc and "$ref" not in one else one

    def ref(self, d: Descriptor) -> dict:
        if d.full_name in _WKT:
            return dict(_WKT[d.full_name])
        if d.full_name not in self.defs:
            self.defs[d.full_name] = {}  # placeholder first: messages may refer to themselves
            self.defs[d.full_name] = self.object(d)
        return {"$ref": f"#/components/schemas/{d.full_name}"}

    def object(self, d: Descriptor, skip: set[str] = frozenset()) -> dict:
        out = {"type": "object", "additionalProperties": False,
               "properties": {f.json_name: self.field(f) for f in d.fields if f.name not in skip}}
        # Answers carry every field without presence, unset ones at their zero value (issue 10,
        # item 13); requests may leave them out. The same schema serves both, so this is said as an
        # extension (and each such field's default) rather than `required`.
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


def _query_params(s: _Schemas, d: Descriptor, skip: set[str], prefix: str = "", depth: int = 0) -> list[dict]:
    out = []
    for f in d.fields:
        if f.name in skip and not prefix:
            continue
        name = prefix + f.json_name
        if f.type == _T.TYPE_MESSAGE and f.message_type.full_name not in _WKT:
            if not f.is_repeated and depth < 2:
                out += _query_params(s, f.message_type, set(), name + ".", depth + 1)
            continue
        out.append({"name": name, "in": "query", "required": False, "schema": s.field(f)})
    return out


def operation(s: _Schemas, r: Route, access: Access) -> dict:
    d = r.input_type.DESCRIPTOR
    path_fields = {v.split(".")[0] for v in r.template.variables}
    params = [{"name": v, "in": "path", "required": True, "schema": {"type": "string"}} for v in r.template.variables]
    op: dict = {"operationId": r.rpc.rsplit(".", 1)[-1], "tags": [r.rpc.rsplit(".", 2)[-2]],
                "summary": r.comment.split("\n")[0] if r.comment else r.rpc, "x-grpc-method": r.grpc_path}
    if r.comment:
        op["description"] = r.comment
    if r.body == "":
        params += _query_params(s, d, path_fields)
    elif r.body == "*":
        op["requestBody"] = {"required": False, "content": {"application/json": {"schema": s.object(d, path_fields)}}}
    else:
        f = d.fields_by_name[r.body]
        schema = ({"description": "the raw body, passed to the service byte for byte"}
                  if f.type == _T.TYPE_BYTES else s.field(f))
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    if access.idempotency_key:
        params.append({"name": "Idempotency-Key", "in": "header", "required": True, "schema": {"type": "string", "maxLength": 255},
                       "description": "one value per intended operation; a replay returns the first answer byte for byte"})
    for header, _ in access.forward_headers:
        params.append({"name": header, "in": "header", "required": False, "schema": {"type": "string"}})
    params.append(REQUEST_TIMEOUT)
    op["parameters"] = params
    op["x-cuty-criticality"] = load_for(r.rpc).criticality
    if access.public:
        op["security"] = []
    else:
        op["security"] = [{"bearerAuth": []}]
        op["x-cuty-roles"] = sorted(access.roles or ())
    ok = {"description": "the resource", "content": {"application/json": {"schema": s.ref(r.output_type.DESCRIPTOR)}}}
    if r.server_streaming:
        ok = {"description": "Server-Sent Events, one per message (`id:` its id, `event:` its type, `data:` the JSON "
                             "of its resource), `: keep-alive` comments between them; reconnect with Last-Event-ID",
              "content": {"text/event-stream": {"schema": {"type": "string"},
                                                "x-cuty-event-schema": s.ref(r.output_type.DESCRIPTOR)}}}
    op["responses"] = {
        "200": ok,
        **{str(status): _problem(why) for status, why in problem_responses(r, access)},
        "default": _problem("any other failure (5xx: quote the traceId)"),
    }
    return op


def _problem(description: str) -> dict:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def problem_responses(r: Route, access: Access) -> list[tuple[int, str]]:
    """The problems a route can answer (issue 10, item 15), from what the gateway and the
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
    paths: dict[str, dict] = {}
    for r in sorted(routes, key=lambda r: (r.template.openapi_path, r.http_method)):
        paths.setdefault(r.template.openapi_path, {})[r.http_method.lower()] = operation(s, r, access[r.rpc])
    health = {"type": "object", "properties": {"status": {"type": "string"},
                                               "services": {"type": "object", "additionalProperties": {"type": "string"}}}}
    paths["/healthz"] = {"get": {"operationId": "Healthz", "security": [], "summary": "each service's gRPC health",
                                 "responses": {"200": {"description": "all SERVING", "content": {"application/json": {"schema": health}}},
                                               "503": {"description": "some service is not", "content": {"application/json": {"schema": health}}}}}}
    paths["/openapi.json"] = {"get": {"operationId": "OpenApi", "security": [], "summary": "this document",
                                      "responses": {"200": {"description": "OpenAPI 3 document"}}}}
    s.defs["Problem"] = PROBLEM
    return {
        "openapi": "3.0.3",
        "info": {"title": "Cuty checkout platform", "version": "v1",
                 "description": "Generated from the protos' google.api.http annotations; JSON is the proto3 JSON "
                                "mapping. Answers carry every field without presence (scalars, enums, lists; "
                                "listed per schema as x-cuty-always-in-answers), zeros, empty strings and false "
                                "included, as grpc-gateway's EmitUnpopulated; an unset message field is left out."},
        "paths": paths,
        "components": {"schemas": dict(sorted(s.defs.items())),
                       "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}},
    }
