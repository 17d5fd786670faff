"""`gpuwise serve --runtime llama.cpp` against real serving on this CPU (docs/serve.md,
"Checked against real serving").

benchmarks/serve_llama_server.py drives llama.cpp's own server (`llama-server`, its slots
with continuous batching) with a random-weight llama model at Poisson rates from light load
to past saturation and with closed-loop clients, for two prompt/output mixes. This replays
each point through the command users run, in-process (benchmarks/public_cli.py):

    gpuwise serve MODEL.gguf --runtime llama.cpp --on local --threads T --max-seqs SLOTS
        --max-batched-tokens 2048 --ctx CTX --trace FILE [--concurrency N] --json

with GPUWISE_CACHE_DIR at the probe cache the run names (`probe.cache`: the profile `gpuwise
probe --runtime llama.cpp` saved just before the load) or `--cache`; a run that names none
(an older one) takes this machine's own cache, as users' commands do.
The trace holds the point's recorded requests (JSON lines of arrival_s, prompt_tokens,
output_tokens: the arrivals as sent, the lengths as drawn); a closed-loop point's requests
all arrive at 0 and are sent in order by its clients (`--concurrency`). The server's threads,
slots and context per slot are read from its start-up log (`server_settings`); n_batch is its
default, 2048. The model file is written again where missing (the run's size, fixed seeds:
the same bytes, checked against the run's). It compares TTFT and TPOT (p50, p90) and the
output tokens/s; points the benchmark flagged `disturbed` (other processes took over 5% of
the CPUs) are reported apart. Each point's label shows how far the machine's speed moved
since the probe (`pp xN.NN tg xN.NN`: the served model's own prompt and generation timed
in-process before the point, against the same just after the probe).

Through the command, the server's host work a token is schedulers.toml's, not the run's own
no-load reading; the earlier options that needed the simulation's internals are gone:
`--drift` (the probe's rates scaled by each point's speed readings) and the comparison with
llama-cpp-python's server (benchmarks/serve_llama_cpp.py: one slot, every prompt position's
logits and its own host costs, none of which `gpuwise serve` takes as options).

Run:  .venv/bin/python benchmarks/validate_serve_llama_cpp.py [--run RESULT] [--cache DIR]
      [--models DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from public_cli import gpuwise_json
from serve_llama_cpp import DEFAULT_MODELS
from serve_llama_server import cache_at, model_file

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
QUANTITIES = (("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"), ("tpot", "p90"))
N_BATCH = 2048  # llama-server's default n_batch (common/common.h)
CLIENTS = 4  # an older run's closed-loop clients, where the point does not say


def served_model(run: dict[str, Any], folder: Path) -> Path:
    """The run's GGUF, written again where missing, and checked to be the same size."""
    folder.mkdir(parents=True, exist_ok=True)
    path = model_file(folder, run["model"].get("size", "M"))
    if path.stat().st_size != run["model"]["file_bytes"]:
        raise SystemExit(f"{path}: {path.stat().st_size} bytes, the run served "
                         f"{run['model']['file_bytes']}")
    return path


def probe_cache(run: dict[str, Any], given: Path | None) -> Path | None:
    """The folder holding the run's probe profile: --cache, else the one the run names; None
    for an older run that names none (this machine's own cache, as users' commands find it)."""
    named = (run.get("probe") or {}).get("cache")
    if given is None and not named:
        return None
    cache = given or Path(named)
    return cache if cache.is_absolute() else REPO / cache


def trace_rows(point: dict[str, Any]) -> list[dict[str, float | int]]:
    """The point's requests as a trace: arrivals as sent (0 for a closed loop, whose clients
    send them in order), lengths as drawn (older runs: the mix's, the tokens received)."""
    closed = point["mode"] != "open"
    drawn = point.get("lengths") or [None] * len(point["records"])
    rows = []
    for rec, lengths in zip(point["records"], drawn, strict=True):
        prompt, output = lengths or (point["prompt_tokens"], rec[5] or point["output_tokens"])
        rows.append({"arrival_s": 0.0 if closed else rec[0], "prompt_tokens": prompt,
                     "output_tokens": output})
    return sorted(rows, key=lambda r: r["arrival_s"]) if not closed else rows


def write_trace(point: dict[str, Any], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in trace_rows(point)))
    return path


def serve_args(run: dict[str, Any], model: Path, point: dict[str, Any], trace: Path,
               on: str = "local") -> list[str]:
    """The `gpuwise serve` command line of one point, as a user would type it."""
    srv = run["server_settings"]
    args = ["serve", str(model), "--runtime", "llama.cpp", "--on", on,
            "--threads", str(srv["threads"]), "--max-seqs", str(srv["slots"]),
            "--max-batched-tokens", str(N_BATCH), "--ctx", str(srv.get("n_ctx_slot", 4096)),
            "--trace", str(trace)]
    if point["mode"] != "open":
        args += ["--concurrency", str(point.get("concurrency") or CLIENTS)]
    return args


