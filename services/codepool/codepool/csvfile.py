"""Reading supplier CSV files: one code per row, optionally under a header row naming a `code` column.

Reading is streaming (a million-line file never sits in memory). Malformed rows are reported by
their line number in the file, never with their content (it may be a code).
"""
from __future__ import annotations

import csv
import pathlib
from dataclasses import dataclass, field
from typing import Iterator

from cutylib.errors import InvalidArgument

from .domain import code_problem

MAX_REPORTED = 20


@dataclass
class CsvCheck:
    codes: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)
    error_count: int = 0

    def add(self, line: int, problem: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_REPORTED:
            self.errors.append((line, problem))

    def raise_if_bad(self, path: str) -> None:
        if not self.error_count:
            return
        listed = "; ".join(f"line {n}: {p}" for n, p in self.errors)
        more = f"; and {self.error_count - len(self.errors)} more" if self.error_count > len(self.errors) else ""
        raise InvalidArgument(f"line {self.errors[0][0]}",
                              f"{path}: {self.error_count} malformed line(s): {listed}{more}")


def _rows(path: pathlib.Path, check: CsvCheck | None) -> Iterator[tuple[int, str | None]]:
    """(line number, code) per data row; code None for a malformed row (recorded in `check`)."""
    with open(path, newline="", encoding="utf-8-sig", errors="strict") as f:
        reader = csv.reader(f, strict=True)
        column, width = 0, 1
        first = True
        while True:
            start = reader.line_num + 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except (csv.Error, UnicodeDecodeError) as e:
                if check is not None:
                    problem = "not valid UTF-8" if isinstance(e, UnicodeDecodeError) else f"malformed CSV ({e})"
                    check.add(start, problem)
                return  # the reader cannot resynchronise after a broken quote or encoding error
            if not row:
                continue  # blank line
            if first:
                first = False
                header = [h.strip().lower() for h in row]
                if "code" in header:
                    column, width = header.index("code"), len(row)
                    continue
            if len(row) != width:
                if check is not None:
                    check.add(start, f"expected {width} column(s), got {len(row)}")
                yield start, None
                continue
            value = row[column].strip()
            problem = code_problem(value)
            if problem:
                if check is not None:
                    check.add(start, f"code {problem}")
                yield start, None
                continue
            yield start, value


def check_file(path: str | pathlib.Path) -> CsvCheck:
    """First pass: count the codes and collect malformed lines, so nothing is sent for a bad file."""
    check = CsvCheck()
    for _, code in _rows(pathlib.Path(path), check):
        if code is not None:
            check.codes += 1
    return check


def read_codes(path: str | pathlib.Path, chunk: int = 5000) -> Iterator[list[str]]:
    """Second pass: the codes in lists of `chunk` (call after check_file found no error)."""
    buf: list[str] = []
    for _, code in _rows(pathlib.Path(path), None):
        if code is None:
            raise InvalidArgument("file", f"{path} changed since it was checked")
        buf.append(code)
        if len(buf) >= chunk:
            yield buf
            buf = []
    if buf:
        yield buf
