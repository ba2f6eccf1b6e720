#!/usr/bin/env bash
# Here: writes .devtree/ for the device tool's `run` (carry [".devtree"], then `cd .devtree && ...`
# there): the committed tree (git archive HEAD: uncommitted edits stay here), .deps, and with
# BASE_REV that commit's files in .devtree/base, the base tools/cuda/device_paired.sh measures
# the tree against, and with NAME=REV that commit's files in .devtree/NAME (a run device_paired.sh's
# RUNS names, e.g. for a bisect). .deps travels once (the carried tree is limited to 64 MiB); the
# other trees go without tests/data (9 MB each: only their regolith target is built).
#   tools/cuda/devtree.sh [BASE_REV [NAME=REV ...]]
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -d .deps ] || { echo "devtree: no .deps/ (run tools/cuda/fetch_deps.sh)"; exit 1; }
grep -qx '/.devtree/' .git/info/exclude 2>/dev/null || echo '/.devtree/' >>.git/info/exclude
rm -rf .devtree
mkdir .devtree
# tar -m: files dated now, not at their commit, so a warm machine's build of an older tree rebuilds.
git archive HEAD | tar -x -m -C .devtree
cp -r .deps .devtree/
# tree DIR REV: REV's files in .devtree/DIR, without the test fixtures.
tree() {
  mkdir ".devtree/$1"
  git archive "$2" | tar -x -m -C ".devtree/$1"
  rm -rf ".devtree/$1/tests/data"
}
if [ $# -ge 1 ]; then
  tree base "$1"
  shift
fi
for named in "$@"; do
  [[ "$named" == ?*=?* ]] || { echo "devtree: '$named' is not NAME=REV"; exit 1; }
  tree "${named%%=*}" "${named#*=}"
done
du -sh .devtree
