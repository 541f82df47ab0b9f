"""Request body checks shared by the two HTTP servers (retrieval/server.py, serving/server.py), made before
`json.loads` so that no body can cost more than its bytes: strict UTF-8, then JSON nesting depth, then parse.

    obj = parse_json_body(raw)     # BodyError(400, message naming the problem), never a RecursionError

Body bytes are each server's own check (Content-Length, then counted while reading): `too_large` words it.
"""
from __future__ import annotations

import json

import numpy as np

# Nesting levels (arrays and objects) a body may have. The servers' own bodies need 4
# ({"messages": [{"content": [{"type": "text", ...}]}]}); json.loads recursed out of stack at about 100k.
MAX_JSON_DEPTH = 32

# every byte but the ones that open, close or delimit: what the depth scan keeps
_NOT_STRUCTURE = bytes(sorted(set(range(256)) - set(b'"[]{}')))


class BodyError(ValueError):
    """A request body refused before or while parsing: `status` (400 or 413) and a message naming the limit."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def too_large(size: int, limit: int, flag: str, counted: bool = False) -> BodyError:
    """The 413 for a body of `size` bytes over `limit` (counted: read so far, no Content-Length)."""
    what = f"over {size:,} bytes (no Content-Length; stopped reading)" if counted else f"{size:,} bytes"
    return BodyError(413, f"request body of {what} is over the limit of {limit:,} bytes (the server's {flag})")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON `raw`, brackets inside strings not counted; in C
    and numpy, linear in len(raw). Malformed JSON gets some number (json.loads then names its error)."""
    # escapes first (an escaped quote does not end a string), then only quotes and brackets are kept and the
    # strings between quote pairs dropped. UTF-8 continuation bytes are >= 0x80: never one of these.
    s = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURE)
    s = b"".join(s.split(b'"')[::2])
    if not s:
        return 0
    a = np.frombuffer(s, np.uint8)
    return int(np.cumsum(np.where((a == ord("[")) | (a == ord("{")), 1, -1)).max())


def parse_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH):
    """`raw` as JSON after the cheap checks: BodyError(400) for bytes that are not UTF-8 (naming the offset),
    nesting deeper than `max_depth`, or invalid JSON (naming line and column)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(400, f"request body is not UTF-8: byte 0x{raw[e.start]:02x} at offset {e.start} "
                        f"({e.reason}); send the JSON encoded as UTF-8") from None
    if raw.count(b"[") + raw.count(b"{") > max_depth:  # fewer brackets cannot nest deeper: skip the scan
        depth = json_depth(raw)
        if depth > max_depth:
            raise BodyError(400, f"request body nests arrays/objects {depth:,} levels deep; the limit is "
                            f"{max_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BodyError(400, f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
