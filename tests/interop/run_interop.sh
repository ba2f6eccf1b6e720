#!/usr/bin/env bash
# llama.cpp interoperability tests (see README.md here). Registered with CTest by CMakeLists.txt.
#
#   run_interop.sh MODE --regolith BIN --tool BIN --cxx CXX --source-dir DIR --fixtures DIR
#                       --cache DIR --work DIR
#   run_interop.sh peer --cxx CXX --source-dir DIR --cache DIR -- logits -m FILE.gguf --tokens 1,2,3 --out FILE.f32
#
# MODE
#   setup        fetch llama.cpp v0.5.0 (npm) into the cache and compile the peer program
#   mkmodel      `regolith mkmodel --preset tiny` (f32, q8_0) -> llama.cpp loads it, finite logits
#   fixtures     every tests/data/fixtures/*/hf -> `regolith convert` (checkpoint type, f32, q8_0)
#                -> llama.cpp loads it, finite logits; on the f32 file, llama.cpp's logits equal the
#                transformers reference on every row inside the QSA budget
#   vs-regolith  `regolith logits` vs llama.cpp on the same GGUF, prompts inside the QSA budget
#                (skipped while regolith has no `logits` subcommand)
#   quantized    llama.cpp's own quantizer on each fixture's f32 conversion, QUANT_TYPES with and
#                without an importance matrix (`regolith imatrix`): (a) regolith's logits on
#                llama.cpp's file agree with llama.cpp's within llama.cpp's own quantized - f32
#                difference (RMS over every position); (b) `regolith quantize --types-from` that
#                file has the same per-tensor types and a mean KL against the f32 file no larger
#                than llama.cpp's file's (paired per position, within two standard errors)
#   peer         run the peer with the arguments after `--` (dump llama.cpp's logits by hand)
#
# Exit codes: 0 pass, 1 fail, 77 skip (npm/registry/git unreachable, wrong platform, nothing to test).
set -euo pipefail

readonly BIN_PKG="@node-llama-cpp/linux-x64@3.22.1"   # libllama.v0.5.0.so, libggml*.so
readonly SRC_PKG="node-llama-cpp@3.22.1"               # package/llama/gitRelease.bundle: the same llama.cpp source
readonly LLAMA_TAG="v0.5.0"
readonly REL_TOL="1e-3"                                # method.md: max|d| <= 1e-3 * max|logit|, same argmax
readonly QUANT_TYPES=(q8_0 q4_0 q4_k_m q6_k iq4_nl iq4_xs)  # llama_ftype names (llama_peer quantize)
# One thread: the models are tiny, and ggml's spinning thread pool slows to seconds per token when
# its threads outnumber free cores (2-core CI running tests in parallel).
THREADS="${REGOLITH_INTEROP_THREADS:-1}"

mode="${1:-}"; shift || true
regolith="" tool="" cxx="${CXX:-c++}" source_dir="" fixtures="" cache="" work=""
peer_args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --regolith) regolith="$2"; shift 2 ;;
    --tool) tool="$2"; shift 2 ;;
    --cxx) cxx="$2"; shift 2 ;;
    --source-dir) source_dir="$2"; shift 2 ;;
    --fixtures) fixtures="$2"; shift 2 ;;
    --cache) cache="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --) shift; peer_args=("$@"); break ;;
    *) echo "run_interop.sh: unknown argument $1" >&2; exit 1 ;;
  esac
done
[[ -n "$mode" && -n "$cache" && -n "$source_dir" ]] || { echo "run_interop.sh: MODE, --cache and --source-dir are required" >&2; exit 1; }

mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1fs", b - a }'; }

llama_dir="$cache/llama-$LLAMA_TAG"     # bins/ (the shipped .so files), include/, llama_peer
peer="$llama_dir/llama_peer"

