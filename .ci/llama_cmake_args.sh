#!/usr/bin/env bash
# CMake options for building llama.cpp (llama-cpp-python's wheel, llama-server) for this CPU
# without AMX: GGML_NATIVE's -march=native turns AMX on wherever CPUID lists it, and a VM that
# lists AMX but does not enable its tile state (XTILEDATA; Firecracker guests of Sapphire
# Rapids hosts) dies with SIGILL at the first quantised matmul (tileloadd in
# ggml_backend_amx_mul_mat). Each x86 feature the CPU reports is named instead, AMX left out.
# Prints the options on one line.
set -euo pipefail
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
if [ "$(uname -m)" != x86_64 ] || [ "$flags" = "  " ]; then
  echo "-DGGML_NATIVE=ON"; exit 0
fi
args=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
has() { [[ "$flags" == *" $1 "* ]]; }
for pair in sse4_2:SSE42 avx:AVX avx2:AVX2 fma:FMA f16c:F16C bmi2:BMI2 avx_vnni:AVX_VNNI \
            avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16; do
  if has "${pair%%:*}"; then args+=("-DGGML_${pair##*:}=ON"); else args+=("-DGGML_${pair##*:}=OFF"); fi
done
echo "${args[*]}"
