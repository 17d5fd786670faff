"""Write gpuwise/catalog/data/time_intervals.toml: the 80% interval every time estimate
carries, from the residuals of the validations (docs/speed.md, "How far to trust a time").

For each runtime, phase and rates source, the ratio measured time / estimated time of every
validation entry (for a rate, estimated / measured); the interval is its 10th to 90th
percentile, so that 80% of the entries' measurements fall inside it. A group with fewer than
MIN_ENTRIES falls back to the runtime's entries of every phase, then to every entry of that
rates source. The leave-one-out coverage (each entry against the interval of the others) is
written beside it: how often the interval holds for a case it was not made from.

Inputs (the latest result of each benchmark):
  benchmarks/results/runtimes_published.json  validate_runtimes.py --json (datasheet, GPUs)
  benchmarks/results/cpu_time.json            validate_cpu.py (transformers, probed CPU)
  benchmarks/results/llama_cpp_time.json      validate_llama_cpp.py (llama.cpp, probed CPU)

Run:  .venv/bin/python tools/write_time_intervals.py [--check]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "gpuwise" / "catalog" / "data" / "time_intervals.toml"
RESULTS = ROOT / "benchmarks" / "results"
MIN_ENTRIES = 5
TIME_QUANTITIES = ("tpot_ms", "e2e_latency_s")  # the others are rates


def _published() -> list[tuple[str, str, str, float]]:
    path = RESULTS / "runtimes_published.json"
    out = []
    for r in json.loads(path.read_text())["rows"] if path.exists() else []:
        est, pub = r["estimated"]["runtime"], r["published"]
        ratio = pub / est if r["quantity"] in TIME_QUANTITIES else est / pub
        out.append((r["model_runtime"], r["phase"], "spec", ratio))
    return out


def _cpu_time() -> list[tuple[str, str, str, float]]:
    path = RESULTS / "cpu_time.json"
    phase = {"prefill_s": "prefill", "decode_s_per_token": "decode", "step_s": "step"}
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return [("transformers", phase[r["quantity"]], r["source"], r["measured"] / r["estimated"])
            for r in rows]  # fmt: skip


def _llama_cpp() -> list[tuple[str, str, str, float]]:
    path = RESULTS / "llama_cpp_time.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return [("llama.cpp", r["phase"], "measured", r["measured_s"] / r["estimated_s"])
            for r in rows]  # fmt: skip


def _interval(ratios: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentile of the ratios, interpolated between entries on a log
    scale (a ratio of 2 and one of 0.5 are as far from 1)."""
    deciles = statistics.quantiles([math.log(r) for r in ratios], n=10, method="inclusive")
    return math.exp(deciles[0]), math.exp(deciles[-1])


def _groups(rows: list[tuple[str, str, str, float]]) -> dict[tuple[str, str, str], list[float]]:
    groups: dict[tuple[str, str, str], list[float]] = {}
    for runtime, phase, source, ratio in rows:
        for key in ((runtime, phase, source), (runtime, "any", source), ("any", "any", source)):
            groups.setdefault(key, []).append(ratio)
    return {k: v for k, v in groups.items() if len(v) >= MIN_ENTRIES or k[0] == "any"}


def _leave_one_out(rows: list[tuple[str, str, str, float]]) -> float:
    inside = 0
    for i, (runtime, phase, source, ratio) in enumerate(rows):
        others = _groups(rows[:i] + rows[i + 1 :])
        for key in ((runtime, phase, source), (runtime, "any", source), ("any", "any", source)):
            if key in others:
                low, high = _interval(others[key])
                inside += low <= ratio <= high
                break
    return inside / len(rows) if rows else 0.0


def render(rows: list[tuple[str, str, str, float]]) -> str:
    groups = _groups(rows)
    lines = [f"# Written by tools/write_time_intervals.py on {date.today().isoformat()} from "
             f"{len(rows)} validation entries; do not edit.",
             "# low, high: measured / estimated time at the 10th and 90th percentile of the "
             "group's entries.",
             f"# Leave-one-out coverage of the 80% interval: {_leave_one_out(rows):.0%}.", ""]  # fmt: skip
    for (runtime, phase, source), ratios in sorted(groups.items()):
        low, high = _interval(ratios)
        inside = sum(low <= r <= high for r in ratios) / len(ratios)
        lines += ["[[interval]]", f'runtime = "{runtime}"', f'phase = "{phase}"',
                  f'source = "{source}"', f"low = {low:.3f}", f"high = {high:.3f}",
                  f"entries = {len(ratios)}", f"coverage = {inside:.3f}", ""]  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args()
    rows = _published() + _cpu_time() + _llama_cpp()
    text = render(rows)
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        strip = [ln for ln in old.splitlines() if not ln.startswith("# Written")]
        if strip != [ln for ln in text.splitlines() if not ln.startswith("# Written")]:
            sys.exit(f"{OUT.name} is out of date: run tools/write_time_intervals.py")
        return
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(rows)} entries")


if __name__ == "__main__":
    main()
