"""The repository explains itself: nothing in it points to a document outside it, and every
relative link in README.md and docs/*.md leads to a file (and, for a markdown file, a heading)
that exists in the repository.

Someone who clones the repository alone must be able to read every reference. The design that
used to live beside the repository is docs/architecture.md now.
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
from urllib.parse import unquote, urlsplit

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Spelled in parts so that this file does not match itself.
_OUTSIDE = re.compile(
    r"\.\./" + "shared" + r"\b" + "|" + r"\b" + "DESIGN" + r"\.md\b" + "|" + r"\b" + "STYLE" + r"\.md\b",
    re.IGNORECASE)

# Folders that are never part of the repository, for the walk used when git cannot list files.
_NOT_SOURCE = {".git", ".venv", "build", ".cuty", "__pycache__", ".pytest_cache", "node_modules"}


def _tracked_files() -> list[pathlib.Path]:
    """The repository's files: git's list when this is a checkout, else a walk of the tree."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in _NOT_SOURCE]
            files += [pathlib.Path(folder, n) for n in names]
        return sorted(files)
    return sorted(ROOT / name for name in out.decode().split("\0") if name)


TRACKED = _tracked_files()
TRACKED_SET = {p.relative_to(ROOT).as_posix() for p in TRACKED}
TRACKED_DIRS = {parent.as_posix() for p in TRACKED_SET for parent in pathlib.PurePosixPath(p).parents}


def _text(path: pathlib.Path) -> str | None:
    """The file's text, or None for a binary file (or one that is listed but absent)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_file_refers_to_documents_outside_the_repository():
    hits = []
    for path in TRACKED:
        text = _text(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, ("these lines refer to a document outside the repository; point them to "
                      "docs/architecture.md (or the doc that covers it) instead:\n" + "\n".join(hits))


# A comment or document that says which tracker issue asked for something instead of what and why
# (the history lives in git). Spelled in parts so that this file does not match itself.
_ISSUE_NUMBER = re.compile(r"\b" + "issue" + r"s? #?\d+\b", re.IGNORECASE)


def test_no_file_narrates_issue_numbers():
    hits = []
    for path in TRACKED:
        text = _text(path)
        if text is None or path.suffix not in {".py", ".md", ".sql", ".proto", ".yaml", ".yml", ".json", ""}:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if _ISSUE_NUMBER.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "say what and why, not which issue asked for it:\n" + "\n".join(hits)
    assert _ISSUE_NUMBER.search("(" + "issue" + " 12, item 2)") and not _ISSUE_NUMBER.search("an issuer 12")


# -- links in the markdown documents -----------------------------------------------------------------

DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def _prose(markdown: str) -> str:
    """The markdown without fenced code blocks and code spans, where brackets are not links."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(markdown: str) -> list[str]:
    prose = _prose(markdown)
    return _INLINE_LINK.findall(prose) + _REFERENCE_DEF.findall(prose)


def _broken(doc: pathlib.Path, markdown: str | None = None) -> list[str]:
    """What is wrong with the links of `doc` (its text, or `markdown` as if it were its text)."""
    problems = []
    if markdown is None:
        markdown = doc.read_text()
    for target in _links(markdown):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc:
            continue  # http(s):, mailto: ... are not files of the repository
        path, fragment = unquote(parts.path), unquote(parts.fragment)
        if not path:
            if fragment and fragment not in _anchors(markdown):
                problems.append(f"{target}: no heading #{fragment} in this file")
            continue
        if path.startswith("/"):
            problems.append(f"{target}: an absolute path; use one relative to {doc.name}")
            continue
        resolved = (doc.parent / path).resolve()
        try:
            rel = resolved.relative_to(ROOT).as_posix()
        except ValueError:
            problems.append(f"{target}: outside the repository")
            continue
        if rel not in TRACKED_SET and rel not in TRACKED_DIRS:
            problems.append(f"{target}: {rel} is not a file of the repository")
            continue
        if fragment and rel.endswith(".md") and fragment not in _anchors((ROOT / rel).read_text()):
            problems.append(f"{target}: {rel} has no heading #{fragment}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_lead_to_files_of_the_repository(doc: pathlib.Path):
    problems = _broken(doc)
    assert not problems, f"{doc.relative_to(ROOT)}: broken links:\n" + "\n".join(problems)


def test_the_link_checker_finds_what_it_must():
    """A checker that cannot fail is no check: a broken file, a broken anchor and a link outside
    are reported; code blocks, code spans and web addresses are left alone."""
    sample = ROOT / "docs" / "architecture.md"
    assert _slug("gRPC inside, HTTP/JSON outside, one contract") == "grpc-inside-httpjson-outside-one-contract"
    assert _slug("Booking (`make bench-booking`)") == "booking-make-bench-booking"
    assert "invariants" in _anchors(sample.read_text())
    markdown = ("[a](missing.md) [b](architecture.md#no-such-heading) [c](../../elsewhere.md)\n"
                "[d](https://example.com/x.md) `[e](missing-too.md)`\n```\n[f](missing-three.md)\n```\n"
                "[g](conventions.md) [h](#nowhere)\n")
    assert _links(markdown) == ["missing.md", "architecture.md#no-such-heading", "../../elsewhere.md",
                                "https://example.com/x.md", "conventions.md", "#nowhere"]
    problems = _broken(sample.parent / "sample.md", markdown)
    assert len(problems) == 4, problems
    assert _OUTSIDE.search("see ../" + "shared/" + "DESIGN" + ".md") and _OUTSIDE.search("STYLE" + ".md")
    assert not _OUTSIDE.search("docs/architecture.md, the DESIGN_TABLE of a test")
