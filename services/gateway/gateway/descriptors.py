"""Routes from the protos' `google.api.http` annotations.

The gateway knows no route by name: it reads `build/gen/descriptors.pb` (a FileDescriptorSet of
every proto with imports and source info, written by `make gen`), registers those files in the
default descriptor pool (so error details and `Any` resolve), and turns every annotated RPC into a
`Route`. A new annotated RPC is a new route after `make gen`, with no gateway code change.
"""
from __future__ import annotations

import importlib
import os
import pathlib
import pkgutil
import sys
from dataclasses import dataclass, field

from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message

from . import pathtemplate

DESCRIPTOR_SET_NAME = "descriptors.pb"


@dataclass(frozen=True)
class Route:
    http_method: str  # GET, POST, ...
    template: pathtemplate.PathTemplate
    body: str  # "" (query parameters), "*" (the whole request) or one field name
    rpc: str  # full name: cuty.booking.v1.BookingService.CreateSalon
    grpc_path: str  # /cuty.booking.v1.BookingService/CreateSalon
    owner: str  # the service process answering it: booking | codepool | payments
    input_type: type[Message] = field(repr=False)
    output_type: type[Message] = field(repr=False)
    comment: str = ""
    # A server-streaming RPC: answered as Server-Sent Events (app.py, sse.py), never as one JSON.
    server_streaming: bool = False

    @property
    def method_descriptor(self) -> MethodDescriptor:
        return descriptor_pool.Default().FindMethodByName(self.rpc)


def find_descriptor_set() -> pathlib.Path | None:
    """`CUTY_GATEWAY_DESCRIPTORS`, else `descriptors.pb` beside the generated code on sys.path."""
    explicit = os.environ.get("CUTY_GATEWAY_DESCRIPTORS")
    if explicit:
        return pathlib.Path(explicit)
    for entry in sys.path:
        candidate = pathlib.Path(entry or ".") / DESCRIPTOR_SET_NAME
        if candidate.is_file():
            return candidate
    return None


def load_file_set(path: pathlib.Path | None = None) -> descriptor_pb2.FileDescriptorSet:
    """The descriptor set file; without one, the `cuty.*` generated modules' own descriptors
    (no comments then, so the OpenAPI document has fewer descriptions)."""
    path = path or find_descriptor_set()
    if path is not None:
        return descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    fds = descriptor_pb2.FileDescriptorSet()
    import cuty  # the generated package (build/gen)

    for mod in pkgutil.walk_packages(cuty.__path__, "cuty."):
        if mod.name.endswith("_pb2"):
            fd = importlib.import_module(mod.name).DESCRIPTOR
            fd.CopyToProto(fds.file.add())
    return fds


def register(fds: descriptor_pb2.FileDescriptorSet) -> None:
    """Add the set's files to the default pool unless already there (the generated modules may
    have been imported first; adding a file twice is an error)."""
    pool = descriptor_pool.Default()
    for f in fds.file:
        try:
            pool.FindFileByName(f.name)
            continue
        except KeyError:
            pass
        # Prefer the generated module when there is one: importing it later, after the set's copy
        # (which carries source info, so it differs) was added, would fail with "duplicate file name".
        if f.name.startswith(("cuty/", "buf/")) and f.name.endswith(".proto"):
            try:
                importlib.import_module(f.name[:-len(".proto")].replace("/", ".") + "_pb2")
                continue
            except ImportError:
                pass
        pool.Add(f)


def _comments(fd: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    return {tuple(loc.path): loc.leading_comments.strip() for loc in fd.source_code_info.location
            if loc.leading_comments}


def owner_of(service_full_name: str) -> str:
    """`cuty.<context>.v1.X` is served by the `<context>` process (CheckoutService lives in payments)."""
    parts = service_full_name.split(".")
    return parts[1] if len(parts) > 2 else parts[0]


def _bindings(rule: http_pb2.HttpRule) -> list[tuple[str, str, str]]:
    out = []
    for r in [rule, *rule.additional_bindings]:
        kind = r.WhichOneof("pattern")
        if kind is None:
            continue
        if kind == "custom":
            out.append((r.custom.kind.upper(), r.custom.path, r.body))
        else:
            out.append((kind.upper(), getattr(r, kind), r.body))
    return out


def routes_from(fds: descriptor_pb2.FileDescriptorSet) -> list[Route]:
    register(fds)
    pool = descriptor_pool.Default()
    routes: list[Route] = []
    for fd in fds.file:
        comments = _comments(fd)
        for si, svc in enumerate(fd.service):
            svc_name = f"{fd.package}.{svc.name}" if fd.package else svc.name
            for mi, m in enumerate(svc.method):
                if not m.options.HasExtension(annotations_pb2.http):
                    continue
                if m.client_streaming:
                    raise ValueError(f"{svc_name}.{m.name}: client-streaming RPCs cannot be transcoded")
                method = pool.FindMethodByName(f"{svc_name}.{m.name}")
                in_cls = message_factory.GetMessageClass(method.input_type)
                out_cls = message_factory.GetMessageClass(method.output_type)
                for verb, path, body in _bindings(m.options.Extensions[annotations_pb2.http]):
                    if body not in ("", "*") and body not in method.input_type.fields_by_name:
                        raise ValueError(f"{method.full_name}: body field {body!r} is not in {method.input_type.full_name}")
                    routes.append(Route(
                        http_method=verb, template=pathtemplate.parse(path), body=body, rpc=method.full_name,
                        grpc_path=f"/{svc_name}/{m.name}", owner=owner_of(svc_name),
                        input_type=in_cls, output_type=out_cls,
                        # path 6 = FileDescriptorProto.service, 2 = ServiceDescriptorProto.method
                        comment=comments.get((6, si, 2, mi), ""), server_streaming=m.server_streaming,
                    ))
    routes.sort(key=lambda r: r.template.specificity, reverse=True)
    return routes


def load_routes(path: pathlib.Path | None = None) -> list[Route]:
    return routes_from(load_file_set(path))


def message_comments(fds: descriptor_pb2.FileDescriptorSet) -> dict[str, str]:
    """Full message/field name -> leading comment, for the OpenAPI document."""
    out: dict[str, str] = {}
    for fd in fds.file:
        comments = _comments(fd)

        def walk(prefix: str, path: tuple[int, ...], msgs) -> None:
            for i, msg in enumerate(msgs):
                name = f"{prefix}.{msg.name}"
                p = path + (i,)
                if p in comments:
                    out[name] = comments[p]
                for fi, f in enumerate(msg.field):
                    c = comments.get(p + (2, fi))
                    if c:
                        out[f"{name}.{f.name}"] = c
                walk(name, p + (3,), msg.nested_type)  # 3 = DescriptorProto.nested_type

        walk(fd.package, (4,), fd.message_type)  # 4 = FileDescriptorProto.message_type
    return out
