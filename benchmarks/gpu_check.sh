#!/usr/bin/env bash
# The GPU check, as one script for a lent GPU machine (its own python3 with torch, CUDA and
# transformers; gpuwise from this checkout): the probe, then the real runs of
# benchmarks/validate_gpu.py, then the CLI against the saved profile. Writes under $OUT (or
# ./gpu_out): probe.json, gpu_measured.json, log.txt, cli.txt, nvidia-smi.txt.
# Compare afterwards, anywhere:
#   .venv/bin/python benchmarks/validate_gpu.py compare OUT/gpu_measured.json --profile OUT/probe.json
# The latest H200 check's files are kept in benchmarks/results/gpu_h200/ (docs/speed.md).
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
gpuwise() { "$PY" -c 'import sys; from gpuwise.cli import main; sys.argv[0] = "gpuwise"; sys.exit(main())' "$@"; }
{
  date -u; nvidia-smi; nvidia-smi -q -d CLOCK | head -40
  "$PY" -c 'import torch, transformers, peft, typer, rich, psutil; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, typer.__version__)'
} >"$OUT/nvidia-smi.txt" 2>&1
timeout "${PROBE_S:-300}" "$PY" benchmarks/validate_gpu.py measure --no-runs --out "$OUT" 2>&1 | tee "$OUT/log.txt"
timeout "${RUNS_S:-330}" "$PY" benchmarks/validate_gpu.py measure --no-probe --out "$OUT" 2>&1 | tee -a "$OUT/log.txt"
{
  gpuwise infer llama-3.1-8b --batch 1 --prompt 1024 --new-tokens 32 --on local --ops
  gpuwise infer llama-3.1-8b --batch 1 --prompt 1024 --new-tokens 32 --on local --json
  gpuwise train llama-3.2-1b --batch 8 --seq 1024 --dtype mixed-bf16 --on local --ops
} >"$OUT/cli.txt" 2>&1
nvidia-smi -q -d CLOCK,TEMPERATURE,POWER | head -60 >>"$OUT/nvidia-smi.txt" 2>&1
echo "gpu_check done: $(date -u)"
