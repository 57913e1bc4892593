"""The supply chain, offline: the lock files are closed (every distribution in the venv pinned with
hashes, the runtime lock closed under its own requirements), `make` and the image install them with
--require-hashes, and the image's final stage carries the runtime alone (no grpcio-tools)."""
from __future__ import annotations

import importlib.metadata
import pathlib
import re
import sys
import tomllib

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = pathlib.Path(__file__).resolve().parents[3]
RUNTIME, BUILD, TEST = "requirements.lock", "requirements-build.lock", "requirements-test.lock"
LOCKS = (RUNTIME, BUILD, TEST)
# ensurepip's, the installer itself: never installed from a lock (the Makefile does not upgrade it).
# Distributions built from this repository (installed by `make` with --no-deps, nothing fetched).
OWN = {"cuty-client"}
INSTALLER = {"pip"}
BUILD_TOOLS = {"grpcio-tools", "setuptools"}


def parse_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a pip-compile style lock (continuation lines with --hash)."""
    out = {}
    for entry in re.sub(r"\\\n\s*", " ", text).splitlines():
        entry = entry.split("#", 1)[0].strip()
        if not entry:
            continue
        spec, *options = entry.split(" --")
        req = Requirement(spec.strip())
        (pin,) = req.specifier
        assert pin.operator == "==", entry
        name = canonicalize_name(req.name)
        assert name not in out, f"{name} twice"
        out[name] = (pin.version, [o.strip().removeprefix("hash=") for o in options if o.startswith("hash=")])
    return out


def lock(name: str) -> dict[str, tuple[str, list[str]]]:
    return parse_lock((REPO / name).read_text())


def test_the_parser_sees_an_unhashed_pin():
    locked = parse_lock("a==1 \\\n    --hash=sha256:00\nb==2\n")
    assert locked == {"a": ("1", ["sha256:00"]), "b": ("2", [])}
    with pytest.raises(AssertionError):
        parse_lock("c>=1\n")


def test_every_pin_is_exact_hashed_and_in_one_file_only():
    seen: dict[str, str] = {}
    for name in LOCKS:
        for pkg, (_, hashes) in lock(name).items():
            assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), (name, pkg)
            assert pkg not in seen, f"{pkg} in {seen.get(pkg)} and {name}"
            seen[pkg] = name


def installed() -> dict[str, str]:
    """The distributions of the environment running the tests (the venv `make` built)."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def test_the_lock_is_closed_every_installed_distribution_is_pinned():
    if sys.prefix == sys.base_prefix:
        pytest.skip("not running in a virtual environment: the venv `make` builds is what is checked")
    locked = {pkg: version for name in LOCKS for pkg, (version, _) in lock(name).items()}
    unpinned = {pkg: v for pkg, v in installed().items()
                if pkg not in INSTALLER and pkg not in OWN and locked.get(pkg) != v}
    assert not unpinned, f"installed but not pinned (or another version) in the locks: {unpinned}"
    assert set(locked) <= set(installed()), set(locked) - set(installed())


def requires(pkg: str, extras: frozenset[str] = frozenset()) -> set[tuple[str, frozenset[str]]]:
    """What an installed distribution needs on this platform (with the given extras)."""
    out = set()
    for spec in importlib.metadata.distribution(pkg).requires or []:
        req = Requirement(spec)
        if req.marker is None or any(req.marker.evaluate({**default_environment(), "extra": e})
                                     for e in (extras or {""})):
            out.add((canonicalize_name(req.name), frozenset(req.extras)))
    return out


def test_the_runtime_lock_alone_is_closed_and_has_no_build_tools():
    """The image installs requirements.lock alone with --require-hashes: everything a runtime
    package needs is in it, and nothing only code generation needs."""
    runtime = lock(RUNTIME)
    assert not BUILD_TOOLS & set(runtime)
    assert set(lock(BUILD)) == BUILD_TOOLS
    todo, missing = [(pkg, frozenset()) for pkg in runtime], set()
    done = set()
    while todo:
        item = todo.pop()
        if item in done:
            continue
        done.add(item)
        for dep, extras in requires(*item):
            if dep not in runtime:
                missing.add((item[0], dep))
            else:
                todo.append((dep, extras))
    assert not missing, f"needed at run time but not in {RUNTIME}: {sorted(missing)}"


