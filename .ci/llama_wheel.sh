#!/usr/bin/env bash
# Build llama-cpp-python's wheel (the `gpuwise[llama]` extra's pin) once for this machine and
# keep it in the CI cache, so `pip install 'gpuwise[llama]'` takes it in seconds on the next
# run. Built for this CPU without AMX (.ci/llama_cmake_args.sh says why); about 10 minutes on
# 2 cores the first time. Prints the wheel's folder on stdout, everything else to stderr.
set -euo pipefail
version=0.3.36
here="$(cd "$(dirname "$0")" && pwd)"
args="$(bash "$here/llama_cmake_args.sh")"
key="$(printf '%s' "$version $args" | sha256sum | cut -c1-12)"
cache="${GPUWISE_CI_CACHE:-$HOME/.cache/gpuwise-ci}/llama-wheel-$key"
if ! ls "$cache"/llama_cpp_python-$version-*.whl >/dev/null 2>&1; then
  mkdir -p "$cache"
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    apt-get update -qq >&2 && apt-get install -y -qq cmake g++ >&2
  fi
  CMAKE_ARGS="$args" python3 -m pip wheel -q --no-cache-dir --no-deps -w "$cache" "llama-cpp-python==$version" >&2
fi
echo "$cache"
