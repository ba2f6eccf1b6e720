#!/usr/bin/env bash
# On the GPU machine: builds llama.cpp v0.5.0's llama-bench with CUDA for sm_90 from
# .llama-src/llama.cpp.tar.gz (tools/cuda/fetch_llama_src.sh here; carry .llama-src), then runs it
# on MODEL as issue 7's side-by-side asks: every layer on the GPU, flash attention on, prefill
# PROMPTS (default 2048,8192) and 128 decoded tokens at DEPTHS (default 0,32768). Logs and the
# table go to $OUT. BUILD_ONLY=1 stops after the build (NPROC jobs, default every core); a built
# llama-bench is reused.
#   tools/cuda/llama_bench.sh MODEL [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
model=${1:?usage: llama_bench.sh MODEL [BUILD_DIR]}
build=${2:-/tmp/llama-build}
out=${OUT:-/tmp/regolith-cuda-out}
mkdir -p "$build/src" "$out"
t0=$(date +%s)
if [ ! -x "$build/bin/llama-bench" ]; then
  tar xzf .llama-src/llama.cpp.tar.gz -C "$build/src" || exit 1
  if ! cmake -S "$build/src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >"$out/llama-configure.log" 2>&1; then
    tail -20 "$out/llama-configure.log"
    exit 1
  fi
  if ! ninja -C "$build" -j "${NPROC:-$(nproc)}" llama-bench >"$out/llama-build.log" 2>&1; then
    grep -E -A8 "error|FAILED" "$out/llama-build.log" | head -40
    exit 1
  fi
  echo "llama-bench built in $(($(date +%s) - t0)) s"
fi
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
"$build/bin/llama-bench" -m "$model" -ngl 99 -fa on -p "${PROMPTS:-2048,8192}" -n 128 -d "${DEPTHS:-0,32768}" \
  -r "${REPS:-3}" -o md | tee "$out/llama-bench.md"
