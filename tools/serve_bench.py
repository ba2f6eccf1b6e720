#!/usr/bin/env python3
"""Decode speed of `regolith serve` with several streams at once (not a test).

Starts `REGOLITH serve -m MODEL --port 0 --parallel K [SERVE_ARGS...]`, then for each round sends K
completions at once (a random token-id prompt of P tokens, a different one per stream and
round, so the prefix cache serves nothing; N tokens each, ignore_eos, greedy, cache_prompt off)
and reads the server's own timings. Prints, per round, the streams' median decode tokens/s
(timings.predicted_per_second: each request's tokens over the time from its prompt's end to its
last token) and the aggregate (all generated tokens over the round's wall time, prefill included).

  tools/serve_bench.py build/regolith MODEL.gguf -k 1,4 -p 128 -n 128 -r 3 [-- --backend cuda]

Only the Python standard library: it runs on the GPU machine as it is.
"""
import argparse
import http.client
import json
import random
import statistics
import subprocess
import sys
import threading
import time


def start_server(binary, model, parallel, n_ctx, extra):
    cmd = [binary, "serve", "-m", model, "--port", "0", "--parallel", str(parallel), "-c", str(n_ctx)] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True)
    deadline = time.time() + 600  # loading a large model
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if "listening on http://" in line:
            return proc, int(line.strip().rsplit(":", 1)[1].split("/")[0])
    proc.kill()
    sys.exit("serve_bench: the server did not start: " + " ".join(cmd))


def complete(port, prompt, n_tokens, out, i):
    body = json.dumps({"prompt": prompt, "max_tokens": n_tokens, "temperature": 0, "ignore_eos": True,
                       "cache_prompt": False})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        out[i] = RuntimeError(f"HTTP {r.status}: {data[:300]!r}")
        return
    out[i] = json.loads(data)


def vocabulary_size(port):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/v1/models")
    return json.loads(conn.getresponse().read())["data"][0]["meta"]["n_vocab"]


def round_of(port, k, p, n, vocab, rng):
    prompts = [[rng.randrange(vocab) for _ in range(p)] for _ in range(k)]
    out = [None] * k
    threads = [threading.Thread(target=complete, args=(port, prompts[i], n, out, i)) for i in range(k)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for o in out:
        if isinstance(o, Exception):
            raise o
    per_stream = [o["timings"]["predicted_per_second"] for o in out]
    generated = sum(o["usage"]["completion_tokens"] for o in out)
    return statistics.median(per_stream), generated / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("-k", "--streams", default="1,4", help="streams at once, comma-separated (one server each)")
    ap.add_argument("-p", "--prompt", type=int, default=128, help="prompt tokens")
    ap.add_argument("-n", "--tokens", type=int, default=128, help="tokens generated per stream")
    ap.add_argument("-r", "--rounds", type=int, default=3)
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1:] if "--" in argv else []  # more `regolith serve` options
    a = ap.parse_args(argv[:len(argv) - len(serve_args) - (1 if "--" in argv else 0)])
    rng = random.Random(1)
    print("| streams | round | median stream tok/s | aggregate tok/s |")
    print("|---:|---:|---:|---:|")
    for k in (int(s) for s in a.streams.split(",")):
        proc, port = start_server(a.binary, a.model, k, a.prompt + a.tokens + 8, serve_args)
        try:
            vocab = vocabulary_size(port)
            round_of(port, k, 8, 8, vocab, rng)  # warm-up: first allocations, graph recording
            for r in range(a.rounds):
                stream, aggregate = round_of(port, k, a.prompt, a.tokens, vocab, rng)
                print(f"| {k} | {r + 1} | {stream:.1f} | {aggregate:.1f} |", flush=True)
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
