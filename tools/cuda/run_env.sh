# Sourced by the tools/cuda scripts that run a built regolith on the GPU machine: strict mode, the
# output folder ($out: $OUT, else /tmp/regolith-cuda-out) and the tokenizer's libraries that
# device_check.sh unpacked from .deps/ (tools/cuda/fetch_deps.sh).
set -uo pipefail
out=${OUT:-/tmp/regolith-cuda-out}
mkdir -p "$out"
[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
