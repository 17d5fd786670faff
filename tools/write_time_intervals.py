"""Write gpuwise/catalog/data/time_intervals.toml: the 80% interval every time estimate
carries, from the residuals of the validations (docs/speed.md, "How far to trust a time").

For each runtime, phase and rates source, the ratio measured time / estimated time of every
validation entry (for a rate, estimated / measured). The interval is the 10th to 90th
percentile of those ratios, read at the ranks p x (n + 1) of the n entries: a new case falls
between two such ranks of n exchangeable entries with probability 80%, where the usual
p x (n - 1) + 1 makes a band that holds for only 57% of new cases at 6 entries, 74% at 24. The
band is then widened to ratio 1 where the residuals are one-sided, so that an interval always
contains its own estimate (ratio 1 is the estimate itself), and its bounds are rounded outward.
A group with fewer than MIN_ENTRIES falls back to the runtime's entries of every phase, then to
every entry of that rates source.

Beside each interval: its in-sample coverage, and the held-out (leave-one-out) coverage,
each entry against the interval made from the others: how often it holds for a case it was
not made from. The header's held_out_coverage judges every entry by the interval that would
serve it (the narrowest group), made without it.

Inputs (the latest result of each benchmark):
  benchmarks/results/runtimes_published.json  validate_runtimes.py --json (datasheet, GPUs)
  benchmarks/results/cpu_time.json            validate_cpu.py (transformers, probed CPU)
  benchmarks/results/llama_cpp_time.json      validate_llama_cpp.py (llama.cpp, probed CPU)

Run:  .venv/bin/python tools/write_time_intervals.py [--check]
(it prints the held-out coverage of every group, the table of docs/speed.md)
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
DIGITS = 3  # of the written bounds

Row = tuple[str, str, str, float]  # runtime, phase, rates source, measured / estimated time
Key = tuple[str, str, str]  # runtime, phase, rates source; "any" where pooled


def _published() -> list[Row]:
    path = RESULTS / "runtimes_published.json"
    out = []
    for r in json.loads(path.read_text())["rows"] if path.exists() else []:
        est, pub = r["estimated"]["runtime"], r["published"]
        ratio = pub / est if r["quantity"] in TIME_QUANTITIES else est / pub
        out.append((r["model_runtime"], r["phase"], "spec", ratio))
    return out


def _cpu_time() -> list[Row]:
    path = RESULTS / "cpu_time.json"
    phase = {"prefill_s": "prefill", "decode_s_per_token": "decode", "step_s": "step"}
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return [("transformers", phase[r["quantity"]], r["source"], r["measured"] / r["estimated"])
            for r in rows]


def _llama_cpp() -> list[Row]:
    path = RESULTS / "llama_cpp_time.json"
    rows = json.loads(path.read_text())["rows"] if path.exists() else []
    return [("llama.cpp", r["phase"], "measured", r["measured_s"] / r["estimated_s"])
            for r in rows]


def _interval(ratios: list[float]) -> tuple[float, float]:
    """The 10th and 90th percentile of the ratios at ranks p x (n + 1), interpolated (and
    below 10 entries extrapolated) on a log scale, where a ratio of 2 and one of 0.5 are as
    far from 1; widened to contain 1, the estimate itself; rounded outward."""
    deciles = statistics.quantiles([math.log(r) for r in ratios], n=10, method="exclusive")
    low, high = min(math.exp(deciles[0]), 1.0), max(math.exp(deciles[-1]), 1.0)
    scale = 10**DIGITS
    return math.floor(low * scale) / scale, math.ceil(high * scale) / scale


def _keys(runtime: str, phase: str, source: str) -> tuple[Key, ...]:
    """The groups an entry belongs to, narrowest first (each once: an entry of phase "any"
    is in its runtime's pooled group once, not twice)."""
    return tuple(dict.fromkeys(((runtime, phase, source), (runtime, "any", source),
                                ("any", "any", source))))


def _groups(rows: list[Row]) -> dict[Key, list[float]]:
    groups: dict[Key, list[float]] = {}
    for runtime, phase, source, ratio in rows:
        for key in _keys(runtime, phase, source):
            groups.setdefault(key, []).append(ratio)
    return {k: v for k, v in groups.items() if len(v) >= MIN_ENTRIES or k[0] == "any"}


def _inside(ratio: float, others: list[float]) -> bool:
    low, high = _interval(others)
    return low <= ratio <= high


def held_out_by_group(rows: list[Row]) -> dict[Key, tuple[int, int]]:
    """For each entry's own (runtime, phase, source): (entries inside, entries), each entry
    against the interval that would serve it, made from the other entries."""
    out: dict[Key, tuple[int, int]] = {}
    for i, (runtime, phase, source, ratio) in enumerate(rows):
        others = _groups(rows[:i] + rows[i + 1 :])
        key = next(k for k in _keys(runtime, phase, source) if k in others)
        inside, total = out.get((runtime, phase, source), (0, 0))
        out[(runtime, phase, source)] = (inside + _inside(ratio, others[key]), total + 1)
    return out


def held_out(rows: list[Row]) -> float:
    """The share of entries inside the interval that would serve them, made without them."""
    counts = held_out_by_group(rows).values()
    return sum(i for i, _ in counts) / max(1, sum(n for _, n in counts))


def _group_held_out(ratios: list[float]) -> float:
    """The share of the group's entries inside the group's interval made from the others."""
    return sum(_inside(r, ratios[:i] + ratios[i + 1 :]) for i, r in enumerate(ratios)) / len(ratios)


def render(rows: list[Row]) -> str:
    lines = [f"# Written by tools/write_time_intervals.py on {date.today().isoformat()} from "
             f"{len(rows)} validation entries; do not edit.",
             "# low, high: measured / estimated time at the 10th and 90th percentile of the "
             "group's entries, widened to contain 1 (the estimate).",
             "# coverage: in-sample; held_out: each entry against the interval of the others.",
             "# held_out_coverage: each entry against the interval that would serve it, made "
             "without it.", f"held_out_coverage = {held_out(rows):.3f}", ""]
    for (runtime, phase, source), ratios in sorted(_groups(rows).items()):
        low, high = _interval(ratios)
        inside = sum(low <= r <= high for r in ratios) / len(ratios)
        lines += ["[[interval]]", f'runtime = "{runtime}"', f'phase = "{phase}"',
                  f'source = "{source}"', f"low = {low:.{DIGITS}f}", f"high = {high:.{DIGITS}f}",
                  f"entries = {len(ratios)}", f"coverage = {inside:.3f}",
                  f"held_out = {_group_held_out(ratios):.3f}", ""]
    return "\n".join(lines)


def coverage_table(rows: list[Row]) -> str:
    """The held-out coverage of each runtime, phase and source as a markdown table: the
    interval that serves it, and how often it held for an entry it was not made from."""
    groups, counts = _groups(rows), held_out_by_group(rows)
    lines = ["| runtime | phase | source | interval (measured / estimated) | entries | held out |",
             "|---|---|---|---|---:|---:|"]
    for (runtime, phase, source), (inside, n) in sorted(counts.items()):
        key = next(k for k in _keys(runtime, phase, source) if k in groups)
        low, high = _interval(groups[key])
        pooled = "" if key == (runtime, phase, source) else f" ({'/'.join(key)})"
        lines.append(f"| {runtime} | {phase} | {source} | {low:.2f}-{high:.2f}{pooled} | {n} "
                     f"| {inside}/{n} = {inside / n:.0%} |")
    inside, n = sum(i for i, _ in counts.values()), sum(n for _, n in counts.values())
    lines.append(f"| all | | | | {n} | {inside}/{n} = {inside / n:.0%} |")
    return "\n".join(lines)


def all_rows() -> list[Row]:
    return _published() + _cpu_time() + _llama_cpp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args()
    rows = all_rows()
    text = render(rows)
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        strip = [ln for ln in old.splitlines() if not ln.startswith("# Written")]
        if strip != [ln for ln in text.splitlines() if not ln.startswith("# Written")]:
            sys.exit(f"{OUT.name} is out of date: run tools/write_time_intervals.py")
        return
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(rows)} entries\n\n{coverage_table(rows)}")


if __name__ == "__main__":
    main()
