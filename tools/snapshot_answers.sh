#!/usr/bin/env bash
# Every answer gpuwise gives for a fixed set of commands, one file each, so that a change that
# should move code and not answers can be checked: snapshot before, snapshot after, diff.
#   tools/snapshot_answers.sh /tmp/before; (change); tools/snapshot_answers.sh /tmp/after
#   diff -r -I ram_available /tmp/before /tmp/after      # nothing printed: the same answers
# `--on local` answers read this machine's saved probe: keep it unchanged in between.
# Run from the repository root after `make test` (module cases import tests/module_zoo.py).
out=${1:?usage: tools/snapshot_answers.sh OUT_DIR}; mkdir -p "$out"; G=".venv/bin/gpuwise"; i=0
run() { i=$((i+1)); printf '%s\n' "$*" > $out/$(printf %03d $i).cmd; PYTHONPATH=tests timeout 300 "$@" > $out/$(printf %03d $i).out 2>&1; echo "rc=$?" >> $out/$(printf %03d $i).out; }
run $G --json
run $G hardware --json
run $G models --json
for m in llama-3.1-8b qwen2.5-7b mixtral-8x7b deepseek-v2-lite gemma-2-9b gpt2; do
  for hw in h100 4090 l4; do run $G check $m --on $hw --json; done
done
run $G check llama-3.1-8b --on h100
run $G infer llama-3.1-8b --on h100 --json
run $G infer llama-3.1-8b --on h100 --ops --json
run $G infer llama-3.1-8b --on h100 --ops
run $G infer qwen2.5-7b --on l4 --batch 4 --prompt 4096 --new-tokens 512 --weights int4 --kv-dtype fp8 --attention sdpa --json
run $G infer qwen2.5-7b --on l4 --batch 4 --prompt 4096 --new-tokens 512 --weights int4 --kv-dtype fp8 --attention sdpa
run $G infer llama-3.1-8b --on h100 --runtime vllm --json
run $G infer llama-3.1-8b --on 4090 --runtime llama.cpp --ctx 8192 --json
run $G infer llama-3.1-70b --on h100 --gpus 4 --json
run $G infer mixtral-8x7b --on a100-80gb --batch 8 --json
run $G infer gemma-2-9b --on h100 --prompt 8192 --json
run $G train llama-3.1-8b --on a100-80gb --batch 4 --seq 2048 --dtype mixed-bf16 --optimizer adamw --finetune lora --checkpointing --json
run $G train llama-3.1-8b --on a100-80gb --batch 4 --seq 2048 --dtype mixed-bf16 --optimizer adamw --finetune lora --checkpointing
run $G train llama-3.1-70b --on h100 --gpus 8 --zero 3 --seq 4096 --json
run $G train gpt2 --on h100 --json
run $G train gpt2 --on h100 --ops --json
run $G train llama-3.1-8b --on h100 --finetune qlora --json
run $G train qwen2.5-7b --on h100 --optimizer sgd --json
run $G train qwen2.5-7b --on h100 --optimizer adafactor --batch 2 --json
for c in "infer smollm2-135m --batch 1 --prompt 256 --new-tokens 16 --weights fp32" \
         "infer smollm2-135m --batch 4 --prompt 128 --new-tokens 16 --weights bf16" \
         "infer qwen2.5-0.5b --batch 1 --prompt 512 --new-tokens 8 --weights bf16" \
         "infer gpt2 --batch 2 --prompt 256 --new-tokens 16 --weights fp32 --attention eager" \
         "infer pythia-160m --batch 1 --prompt 512 --new-tokens 16 --weights fp32" \
         "infer tinyllama-1.1b --batch 1 --prompt 128 --new-tokens 8 --weights bf16" \
         "train gpt2 --batch 2 --seq 256 --dtype fp32 --optimizer adamw" \
         "train smollm2-135m --batch 2 --seq 256 --dtype fp32 --optimizer adamw" \
         "train pythia-70m --batch 4 --seq 256 --dtype fp32 --optimizer sgd" \
         "train smollm2-135m --batch 2 --seq 256 --dtype mixed-bf16 --optimizer adamw" \
         "train smollm2-135m --batch 1 --seq 512 --dtype fp32 --optimizer adamw --checkpointing" \
         "train qwen2.5-0.5b --batch 1 --seq 128 --dtype bf16 --optimizer adamw" \
         "train gpt2 --batch 1 --seq 512 --dtype fp32 --optimizer adafactor --attention eager" \
         "infer qwen2.5-0.5b --batch 1 --prompt 1024 --new-tokens 8 --weights bf16"; do
  run $G $c --on local --json
  run $G $c --on local --ops --json
done
run $G module module_zoo:resnet18 --input 8x3x112x112 --json
run $G module module_zoo:resnet18 --input 8x3x112x112 --train --optimizer adamw --json
run $G module module_zoo:vit_small --input 4x3x224x224 --dtype bf16 --on h100 --json
run $G module module_zoo:bert_small --train --optimizer adafactor --json
run $G module module_zoo:resnet18 --input 8x3x112x112 --train --ops
run $G advise qwen2.5-7b --requests-per-day 100000 --prompt 512 --output 256 --latency-ms 50 --ttft-ms 1000 --api-price-per-mtok 0.2,0.6 --json
run $G advise qwen2.5-7b --requests-per-day 100000 --prompt 512 --output 256 --latency-ms 50 --ttft-ms 1000 --api-price-per-mtok 0.2,0.6
run $G advise qwen2.5-7b --train-tokens 2e8 --finetune lora --batch 4 --checkpointing --deadline-hours 8 --measured-util 30% --json
run $G advise smollm2-135m --requests-per-day 1000 --json
run $G cost qwen2.5-7b --on h100 --rent --requests-per-day 100000 --json
run $G cost qwen2.5-7b --on h100 --owned --requests-per-day 100000 --json
run $G cost qwen2.5-7b --on api --requests-per-day 100000 --json
run $G cost qwen2.5-7b --on h100 --reserved --requests-per-day 100000
run .venv/bin/python benchmarks/validate_published.py
run .venv/bin/python benchmarks/validate_gpu.py compare benchmarks/results/gpu_h200/gpu_measured.json
run $G check nonexist-model --on h100
run $G infer llama-3.1-8b --on h1000
