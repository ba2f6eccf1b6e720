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
# build and its settings joined by commas: `tree`, `base` or the name of another tree under
# .devtree (e.g. `clean` for .devtree/clean), e.g. RUNS="base clean tree,REGOLITH_XA=1"; every
# tree a run names is built at once with the tree. CHECK=0 builds the tree without `ctest -L cuda`;
# with CHECK=1, `ctest -L cuda` of the tree also runs under each setting of the tree's runs (a
# failing setting's output comes back as ctest_SETTING.log), and a bench that prints no rows shows
# its last lines instead.
# SERVE (e.g. "1,4") then times `regolith serve` of every run with that many streams at once
# (tools/serve_bench.py: 128-token prompts, 128 tokens a stream, two rounds). SPEC (e.g. "1 3")
# writes the same model with an MTP block and times every run's speculative decode on it with that
# many drafts a round (`bench --draft K`: every draft kept, and none).
#   tools/cuda/device_paired.sh
# Past DEADLINE seconds (default 540: a device call ends at 600, and what it printed is lost with
# it) no further bench starts.
#   env: ROUNDS (2), BENCH ("-p 2048,8192 -n 32 -r 2"), PROFILE ("2048"; "" for none), DEPTH (0), DEADLINE (540),
#        VARIANTS (""), RUNS (""), CHECK (1), SERVE (""), SPEC ("")
source "$(dirname "$0")/run_env.sh"
cd "$(dirname "$0")/../.."
t0=$(date +%s)
since() { echo "$(($(date +%s) - t0)) s"; }
# Each run is "BUILD ENV...": the runs RUNS names, the tree under each setting of VARIANTS, or
# the base and the tree. Builds: b the tree, b0 base/, b_NAME the tree NAME/.
runs=()
if [ -n "${RUNS:-}" ]; then
  for r in $RUNS; do
    name=${r%%,*} settings=""
    [[ "$r" == *,* ]] && settings=${r#*,}
    case "$name" in
      tree) dir=b ;;
      base) dir=b0 ;;
      *) dir=b_$name ;;
    esac
    runs+=("$dir${settings:+ ${settings//,/ }}")
  done
elif [ -n "${VARIANTS:-}" ]; then
  for v in $VARIANTS; do runs+=("b ${v//,/ }"); done
else
  runs=("b0" "b")
  echo "b0: the base, b: the tree"
fi
# The other trees the runs read, built (regolith only) in the background beside the tree.
others=()
for r in "${runs[@]}"; do
  dir=${r%% *}
  [ "$dir" = b ] || [[ " ${others[*]} " == *" $dir "* ]] || others+=("$dir")
done
tree_of() { [ "$1" = b0 ] && echo base || echo "${1#b_}"; }
for dir in "${others[@]}"; do
  t=$(tree_of "$dir")
  [ -d "$t/tools/cuda" ] || { echo "device_paired: no $t/ (tools/cuda/devtree.sh BASE_REV writes base/)"; exit 1; }
  [ -d "$t/.deps" ] || cp -r .deps "$t/"
  (BUILD_ONLY=1 OUT="/tmp/$dir-out" "$t/tools/cuda/device_check.sh" "/tmp/$dir" >"/tmp/$dir-build.txt" 2>&1) &
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
for dir in "${others[@]}"; do
  echo "$(tree_of "$dir"): $(tail -1 "/tmp/$dir-build.txt")"
  [ -x "/tmp/$dir/regolith" ] || { echo "device_paired: the build of $(tree_of "$dir")/ failed"; exit 1; }
done
[ -x /tmp/b/regolith ] || { echo "device_paired: the tree's build failed"; exit 1; }
# The tree's tests under each switch setting its runs use (the switches' code is tested too).
if [ "${CHECK:-1}" != 0 ]; then
  for r in "${runs[@]}"; do
    spec=($r)
    [ "${spec[0]}" = b ] && [ ${#spec[@]} -gt 1 ] || continue
    log="$out/ctest_$(echo "${spec[*]:1}" | tr -c 'A-Za-z0-9\n' '_').log"
    env "${spec[@]:1}" ctest --test-dir /tmp/b -L cuda -j 8 --timeout 300 --output-on-failure >"$log" 2>&1
    status=$?
    echo "ctest -L cuda under ${spec[*]:1}: $(grep -E "tests passed|tests failed|\(Failed\)|Timeout" "$log")"
    [ "$status" != 0 ] || rm "$log"
  done
fi
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
late() { [ $(($(date +%s) - t0)) -gt "${DEADLINE:-540}" ] && echo "past DEADLINE at $(since): no more benches"; }
for round in $(seq "${ROUNDS:-2}"); do
  for r in "${runs[@]}"; do
    late && break 2
    echo "== $r, round $round"
    # Its rows, or its last lines where it printed none (an error).
    # shellcheck disable=SC2086
    rows=$(run_as "$r" bench -m "$model" --backend cuda ${BENCH:--p 2048,8192 -n 32 -r 2} 2>&1)
    grep -E "^\| (pp|tg)" <<<"$rows" || tail -2 <<<"$rows"
  done
done
echo "benches at $(since)"
for p in ${PROFILE-2048}; do
  late && break
  REGOLITH_CUDA_PROFILE=1 /tmp/b/regolith bench -m "$model" --backend cuda -p "$p" -n 0 -r 1 2>&1 |
    grep -A25 "multi-token calls, per op/kernel"
done
if [ "${DEPTH:-0}" = 1 ] && ! late; then
  /tmp/b/regolith bench -m "$model" --backend cuda -p 512 -n 128 -d 1024,32768 -r 1 --fill-chunk 4096 2>&1 |
    grep -E "^\| (pp|tg)"
fi
if [ -n "${SERVE:-}" ]; then
  for r in "${runs[@]}"; do
    late && break
    echo "== serve $r"
    spec=($r)
    env "${spec[@]:1}" python3 tools/serve_bench.py "/tmp/${spec[0]}/regolith" "$model" -k "$SERVE" -p 128 -n 128 -r 2 \
      -- --backend cuda 2>/dev/null | grep "^|"
  done
fi
if [ -n "${SPEC:-}" ] && ! late; then
  mtp_model=/tmp/flash-next-64e-q4k-mtp.gguf
  [ -f "$mtp_model" ] || /tmp/b/regolith mkmodel --preset flash-next --experts 64 --type q8_0 \
    --tensor-type expert_gate_up=q4_k --repeat-experts --mtp -o "$mtp_model" >"$out/mkmodel_mtp.txt" 2>&1
  for k in $SPEC; do
    for r in "${runs[@]}"; do
      late && break 2
      echo "== $r, speculative, $k drafts a round (at $(since))"
      run_as "$r" bench -m "$mtp_model" --backend cuda -p 0 -n 64 -r 2 --draft "$k" 2>&1 | grep -E "^\| tg|kept\)"
    done
  done
fi
echo "done at $(since)"
rm -f "$out"/{configure.log,build.log,gpu.txt,parity.txt,cuda_vs_ref.txt}  # only a few files come back
