"""`gpuwise serve --runtime llama.cpp` against real serving on this CPU (docs/serve.md,
"Checked against real serving").

benchmarks/serve_llama_server.py drives llama.cpp's own server (`llama-server`, 4 slots with
continuous batching, its defaults) with a random-weight llama model at Poisson rates from
light load to past saturation and with 4 closed-loop clients, for two prompt/output mixes;
benchmarks/serve_llama_cpp.py does the same with llama-cpp-python's server (one request at a
time). This replays each point's recorded arrivals (a trace) through the simulation with the
rates the llama.cpp probe measured just before the load (the run's own `probe`; older runs:
benchmarks/results/llama_cpp_time.json), the server's slots, batch and logits settings, and
compares TTFT and TPOT (p50, p90) and the output tokens/s. Points the benchmark flagged
`disturbed` (other processes took over 5% of the CPUs) are reported apart. The run also timed
the served model's own prompt and generation just after the probe and before each point
(`reference`: pp512 and tg32; older runs: tg32 only, `reference_tg_s`); each point's label shows
the ratios, how far the machine's speed moved, and `--drift` simulates each point with the
probe's prompt-processing rates scaled by the first and the others by the second. A short
reading moves by about 10% on its own here, so the rates as probed are the default.

Run:  .venv/bin/python benchmarks/validate_serve_llama_cpp.py [--run RESULT] [--json OUT]
      [--drift]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from gpuwise.catalog.hardware import find_hardware
from gpuwise.estimate.serve.metrics import Slo, summary
from gpuwise.estimate.serve.replica import ReplicaOptions, build_engine
from gpuwise.estimate.serve.simulate import simulate
from gpuwise.estimate.speed.device_rates import rates_from_spec
from gpuwise.measure.llama_cpp.fit import llama_arch
from gpuwise.measure.llama_cpp.probe import rates_from_timings
from gpuwise.workload.plans import InferencePlan, StoredWeights
from gpuwise.workload.requests import Request

RESULTS = Path(__file__).resolve().parent / "results"
QUANTITIES = (("ttft_ms", "p50"), ("ttft_ms", "p90"), ("tpot_ms", "p50"), ("tpot_ms", "p90"))


def server_settings(run: dict) -> dict:
    """Slots, n_batch, logits and context of the server the run measured."""
    if run.get("server") == "llama-server":  # its defaults: tools/server/server.cpp
        ctx = run["server_settings"].get("n_ctx_slot", 4096)
        return {"slots": run["server_settings"]["slots"], "batch": 2048, "logits": "last",
                "context": ctx, "host": None, "token_host_s": token_host_s(run)}  # fmt: skip
    # llama-cpp-python: one request at a time, n_batch 512, logits_all; its own host costs
    # measured at no load against the same Llama object in-process (serve_llama_cpp.py)
    return {"slots": 1, "batch": 512, "logits": "all", "context": 2048,
            "host": (0.8e-3, 6.0e-3)}  # fmt: skip


def token_host_s(run: dict) -> float | None:
    """llama-server's own host work a streamed token, as the run measured it at no load: its
    token gaps (TPOT) less the same decode step in-process, the median over the mixes (None:
    an older run without the in-process step; schedulers.toml's then)."""
    gaps = [nl["tpot_ms"] / 1e3 - nl["in_process_step_s"] for nl in run.get("no_load", {}).values()
            if nl.get("in_process_step_s")]  # fmt: skip
    return max(0.0, statistics.median(gaps)) if gaps else None


def engine_for(run: dict, probe: dict, prompt: int, output: int) -> object:
    cfg, srv = run["model"]["config"], server_settings(run)
    arch = llama_arch(cfg["hidden"], cfg["layers"], cfg["heads"], cfg["kv_heads"], cfg["ffn"],
                      cfg["vocab"])  # fmt: skip
    embedding = cfg["vocab"] * cfg["hidden"] * 18 // 32  # token_embd in q4_0 blocks
    stored = StoredWeights(run["model"]["file_bytes"], embedding, "Q4_0 (gguf)", "q4_0")
    plan = InferencePlan(prompt_tokens=prompt, new_tokens=output, weights="fp16",
                         logits=srv["logits"], stored_weights=stored, runtime="llama.cpp",
                         threads=2, context_alloc=srv["context"])  # fmt: skip
    spec = rates_from_spec(find_hardware("cpu-cloud-32vcpu"))
    rates = replace(spec, compute_units=os.cpu_count() or 1, ggml_measured=probe["rates"],
                    source="measured")  # fmt: skip
    engine = build_engine(arch, plan, find_hardware("cpu-cloud-32vcpu"), rates,
                          ReplicaOptions(max_seqs=srv["slots"], max_batched_tokens=srv["batch"]))  # fmt: skip
    if srv["host"]:
        engine = replace(engine, token_host_s=srv["host"][0], request_host_s=srv["host"][1])
    if srv.get("token_host_s") is not None:
        engine = replace(engine, token_host_s=srv["token_host_s"])
    return engine


# The probe's fields by the phase they were fitted to: prompt processing's scale with the
# served model's prompt reading, the rest (generation, decode steps) with its generation's.
PROMPT_FIELDS = ("matmul_flops", "half_matmul_flops", "attention_flops", "layer_token_s",
                 "masked_head_s")  # fmt: skip


def drifted(rates: dict[str, dict[str, float]], slower: dict[str, float]) -> dict[str, dict[str, float]]:
    """The probe's rates on a machine `slower` times as slow ("pp_s" for prompt processing's
    fields, "tg_s" for the others): rates (per second, FLOPs a second) divided by it, costs
    in seconds multiplied."""

    def one(k: str, v: float) -> float:
        by = slower["pp_s" if k in PROMPT_FIELDS else "tg_s"]
        return v / by if k.endswith(("_per_s", "_flops")) else v * by

    return {key: {k: one(k, v) for k, v in r.items()} for key, r in rates.items()}


def slowdown(run: dict, point: dict) -> dict[str, float]:
    """The point's readings of the served model's speed against those just after the probe
    (1.0 where the run has none; older runs read generation only)."""
    before = run.get("reference") or {"tg_s": run.get("reference_tg_s")}
    now = point.get("reference") or {"tg_s": point.get("reference_tg_s")}
    out = {k: now[k] / before[k] if before.get(k) and now.get(k) else 1.0 for k in ("pp_s", "tg_s")}
    if "pp_s" not in before:
        out["pp_s"] = out["tg_s"]
    return out


def simulated(point: dict, engine: object) -> dict:
    closed = point["mode"] != "open"
    reqs = sorted((Request(0.0 if closed else r[0], point["prompt_tokens"],
                           r[5] or point["output_tokens"]) for r in point["records"]),
                  key=lambda r: r.arrival_s)  # fmt: skip
    clients = (point.get("concurrency") or 4) if closed else 0
    rec = summary(simulate(engine, reqs, clients), Slo())  # type: ignore[arg-type]
    return {"ttft_ms": {k: 1e3 * v for k, v in rec["ttft_s"].items()},
            "tpot_ms": {k: 1e3 * v for k, v in rec["tpot_s"].items()},
            "output_tokens_per_s": rec["output_tokens_per_s"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, default=RESULTS / "serve_llama_server.json")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--drift", action="store_true",
                        help="scale each point's rates by the machine's speed before it")  # fmt: skip
    args = parser.parse_args()
    run = json.loads(args.run.read_text())
    probe = run.get("probe") or json.loads((RESULTS / "llama_cpp_time.json").read_text())["probe"]
    if "timings" in probe:  # fitted again, so the comparison follows the current fit
        probe = {**probe, "rates": rates_from_timings(probe["timings"], probe.get("n_prompt", 256),
                                                      probe.get("n_gen", 32))}  # fmt: skip
    rows = []
    for point in run["points"]:
        slower = slowdown(run, point)
        at_point = {**probe, "rates": drifted(probe["rates"], slower)} if args.drift else probe
        moved = "" if set(slower.values()) == {1.0} else (
            f" x{slower['tg_s']:.2f}" if slower["pp_s"] == slower["tg_s"]
            else f" pp x{slower['pp_s']:.2f} tg x{slower['tg_s']:.2f}")  # fmt: skip
        engine = engine_for(run, at_point, point["prompt_tokens"], point["output_tokens"])
        sim, real = simulated(point, engine), point["summary"]
        label = (f"{point['mix']} {point['mode']} "
                 + (f"{point['rate']:.3g}/s" if point["mode"] == "open" else "4 clients")
                 + moved)  # fmt: skip
        for key, stat in QUANTITIES:
            rows.append({"point": label, "quantity": f"{key[:-3]} {stat}",
                         "measured": real[key][stat], "simulated": sim[key][stat],
                         "disturbed": bool(point.get("disturbed"))})  # fmt: skip
        rows.append({"point": label, "quantity": "output tokens/s",
                     "measured": real["output_tokens_per_s"],
                     "simulated": sim["output_tokens_per_s"],
                     "disturbed": bool(point.get("disturbed"))})  # fmt: skip
    print(f"{'point':38s} {'quantity':16s} {'measured':>10s} {'simulated':>10s} {'error':>7s}")
    for r in rows:
        r["error"] = r["simulated"] / r["measured"] - 1
        print(f"{r['point']:38s} {r['quantity']:16s} {r['measured']:10.1f} {r['simulated']:10.1f} "
              f"{100 * r['error']:+6.0f}%{'  (disturbed)' if r['disturbed'] else ''}")  # fmt: skip
    summaries = {}
    for name, subset in (("quiet points", [r for r in rows if not r["disturbed"]]),
                         ("all points", rows)):  # fmt: skip
        for q in sorted({r["quantity"].split()[0] for r in subset}):
            errs = [abs(r["error"]) for r in subset if r["quantity"].startswith(q)]
            summaries[f"{name}: {q}"] = {"n": len(errs), "median_abs_error": statistics.median(errs),
                                         "worst": max(errs)}  # fmt: skip
    print()
    for key, s in summaries.items():
        print(f"{key:28s} n {s['n']:3d}  median |error| {100 * s['median_abs_error']:5.1f}%  "
              f"worst {100 * s['worst']:5.0f}%")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summaries": summaries}, indent=1) + "\n")


if __name__ == "__main__":
    main()
