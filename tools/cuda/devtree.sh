#!/usr/bin/env bash
# Here: writes .devtree/ for the device tool's `run` (carry [".devtree"], then `cd .devtree && ...`
# there): the committed tree (git archive HEAD: uncommitted edits stay here), .deps, and with
# BASE_REV that commit's files in .devtree/base, the base tools/cuda/device_paired.sh measures
# the tree against. .deps travels once (the carried tree is limited to 64 MiB).
#   tools/cuda/devtree.sh [BASE_REV]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .deps ] || { echo "devtree: no .deps/ (run tools/cuda/fetch_deps.sh)"; exit 1; }
grep -qx '/.devtree/' .git/info/exclude 2>/dev/null || echo '/.devtree/' >>.git/info/exclude
rm -rf .devtree
mkdir .devtree
# tar -m: files dated now, not at their commit, so a warm machine's build of an older tree rebuilds.
git archive HEAD | tar -x -m -C .devtree
cp -r .deps .devtree/
if [ $# -ge 1 ]; then
  mkdir .devtree/base
  git archive "$1" | tar -x -m -C .devtree/base
fi
du -sh .devtree
