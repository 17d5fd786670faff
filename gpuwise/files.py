"""Bottom layer: the user's files, read and written without harm. Imports only errors.py.

Every path a user names goes through here. A read looks at what the path is before opening it
(a FIFO would block forever, `/dev/zero` never ends, a folder is not a file) and is bounded by
the size a real file of its kind can have. An output goes only to a new path or to a file whose
first line says it is gpuwise's own of that kind, and a file that is replaced is replaced
atomically. Every failure is one GpuwiseError naming the file, never a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from gpuwise.errors import GpuwiseError
from gpuwise.units import KIB, format_bytes

__all__ = ["CACHE_ENV", "cache_dir", "file_type", "json_object", "own_output", "read_bytes",
           "read_json", "read_text", "regular_file", "replace_atomically", "shown",
           "write_failed"]

CACHE_ENV = "GPUWISE_CACHE_DIR"

SHOWN_CHARS = 80  # a name in a message is cut to about this (a name can be megabytes long)
FIRST_LINE_BYTES = 64 * KIB  # more than any header record gpuwise writes
# What stat says is not there: a missing file, a path through a file, a name no file can have.
NOTHING_THERE = (FileNotFoundError, NotADirectoryError)
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def cache_dir() -> Path:
    """gpuwise's own folder (probe profiles, the catalogue's parsed copies): $GPUWISE_CACHE_DIR,
    else the XDG cache's gpuwise; not created until something is saved there."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "gpuwise"


def shown(text: str | os.PathLike[str], limit: int = SHOWN_CHARS) -> str:
    """`text` as a message shows it: cut in the middle to about `limit` characters."""
    s = str(text)
    if len(s) <= limit:
        return s
    head = 2 * limit // 3
    return f"{s[:head]}...{s[len(s) - (limit - head) :]} ({len(s):,} characters)"


def file_type(path: str | os.PathLike[str], what: str = "file", hint: str = "") -> str | None:
    """What `path` names, links followed: 'file', 'directory', 'named pipe (FIFO)', 'socket' or
    'device'; None when nothing is there (or no file could have that name)."""
    try:
        mode = os.stat(path).st_mode
    except NOTHING_THERE:
        return None
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return None
        raise _failed("cannot read", what, path, exc, hint) from None
    except ValueError:  # an embedded NUL byte: no file has that name
        return None
    return _kind(mode)


def regular_file(path: str | os.PathLike[str], what: str, max_bytes: int, hint: str = "") -> Path:
    """`path` when it names a readable regular file of at most `max_bytes` (links followed),
    for a library that opens the file itself; anything else is one GpuwiseError."""
    with _open_regular(path, what, max_bytes, hint):
        return Path(path)


def read_bytes(path: str | os.PathLike[str], what: str, max_bytes: int, hint: str = "") -> bytes:
    """The bytes of a regular file of at most `max_bytes`; anything else is one GpuwiseError."""
    with _open_regular(path, what, max_bytes, hint) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise _failed("cannot read", what, path, exc, hint) from None
    if len(data) > max_bytes:  # it grew since it was looked at
        raise _too_large(path, what, len(data), max_bytes, hint)
    return data


def read_text(path: str | os.PathLike[str], what: str, max_bytes: int, hint: str = "") -> str:
    """The UTF-8 text of a regular file of at most `max_bytes`; binary data is one GpuwiseError."""
    data = read_bytes(path, what, max_bytes, hint)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GpuwiseError(f"{what} {shown(path)} is not a text file (binary data at byte "
                           f"{exc.start:,})", hint) from None


def read_json(path: str | os.PathLike[str], what: str, max_bytes: int, hint: str = "") -> dict[str, Any]:
    """The JSON object in a regular file of at most `max_bytes`; anything else is one GpuwiseError."""
    text = read_text(path, what, max_bytes, hint)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuwiseError(f"{what} {shown(path)} is not valid JSON ({exc.msg} at line "
                           f"{exc.lineno})", hint) from None
    except RecursionError:
        raise GpuwiseError(f"{what} {shown(path)} is nested too deep to be real JSON", hint) from None
    if not isinstance(value, dict):
        raise GpuwiseError(f"{what} {shown(path)} is not a JSON object", hint)
    return value


