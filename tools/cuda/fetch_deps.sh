#!/usr/bin/env bash
# Downloads (here, with apt) the Debian 12 packages the GPU machine's image lacks for building
# regolith: PCRE2 and ICU development files and pkg-config. They land in .deps/ (ignored by git;
# name it in the device tool's `carry`); tools/cuda/device_check.sh unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .deps
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx "/.deps/" "$exclude" 2>/dev/null || echo "/.deps/" >>"$exclude"
cd .deps
apt-get download libpcre2-dev libpcre2-8-0 libicu-dev libicu72 pkgconf pkgconf-bin libpkgconf3
ls -la