def simulated(answer: dict[str, Any]) -> dict[str, Any]:
    """TTFT and TPOT percentiles (ms) and output tokens/s of a `serve --json` answer."""
    return {"ttft_ms": {k: 1e3 * v for k, v in answer["ttft_s"].items()},
            "tpot_ms": {k: 1e3 * v for k, v in answer["tpot_s"].items()},
            "output_tokens_per_s": answer["output_tokens_per_s"]}


def speed_moved(run: dict[str, Any], point: dict[str, Any]) -> str:
    """How far the served model's own speed moved between the probe and the point."""
    before = run.get("reference") or {"tg_s": run.get("reference_tg_s")}
    now = point.get("reference") or {"tg_s": point.get("reference_tg_s")}
    ratios = {k: now[k] / before[k] for k in ("pp_s", "tg_s") if before.get(k) and now.get(k)}
    return " ".join(f"{k[:2]} x{v:.2f}" for k, v in ratios.items())


def label(run: dict[str, Any], point: dict[str, Any]) -> str:
    load = (f"{point['rate']:.3g}/s" if point["mode"] == "open"
            else f"{point.get('concurrency') or CLIENTS} clients")
    return f"{point['mix']} {point['mode']} {load} {speed_moved(run, point)}".rstrip()


def point_rows(run: dict[str, Any], point: dict[str, Any], sim: dict[str, Any]) -> list[dict]:
    real, name = point["summary"], label(run, point)
    disturbed = bool(point.get("disturbed"))
    rows = [{"point": name, "quantity": f"{key} {stat}", "measured": real[f"{key}_ms"][stat],
             "simulated": sim[f"{key}_ms"][stat], "disturbed": disturbed}
            for key, stat in QUANTITIES]
    rows.append({"point": name, "quantity": "output tokens/s",
                 "measured": real["output_tokens_per_s"],
                 "simulated": sim["output_tokens_per_s"], "disturbed": disturbed})
    for r in rows:
        r["error"] = r["simulated"] / r["measured"] - 1
    return rows


def summarize(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Median and worst |error| per quantity (ttft, tpot, output), quiet points and all."""
    out = {}
    for name, subset in (("quiet points", [r for r in rows if not r["disturbed"]]),
                         ("all points", rows)):
        for q in sorted({r["quantity"].split()[0] for r in subset}):
            errs = [abs(r["error"]) for r in subset if r["quantity"].startswith(q)]
            out[f"{name}: {q}"] = {"n": len(errs), "median_abs_error": statistics.median(errs),
                                   "worst": max(errs)}
    return out


def print_table(rows: list[dict], summaries: dict[str, dict[str, float]]) -> None:
    print(f"{'point':38s} {'quantity':16s} {'measured':>10s} {'simulated':>10s} {'error':>7s}")
    for r in rows:
        print(f"{r['point']:38s} {r['quantity']:16s} {r['measured']:10.1f} {r['simulated']:10.1f} "
              f"{100 * r['error']:+6.0f}%{'  (disturbed)' if r['disturbed'] else ''}")
    print()
    for key, s in summaries.items():
        print(f"{key:28s} n {s['n']:3d}  median |error| {100 * s['median_abs_error']:5.1f}%  "
              f"worst {100 * s['worst']:5.0f}%")


def validate(run: dict[str, Any], model: Path, cache: Path | None, traces: Path,
             on: str = "local") -> list[dict]:
    """Every point of the run through `gpuwise serve`, its trace written to `traces`."""
    rows = []
    with cache_at(cache) if cache else contextlib.nullcontext():
        for i, point in enumerate(run["points"]):
            trace = write_trace(point, traces / f"point-{i:02d}.jsonl")
            answer = gpuwise_json(*serve_args(run, model, point, trace, on))
            rows += point_rows(run, point, simulated(answer))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RESULTS / "serve_llama_server.json")
    parser.add_argument("--cache", type=Path, help="the probe's GPUWISE_CACHE_DIR (default: "
                        "the run's probe.cache)")
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS,
                        help="where the run's GGUF is (written again if missing)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    run = json.loads(args.run.read_text())
    if run.get("server") != "llama-server":
        raise SystemExit(f"{args.run}: not a llama-server run (benchmarks/serve_llama_server.py)")
    cache = probe_cache(run, args.cache)
    model = served_model(run, args.models)
    with tempfile.TemporaryDirectory(prefix="gpuwise-traces-") as tmp:
        rows = validate(run, model, cache, Path(tmp))
    summaries = summarize(rows)
    print_table(rows, summaries)
    if args.json:
        args.json.write_text(json.dumps({"run": str(args.run), "probe_cache": str(cache) if cache else None,
                                         "rows": rows, "summaries": summaries},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
