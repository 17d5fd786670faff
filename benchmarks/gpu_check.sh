#!/usr/bin/env bash
# The GPU check, as one script for a lent GPU machine (its own python3 with torch, CUDA and
# transformers; gpuwise from this checkout): the probe, then the real runs of
# benchmarks/validate_gpu.py, then the memory check of benchmarks/gpu_memory_check.py (issue 24),
# then the CLI against the saved profile. Writes under $OUT (or ./gpu_out): probe.json,
# gpu_measured.json, log.txt, gpu_memory.json, memory_log.txt, cli.txt, nvidia-smi.txt.
# STEPS picks steps (default all: "probe runs memory cli"); the four together run past 15
# minutes of device time, so e.g. STEPS=memory bash benchmarks/gpu_check.sh for the memory
# check alone (about 6 minutes).
# Compare afterwards, anywhere:
#   .venv/bin/python benchmarks/validate_gpu.py compare OUT/gpu_measured.json
#   .venv/bin/python benchmarks/gpu_memory_check.py compare OUT/gpu_memory.json --out OUT/memory_compare.json
# The latest H200 check's files are kept in benchmarks/results/gpu_h200/ (docs/speed.md).
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
STEPS=" ${STEPS:-probe runs memory cli} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
gpuwise() { "$PY" -c 'import sys; from gpuwise.cli import main; sys.argv[0] = "gpuwise"; sys.exit(main())' "$@"; }
{
  date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -40
  "$PY" -c 'import torch, transformers, peft, typer, rich, psutil; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, typer.__version__)'
} >"$OUT/nvidia-smi.txt" 2>&1
if want probe; then
  timeout "${PROBE_S:-300}" "$PY" benchmarks/validate_gpu.py measure --no-runs --out "$OUT" 2>&1 | tee "$OUT/log.txt"
fi
if want runs; then
  timeout "${RUNS_S:-330}" "$PY" benchmarks/validate_gpu.py measure --no-probe --out "$OUT" 2>&1 | tee -a "$OUT/log.txt"
fi
if want memory; then
  # --budget-s paces the cases and largest-batch searches; the timeout is the hard stop (the
  # JSON is written after every case and try, so a cut run keeps what it measured).
  timeout "${MEMORY_S:-420}" "$PY" benchmarks/gpu_memory_check.py measure --out "$OUT" \
    --budget-s "${MEMORY_BUDGET_S:-360}" 2>&1 | tee "$OUT/memory_log.txt"
fi
if want cli; then
  {
    gpuwise infer llama-3.1-8b --batch 1 --prompt 1024 --new-tokens 32 --on local --ops
    gpuwise infer llama-3.1-8b --batch 1 --prompt 1024 --new-tokens 32 --on local --json
    gpuwise train llama-3.2-1b --batch 8 --seq 1024 --dtype mixed-bf16 --on local --ops
  } >"$OUT/cli.txt" 2>&1
fi
nvidia-smi -q -d CLOCK,TEMPERATURE,POWER | head -60 >>"$OUT/nvidia-smi.txt" 2>&1
echo "gpu_check done: $(date -u)"
