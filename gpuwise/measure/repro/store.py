"""The results file: one JSON line per finished run, after a header line naming the study.

Each run is appended (and flushed to disk) as soon as it finishes, so an interrupted study keeps
every finished run; started again with the same command, it skips the (condition, index) pairs
that already succeeded and runs the rest. A header that names a different study is an error,
not a silent mix of two studies; a file whose first line is not a study header is never written
to (gpuwise.files.own_output), and --fresh replaces only a results file.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.files import (
    json_object,
    own_output,
    read_text,
    replace_atomically,
    shown,
    write_failed,
)
from gpuwise.units import GIB

WHAT = "repro results file"
HINT = "name another file with --results"
# Each run is a line of ~1-5 KB (its stderr tail included): a million runs fit.
MAX_RESULTS_BYTES = 4 * GIB
# The settings that must match for a resumed study to be the same study.
IDENTITY = ("command", "seed_flag", "base_seed", "metric_patterns")


def is_results_file(first_line: bytes | str) -> bool:
    """Whether a file's first line is the study header gpuwise repro writes."""
    record = json_object(first_line)
    return record is not None and record.get("kind") == "study" and "command" in record


class ResultsFile:
    """Append-only JSON lines; safe to append to from several threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def open_study(self, header: dict[str, Any], fresh: bool = False) -> list[dict[str, Any]]:
        """Check or write the header; return the runs already recorded (all, in file order).
        Only a new or empty file or a results file of gpuwise's is ever written to; `fresh`
        replaces such a file (atomically) with the header alone."""
        own_output(self.path, is_results_file, WHAT, HINT)
        if fresh or not self.path.exists() or self.path.stat().st_size == 0:
            study = json.dumps({"kind": "study", **header}) + "\n"
            replace_atomically(self.path, study.encode(), WHAT, HINT)
            return []
        lines = self._read()
        old = lines[0] if lines else {}
        differs = [k for k in IDENTITY if old.get(k) != header.get(k)]
        if differs:
            raise GpuwiseError(
                f"{shown(self.path)} holds another study (its {', '.join(differs)} differ)",
                "name a new file with --results, or start over with --fresh")
        return [rec for rec in lines if rec.get("kind") == "run"]

    def append_run(self, record: dict[str, Any]) -> None:
        self._append({"kind": "run", **record})

    def _append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record) + "\n"
        try:
            with self._lock, open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise write_failed(exc, self.path, WHAT, "free some space, or " + HINT) from None

    def _read(self) -> list[dict[str, Any]]:
        out = []
        for line in read_text(self.path, WHAT, MAX_RESULTS_BYTES, HINT).splitlines():
            rec = json_object(line)
            if rec is not None:  # None: the last line of a study killed mid-write
                out.append(rec)
        return out


def completed(records: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """The successful runs by (condition, index); the last record of a pair wins."""
    done = {}
    for rec in records:
        if rec.get("returncode") == 0:
            done[(str(rec["condition"]), int(rec["index"]))] = rec
    return done