def json_object(line: bytes | str) -> dict[str, Any] | None:
    """One line parsed as a JSON object, or None (not JSON, or not an object)."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def own_output(path: str | os.PathLike[str], is_ours: Callable[[bytes], bool], what: str,
               hint: str) -> Path:
    """`path` when gpuwise may write its `what` there: nothing is there yet (its folder is
    made), an empty file (nothing to lose: `--log $(mktemp)`), or a file whose first line
    `is_ours` accepts. Anything else (the user's own file, a folder, a FIFO, a device) is
    refused with one line; nothing is touched."""
    path = Path(path)
    kind = file_type(path, what, hint)
    if kind is None:
        if os.path.islink(path):
            raise GpuwiseError(f"{what} {shown(path)} is a link to a missing file", hint)
        _make_folder(path.parent, what, path, hint)
        return path
    if kind != "file":
        raise GpuwiseError(f"{what} {shown(path)} is a {kind}, not a file gpuwise can write", hint)
    with _open_regular(path, what, None, hint) as f:
        try:
            head = f.readline(FIRST_LINE_BYTES)
        except OSError as exc:
            raise _failed("cannot read", what, path, exc, hint) from None
    if head and not is_ours(head.rstrip(b"\r\n")):
        raise GpuwiseError(f"{shown(path)} exists and is not a gpuwise {what}: gpuwise "
                           "writes only to new, empty or its own files", hint)
    return path


def replace_atomically(path: str | os.PathLike[str], data: bytes, what: str, hint: str) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: a reader (or
    a crash) sees the old file or the new one, never half of one."""
    path = Path(path)
    kind = file_type(path, what, hint)
    if kind not in (None, "file"):  # as root, a rename would replace a device node itself
        raise GpuwiseError(f"{what} {shown(path)} is a {kind}, not a file gpuwise can write", hint)
    _make_folder(path.parent, what, path, hint)
    tmp = ""
    try:
        mode = _mode_for(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
        os.fchmod(fd, mode)  # mkstemp makes 0600; keep the old file's mode, or the umask's
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise write_failed(exc, path, what, hint) from None


def write_failed(exc: OSError, path: str | os.PathLike[str], what: str,
                 hint: str) -> GpuwiseError:
    """The one line for a write that failed (no space, no permission, a folder in the way)."""
    return _failed("cannot write", what, path, exc, hint)


@contextlib.contextmanager
def _open_regular(path: str | os.PathLike[str], what: str, max_bytes: int | None,
                  hint: str) -> Iterator[BinaryIO]:
    """The file opened for reading, once it is known to be a regular file (checked before
    opening, so a FIFO is never opened, and again on the open file)."""
    kind = file_type(path, what, hint)
    if kind is None:
        raise GpuwiseError(f"cannot read {what} {shown(path)}: no such file", hint)
    if kind != "file":
        raise GpuwiseError(f"{what} {shown(path)} is a {kind}, not a regular file", hint)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        raise _failed("cannot read", what, path, exc, hint) from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # swapped for something else in between
            raise GpuwiseError(f"{what} {shown(path)} is not a regular file", hint)
        if max_bytes is not None and info.st_size > max_bytes:
            raise _too_large(path, what, info.st_size, max_bytes, hint)
        yield f


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0o022)
        os.umask(umask)
        return 0o666 & ~umask


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def _make_folder(folder: Path, what: str, path: Path, hint: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise GpuwiseError(f"cannot write {what} {shown(path)}: {shown(folder)} is not a "
                           "directory", hint) from None
    except OSError as exc:
        raise write_failed(exc, path, what, hint) from None


def _too_large(path: str | os.PathLike[str], what: str, size: int, max_bytes: int,
               hint: str) -> GpuwiseError:
    return GpuwiseError(f"{what} {shown(path)} is {format_bytes(size)}, more than any real {what} "
                        f"(at most {format_bytes(max_bytes)})", hint)


def _failed(action: str, what: str, path: str | os.PathLike[str], exc: OSError,
            hint: str) -> GpuwiseError:
    reason = exc.strerror or type(exc).__name__
    return GpuwiseError(f"{action} {what} {shown(path)}: {reason}", hint)
