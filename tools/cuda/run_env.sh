# Sourced by the tools/cuda scripts that run a built regolith on the GPU machine: strict mode, the
# output folder ($out: $OUT, else /tmp/regolith-cuda-out) and the tokenizer's libraries that
# device_check.sh unpacks from .deps/ (tools/cuda/fetch_deps.sh). The library path is set even
# before they are unpacked, so that a script may source this first and build afterwards.
set -uo pipefail
out=${OUT:-/tmp/regolith-cuda-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
