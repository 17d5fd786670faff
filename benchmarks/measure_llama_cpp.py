"""Real llama.cpp speeds on this CPU: random-weight llama models at three sizes, quantized by
llama.cpp, timed as llama-bench times them (run on demand, not in CI).

For each size (S: hidden 512, 8 layers, 8 heads / 4 KV heads, ffn 1408; M: 1024, 12, 16/4,
2816; L: 2048, 16, 16/8, 5632; vocab 32000, untied output head) the script writes an F16
GGUF with random weights, quantizes it to q8_0, q4_0 and q4_k_m with llama.cpp's own
quantizer, then times every (size, qtype, threads) with
`gpuwise.measure.llama_cpp.bench.time_llama_cpp`: a pp test (n_prompt random tokens decoded
in one batch into an empty KV cache) and a tg test (n_gen tokens decoded one at a time), one
warm-up each, then `--reps` timed repetitions; tokens/s averaged over them, with the stdev.
Every timing runs in its own fresh process.

Run:  .venv/bin/python benchmarks/measure_llama_cpp.py [--sizes S,M,L] [--quants q8_0,q4_0,q4_k_m]
      [--threads 1,2] [--n-prompt 256] [--n-gen 32] [--reps 5] [--flash-attn auto|on|off]
      [--models DIR] [--out FILE]

Models go to a temporary directory, or to `--models DIR`, where files already written (same
size and qtype) are reused. The results go to benchmarks/results/llama_cpp_cpu.json unless
`--out` names another file; the file is rewritten after every timing, so an interrupted run
keeps what it measured.

The default grid (3 sizes x 3 qtypes x threads 1, 2; pp256, tg32, 5 reps) took 2 min 41 s of
wall time on this machine (2 vCPUs of an AMD EPYC with AVX-512, llama-cpp-python 0.3.36),
writing and quantizing the models included (L's F16 file is 1.8 GB, written in 12 s with
under 300 MB resident). A timing during which other processes kept 5% or more of the CPUs
busy is made again (`--retries`): on 2 vCPUs one busy neighbour stalls the 2-thread runs
(an L q8_0 tg run fell from 46 to 6 tokens/s).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.llama_cpp.bench import tensor_bytes, time_llama_cpp
from gpuwise.measure.llama_cpp.gguf_model import (
    QTYPES,
    GgufConfig,
    qtype_key,
    quantize,
    write_random_gguf,
)

SIZES = {
    "S": GgufConfig(hidden=512, layers=8, heads=8, kv_heads=4, ffn=1408),
    "M": GgufConfig(hidden=1024, layers=12, heads=16, kv_heads=4, ffn=2816),
    "L": GgufConfig(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632),
}
DEFAULT_QUANTS = "q8_0,q4_0,q4_k_m"
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "llama_cpp_cpu.json"
FLASH_ATTN = {"auto": None, "on": True, "off": False}
# A run during which other processes used this share of the CPUs is made again (--retries).
BUSY_SHARE = 0.05
HEADER = (f"{'size':<5}{'qtype':<8}{'thr':>4}{'pp tok/s':>12}{'±':>8}{'tg tok/s':>11}{'±':>7}"
          f"{'file MB':>10}{'others':>8}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="S,M,L", help=f"of {','.join(SIZES)}")
    parser.add_argument("--quants", default=DEFAULT_QUANTS, help=f"of {','.join(QTYPES)}")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--n-prompt", type=int, default=256)
    parser.add_argument("--n-gen", type=int, default=32)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--retries", type=int, default=2,
                        help=f"times to rerun a timing that others disturbed (>= {BUSY_SHARE * 100:g}%% "
                             "of the CPUs busy)")
    parser.add_argument("--flash-attn", choices=list(FLASH_ATTN), default="auto")
    parser.add_argument("--models", type=Path, help="keep (and reuse) the model files here")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    args.sizes = [s.strip().upper() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown sizes {unknown}: choose from {','.join(SIZES)}")
    try:
        args.quants = [qtype_key(q) for q in args.quants.split(",") if q.strip()]
    except GpuwiseError as exc:
        parser.error(f"{exc.message} ({exc.hint})")
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    return args


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def prepare_models(folder: Path, size: str, quants: list[str]) -> tuple[dict, dict[str, Path]]:
    """The size's F16 file and its quantized copies (reused when already there), and the
    model's entry for the results: its config, file bytes and tensor bytes per qtype."""
    cfg = SIZES[size]
    f16 = folder / f"{size}-{cfg.name}-f16.gguf"
    started = time.perf_counter()
    if not f16.is_file():
        write_random_gguf(f16, cfg)
    paths: dict[str, Path] = {}
    for q in quants:
        dst = folder / f"{size}-{cfg.name}-{q}.gguf"
        paths[q] = dst if dst.is_file() else quantize(f16, dst, q)
    entry = {
        "size": size, "config": asdict(cfg), "params": cfg.params,
        "file_bytes": {q: p.stat().st_size for q, p in paths.items()},
        "tensor_bytes": {q: tensor_bytes(p) for q, p in paths.items()},
    }
    print(f"# {size} {cfg.name}: {cfg.params / 1e6:.1f} M params, files ready in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    return entry, paths


def row(size: str, qtype: str, rec: dict) -> str:
    def num(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return (f"{size:<5}{qtype:<8}{rec['threads']:>4}{num(rec['pp_tokens_per_s'], 1):>12}"
            f"{num(rec['pp_stdev'], 1):>8}{num(rec['tg_tokens_per_s'], 2):>11}"
            f"{num(rec['tg_stdev'], 2):>7}{rec['file_bytes'] / 1e6:>10.1f}"
            f"{num(100 * (rec['others_cpu_share'] or 0), 0) + '%':>8}")


def quiet_timing(path: Path, threads: int, args: argparse.Namespace) -> dict:
    """time_llama_cpp, made again (up to --retries times) while other processes kept
    BUSY_SHARE or more of the CPUs busy; the quietest run is kept, with the attempts made."""
    runs: list[dict] = []
    while len(runs) <= args.retries:
        runs.append(time_llama_cpp(path, threads=threads, n_prompt=args.n_prompt,
                                   n_gen=args.n_gen, reps=args.reps,
                                   flash_attn=FLASH_ATTN[args.flash_attn]))
        if (runs[-1]["others_cpu_share"] or 0.0) < BUSY_SHARE:
            break
    best = min(runs, key=lambda rec: rec["others_cpu_share"] or 0.0)
    return {**best, "attempts": len(runs)}


def about(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "what": "llama.cpp prompt processing (pp) and generation (tg) speeds of random-weight "
                "llama models on this CPU, for the llama.cpp time model",
        "how": "gpuwise.measure.llama_cpp: F16 GGUF written from the config, quantized by "
               "llama_model_quantize; llama-bench's loops (llama_decode of random tokens, pp in "
               "batches of n_batch, tg one token at a time, empty KV cache per repetition, one "
               "warm-up) in a fresh process per timing; tokens/s averaged over reps, stdev",
        "command": " ".join(["python benchmarks/measure_llama_cpp.py", *sys.argv[1:]]),
        "n_prompt": args.n_prompt, "n_gen": args.n_gen, "reps": args.reps,
        "flash_attn": args.flash_attn, "busy_share_retried": BUSY_SHARE,
        "retries": args.retries,
    }


def write_results(out: Path, results: dict) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(out.name + ".part")
    part.write_text(json.dumps(results, indent=1) + "\n")
    os.replace(part, out)


def run(args: argparse.Namespace, folder: Path) -> dict:
    started = time.perf_counter()
    results: dict[str, Any] = {"about": about(args),
                               "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
                               "date": datetime.now(UTC).isoformat(timespec="seconds"),
                               "models": {}, "runs": []}
    print(HEADER, flush=True)
    for size in args.sizes:
        entry, paths = prepare_models(folder, size, args.quants)
        results["models"][SIZES[size].name] = entry
        for qtype, path in paths.items():
            for threads in args.threads:
                rec = quiet_timing(path, threads, args)
                results["machine"]["llama_cpp_python"] = rec["llama_cpp_python"]
                results["machine"]["system_info"] = rec["system_info"]
                results["runs"].append({"size": size, "qtype": qtype, **rec})
                results["about"]["wall_s"] = round(time.perf_counter() - started, 1)
                write_results(args.out, results)
                print(row(size, qtype, rec), flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.models is not None:
            args.models.mkdir(parents=True, exist_ok=True)
            results = run(args, args.models)
        else:
            with tempfile.TemporaryDirectory(prefix="gpuwise-llama-") as tmp:
                results = run(args, Path(tmp))
    except GpuwiseError as exc:
        print(f"error: {exc.message}\n  {exc.hint}", file=sys.stderr)
        return 2
    print(f"# {len(results['runs'])} runs in {results['about']['wall_s']:.0f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
