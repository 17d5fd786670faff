#!/usr/bin/env bash
# Install gpuwise as users install it and run every command from outside the source tree:
# the sdist is built, the wheel is built from the sdist (so both must carry every data file),
# and the wheel goes into a clean venv (no -e). Then torch (the CPU build, pinned) and the
# [torch] extra, for the commands that trace or run models. Any traceback fails the check.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$repo/.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A home of its own: nothing the smoke test runs reads or writes the user's real home or cache
# (pip keeps its own cache, so the wheels it fetched are not fetched again).
export PIP_CACHE_DIR="${PIP_CACHE_DIR:-$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")}"
export HOME="$work/home" XDG_CACHE_HOME="$work/home/.cache" GPUWISE_CACHE_DIR="$work/cache" HF_HUB_OFFLINE=1
mkdir -p "$HOME"

"$py" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }
sdist=$(ls "$work"/dist/gpuwise-*.tar.gz)
wheel=$(ls "$work"/dist/gpuwise-*.whl)
tar -tzf "$sdist" >"$work/sdist.txt"
unzip -l "$wheel" >"$work/wheel.txt"
for f in catalog/data/op_counts.json catalog/data/activation_profiles.json \
         catalog/data/hardware.toml catalog/data/models/gpt2.json; do
  grep -q "gpuwise/$f$" "$work/sdist.txt" || { echo "sdist lacks gpuwise/$f"; exit 1; }
  grep -q "gpuwise/$f$" "$work/wheel.txt" || { echo "wheel lacks gpuwise/$f"; exit 1; }
done

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q "$wheel"
cd "$work"  # never the source tree: everything must come from the installed package
G="$work/venv/bin/gpuwise"
failed=0

ok() {  # ok COMMAND...: exit 0 and no traceback
  if ! "$@" >"$work/out" 2>"$work/err" || grep -q Traceback "$work/err"; then
    echo "FAILED: $*"; tail -5 "$work/err"; failed=1
  else
    echo "ok: $*"
  fi
}

refused() {  # refused COMMAND...: one `error:` line and exit code 2, no traceback
  set +e; "$@" >"$work/out" 2>"$work/err"; code=$?; set -e
  if [ "$code" -ne 2 ] || ! grep -q "^error: " "$work/err" || grep -q Traceback "$work/err"; then
    echo "FAILED (expected exit 2 with error:): $*"; tail -5 "$work/err"; failed=1
  else
    echo "ok (refused): $*"
  fi
}

cat >"$work/smoke_model.py" <<'PY'
def build():
    import torch

    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 8))
PY
cat >"$work/job.py" <<'PY'
import time

for step in range(3):
    time.sleep(0.05)
print("loss=0.25")
PY

ok "$G" --version
ok "$G" --json
ok "$G" hardware --json
ok "$G" models --json
ok "$G" check llama-3.1-8b --on h100 --json
ok "$G" infer llama-3.1-8b --on h100 --ops
ok "$G" infer qwen2.5-7b --on l4 --weights int4 --kv-dtype fp8 --runtime vllm --json
ok "$G" infer llama-3.1-8b --on rtx-4090 --runtime llama.cpp --weights q4_k_m --json
ok "$G" check llama-3.1-8b --on h100 --runtime sglang
ok "$G" train llama-3.1-8b --on h100 --runtime compiled --json
ok "$G" serve llama-3.1-8b --on h100 --rate 8 --ttft-ms 500 --tpot-ms 40 --sweep --json
ok "$G" serve llama-3.1-8b --on rtx-4090 --runtime llama.cpp --weights q4_k_m --concurrency 2
ok "$G" train gpt2 --on h100 --json
ok "$G" train llama-3.1-8b --on a100-80gb --finetune lora --checkpointing --json
ok "$G" advise qwen2.5-7b --requests-per-day 100000 --prompt 512 --new-tokens 256 --json
ok "$G" cost qwen2.5-7b --on h100 --rent --requests-per-day 100000 --json
ok "$G" plan qwen2.5-1.5b --on t4,l4,rtx-4090 --rate 2 --tpot-ms 50 --ttft-ms 1000 --json
ok "$G" plan qwen2.5-1.5b --on t4 --runtime vllm --concurrency 8 --tpot-ms 50 --ttft-ms 300
refused "$G" plan qwen2.5-1.5b --on t4
ok "$G" watch --json --log "$work/watch.jsonl" -- "$work/venv/bin/python" job.py
ok "$G" watch --report "$work/watch.jsonl" --json
ok "$G" repro --runs 2 --conditions seeds --results "$work/repro.jsonl" \
   --metric 'loss=loss=([0-9.]+)' --json -- "$work/venv/bin/python" job.py
ok "$G" probe --quick --json
ok "$G" claims --only memory --json      # the wheel carries claims.toml and the experiments
refused "$G" module smoke_model:build --input 8x64      # torch not installed: said, not raised
refused "$G" infer no-such-model --on h100
refused "$G" infer llama-3.1-8b --on h1000
refused "$G" train llama-3.1-8b --on h100 --runtime llama.cpp   # serving runtimes do not train
refused "$G" infer llama-3.1-8b --on h100 --runtime vlm          # did you mean vllm
refused "$G" probe --runtime llama.cpp                           # llama-cpp-python not installed
refused "$G" serve llama-3.1-8b --on h100 --rate 5 --ttft-ms 1    # below one request's own TTFT
refused "$G" serve llama-3.1-8b --on h100 --trace /etc/hostname   # not JSON lines
refused "$G" check llama-3.1-8b --on h100 --html "$work/check.html"  # plotly not installed
refused "$G" watch --prometheus 127.0.0.1:0 -- "$work/venv/bin/python" job.py  # prometheus-client not installed

# With torch (the CPU build on this disk, pinned first so no extra pulls a CUDA build).
"$work/venv/bin/pip" install -q torch==2.13.0
"$work/venv/bin/pip" install -q "$wheel[torch,html,prometheus]"
ok "$G" watch --json --prometheus 127.0.0.1:0 --log "$work/watch-prometheus.jsonl" -- "$work/venv/bin/python" job.py
ok "$G" module smoke_model:build --input 8x64 --train --json
ok "$G" module smoke_model:build --input 8x64 --train --html "$work/module.html"
ok "$G" infer llama-3.1-8b --on h100 --html "$work/infer.html"
ok "$G" claims --only memory,energy --html "$work/claims.html"
head -1 "$work/infer.html" | grep -q '^<!DOCTYPE html><!-- gpuwise report -->$' \
  && echo "ok: the HTML report" || { echo "FAILED: the HTML report"; failed=1; }
ok "$G" probe --quick --json
ok "$G" validate infer smollm2-135m --prompt 32 --new-tokens 2 --weights fp32 --json
"$work/venv/bin/python" -c "import gpuwise, torch; e = gpuwise.from_module(torch.nn.Linear(8, 8), (4, 8)); assert e.memory.total_bytes > 0" \
  && echo "ok: gpuwise.from_module" || { echo "FAILED: gpuwise.from_module"; failed=1; }

# The [llama] extra as users install it (llama-cpp-python from the wheel .ci/llama_wheel.sh
# built, where PIP_FIND_LINKS names it); the probe itself runs in the tests.
if [ -n "${PIP_FIND_LINKS:-}" ]; then
  "$work/venv/bin/pip" install -q "$wheel[llama]"
  ok "$work/venv/bin/python" -c "import llama_cpp, gguf"
  ok "$G" probe --runtime llama.cpp --help
fi

exit "$failed"
