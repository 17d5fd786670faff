"""What one run reported: metrics from its output and from the API's report file."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from gpuwise.errors import GpuwiseError


@dataclass(frozen=True)
class ApiReport:
    """The calls a run made to gpuwise's API (gpuwise/measure/repro/program_api.py)."""

    metrics: dict[str, float] = field(default_factory=dict)
    params_hash: str | None = None
    steps: list[tuple[int, str]] = field(default_factory=list)
    deterministic_applied: bool | None = None  # None: seed_everything was not called


def parse_metric_patterns(specs: list[str]) -> dict[str, re.Pattern[str]]:
    """`NAME=REGEX` options: the metric is the regex's first group (or whole match), last match."""
    patterns = {}
    for spec in specs:
        name, sep, regex = spec.partition("=")
        if not sep or not name.strip() or not regex:
            raise GpuwiseError(f"--metric {spec!r} is not NAME=REGEX",
                               r"for example --metric 'val_loss=val loss ([0-9.eE+-]+)'")
        try:
            patterns[name.strip()] = re.compile(regex)
        except re.error as exc:
            raise GpuwiseError(
                f"--metric {name}: bad regex ({exc})", "use Python regex syntax"
            ) from exc
    return patterns


def _number(value: object) -> float | None:
    """A metric value: numbers, and the text forms of NaN and infinity the API writes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and value.strip().lower() in ("nan", "inf", "-inf"):
        return float(value)
    return None


def last_json_metrics(text: str) -> dict[str, float]:
    """The numeric top-level fields of the last line of `text` that is a JSON object."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not (line.startswith("{") and line.endswith("}")):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return {k: v for k, v in ((k, _number(v)) for k, v in obj.items()) if v is not None}
    return {}


def regex_metrics(text: str, patterns: dict[str, re.Pattern[str]]) -> dict[str, float]:
    """Each pattern's last match in `text`, as a number (matches that are not numbers are skipped)."""
    found = {}
    for name, pattern in patterns.items():
        for match in reversed(list(pattern.finditer(text))):
            raw = match.group(1) if pattern.groups else match.group(0)
            try:
                found[name] = float(raw)
                break
            except (TypeError, ValueError):
                continue
    return found


def read_api_report(path: Path) -> ApiReport:
    """Parse the API's report file; a missing file is an empty report."""
    if not path.exists():
        return ApiReport()
    metrics: dict[str, float] = {}
    params_hash, steps, applied = None, [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        kind = rec.get("kind")
        if kind == "metric" and (value := _number(rec.get("value"))) is not None:
            metrics[str(rec["name"])] = value
        elif kind == "params_hash":
            params_hash = str(rec["hash"])
        elif kind == "step":
            steps.append((int(rec["step"]), str(rec["hash"])))
        elif kind == "seed":
            applied = bool(rec.get("deterministic"))
    return ApiReport(metrics, params_hash, steps, applied)


def run_metrics(stdout: str, stderr: str, patterns: dict[str, re.Pattern[str]],
                api: ApiReport) -> dict[str, float]:
    """All metrics of a run: last JSON line of stdout, then regexes (stdout and stderr), then API.

    A later source wins for the same name. Non-finite values are kept here (the results file
    shows them); the analysis leaves them out of the statistics.
    """
    metrics = last_json_metrics(stdout)
    metrics.update(regex_metrics(stdout + "\n" + stderr, patterns))
    metrics.update(api.metrics)
    return metrics