def test_the_direct_dependencies_are_declared_and_locked_at_their_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {RUNTIME: project["dependencies"], BUILD: project["optional-dependencies"]["build"],
              TEST: project["optional-dependencies"]["test"]}
    for name, deps in groups.items():
        locked = lock(name)
        for spec in deps:
            req = Requirement(spec)
            assert locked[canonicalize_name(req.name)][0] == next(iter(req.specifier)).version, (name, spec)
    # what the code imports by name though nothing requires it: the event loop and the HTTP parser
    declared = {canonicalize_name(Requirement(s).name) for s in project["dependencies"]}
    assert {"uvloop", "httptools"} <= declared


def test_make_and_the_image_install_with_require_hashes():
    makefile = (REPO / "Makefile").read_text()
    installs, own = re.findall(r"\$\(PY\) -m pip install[^\n]*", makefile)
    assert "--require-hashes" in installs and "$(LOCKS)" in installs
    # The repository's own client package: built from this checkout with the locked build tools,
    # its dependencies already locked; nothing is fetched.
    assert "--no-deps" in own and "--no-build-isolation" in own and own.endswith("./clients/python")
    assert re.search(r"^LOCKS := " + " ".join(LOCKS) + "$", makefile, re.M)
    assert "--upgrade pip" not in makefile  # an unpinned download
    for line in re.findall(r"pip install[^\n&]*", dockerfile()):
        assert "--require-hashes" in line, line


def dockerfile() -> str:
    return (REPO / "deploy" / "k8s" / "Dockerfile").read_text()


def stages(text: str) -> list[tuple[str, str]]:
    """(name, body) of each FROM stage, continuation lines joined; the final stage is last."""
    text = re.sub(r"\\\n", " ", text)
    out = []
    for part in re.split(r"^FROM ", text, flags=re.M)[1:]:
        head, _, body = part.partition("\n")
        name = head.split(" AS ")[1].strip() if " AS " in head else ""
        out.append((name, body))
    return out


def build_tools_in_final_stage(text: str) -> list[str]:
    """What would ship build tools: the final stage installing anything, or copying other than the
    venv of a stage that installs requirements.lock alone and the generated code."""
    all_stages = dict(stages(text))
    final = stages(text)[-1][1]
    problems = [w for w in ("pip install", "apt-get", "grpcio", BUILD) if w in final]
    sources = re.findall(r"COPY --from=(\S+) (\S+) (\S+)", final)
    for stage, path, _ in sources:
        body = all_stages[stage]
        if path == "/venv":
            if "-r /tmp/requirements.lock" not in body or BUILD in body or "grpcio-tools" in body:
                problems.append(f"the venv from {stage}")
        elif path != "/app/build/gen":
            problems.append(f"{path} from {stage}")
    if {p for _, p, _ in sources} != {"/venv", "/app/build/gen"}:
        problems.append(f"copies {sources}")
    return problems


def test_the_runtime_image_has_no_build_tools():
    """No Docker engine here: statically, the final stage installs nothing and copies the venv only
    from a stage that installs requirements.lock alone; grpcio-tools lives in the `gen` stage."""
    assert build_tools_in_final_stage(dockerfile()) == []
    gen = dict(stages(dockerfile()))["gen"]
    assert BUILD in gen
    # `make gen` would remake the venv, whose prerequisites (the test lock among them) are not in
    # this stage: the stage's own venv stands in for it
    assert "make -o .venv/.installed gen" in gen


def test_the_image_check_bites():
    old = dockerfile()
    assert build_tools_in_final_stage(old.replace("COPY --from=runtime-deps /venv /venv", "COPY --from=gen /app/.venv /venv"))
    assert build_tools_in_final_stage(old.replace(" -r /tmp/requirements.lock", " -r /tmp/requirements.lock -r requirements-build.lock"))
