#!/usr/bin/env bash
# On the GPU machine: the tree against a base commit in one call, as tools/cuda/NOTES.md's
# sessions measure a change (tools/cuda/devtree.sh BASE_REV here first; carry [".devtree"]; run
# from .devtree). Both are built at once, the tree with `ctest -L cuda`; the issue-7 model is
# written (Q8_0, routed gate/up Q4_K, --repeat-experts); both builds' greedy ids of a 300-token
# prompt are printed as md5 sums (a change that keeps every sum's order must keep them); then
# `regolith bench $BENCH` alternates between base and tree for ROUNDS rounds, and for the tree
# come per-kernel profiles of the prefill lengths in PROFILE and, with DEPTH=1, decode at depths
# 1K and 32K. With VARIANTS (environment settings of experiment switches, space-separated, e.g.
# "REGOLITH_XGEMV=0 REGOLITH_XGEMV=1"; commas join the settings of one variant, e.g.
# "REGOLITH_XA=1,REGOLITH_XB=1"), the tree alone is built and its ids and benches alternate between
# those settings instead (no base/ needed).
#   tools/cuda/device_paired.sh
#   env: ROUNDS (2), BENCH ("-p 2048,8192 -n 32 -r 2"), PROFILE ("2048"; "" for none), DEPTH (0),
#        VARIANTS ("")
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
t0=$(date +%s)
since() { echo "$(($(date +%s) - t0)) s"; }
variants=${VARIANTS:-}
if [ -z "$variants" ]; then
  [ -d base/tools/cuda ] || { echo "device_paired: no base/ (tools/cuda/devtree.sh BASE_REV)"; exit 1; }
  [ -d base/.deps ] || cp -r .deps base/
  (BUILD_ONLY=1 OUT=/tmp/base-out base/tools/cuda/device_check.sh /tmp/b0 >/tmp/base-build.txt 2>&1) &
fi
tools/cuda/device_check.sh /tmp/b -- --timeout 90 >"$out/check.txt" 2>&1
echo "tree: built, ctest -L cuda exit $? at $(since)"
grep -E "tests passed|tests failed|\(Failed\)|Timeout" "$out/check.txt"
wait
# Each run is "BUILD ENV...": the base and the tree, or the tree under each setting of VARIANTS.
runs=()
if [ -z "$variants" ]; then
  echo "base: $(tail -1 /tmp/base-build.txt)"
  [ -x /tmp/b0/regolith ] || { echo "device_paired: the base build failed"; exit 1; }
  runs=("b0" "b")
  echo "b0: the base, b: the tree"
else
  for v in $variants; do runs+=("b ${v//,/ }"); done
fi
[ -x /tmp/b/regolith ] || { echo "device_paired: the tree's build failed"; exit 1; }
model=/tmp/flash-next-64e-q4k.gguf
[ -f "$model" ] || /tmp/b/regolith mkmodel --preset flash-next --experts 64 --type q8_0 \
  --tensor-type expert_gate_up=q4_k --repeat-experts -o "$model" >"$out/mkmodel.txt" 2>&1
echo "model at $(since)"
# run_as "BUILD ENV..." ARGS...: regolith of BUILD with the environment settings ENV.
run_as() {
  local spec=($1)
  shift
  env "${spec[@]:1}" "/tmp/${spec[0]}/regolith" "$@"
}
for r in "${runs[@]}"; do
  echo "ids $r: $(run_as "$r" run -m "$model" --backend cuda --tokens "$(seq -s, 1 300)" --ids --ignore-eos \
    -n 40 --temp 0 2>/dev/null | md5sum)"
done
for round in $(seq "${ROUNDS:-2}"); do
  for r in "${runs[@]}"; do
    echo "== $r, round $round"
    # shellcheck disable=SC2086
    run_as "$r" bench -m "$model" --backend cuda ${BENCH:--p 2048,8192 -n 32 -r 2} 2>&1 | grep -E "^\| (pp|tg)"
  done
done
echo "benches at $(since)"
for p in ${PROFILE-2048}; do
  REGOLITH_CUDA_PROFILE=1 /tmp/b/regolith bench -m "$model" --backend cuda -p "$p" -n 0 -r 1 2>&1 |
    grep -A25 "multi-token calls, per op/kernel"
done
if [ "${DEPTH:-0}" = 1 ]; then
  /tmp/b/regolith bench -m "$model" --backend cuda -p 512 -n 128 -d 1024,32768 -r 1 --fill-chunk 4096 2>&1 |
    grep -E "^\| (pp|tg)"
fi
echo "done at $(since)"
rm -f "$out"/{configure.log,build.log,gpu.txt,parity.txt,cuda_vs_ref.txt}  # only a few files come back
