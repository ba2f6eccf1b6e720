#!/usr/bin/env bash
# Here, not on the GPU machine (which has no network): writes .llama-src/llama.cpp.tar.gz, the
# llama.cpp source that npm node-llama-cpp@3.22.1 bundles (v0.5.0, the interop tests' version), for
# tools/cuda/llama_bench.sh to build there (carry .llama-src). Kept out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
readonly SRC_PKG="node-llama-cpp@3.22.1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack "$SRC_PKG" --silent >/dev/null && tar xzf ./*.tgz package/llama/gitRelease.bundle)
git init -q --bare "$tmp/llama.git"
git --git-dir="$tmp/llama.git" fetch -q "$tmp/package/llama/gitRelease.bundle" HEAD
mkdir -p .llama-src
# The library, ggml and llama-bench's tree; the build turns the rest off (llama_bench.sh).
git --git-dir="$tmp/llama.git" archive FETCH_HEAD CMakeLists.txt cmake ggml src include common vendor tools \
  licenses LICENSE | gzip >.llama-src/llama.cpp.tar.gz
grep -qx "/.llama-src/" .git/info/exclude || echo "/.llama-src/" >>.git/info/exclude
ls -l .llama-src/llama.cpp.tar.gz