# Downloads and unpacks llama.cpp's libraries and headers once per cache (under a lock, so tests
# running in parallel share one download), then compiles the peer program when its source changed.
ensure_peer() {
  [[ "$(uname -s)" == Linux && "$(uname -m)" == x86_64 ]] ||
    skip "the npm package $BIN_PKG ships linux-x64 libraries; this is $(uname -s)/$(uname -m)"
  mkdir -p "$cache"
  if command -v flock >/dev/null; then
    exec 9>"$cache/.lock"
    flock 9
  fi
  local t0; t0=$(now)
  if [[ ! -f "$llama_dir/bins/libllama.$LLAMA_TAG.so" || ! -f "$llama_dir/include/llama.h" ]]; then
    command -v npm >/dev/null || skip "npm is not installed (it fetches $BIN_PKG)"
    command -v git >/dev/null || skip "git is not installed (it reads the llama.cpp headers from the $SRC_PKG bundle)"
    local dl="$cache/download"
    rm -rf "$dl" "$llama_dir"
    mkdir -p "$dl/bin" "$dl/src" "$llama_dir/include"
    local npm_opts=(--cache "$cache/npm-cache" --fetch-retries 1 --fetch-timeout 60000 --loglevel error --no-fund --no-audit)
    echo "fetching $BIN_PKG and $SRC_PKG with npm pack"
    (cd "$dl/bin" && npm pack "$BIN_PKG" "${npm_opts[@]}" >/dev/null) ||
      skip "npm pack $BIN_PKG failed (registry unreachable?)"
    (cd "$dl/src" && npm pack "$SRC_PKG" "${npm_opts[@]}" >/dev/null) ||
      skip "npm pack $SRC_PKG failed (registry unreachable?)"
    tar xzf "$dl"/bin/*.tgz -C "$dl/bin" package/bins/linux-x64
    mv "$dl/bin/package/bins/linux-x64" "$llama_dir/bins"
    tar xzf "$dl"/src/*.tgz -C "$dl/src" package/llama/gitRelease.bundle
    # Only the public headers are needed: fetch the bundle into a bare repository and archive
    # include/ and ggml/include/ from it (no checkout of the whole tree).
    git init -q --bare "$dl/llama.git"
    git --git-dir="$dl/llama.git" fetch -q "$dl/src/package/llama/gitRelease.bundle" HEAD
    git --git-dir="$dl/llama.git" rev-parse FETCH_HEAD >"$dl/llama-commit"
    mkdir -p "$dl/hdr"
    git --git-dir="$dl/llama.git" archive FETCH_HEAD include ggml/include | tar x -C "$dl/hdr"
    [[ -f "$llama_dir/bins/libllama.$LLAMA_TAG.so" && -f "$dl/hdr/include/llama.h" && -f "$dl/hdr/ggml/include/ggml-backend.h" ]] ||
      fail "the npm packages did not contain libllama.$LLAMA_TAG.so, llama.h and ggml-backend.h where expected"
    cp "$dl/llama-commit" "$llama_dir/llama-commit"
    cp "$dl"/hdr/ggml/include/*.h "$llama_dir/include/"
    cp "$dl"/hdr/include/*.h "$llama_dir/include/"   # llama.h last: its presence marks a complete unpack
    rm -rf "$dl"
    echo "llama.cpp $LLAMA_TAG (source commit $(cat "$llama_dir/llama-commit")) unpacked in $(since "$t0")"
  fi
  local src="$source_dir/llama_peer.cpp"
  if [[ ! -x "$peer" || "$src" -nt "$peer" || "${BASH_SOURCE[0]}" -nt "$peer" ]]; then
    local b="$llama_dir/bins"
    "$cxx" -std=c++17 -O2 -Wall -Wextra -I"$llama_dir/include" "$src" -o "$peer.tmp" \
      "$b/libllama.$LLAMA_TAG.so" "$b/libggml.$LLAMA_TAG.so" "$b/libggml-base.so" -Wl,-rpath,'$ORIGIN/bins' ||
      fail "could not compile $src against the llama.cpp $LLAMA_TAG headers"
    mv "$peer.tmp" "$peer"
  fi
  if command -v flock >/dev/null; then flock -u 9; fi
}

# llama_peer logits with the CPU backends of the package; extra arguments are passed through.
run_peer() { "$peer" logits --backend-dir "$llama_dir/bins" --threads "$THREADS" "$@"; }

# Reads `regolith_interop_tool info FILE` into the globals vocab, eos, budget, unsupported.
# `regolith convert` of the fixture checkpoint HF_DIR to F32 at OUT, then read_info; returns 1 (with
# a note) when the file is outside what llama.cpp can run.
convert_f32() {
  "$regolith" convert "$1" -o "$2" --outtype f32 >/dev/null 2>&1 || fail "regolith convert $1 --outtype f32"
  read_info "$2"
  if [[ "$unsupported" != "-" ]]; then
    echo "NOTE: $(basename "$(dirname "$1")") is outside llama.cpp $LLAMA_TAG: $unsupported (skipped)"
    return 1
  fi
}

read_info() {
  local out; out=$("$tool" info "$1") || fail "regolith_interop_tool info $1"
  vocab=$(awk '$1 == "vocab" { print $2 }' <<<"$out")
  eos=$(awk '$1 == "eos" { print $2 }' <<<"$out")
  budget=$(awk '$1 == "qsa_budget" { print $2 }' <<<"$out")
  unsupported=$(sed -n 's/^llama_unsupported //p' <<<"$out")
}

# N deterministic token ids below the vocabulary, with the PLE cut token (EOS) at position 5.
make_tokens() {
  local n="$1" v="$2" e="$3" i out=""
  for ((i = 0; i < n; i++)); do
    local t=$(((7 + 31 * i) % v))
    ((i == 5 && e >= 0 && e < v)) && t=$e
    out+="${out:+,}$t"
  done
  echo "$out"
}

first_tokens() { tr ',' '\n' <<<"$2" | head -n "$1" | paste -sd, -; }

# N pseudo-random token ids below V (an LCG seeded with SEED): space-separated on one line, or
# comma-separated lines of PER_LINE ids when PER_LINE is given.
lcg_tokens() {
  awk -v n="$1" -v v="$2" -v x="$3" -v per="${4:-0}" 'BEGIN {
    for (i = 1; i <= n; i++) {
      x = (x * 1103515245 + 12345) % 2147483648
      printf "%d%s", int(x / 65536) % v, per ? (i % per ? "," : "\n") : (i < n ? " " : "\n")
    }
  }'
}

# Runs the peer on FILE with TOKENS; writes OUT; fails unless llama.cpp loads it and every logit is finite.
expect_finite() {
  local file="$1" tokens="$2" out="$3" t0 rc=0 json
  shift 3
  t0=$(now)
  json=$(run_peer -m "$file" --tokens "$tokens" --out "$out" "$@") || rc=$?
  echo "$json" | sed 's/^/    /'
  case $rc in
    0) echo "  ok: llama.cpp loaded $(basename "$file"), $(tr ',' '\n' <<<"$tokens" | wc -l) positions, all logits finite ($(since "$t0"))" ;;
    2) fail "llama.cpp refused $(basename "$file") (its message is above)" ;;
    3) fail "llama.cpp produced non-finite logits for $(basename "$file")" ;;
    *) fail "llama_peer exited with $rc on $(basename "$file")" ;;
  esac
}

compare() {  # REF OTHER VOCAB [ROWS] ; fails when they differ beyond the tolerance
  local rows=()
  [[ -n "${4:-}" ]] && rows=(--rows "$4")
  local line rc=0
  line=$("$tool" compare "$1" "$2" --vocab "$3" --rel-tol "$REL_TOL" "${rows[@]}" 2>&1) || rc=$?
  echo "$line" | sed 's/^/    /'
  ((rc == 0)) || fail "$(basename "$2") differs from $(basename "$1") beyond $REL_TOL * max|logit| (or in argmax)"
}

need_build_args() {
  [[ -x "$regolith" && -x "$tool" && -n "$work" ]] || fail "--regolith, --tool and --work are required (regolith: '$regolith')"
  rm -rf "$work"
  mkdir -p "$work"
}

mode_mkmodel() {
  need_build_args
  for type in f32 q8_0; do
    local f="$work/tiny-$type.gguf" t0; t0=$(now)
    "$regolith" mkmodel --preset tiny --type "$type" -o "$f" >/dev/null || fail "regolith mkmodel --type $type"
    read_info "$f"
    [[ "$unsupported" == "-" ]] || fail "mkmodel's tiny preset is outside what llama.cpp $LLAMA_TAG runs: $unsupported"
    # Longer than the QSA budget, so llama.cpp's top-k selection really runs (finiteness only).
    local tokens; tokens=$(make_tokens $((budget + 13)) "$vocab" "$eos")
    echo "mkmodel tiny $type (made in $(since "$t0")): vocab $vocab, QSA budget $budget, tokens $tokens"
    expect_finite "$f" "$tokens" "$work/tiny-$type.whole.f32"
    # The peer's token-by-token path agrees with its whole-prompt path (llama.cpp with itself).
    expect_finite "$f" "$tokens" "$work/tiny-$type.decode.f32" --chunk 1
    compare "$work/tiny-$type.whole.f32" "$work/tiny-$type.decode.f32" "$vocab"
    if [[ "$type" == q8_0 ]]; then
      # Information only: llama.cpp's default "extra" weight buffers (AMX / repacked matmuls) on
      # this CPU. v0.5.0's AMX Q8_0 kernels (Sapphire Rapids and later) give wrong logits for
      # batches of 32+ tokens on this model, which is why the peer leaves them off by default.
      local rc=0
      run_peer -m "$f" --tokens "$tokens" --out "$work/tiny-$type.extra.f32" --extra-bufts >/dev/null || rc=$?
      if ((rc == 0)) && ! "$tool" compare "$work/tiny-$type.decode.f32" "$work/tiny-$type.extra.f32" --vocab "$vocab" >/dev/null 2>&1; then
        echo "  NOTE: with llama.cpp's extra buffer types (AMX/repack) this CPU's Q8_0 whole-prompt logits differ:"
        "$tool" compare "$work/tiny-$type.decode.f32" "$work/tiny-$type.extra.f32" --vocab "$vocab" 2>/dev/null | sed 's/^/    /' || true
      fi
    fi
  done
  echo "PASS: llama.cpp $LLAMA_TAG loads regolith mkmodel GGUFs and produces finite logits"
}

mode_fixtures() {
  need_build_args
  shopt -s nullglob
  local dirs=("$fixtures"/*/hf)
  ((${#dirs[@]} > 0)) || skip "no fixture checkpoints under $fixtures/*/hf yet"
  local n_ok=0 notes=()
  for hf in "${dirs[@]}"; do
    local name; name=$(basename "$(dirname "$hf")")
    local ref="$(dirname "$hf")/reference.safetensors"
    echo "== fixture $name"
    local variants=(native f32 q8_0)
    for v in "${variants[@]}"; do
      local opt=() t0; t0=$(now)
      [[ "$v" != native ]] && opt=(--outtype "$v")
      "$regolith" convert "$hf" -o "$work/$name-$v.gguf" "${opt[@]}" >"$work/$name-$v.convert.log" 2>&1 ||
        { cat "$work/$name-$v.convert.log"; fail "regolith convert $hf ${opt[*]}"; }
      echo "  converted ($v) in $(since "$t0")"
    done
    read_info "$work/$name-f32.gguf"
    if [[ "$unsupported" != "-" ]]; then
      # A valid qwen4exp GGUF of a geometry llama.cpp cannot run: confirm that llama.cpp refuses it
      # (so the diagnosis stays true), and say so loudly instead of failing on it.
      local rc=0
      run_peer -m "$work/$name-f32.gguf" --tokens 1,2,3 >/dev/null 2>"$work/$name.refusal.log" || rc=$?
      sed 's/^/    /' "$work/$name.refusal.log"
      if ((rc == 2)); then
        notes+=("$name: outside llama.cpp $LLAMA_TAG: $unsupported (llama.cpp refuses it, as expected)")
        echo "  NOT TESTABLE WITH llama.cpp: $unsupported"
        continue
      fi
      fail "$name: expected llama.cpp to refuse it ($unsupported), but the peer exited with $rc"
    fi
    local prompts=()
    if [[ -f "$ref" ]]; then
      mapfile -t prompts < <("$tool" prompts "$ref")
    else
      prompts=("synthetic $((budget + 5)) $(make_tokens $((budget + 5)) "$vocab" "$eos")")
    fi
    for v in "${variants[@]}"; do
      for p in "${prompts[@]}"; do
        read -r pname plen ptokens <<<"$p"
        echo "  $name-$v $pname ($plen tokens)"
        expect_finite "$work/$name-$v.gguf" "$ptokens" "$work/$name-$v.$pname.f32"
        if [[ "$v" == f32 && -f "$ref" ]]; then
          # Rows inside the QSA budget: llama.cpp's selection equals the reference (method.md),
          # so llama.cpp on our converted file must match transformers there.
          local rows=$((plen < budget ? plen : budget))
          "$tool" ref-logits "$ref" "$pname" "$rows" "$work/$name.$pname.ref.f32"
          echo "    vs transformers reference, first $rows rows (QSA budget $budget):"
          compare "$work/$name.$pname.ref.f32" "$work/$name-$v.$pname.f32" "$vocab" "$rows"
        fi
      done
    done
    n_ok=$((n_ok + 1))
  done
  for n in "${notes[@]}"; do echo "NOTE: $n"; done
  ((n_ok > 0)) || skip "no fixture is inside llama.cpp $LLAMA_TAG's supported geometry"
  echo "PASS: $n_ok fixture(s) convert to GGUFs that llama.cpp $LLAMA_TAG loads, with finite logits equal to the reference inside the QSA budget"
}

mode_vs_regolith() {
  need_build_args
  local help
  # (CLI11 answers `regolith UNKNOWN --help` with the top-level help, so look for the options.)
  help=$("$regolith" logits --help 2>&1) || true
  grep -q -- "--tokens" <<<"$help" && grep -q -- "--out" <<<"$help" ||
    skip "this regolith has no 'logits' subcommand (with --tokens and --out) yet: nothing to compare with llama.cpp"
  ensure_peer
  local modes=(whole)
  grep -q -- "--decode" <<<"$help" && modes+=(decode)
  grep -q -- "--chunk" <<<"$help" && modes+=(chunk3)
  # (file, token list) pairs; every list fits the file's QSA budget.
  local cases=()
  "$regolith" mkmodel --preset tiny --type f32 -o "$work/tiny-f32.gguf" >/dev/null || fail "regolith mkmodel"
  read_info "$work/tiny-f32.gguf"
  cases+=("$work/tiny-f32.gguf synthetic $(make_tokens "$budget" "$vocab" "$eos")")
  shopt -s nullglob
  for hf in "$fixtures"/*/hf; do
    local name; name=$(basename "$(dirname "$hf")")
    local f="$work/$name-f32.gguf" ref; ref="$(dirname "$hf")/reference.safetensors"
    convert_f32 "$hf" "$f" || continue
    if [[ -f "$ref" ]]; then
      while read -r pname plen ptokens; do
        cases+=("$f $pname $(first_tokens "$budget" "$ptokens")")
      done < <("$tool" prompts "$ref")
    else
      cases+=("$f synthetic $(make_tokens "$budget" "$vocab" "$eos")")
    fi
  done
  for c in "${cases[@]}"; do
    read -r f pname tokens <<<"$c"
    read_info "$f"
    local base; base="$work/$(basename "$f" .gguf).$pname"
    echo "== $(basename "$f") $pname: $tokens"
    expect_finite "$f" "$tokens" "$base.llama.f32"
    for m in "${modes[@]}"; do
      local opt=() t0 rc=0; t0=$(now)
      [[ "$m" == decode ]] && opt=(--decode)
      [[ "$m" == chunk3 ]] && opt=(--chunk 3)
      "$regolith" logits -m "$f" --tokens "$tokens" --out "$base.regolith-$m.f32" "${opt[@]}" >"$base.regolith-$m.json" 2>&1 || rc=$?
      ((rc == 0)) || { cat "$base.regolith-$m.json"; fail "regolith logits ${opt[*]} on $(basename "$f") exited with $rc"; }
      echo "  regolith ($m, $(since "$t0")) vs llama.cpp:"
      compare "$base.llama.f32" "$base.regolith-$m.f32" "$vocab"
    done
  done
  echo "PASS: regolith's logits equal llama.cpp $LLAMA_TAG's within $REL_TOL * max|logit| with the same argmax (${#cases[@]} cases, modes: ${modes[*]})"
}

# method.md: llama.cpp rounds activations inside quantized matmuls, so a quantized file is compared
# within a tolerance measured on llama.cpp's own quantized and F32 runs; quantization quality is
# mean KL against the F32 model (issue #5's acceptance).
mode_quantized() {
  need_build_args
  shopt -s nullglob
  local n_ok=0
  for hf in "$fixtures"/*/hf; do
    local name; name=$(basename "$(dirname "$hf")")
    local f32="$work/$name-f32.gguf" ref; ref="$(dirname "$hf")/reference.safetensors"
    convert_f32 "$hf" "$f32" || continue
    echo "== $name (vocab $vocab, QSA budget $budget)"
    # (a)'s prompts, each cut to the QSA budget: the fixture's reference prompts and 24 synthetic
    # ones, so that the statistics below are over many positions.
    local prompts=()
    if [[ -f "$ref" ]]; then
      while read -r _ _ ptokens; do prompts+=("$(first_tokens "$budget" "$ptokens")"); done < <("$tool" prompts "$ref")
    fi
    mapfile -t -O "${#prompts[@]}" prompts < <(lcg_tokens $((24 * budget)) "$vocab" 7 "$budget")
    local lf="$work/$name.llama-f32.f32"
    rm -f "$lf"
    for p in "${prompts[@]}"; do
      run_peer -m "$f32" --tokens "$p" --out "$work/$name.p.f32" >/dev/null || fail "llama.cpp on $(basename "$f32")"
      cat "$work/$name.p.f32" >>"$lf"
    done
    # (b)'s inputs: KL tokens, and separate tokens for the importance matrix.
    lcg_tokens 8192 "$vocab" 1 >"$work/$name.kld.tokens"
    lcg_tokens 4096 "$vocab" 2 >"$work/$name.imatrix.tokens"
    local imatrix="$work/$name.imatrix.gguf"
    "$regolith" imatrix -m "$f32" --tokens "$work/$name.imatrix.tokens" --chunk 256 -o "$imatrix" >"$imatrix.log" 2>&1 ||
      { cat "$imatrix.log"; fail "regolith imatrix on $(basename "$f32")"; }
    local files=()
    for type in "${QUANT_TYPES[@]}"; do
      for variant in plain imatrix; do
        local lq="$work/$name-$type-$variant.llama.gguf" rq="$work/$name-$type-$variant.regolith.gguf" opt=()
        [[ "$variant" == imatrix ]] && opt=(--imatrix "$imatrix")
        "$peer" quantize "$f32" "$lq" "$type" "${opt[@]}" --threads "$THREADS" >"$lq.log" 2>&1 ||
          { cat "$lq.log"; fail "llama.cpp could not quantize $(basename "$f32") to $type ($variant)"; }
        "$regolith" quantize "$f32" "$rq" --types-from "$lq" "${opt[@]}" >"$rq.log" 2>&1 ||
          { cat "$rq.log"; fail "regolith quantize --types-from $(basename "$lq")"; }
        diff <("$tool" types "$lq" | sort) <("$tool" types "$rq" | sort) >"$rq.types.diff" ||
          { cat "$rq.types.diff"; fail "regolith's $type ($variant) file has other tensor types than llama.cpp's"; }
        files+=("$rq" "$lq")
      done
      # (a) regolith reads llama.cpp's file: over every position of every prompt, the RMS of
      # regolith - llama.cpp on that file <= the RMS of llama.cpp's own quantized - f32 logits. (The
      # RMS, not the maximum: the largest differences sit at the few positions where any small
      # perturbation flips a routing or QSA choice, and are that jump on both sides; and for q8_0,
      # llama.cpp's rounding of activations to Q8_0 is most of its own error, which regolith shares
      # only where it rounds too: its cpu backend quantizes activations for at most 16 tokens and
      # keeps FP32 for the dense products of these whole-prompt runs.) Both maxima are printed too.
      local lq="$work/$name-$type-plain.llama.gguf" lqo="$work/$name-$type.llama.f32" rqo="$work/$name-$type.regolith.f32"
      rm -f "$lqo" "$rqo"
      for p in "${prompts[@]}"; do
        run_peer -m "$lq" --tokens "$p" --out "$work/$name.p.f32" >/dev/null || fail "llama.cpp on $(basename "$lq")"
        cat "$work/$name.p.f32" >>"$lqo"
        "$regolith" logits -m "$lq" --tokens "$p" --out "$work/$name.p.f32" >/dev/null || fail "regolith logits on $(basename "$lq")"
        cat "$work/$name.p.f32" >>"$rqo"
      done
      local gap diff gap_max gap_rms diff_max diff_rms n_pos
      gap=$("$tool" diff-stats "$lf" "$lqo" --vocab "$vocab") || fail "diff-stats"
      diff=$("$tool" diff-stats "$lqo" "$rqo" --vocab "$vocab") || fail "diff-stats"
      read -r _ gap_max _ gap_rms _ n_pos <<<"$gap"
      read -r _ diff_max _ diff_rms _ _ <<<"$diff"
      echo "  $type: llama.cpp's file in regolith: |regolith - llama.cpp| rms $diff_rms (max $diff_max) vs |llama.cpp $type - llama.cpp f32| rms $gap_rms (max $gap_max) over $n_pos positions"
      awk -v d="$diff_rms" -v g="$gap_rms" 'BEGIN { exit !(d <= g) }' ||
        fail "regolith's logits on llama.cpp's $type file differ from llama.cpp's by more than llama.cpp's own quantization error (RMS)"
    done
    # (b) every file against the f32 one in one pass, on the same positions. "No worse" is judged
    # on the paired per-position differences: regolith's mean KL minus llama.cpp's must not exceed
    # twice its standard error. (Where a type covers few tensors of a fixture — tiny-b's 48-wide
    # rows fit no 32-value block, so most matrices are F16 in every file — the two files differ in
    # a handful of tensors and the difference is below what 8192 positions resolve.)
    local json="$work/$name.kld.json" kl_values="$work/$name.kl.txt"
    "$regolith" kld --base "$f32" -m "${files[@]}" --tokens "$work/$name.kld.tokens" --chunk 256 --json \
      --kl-out "$kl_values" >"$json" 2>"$json.log" || { cat "$json.log"; fail "regolith kld"; }
    # One "model mean stderr top1" line per model (the JSON's keys are sorted: kl, model, ppl, top1_percent),
    # and one "mean_difference stderr" line per (regolith, llama.cpp) pair of columns of the KL values.
    local rows pairs
    rows=$(awk '{ gsub(/[",]/, "") } $1 == "mean:" { m = $2 } $1 == "stderr:" { e = $2 } $1 == "model:" { f = $2 }
                $1 == "top1_percent:" { print f, m, e, $2 }' "$json")
    pairs=$(awk '{ for (k = 1; k < NF; k += 2) { d = $k - $(k + 1); s[k] += d; ss[k] += d * d } n++ }
                 END { for (k = 1; k < NF; k += 2) { m = s[k] / n; v = (ss[k] - n * m * m) / (n - 1) / n
                                                     print m, (v > 0 ? sqrt(v) : 0) } }' "$kl_values")
    local bad=0 pair=0
    echo "  mean KL against $(basename "$f32") (8192 tokens in chunks of 256; ± standard error; top-1 agreement):"
    printf '  %-8s %-8s %-30s %-30s %s\n' type imatrix "regolith" "llama.cpp" "regolith - llama.cpp"
    for type in "${QUANT_TYPES[@]}"; do
      for variant in plain imatrix; do
        local r l line
        r=$(awk -v f="$work/$name-$type-$variant.regolith.gguf" '$1 == f { print $2, $3, $4 }' <<<"$rows")
        l=$(awk -v f="$work/$name-$type-$variant.llama.gguf" '$1 == f { print $2, $3, $4 }' <<<"$rows")
        pair=$((pair + 1))
        line=$(awk -v t="$type" -v v="$variant" -v r="$r" -v l="$l" -v p="$(sed -n "${pair}p" <<<"$pairs")" 'BEGIN {
          split(r, a, " "); split(l, b, " "); split(p, d, " ")
          verdict = d[1] <= 0 ? "ok" : d[1] <= 2 * d[2] ? "ok (within 2 SE)" : "REGOLITH WORSE"
          printf "%-8s %-8s %.6f ± %.6f (%5.2f%%)   %.6f ± %.6f (%5.2f%%)   %+.3g ± %.2g  %s", t, v == "imatrix" ? "yes" : "no",
                 a[1], a[2], a[3], b[1], b[2], b[3], d[1], d[2], verdict }')
        echo "  $line"
        [[ "$line" == *"REGOLITH WORSE"* ]] && bad=1
      done
    done
    ((bad == 0)) || fail "regolith's quantization of $name has a larger mean KL than llama.cpp's (see the table)"
    n_ok=$((n_ok + 1))
  done
  ((n_ok > 0)) || skip "no fixture is inside llama.cpp $LLAMA_TAG's supported geometry"
  echo "PASS: llama.cpp-quantized files of $n_ok fixture(s) run in regolith within llama.cpp's own quantization error (RMS), and regolith's quantizations with the same per-tensor types have no larger mean KL (paired, within 2 SE; ${QUANT_TYPES[*]}, with and without an importance matrix)"
}

case "$mode" in
  setup) ensure_peer; echo "llama.cpp peer ready: $peer" ;;
  peer) ensure_peer; exec "$peer" "${peer_args[@]:-}" --backend-dir "$llama_dir/bins" ;;
  mkmodel) ensure_peer; mode_mkmodel ;;
  fixtures) ensure_peer; mode_fixtures ;;
  vs-regolith) mode_vs_regolith ;;
  quantized) ensure_peer; mode_quantized ;;
  *) echo "run_interop.sh: unknown mode '$mode'" >&2; exit 1 ;;
esac
