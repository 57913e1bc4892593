"""Bounded memo tables for the gateway's pure per-request steps.

Matching a path, transcoding a request and writing a GET's answer as JSON are pure functions
of their inputs (the route table and descriptors never change in a running gateway), and the same
inputs come back again and again: every buyer of a product posts the same body, every visitor of
a salon's day asks the same query and gets the same answer bytes. A `Memo` keeps the results,
bounded by entries and by bytes; when full it is cleared (entries are cheap to rebuild), as the
token caches are. Keys and values are immutable (str, bytes, tuples) or never mutated by a caller.

Nothing secret is ever kept: a field marked `[debug_redact = true]` in the protos (client secrets,
3-D Secure redirect URLs, code values, endpoint signing secrets) makes its message unfit for a memo
(`can_carry_secrets`, decided once per message type; `carries_secrets`, per answer).
"""
from __future__ import annotations

import functools

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message


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


@functools.cache
def can_carry_secrets(descriptor: Descriptor) -> bool:
    """Whether a message of this type may hold a `debug_redact` field, at any depth."""
    return _redacted_within(descriptor, frozenset())


def _redacted_within(descriptor: Descriptor, seen: frozenset) -> bool:
    if descriptor.full_name in seen:
        return False
    seen = seen | {descriptor.full_name}
    for f in descriptor.fields:
        if f.GetOptions().debug_redact:
            return True
        if f.type == FieldDescriptor.TYPE_MESSAGE and _redacted_within(f.message_type, seen):
            return True
    return False


def carries_secrets(msg: Message) -> bool:
    """Whether this message has a `debug_redact` field set, at any depth."""
    for f, value in msg.ListFields():
        if f.GetOptions().debug_redact:
            return True
        if f.type == FieldDescriptor.TYPE_MESSAGE and can_carry_secrets(f.message_type):
            if f.is_repeated:
                if any(carries_secrets(v) for v in (value.values() if f.message_type.GetOptions().map_entry
                                                    else value)):
                    return True
            elif carries_secrets(value):
                return True
    return False
