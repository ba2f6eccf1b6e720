#!/usr/bin/env bash
# On the GPU machine (the device tool's `run`): configure and build regolith with the CUDA backend,
# run the tests labelled cuda (op parity against float64 and against ref, fixture parity against
# transformers), and print a short table. Full logs go to $OUT (or /tmp/regolith-cuda-out).
#   tools/cuda/device_check.sh [BUILD_DIR] [-- EXTRA_CTEST_ARGS...]   (BUILD_ONLY=1: build regolith, no tests)
# The GPU image lacks the PCRE2 and ICU development files the tokenizer needs: tools/cuda/fetch_deps.sh
# puts Debian's packages in .deps/ (carry it); they are unpacked under /tmp/deps, never into /.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/regolith-cuda-out}
build=${1:-/tmp/b}
mkdir -p "$out"
jobs=$(nproc)

if ! pkg-config --exists libpcre2-8 icu-uc 2>/dev/null; then
  if [ ! -d .deps ]; then
    echo "device_check: no PCRE2/ICU development files and no .deps/ (run tools/cuda/fetch_deps.sh, carry .deps)"
    exit 1
  fi
  mkdir -p /tmp/deps
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
  sed -i -E 's|^prefix *= *.*|prefix=/tmp/deps/usr|' /tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc
  export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  command -v pkg-config >/dev/null || export PATH=/tmp/deps/usr/bin:$PATH
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
t0=$(date +%s)
if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log"
  exit 1
fi
targets="regolith regolith_ops_tests regolith_engine_tests regolith_server_tests regolith_cuda_quant_selfcheck"
[ "${BUILD_ONLY:-0}" = 1 ] && targets=regolith
if ! ninja -C "$build" -j "$jobs" $targets >"$out/build.log" 2>&1; then
  grep -E -A12 "error|FAILED" "$out/build.log" | head -80
  exit 1
fi
t1=$(date +%s)
echo "build: $((t1 - t0)) s"
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
shift || true
[ "${1:-}" = "--" ] && shift
# A test that hangs (a device waiting for the host) fails after 300 s rather than holding the call.
ctest --test-dir "$build" -L cuda -j 8 -V --timeout 300 "$@" >"$out/ctest.log" 2>&1
rc=$?
t2=$(date +%s)
echo "ctest -L cuda: $((t2 - t1)) s, exit $rc"
grep -E "tests passed|tests failed|The following tests|Failed|\(Failed\)|Not Run|Skipped\)" "$out/ctest.log" | grep -v "^[0-9]*: \[" | head -40

# Worst error per op family (CudaVsRef) and per fixture / mode (Parity), from the -V log.
grep -o "\[cuda-vs-ref\].*" "$out/ctest.log" | sort >"$out/cuda_vs_ref.txt"
grep -o "\[parity\] cuda .*" "$out/ctest.log" >"$out/parity.txt"
echo "--- op parity, cuda vs ref (max rel err) ---"
awk '{for (i = 1; i <= NF; ++i) if ($i == "err") v = $(i + 1); if (!($2 in w) || v + 0 > w[$2] + 0) w[$2] = v}
     END {for (k in w) printf "  %-22s %s\n", k, w[k]}' "$out/cuda_vs_ref.txt" | sort
echo "--- fixture parity, cuda vs transformers (worst rel per fixture and mode; argmax mismatches) ---"
awk '{key = $3 " " $5; if (!(key in rel) || $9 > rel[key]) rel[key] = $9; mm[key] += $12}
     END {for (k in rel) printf "  %-22s rel %s  argmax mismatches %d\n", k, rel[k], mm[k]}' "$out/parity.txt" | sort
exit $rc
