"""A 512-token prompt step in llama.cpp's shared cache beside other sequences' cells, measured
in-process against what `gpuwise serve --runtime llama.cpp` charges for it (run on demand, not
in CI; docs/serve.md, "A step's time").

The served model of benchmarks/serve_llama_server.py (h1024 x 12, 16 heads, Q4_0; written by
serve_llama_cpp.py's `prepare_model` when missing) in a context as llama-server's defaults
make one: 4 x 4096 cells, 4 sequences, unified, n_ubatch 512, 2 threads, the logits of each
sequence's last token. Three sequences are filled first, in one of two layouts:
* contiguous: a 512-token prompt each, one after another (cells 0-1535);
* interleaved: a 128-token prompt each, then 384 decode steps of all three together, so
  their later cells alternate (as decoding slots' cells do in the server).
Then a fourth sequence's 512-token prompt is decoded, alone in the batch or after the three
sequences' next tokens (llama-server puts decode tokens first: one ubatch of 3 + 509, one of
3). Two more cases time decode steps, of one and of four sequences 64 tokens past their
512-token prompts. Each case is the median of 3 timed runs after a warm-up, the new positions removed before
each. The estimate places the same tokens with estimate/serve/cells.py and times each ubatch
with the rates of the llama.cpp probe stored with the latest llama-server run
(benchmarks/results/serve_llama_server.json, or `--probe FILE`). Since the probe ran at another
time and this machine's speed drifts, the comparison is of each case against the empty cache,
measured side by side: the ratios, to the mean of the empty cache's step timed first and last.

Run:  .venv/bin/python benchmarks/llama_cpp_shared_cells.py [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_llama_cpp import DEFAULT_MODELS, prepare_model  # noqa: E402
from validate_serve_llama_cpp import RESULTS, engine_for  # noqa: E402

from gpuwise.estimate.serve.cells import SharedCells  # noqa: E402
from gpuwise.estimate.serve.engine import Seq  # noqa: E402
from gpuwise.estimate.serve.simulate import _ubatch_work  # noqa: E402
from gpuwise.measure.llama_cpp.bench_child import _capture_log  # noqa: E402
from gpuwise.measure.llama_cpp.decode_child import _context  # noqa: E402
from gpuwise.measure.llama_cpp.probe import rates_from_timings  # noqa: E402
from gpuwise.workload.requests import Request  # noqa: E402

N_CTX, SEQS, PROMPT, THREADS, REPS, UBATCH = 16384, 4, 512, 2, 3, 512
THREE = [(0, 1), (1, 1), (2, 1)]  # the three sequences' next tokens, first in the batch
# (name, layout of the cache before, the timed batch as (sequence, tokens))
CASES = (("alone", "", [(3, PROMPT)]), ("contiguous", "contiguous", [(3, PROMPT)]),
         ("contiguous + 3 decoding", "contiguous", [*THREE, (3, PROMPT)]),
         ("interleaved", "interleaved", [(3, PROMPT)]),
         ("interleaved + 3 decoding", "interleaved", [*THREE, (3, PROMPT)]),
         ("decode step, 1 of 4 at 576", "decoding", [(0, 1)]),
         ("decode step, 4 at 576", "decoding", [*THREE, (3, 1)]),
         ("alone, again", "", [(3, PROMPT)]))


def _fill(layout: str) -> list[list[tuple[int, int]]]:
    """The batches that fill the cache first, as (sequence, tokens)."""
    if layout == "contiguous":
        return [[(s, PROMPT)] for s in range(3)]
    if layout == "interleaved":
        return [[(s, 128)] for s in range(3)] + [THREE] * 384
    if layout == "decoding":  # four slots past their prompts, 64 tokens into decoding
        return [[(s, PROMPT)] for s in range(4)] + [[*THREE, (3, 1)]] * 64
    return []


def measure(lc: Any, model: Any, layout: str, timed: list[tuple[int, int]]) -> float:
    """Seconds of the timed batch: the median of REPS runs after a warm-up."""
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    rng = random.Random(7)
    ctx = _context(lc, model, THREADS, N_CTX, SEQS)
    batch = lc.llama_batch_init(UBATCH, 0, SEQS)
    pos = [0] * SEQS

    def decode(work: list[tuple[int, int]]) -> None:
        items = [(s, pos[s] + i) for s, n in work for i in range(n)]
        last = {s: pos[s] + n - 1 for s, n in work}
        for start in range(0, len(items), UBATCH):  # llama_decode's split_simple, by hand
            part = items[start : start + UBATCH]
            for i, (s, p) in enumerate(part):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = rng.randrange(n_vocab), p, 1
                batch.seq_id[i][0], batch.logits[i] = s, p == last[s]
            batch.n_tokens = len(part)
            if lc.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")

    try:
        for work in _fill(layout):
            decode(work)
            for s, n in work:
                pos[s] += n
        memory, runs = lc.llama_get_memory(ctx), []
        for _ in range(REPS + 1):
            for s in range(SEQS):
                lc.llama_memory_seq_rm(memory, s, pos[s], -1)
            lc.llama_synchronize(ctx)
            start = time.perf_counter()
            decode(timed)
            lc.llama_synchronize(ctx)
            runs.append(time.perf_counter() - start)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
    return statistics.median(runs[1:])


def estimate(engine: Any, layout: str, timed: list[tuple[int, int]]) -> float:
    """The simulation's seconds for the timed batch, its tokens placed as cells.py places them."""
    cells = SharedCells(N_CTX, tiled=engine.tiled_attention)
    seqs = {s: Seq(s, Request(0.0, PROMPT, 128), PROMPT) for s in range(SEQS)}
    for s in range(SEQS):
        cells.start(s)
    for work in _fill(layout):
        cells.take(work)
    for s, n in (work for batch in _fill(layout) for work in batch):
        seqs[s].computed += n
    for s, n in timed:
        if n == 1:  # a decoding sequence: past its prompt
            seqs[s].target = 0
    done = dict.fromkeys(seqs, 0)
    return sum(sum(engine.step_parts(*_ubatch_work(engine, ub, seqs, done)))
               for ub in cells.take(timed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probe", type=Path, default=RESULTS / "serve_llama_server.json")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    run = json.loads(args.probe.read_text())
    probe = run["probe"]
    probe = {**probe, "rates": rates_from_timings(probe["timings"], probe.get("n_prompt", 256),
                                                  probe.get("n_gen", 32))}
    engine = engine_for(run, probe, PROMPT, 128)
    path, _ = prepare_model(DEFAULT_MODELS)
    import llama_cpp as lc

    _capture_log(lc)  # llama.cpp's log kept out of the table
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    rows = []
    try:
        for name, layout, timed in CASES:
            rows.append({"case": name, "measured_s": measure(lc, model, layout, timed),
                         "estimated_s": estimate(engine, layout, timed)})
    finally:
        lc.llama_model_free(model)
    # the empty cache's step before and after the rest: the machine's speed drifts meanwhile
    base = {k: (rows[0][k] + rows[-1][k]) / 2 for k in ("measured_s", "estimated_s")}
    print(f"{'case':28s} {'measured':>9s} {'estimated':>9s}   {'x alone':>7s} {'x alone':>7s}  error")
    for r in rows:
        r["measured_ratio"] = r["measured_s"] / base["measured_s"]
        r["estimated_ratio"] = r["estimated_s"] / base["estimated_s"]
        r["ratio_error"] = r["estimated_ratio"] / r["measured_ratio"] - 1
        print(f"{r['case']:28s} {1e3 * r['measured_s']:7.1f}ms {1e3 * r['estimated_s']:7.1f}ms   "
              f"{r['measured_ratio']:7.3f} {r['estimated_ratio']:7.3f} {100 * r['ratio_error']:+5.1f}%")
    if args.json:
        args.json.write_text(json.dumps({"about": __doc__.split("\n\n")[0], "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
