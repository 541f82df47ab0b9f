"""Files and directories this project owns: atomic writes (a kill mid-write leaves the old file or the new one,
never half of one), output directories it may write (never a user's), and a directory lock (one writer).

    claim_output_dir(out, "--out")       # before any work: absent, empty or ours, else OutputDirError
    with DirLock(os.path.join(workdir, "train.lock")):   # a second holder gets LockedError naming this one
        ...
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import shutil
import socket
from typing import Callable, Sequence

log = logging.getLogger(__name__)

# The file that marks a directory as written by this project: a command may replace what such a directory holds.
MARKER = ".jaxsearch"
_MARKER_TEXT = "written by jaxsearch: its commands may replace this directory's contents\n"


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


class OutputDirError(ValueError):
    """An output directory this project may not write; the message names it and the fix."""


def mark(directory: str) -> None:
    """Mark `directory` (which exists) as written by this project. Created in place, not by rename: several
    processes may mark the same directory, and none may see a temporary file there."""
    try:
        with open(os.path.join(directory, MARKER), "x", encoding="utf-8") as f:
            f.write(_MARKER_TEXT)
    except FileExistsError:
        pass


def is_ours(directory: str, legacy: Sequence[Sequence[str]] = ()) -> bool:
    """Whether `directory` holds the marker, or one of the `legacy` layouts (entries that all exist: what
    versions before the marker wrote)."""
    if os.path.isfile(os.path.join(directory, MARKER)):
        return True
    return any(all(os.path.exists(os.path.join(directory, p)) for p in layout) for layout in legacy)


def claim_output_dir(
    path: str,
    flag: str,
    *,
    legacy: Sequence[Sequence[str]] = (),
    inputs: Sequence[str] = (),
    create: bool = True,
) -> None:
    """Check, before any work, that directory `path` (given as `flag`) may be written: absent, empty, or
    written by this project (`is_ours`). Anything else raises OutputDirError naming the path and the fix;
    nothing is ever deleted or renamed here. `inputs`: paths the command reads, which must not lie at or
    inside `path`. create: make `path` now and mark it (False: a build that swaps a finished, marked
    directory in later checks only)."""
    where = f"{flag} {path}"
    root = os.path.realpath(path) + os.sep
    for source in inputs:
        if source and (os.path.realpath(source) + os.sep).startswith(root):
            raise OutputDirError(f"{where}: the input {source} is there and would be replaced; name another "
                                 f"{flag} (nothing was changed)")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise OutputDirError(f"{where} is a file, not a directory; name a new directory for {flag} "
                             "(nothing was changed)")
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        if names and not is_ours(path, legacy):
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise OutputDirError(f"{where} holds files jaxsearch did not write ({shown}); name a new or empty "
                                 f"directory for {flag}, or move those files away (nothing was changed)")
    if create:
        os.makedirs(path, exist_ok=True)
        mark(path)


def fresh_save_dir(tmp: str, legacy: Sequence[Sequence[str]] = ()) -> None:
    """Make `tmp` (a save's temporary directory, `<dst>.tmp-save`) an empty, marked directory. A leftover
    of an interrupted save of ours (marked, or a `legacy` layout) is removed; anything else there is refused
    with an OutputDirError (nothing deleted)."""
    if os.path.lexists(tmp):
        if not os.path.isdir(tmp) or not is_ours(tmp, legacy):
            raise OutputDirError(f"{tmp}: a save's temporary directory, but it holds files jaxsearch did not "
                                 "write; move it away and save again (nothing was changed)")
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    mark(tmp)


def replace_dir(src: str, dst: str, legacy: Sequence[Sequence[str]] = ()) -> None:
    """Move the complete directory `src` to `dst`. An existing `dst` is replaced only if it is ours (`is_ours`:
    marked, or a `legacy` layout); anything else raises OutputDirError (`src` kept, nothing deleted)."""
    dst = dst.rstrip("/")
    if not os.path.lexists(dst):
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
        os.rename(src, dst)
        return
    if not os.path.isdir(dst) or (os.listdir(dst) and not is_ours(dst, legacy)):
        raise OutputDirError(f"{dst} holds files jaxsearch did not write; the new save is kept in {src} "
                             "(move it where you want it)")
    old = dst + ".old-save"
    if os.path.exists(old):
        shutil.rmtree(old)
    os.rename(dst, old)
    os.rename(src, dst)
    shutil.rmtree(old)


class LockedError(RuntimeError):
    """A directory lock held by another process; the message names the holder and the lock file."""


class DirLock:
    """An exclusive lock held by this process: the file `path` records the holder's pid and host.

    The kernel lock (flock) dies with its process, so a lock file left by a killed process on this host is
    taken over with a warning. A lock file of another host is refused (its process cannot be checked from
    here): delete the file once that run is gone. Use as a context manager; released (file removed) on exit.
    """

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        me = {"pid": os.getpid(), "host": socket.gethostname()}
        for _ in range(3):  # retry when the file was removed by a releasing holder between open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                kernel_lock = self._flock(fd)
                if os.fstat(fd).st_ino != _inode(self.path):
                    os.close(fd)
                    continue
                holder = _read_holder(fd)
                if holder and holder != me:
                    if holder.get("host") != me["host"] or (not kernel_lock and _alive(holder.get("pid"))):
                        raise LockedError(self._held(holder, "; if that run has ended, delete the lock file"))
                    log.warning("%s: taking over the lock of pid %s on %s, which is no longer running",
                                self.path, holder.get("pid"), holder.get("host"))
                os.ftruncate(fd, 0)
                os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
            return
        raise LockedError(f"{self.path}: could not take the lock (it keeps being replaced)")

    def release(self) -> None:
        if self._fd is not None:
            os.unlink(self.path)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _flock(self, fd: int) -> bool:
        """Take the kernel lock; False where the filesystem has none (then the recorded pid decides)."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockedError(self._held(_read_holder(fd), "")) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            return False
        return True

    def _held(self, holder: dict, fix: str) -> str:
        who = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
        return f"{os.path.dirname(self.path) or '.'} is in use by {who} (lock file {self.path}){fix}"


def _inode(path: str) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _read_holder(fd: int) -> dict:
    """The holder recorded in an open lock file ({} when empty or unreadable)."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except ValueError:
        return {}
    return holder if isinstance(holder, dict) else {}


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, ValueError, TypeError):
        return False
    except PermissionError:  # another user's process
        return True
    return True
