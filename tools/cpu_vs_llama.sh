#!/usr/bin/env bash
# The CPU backend beside llama.cpp's CPU build on the same GGUF files and threads: a whole prompt
# of 256 tokens and 48 tokens decoded one at a time, logits at every position in both programs
# (`regolith logits` and the interop peer's `llama_peer logits`, tests/interop/README.md). A
# program's evaluation time is its wall time less that of a 3-token prompt (loading the file, from
# the page cache: each program loads each file once untimed first), the median of ROUNDS rounds,
# the two programs alternating.
#   tools/cpu_vs_llama.sh BUILD_DIR FILE.gguf [FILE.gguf ...]
# Needs BUILD_DIR's interop cache (`ctest --test-dir BUILD_DIR -R interop.mkmodel` fetches and
# compiles it). env: THREADS (2), ROUNDS (3).
set -euo pipefail
build=${1:?usage: tools/cpu_vs_llama.sh BUILD_DIR FILE.gguf ...}
shift
peer_dir="$build/interop-cache/llama-v0.5.0"
[ -x "$peer_dir/llama_peer" ] || { echo "cpu_vs_llama: no $peer_dir/llama_peer (run ctest -R interop.mkmodel)"; exit 1; }
threads=${THREADS:-2} rounds=${ROUNDS:-3}

tokens() { python3 -c "print(','.join(str(100 + i * 37 % 30000) for i in range($1)))"; }
# elapsed BASE COMMAND...: the command's wall seconds less BASE, its output dropped.
elapsed() {
  local base=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1 || { echo "cpu_vs_llama: failed: $*" >&2; return 1; }
  t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0 - $base)"
}
regolith() { elapsed "$1" "$build/regolith" logits -m "$file" --tokens "$2" "${@:3}" --backend cpu -t "$threads" --out /tmp/cpu_vs_llama.f32; }
llama() {
  elapsed "$1" "$peer_dir/llama_peer" logits -m "$file" --tokens "$2" "${@:3}" --threads "$threads" --kv-f16 \
    --backend-dir "$peer_dir/bins" --out /tmp/cpu_vs_llama.f32
}
median() { python3 -c "import statistics, sys; print(f'{statistics.median(map(float, sys.argv[1:])):.2f}')" "$@"; }
# row TEST REGOLITH_TIMES LLAMA_TIMES: a table row of the medians of the two arrays (by name).
row() {
  local -n regolith_s=$2 llama_s=$3
  local r l
  r=$(median "${regolith_s[@]}") l=$(median "${llama_s[@]}")
  echo "| $(basename "$file") | $1 | $r | $l | $(python3 -c "print(f'{$l / $r:.2f}×')") |"
}

short=$(tokens 3) prompt=$(tokens 256) steps=$(tokens 48)
echo "| file | test | regolith s | llama.cpp s | llama.cpp / regolith |"
echo "|---|---|---:|---:|---:|"
for file in "$@"; do
  rp=() lp=() rd=() ld=()
  # Untimed first loads: a round's 3-token load time is subtracted from its others, so the file
  # must be in the page cache for all of them (a cold first load made a round's decode 0.15 s).
  regolith 0 "$short" >/dev/null
  llama 0 "$short" >/dev/null
  for _ in $(seq "$rounds"); do
    r0=$(regolith 0 "$short")
    l0=$(llama 0 "$short")
    t=$(regolith "$r0" "$prompt")
    rp+=("$t")
    t=$(llama "$l0" "$prompt")
    lp+=("$t")
    t=$(regolith "$r0" "$steps" --decode)
    rd+=("$t")
    t=$(llama "$l0" "$steps" --chunk 1)
    ld+=("$t")
  done
  row "256-token prompt" rp lp
  row "48 tokens decoded" rd ld
done
