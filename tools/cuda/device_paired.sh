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
# those settings instead (no base/ needed). RUNS names the runs outright, space-separated, each a
# build and its settings joined by commas: `tree`, `base` or one of TREES (more trees under
# .devtree, e.g. `TREES=clean` for .devtree/clean, all built at once with the tree), e.g.
# RUNS="base clean tree,REGOLITH_XA=1". CHECK=0 builds the tree without running `ctest -L cuda`.
#   tools/cuda/device_paired.sh
#   env: ROUNDS (2), BENCH ("-p 2048,8192 -n 32 -r 2"), PROFILE ("2048"; "" for none), DEPTH (0),
#        VARIANTS (""), RUNS (""), TREES (""), CHECK (1)
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
t0=$(date +%s)
since() { echo "$(($(date +%s) - t0)) s"; }
variants=${VARIANTS:-}
named_runs=${RUNS:-}
# Other trees to build (BUILD_ONLY, in the background): "NAME DIR" pairs; base/ builds to /tmp/b0.
others=()
if { [ -z "$variants" ] && [ -z "$named_runs" ]; } || [[ " ${named_runs//,/ } " == *" base "* ]]; then
  [ -d base/tools/cuda ] || { echo "device_paired: no base/ (tools/cuda/devtree.sh BASE_REV)"; exit 1; }
  others+=("base b0")
fi
for t in ${TREES:-}; do
  [ -d "$t/tools/cuda" ] || { echo "device_paired: no $t/ tree"; exit 1; }
  others+=("$t b_$t")
done
for o in "${others[@]}"; do
  set -- $o
  [ -d "$1/.deps" ] || cp -r .deps "$1/"
  (BUILD_ONLY=1 OUT="/tmp/$2-out" "$1/tools/cuda/device_check.sh" "/tmp/$2" >"/tmp/$2-build.txt" 2>&1) &
done
if [ "${CHECK:-1}" = 0 ]; then
  BUILD_ONLY=1 tools/cuda/device_check.sh /tmp/b >"$out/check.txt" 2>&1
  echo "tree: built (no tests) at $(since)"
else
  tools/cuda/device_check.sh /tmp/b -- --timeout 90 >"$out/check.txt" 2>&1
  echo "tree: built, ctest -L cuda exit $? at $(since)"
  grep -E "tests passed|tests failed|\(Failed\)|Timeout" "$out/check.txt"
fi
wait
for o in "${others[@]}"; do
  set -- $o
  echo "$1: $(tail -1 "/tmp/$2-build.txt")"
  [ -x "/tmp/$2/regolith" ] || { echo "device_paired: the build of $1/ failed"; exit 1; }
done
# Each run is "BUILD ENV...": the runs RUNS names, the tree under each setting of VARIANTS, or
# the base and the tree.
runs=()
if [ -n "$named_runs" ]; then
  for r in $named_runs; do
    name=${r%%,*} settings=""
    [[ "$r" == *,* ]] && settings=${r#*,}
    case "$name" in
      tree) dir=b ;;
      base) dir=b0 ;;
      *) dir=b_$name ;;
    esac
    runs+=("$dir${settings:+ ${settings//,/ }}")
  done
elif [ -n "$variants" ]; then
  for v in $variants; do runs+=("b ${v//,/ }"); done
else
  runs=("b0" "b")
  echo "b0: the base, b: the tree"
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
