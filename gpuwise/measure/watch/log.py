"""Read watch logs (JSON lines) back: one file, or one per rank, merged."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.log_records import WatchLog, parse_records


def read_log(paths: Sequence[str | Path]) -> WatchLog:
    """Parse one or more logs; a line cut short by a kill is skipped."""
    return parse_records(_records(paths))


def _records(paths: Sequence[str | Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise GpuwiseError(f"cannot read watch log {path}: {exc.strerror}",
                               "pass the path `gpuwise watch` printed (--log)") from exc  # fmt: skip
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

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
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
