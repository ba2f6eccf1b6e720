#!/bin/bash
# Starts `regolith serve` on a free loopback port and runs openai_client_test.cjs against it with the
# official `openai` npm client (v4), installed at test time into WORK/node_modules (git-ignored:
# WORK is in the build tree). Exits 77 (CTest: skipped) when node/npm or the registry is unreachable.
# Usage: openai_client_test.sh REGOLITH MODEL.gguf WORK CHAT_TEMPLATE.jinja CLIENT_SCRIPT.cjs
set -u
regolith=$1 model=$2 work=$3 template=$4 script=$5
mkdir -p "$work"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "SKIP: node/npm not found"; exit 77
fi
if [ ! -f "$work/node_modules/openai/package.json" ]; then
  if ! (cd "$work" && timeout 180 npm install --no-audit --no-fund --no-save --loglevel=error openai@4 >"$work/npm.log" 2>&1); then
    echo "SKIP: 'npm install openai@4' failed (registry unreachable?):"; tail -5 "$work/npm.log"; exit 77
  fi
fi
echo "openai client $(node -p "require('$work/node_modules/openai/package.json').version")"

"$regolith" serve -m "$model" --port 0 --chat-template-file "$template" -c 2048 --parallel 4 --api-key test-key \
  >"$work/serve.out" 2>"$work/serve.err" &
pid=$!
port=
for _ in $(seq 100); do
  port=$(grep -o 'listening on http://[^ ]*' "$work/serve.out" 2>/dev/null | grep -o '[0-9]*$')
  [ -n "$port" ] && break
  sleep 0.1
done
if [ -z "$port" ]; then
  echo "the server did not start"; cat "$work/serve.err"; kill -KILL $pid 2>/dev/null; exit 1
fi

NODE_PATH="$work/node_modules" node "$script" "http://127.0.0.1:$port/v1" test-key "$(basename "$model" .gguf)"
rc=$?
kill -TERM $pid
wait $pid
server_rc=$?
if [ $server_rc -ne 0 ]; then echo "the server exited with $server_rc"; cat "$work/serve.err"; fi
[ $rc -eq 0 ] && [ $server_rc -eq 0 ]
