"""Atomic file writes: a kill mid-write leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
from typing import Callable


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """`write(tmp)` writes the new content to a temporary path beside `path`, which then replaces `path`."""
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    write(tmp)
    os.replace(tmp, path)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """`path` holds `text` (UTF-8), written atomically."""

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)
