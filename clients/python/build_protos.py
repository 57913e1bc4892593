"""Generates the protobuf and gRPC modules cuty-client ships, from the repository's protos
(`../../protos`, or the folder given), into `<out>/cuty_client/_pb/`.

protoc writes absolute imports (`from cuty.common.v1 import common_pb2`); they are rewritten to
`cuty_client._pb.cuty...` so the client's modules never clash with another package named `cuty`
or `buf` in the program that installs it. The descriptors themselves are unchanged (the same
file names as the services' own modules, so both may live in one process).

    python build_protos.py OUT_DIR [PROTOS_DIR]
"""
from __future__ import annotations

import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
PACKAGE = "cuty_client._pb"
_IMPORT = re.compile(r"^(from|import) (cuty|buf)\.", re.MULTILINE)


def generate(out: pathlib.Path, protos: pathlib.Path | None = None) -> list[pathlib.Path]:
    import grpc_tools
    from grpc_tools import protoc
    import google.api.annotations_pb2 as annotations

    protos = (protos or HERE.parent.parent / "protos").resolve()
    if not (protos / "cuty").is_dir():
        raise SystemExit(f"no protos in {protos}: build cuty-client from the repository (clients/python)")
    target = out / "cuty_client" / "_pb"
    target.mkdir(parents=True, exist_ok=True)
    files = sorted(str(p.relative_to(protos)) for p in protos.rglob("*.proto"))
    includes = [str(protos), str(pathlib.Path(grpc_tools.__file__).parent / "_proto"),
                str(pathlib.Path(annotations.__file__).parent.parent.parent)]
    args = ["protoc", *(f"-I{i}" for i in includes), f"--python_out={target}", f"--pyi_out={target}",
            f"--grpc_python_out={target}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed on " + " ".join(files))
    written = []
    for f in sorted(target.rglob("*.py*")):
        if f.suffix in (".py", ".pyi"):
            f.write_text(_IMPORT.sub(lambda m: f"{m.group(1)} {PACKAGE}.{m.group(2)}.", f.read_text()))
            written.append(f)
    for d in [target, *(p for p in target.rglob("*") if p.is_dir())]:
        (d / "__init__.py").touch()
    return written


if __name__ == "__main__":
    generate(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else None)
