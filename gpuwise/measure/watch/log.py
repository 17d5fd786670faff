"""Read watch logs (JSON lines) back: one file, or one per rank, merged."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.log_records import WatchLog, parse_records
from gpuwise.files import json_object, read_text, shown
from gpuwise.units import GIB

WHAT = "watch log"
# A day of 0.2 s samples and 20 ms steps is ~1.5 GB; a larger file is not read into memory.
MAX_LOG_BYTES = 4 * GIB
READ_HINT = "pass the path `gpuwise watch` printed (--log)"
# The records a log can start with: the sampler's header, or (before it, or without it) a
# step of the watched program, a note that the sampler did not start.
FIRST_KINDS = ("header", "step", "note", "sample")


def is_watch_log(first_line: bytes | str) -> bool:
    """Whether a file's first line is a record gpuwise watch (or gpuwise.watch()) writes."""
    record = json_object(first_line)
    if record is None or record.get("kind") not in FIRST_KINDS:
        return False
    if record["kind"] == "header":
        return str(record.get("format", "")).startswith("gpuwise-watch/")
    if record["kind"] == "step":
        return {"rank", "pid", "step_s"} <= record.keys()
    return "t" in record or "text" in record


def read_log(paths: Sequence[str | Path], allow_empty: bool = False) -> WatchLog:
    """Parse one or more logs; a line cut short by a kill is skipped. A file that is not a
    watch log (or is empty, unless `allow_empty`: a log just opened) is one GpuwiseError."""
    return parse_records(_records(paths, allow_empty))


def _records(paths: Sequence[str | Path], allow_empty: bool) -> Iterator[dict[str, Any]]:
    for path in paths:
        lines = read_text(path, WHAT, MAX_LOG_BYTES, READ_HINT).splitlines()
        if not lines and not allow_empty:
            raise GpuwiseError(f"{WHAT} {shown(path)} is empty", READ_HINT)
        if lines and not is_watch_log(lines[0]):
            raise GpuwiseError(f"{shown(path)} is not a gpuwise watch log (its first line is "
                               "not a watch record)", READ_HINT)
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a killed job may be partial
            if isinstance(record, dict):
                yield record


class LogTail:
    """New complete records appended to a log since the last call (for the live view)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def read_new(self, max_bytes: int = -1) -> list[dict[str, Any]]:
        """The complete records appended since the last call (from at most `max_bytes` of
        the file, when given: call again for the rest)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(max_bytes)
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        out = []
        for line in data[:end].splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out
