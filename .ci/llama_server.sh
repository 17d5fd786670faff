#!/usr/bin/env bash
# Build llama.cpp's own server, llama-server, from the llama.cpp sources that llama-cpp-python
# 0.3.36 vendors (its sdist on PyPI), for the one short real serving load the tests run
# (tests/test_serve_llama_server.py; benchmarks/serve_llama_server.py is the full one).
# Only the server target is built (about 2-3 minutes on 2 cores); the binary is cached. Built
# for this CPU without AMX, as the wheel is (.ci/llama_cmake_args.sh says why).
# Prints the binary's path on stdout, everything else goes to stderr.
set -euo pipefail
version=0.3.36
args="$(bash "$(dirname "$0")/llama_cmake_args.sh")"
key="$(printf '%s' "$version $args" | sha256sum | cut -c1-12)"
cache="${GPUWISE_CI_CACHE:-$HOME/.cache/gpuwise-ci}"
src="$cache/llama_cpp_python-$version/vendor/llama.cpp"
bin="$src/build-$key/bin/llama-server"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
    apt-get update -qq >&2 && apt-get install -y -qq cmake g++ >&2
  fi
  [ -x "$cache/venv/bin/pip" ] || python3 -m venv "$cache/venv" >&2
  if [ ! -d "$src" ]; then
    "$cache/venv/bin/pip" download -q --no-deps --no-binary :all: -d "$cache" \
      "llama-cpp-python==$version" >&2
    tar -xzf "$cache/llama_cpp_python-$version.tar.gz" -C "$cache"
  fi
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # shellcheck disable=SC2086  # the options are words
  cmake -S "$src" -B "$src/build-$key" "${generator[@]}" $args -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >&2
  cmake --build "$src/build-$key" --target llama-server -j "$(nproc)" >&2
fi
echo "$bin"
