"""Bounded memo tables for the gateway's pure per-request steps (issue 11, part 2).

Matching a path, transcoding a request and writing a GET's answer as JSON are pure functions
of their inputs (the route table and descriptors never change in a running gateway), and the same
inputs come back again and again: every buyer of a product posts the same body, every visitor of
a salon's day asks the same query and gets the same answer bytes. A `Memo` keeps the results,
bounded by entries and by bytes; when full it is cleared (entries are cheap to rebuild), as the
token caches are. Keys and values are immutable (str, bytes, tuples) or never mutated by a caller.
"""
from __future__ import annotations


class Memo:
    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: dict = {}
        self._bytes = 0
        self.hits = self.misses = 0

    def get(self, key):
        value = self._data.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key, value, size: int) -> None:
        """Keep `value` (never None) under `key`; `size` is what it holds in bytes, roughly."""
        if key in self._data:
            return
        if len(self._data) >= self.max_entries or self._bytes + size > self.max_bytes:
            self._data.clear()
            self._bytes = 0
        if size <= self.max_bytes:
            self._data[key] = value
            self._bytes += size

    def __len__(self) -> int:
        return len(self._data)
