"""The results file: one JSON line per finished run, after a header line naming the study.

Each run is appended (and flushed to disk) as soon as it finishes, so an interrupted study keeps
every finished run; started again with the same command, it skips the (condition, index) pairs
that already succeeded and runs the rest. A header that names a different study is an error,
not a silent mix of two studies.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError

# The settings that must match for a resumed study to be the same study.
IDENTITY = ("command", "seed_flag", "base_seed", "metric_patterns")


class ResultsFile:
    """Append-only JSON lines; safe to append to from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def open_study(self, header: dict[str, Any], fresh: bool = False) -> list[dict[str, Any]]:
        """Check or write the header; return the runs already recorded (all, in file order)."""
        if fresh and self.path.exists():
            self.path.unlink()
        if not self.path.exists() or self.path.stat().st_size == 0:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._append({"kind": "study", **header})
            return []
        lines = self._read()
        old = next((rec for rec in lines if rec.get("kind") == "study"), None)
        if old is None:
            raise GpuwiseError(f"{self.path} is not a gpuwise repro results file",
                               "name another file with --results")  # fmt: skip
        differs = [k for k in IDENTITY if old.get(k) != header.get(k)]
        if differs:
            raise GpuwiseError(
                f"{self.path} holds another study (its {', '.join(differs)} differ)",
                "name a new file with --results, or start over with --fresh")  # fmt: skip
        return [rec for rec in lines if rec.get("kind") == "run"]

    def append_run(self, record: dict[str, Any]) -> None:
        self._append({"kind": "run", **record})

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        with self._lock, open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def _read(self) -> list[dict[str, Any]]:
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a study killed mid-write
            if isinstance(rec, dict):
                out.append(rec)
        return out


def completed(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The successful runs by (condition, index); the last record of a pair wins."""
    done = {}
    for rec in records:
        if rec.get("returncode") == 0:
            done[(str(rec["condition"]), int(rec["index"]))] = rec
    return done
