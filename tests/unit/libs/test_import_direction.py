"""Dependencies point one way: services use cutylib, cutylib uses no service, and no service uses
another's package (they talk through the generated `cuty.*.v1` stubs; docs/conventions.md)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("booking", "codepool", "payments", "gateway", "pspsim")


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports only; relative ones stay inside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def offenders(folder: Path, forbidden: set[str]) -> list[str]:
    return sorted(f"{p.relative_to(ROOT)} imports {', '.join(sorted(imported_packages(p) & forbidden))}"
                  for p in folder.rglob("*.py") if imported_packages(p) & forbidden)


def test_cutylib_imports_no_service():
    assert offenders(ROOT / "libs" / "cutylib", set(SERVICES)) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service):
    assert offenders(ROOT / "services" / service / service, set(SERVICES) - {service}) == []


def test_the_check_sees_an_import_of_a_service(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom payments.psp import PspError\nfrom . import sibling\n")
    assert imported_packages(module) == {"os", "payments"}
