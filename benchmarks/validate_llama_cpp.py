"""llama.cpp's time model against real llama.cpp runs on this CPU, the way users get their
estimates (docs/speed.md, "llama.cpp on this CPU"): `gpuwise probe --runtime llama.cpp` saves
the probe in the cache, and each case's estimate is `gpuwise infer MODEL.gguf --runtime
llama.cpp --on local --threads T --json` on the case's own GGUF file, the command reading the
saved profile as it does for a user.

The cases (benchmarks/measure_llama_cpp.py: sizes S, M, L from ones that fit in the
last-level cache to ones 20x larger, f16, q8_0, q4_0 and q4_k_m, 1 thread and every core,
llama-bench's pp and tg, each its median repetition) are models the probe's rates were not
fitted to. By default all run here, the probe first; `--cache DIR` reuses a probe saved there
(a GPUWISE_CACHE_DIR), `--cases FILE` earlier timings (their GGUF files are written again into
`--models DIR` where missing: random weights from fixed seeds, the same bytes).

Run:  .venv/bin/python benchmarks/validate_llama_cpp.py [--quick] [--cache DIR] [--cases FILE]
        [--models DIR] [--out benchmarks/results/llama_cpp_time.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from measure_llama_cpp import prepare_models
from public_cli import gpuwise_json

ROOT = Path(__file__).resolve().parent
CASES = ROOT / "results" / "llama_cpp_cpu.json"
OUT = ROOT / "results" / "llama_cpp_time.json"


def probe_into(cache: Path, quick: bool) -> dict[str, Any]:
    """`gpuwise probe --runtime llama.cpp` as a user runs it, saved in `cache`; its answer."""
    os.environ["GPUWISE_CACHE_DIR"] = str(cache)
    answer = gpuwise_json("probe", "--runtime", "llama.cpp", *(["--quick"] if quick else []))
    if not answer["trusted"] or answer.get("llama_cpp") is None:
        raise SystemExit(f"the probe was not trusted: {answer.get('warnings') or answer['missing']}")
    return answer


def saved_probe(cache: Path) -> dict[str, Any]:
    """The profile a user's `--on local` reads from `cache` (for the record only)."""
    os.environ["GPUWISE_CACHE_DIR"] = str(cache)
    found = sorted(p for p in cache.glob("probe-*.json") if not p.stem.endswith("-rejected"))
    if not found:
        raise SystemExit(f"no saved probe in {cache}: run without --cache, or `gpuwise probe "
                         f"--runtime llama.cpp` with GPUWISE_CACHE_DIR={cache}")
    return json.loads(found[0].read_text())


def measure_cases(models: Path, threads: str) -> dict[str, Any]:
    """The cases measured now (measure_llama_cpp.py) at these thread counts ("1,2")."""
    subprocess.run([sys.executable, str(ROOT / "measure_llama_cpp.py"), "--quants",
                    "f16,q8_0,q4_0,q4_k_m", "--threads", threads, "--models", str(models),
                    "--out", str(CASES)], check=True)
    return json.loads(CASES.read_text())


def model_files(cases: dict[str, Any], models: Path) -> dict[tuple[str, str], Path]:
    """The GGUF file of each (size, qtype) the cases ran, written again where missing."""
    wanted: dict[str, set[str]] = {}
    for case in cases["runs"]:
        wanted.setdefault(case["size"], set()).add(case["qtype"])
    files = {}
    for size, quants in wanted.items():
        _, paths = prepare_models(models, size, sorted(quants))
        files |= {(size, q): p for q, p in paths.items()}
    return files


def estimate(path: Path, case: dict[str, Any]) -> tuple[float, float]:
    """(pp seconds, tg seconds a token) of the case from `gpuwise infer` on its file: the
    prompt alone, and n_gen tokens from an empty cache (llama-bench's two tests)."""
    common = ("infer", str(path), "--runtime", "llama.cpp", "--on", "local",
              "--threads", str(case["threads"]))
    pp = gpuwise_json(*common, "--prompt", str(case["n_prompt"]), "--new-tokens", "1")["time"]
    tg = gpuwise_json(*common, "--prompt", "1", "--new-tokens", str(case["n_gen"]))["time"]
    for t in (pp, tg):
        if t.get("missing_parts") or t["source"] != "measured":
            raise SystemExit(f"{path.name} on {case['threads']} threads: not from the probe: {t['rates']}")
    return pp["prefill_s"], tg["decode_s_per_token"]


def compare(cases: dict[str, Any], files: dict[tuple[str, str], Path]) -> list[dict[str, Any]]:
    rows = []
    for case in cases["runs"]:
        pp_est, tg_est = estimate(files[(case["size"], case["qtype"])], case)
        pp_s = statistics.median(case["pp_samples_s"])
        tg_s = statistics.median(case["tg_samples_s"]) / case["n_gen"]
        for phase, est, measured in (("prefill", pp_est, pp_s), ("decode", tg_est, tg_s)):
            rows.append({"size": case["size"], "qtype": case["qtype"], "threads": case["threads"],
                         "phase": phase, "estimated_s": est, "measured_s": measured,
                         "error": est / measured - 1})
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errs = [abs(r["error"]) for r in rows]
    by_phase = {p: statistics.median(abs(r["error"]) for r in rows if r["phase"] == p)
                for p in ("prefill", "decode")}
    return {"cases": len(rows), "median_abs_error": statistics.median(errs),
            "worst": max(rows, key=lambda r: abs(r["error"]))["error"],
            "median_abs_error_by_phase": by_phase}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="probe with --quick")
    parser.add_argument("--cache", type=Path, help="a GPUWISE_CACHE_DIR holding a saved probe")
    parser.add_argument("--cases", type=Path, help="a measure_llama_cpp.py result")
    parser.add_argument("--models", type=Path, help="the cases' GGUF files (kept here)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwise-validate-llama-") as tmp:
        models = args.models or Path(tmp) / "models"
        models.mkdir(parents=True, exist_ok=True)
        cache = args.cache or Path(tmp) / "cache"
        probe = saved_probe(cache) if args.cache else probe_into(cache, args.quick)
        # a quick probe times every core only: its cases are those it has rates for
        threads = str(os.cpu_count() or 1) if args.quick else f"1,{os.cpu_count() or 1}"
        cases = json.loads(args.cases.read_text()) if args.cases else measure_cases(models, threads)
        rows = compare(cases, model_files(cases, models))
    print(f"{'size':5s} {'type':7s} {'thr':>3s} {'phase':8s} {'estimated':>10s} "
          f"{'measured':>10s} {'error':>7s}")
    for r in rows:
        print(f"{r['size']:5s} {r['qtype']:7s} {r['threads']:3d} {r['phase']:8s} "
              f"{r['estimated_s'] * 1e3:8.2f}ms {r['measured_s'] * 1e3:8.2f}ms "
              f"{100 * r['error']:+6.1f}%")
    s = summary(rows)
    print(f"\n{len(rows)} cases: median |error| {100 * s['median_abs_error']:.1f}%, "
          f"worst {100 * s['worst']:+.1f}%")
    args.out.write_text(json.dumps({"about": __doc__.splitlines()[0],
                                    "probe": probe.get("llama_cpp"), "quick": probe.get("quick"),
                                    "machine": cases.get("machine"), "summary": s,
                                    "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
