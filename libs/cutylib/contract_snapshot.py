"""The public shape of the contracts (protos/cuty), kept as a committed snapshot so that a breaking
change is caught before it ships: a removed or renumbered field, a field whose type or cardinality
changed, a removed enum value, a removed RPC or one whose request, answer or streaming changed, and
a removed or changed HTTP route. Additions are never breaking.

    python -m cutylib.contract_snapshot            # compare build/gen/descriptors.pb with the snapshot
    python -m cutylib.contract_snapshot --write    # record the current contracts (a deliberate break)

tests/unit/test_contract_snapshot.py runs the comparison in `make test`.
"""
from __future__ import annotations

import json
import pathlib
import sys

from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "protos" / "contract-snapshot.json"
DESCRIPTORS = ROOT / "build" / "gen" / "descriptors.pb"
_F = descriptor_pb2.FieldDescriptorProto


def shape(fds: descriptor_pb2.FileDescriptorSet) -> dict:
    """Messages (fields by name: number, type, cardinality), enums (values by name: number),
    services (RPCs: request, answer, streaming, HTTP route) of every `cuty/` file."""
    messages: dict[str, dict] = {}
    enums: dict[str, dict] = {}
    rpcs: dict[str, dict] = {}

    def message(prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{m.name}"
        fields = {}
        for f in m.field:
            kind = f.type_name.lstrip(".") if f.type_name else _F.Type.Name(f.type).removeprefix("TYPE_").lower()
            label = "repeated" if f.label == _F.LABEL_REPEATED else ("optional" if f.proto3_optional else "")
            fields[f.name] = {"number": f.number, "type": kind, "label": label}
        messages[name] = fields
        for nested in m.nested_type:
            message(name, nested)
        for e in m.enum_type:
            enums[f"{name}.{e.name}"] = {v.name: v.number for v in e.value}

    for fd in fds.file:
        if not fd.name.startswith("cuty/"):
            continue
        for m in fd.message_type:
            message(fd.package, m)
        for e in fd.enum_type:
            enums[f"{fd.package}.{e.name}"] = {v.name: v.number for v in e.value}
        for s in fd.service:
            for m in s.method:
                rule = m.options.Extensions[annotations_pb2.http] if m.options.HasExtension(annotations_pb2.http) else None
                route = ""
                if rule is not None:
                    verb = rule.WhichOneof("pattern")
                    route = f"{verb.upper()} {getattr(rule, verb)}" if verb else ""
                rpcs[f"{fd.package}.{s.name}.{m.name}"] = {
                    "request": m.input_type.lstrip("."), "answer": m.output_type.lstrip("."),
                    "client_streaming": m.client_streaming, "server_streaming": m.server_streaming,
                    "route": route, "body": rule.body if rule is not None else ""}
    return {"messages": dict(sorted(messages.items())), "enums": dict(sorted(enums.items())),
            "rpcs": dict(sorted(rpcs.items()))}


def breaks(old: dict, new: dict) -> list[str]:
    """What `new` breaks of `old`, one line each; [] when it only adds."""
    out = []
    for name, fields in old["messages"].items():
        now = new["messages"].get(name)
        if now is None:
            out.append(f"message {name} removed")
            continue
        by_number = {f["number"]: n for n, f in now.items()}
        for fname, f in fields.items():
            g = now.get(fname)
            if g is None:
                taken = by_number.get(f["number"])
                out.append(f"{name}.{fname} (field {f['number']}) removed"
                           + (f"; its number is now {taken}" if taken else ""))
            elif g["number"] != f["number"]:
                out.append(f"{name}.{fname} renumbered {f['number']} -> {g['number']}")
            elif (g["type"], g["label"]) != (f["type"], f["label"]):
                out.append(f"{name}.{fname} changed type {f['label']} {f['type']} -> {g['label']} {g['type']}".replace("  ", " "))
    for name, values in old["enums"].items():
        now = new["enums"].get(name)
        if now is None:
            out.append(f"enum {name} removed")
            continue
        for v, n in values.items():
            if now.get(v) != n:
                out.append(f"enum value {name}.{v} = {n} removed or renumbered")
    for name, rpc in old["rpcs"].items():
        now = new["rpcs"].get(name)
        if now is None:
            out.append(f"rpc {name} removed" + (f" (and its route {rpc['route']})" if rpc["route"] else ""))
            continue
        for key in ("request", "answer", "client_streaming", "server_streaming", "body"):
            if now[key] != rpc[key]:
                out.append(f"rpc {name}: {key} changed {rpc[key]!r} -> {now[key]!r}")
        if rpc["route"] and now["route"] != rpc["route"]:
            out.append(f"rpc {name}: route {rpc['route']} changed to {now['route'] or 'none'}")
    return out


def current(path: pathlib.Path = DESCRIPTORS) -> dict:
    return shape(descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()))


def main(argv: list[str]) -> int:
    now = current()
    if "--write" in argv:
        SNAPSHOT.write_text(json.dumps(now, indent=1, sort_keys=False) + "\n")
        print(f"wrote {SNAPSHOT.relative_to(ROOT)}")
        return 0
    found = breaks(json.loads(SNAPSHOT.read_text()), now)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
