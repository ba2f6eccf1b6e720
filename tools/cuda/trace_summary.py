#!/usr/bin/env python3
"""Where one-token forwards spend their time, from kernel_trace.cpp's timeline.

    tools/cuda/trace_summary.py TRACE [--steps N]

A forward starts at the token embedding's get_rows_kernel (the first get_rows at least 300
kernels after the last start). Within a forward, in launch order, a kernel's share of the chain is
end_i - end_(i-1): with programmatic dependent launch a kernel starts while its predecessor runs
and waits for it, so durations overlap, but the ends are in chain order and the shares sum to the
forward's time. Kernels are grouped by name and grid x and y (the same product kernel over
different matrices has different grids; z, the QSA splits, changes with the context). The gap between forwards (host time: reading logits, issuing) is
shown apart. The last N forwards (default 16) are summarised, medians of their per-forward sums.
"""
import argparse
import collections
import re
import statistics
import subprocess


def short_name(name):
    """The kernel's own name: no namespaces, template arguments or parameters."""
    name = name.replace("(anonymous namespace)::", "")
    base = re.split(r"[<(]", name)[0].split("::")[-1].strip()
    return base.split(" ")[-1] or name


def demangle(names):
    """Demangled names by c++filt where it exists (CUPTI records mangled names)."""
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.split("\n")))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def load(path):
    raw = [line.rstrip("\n").split(" ", 7) for line in open(path)]
    raw = [p for p in raw if len(p) == 8]
    names = demangle(sorted({p[7] for p in raw}))
    return [(int(p[0]), int(p[1]), (int(p[2]), int(p[3]), int(p[4])), int(p[5]), int(p[6]), short_name(names[p[7]]))
            for p in raw]


def forwards(rows, min_kernels=300):
    starts, last = [], -min_kernels
    for i, r in enumerate(rows):
        if r[5] == "get_rows_kernel" and i - last >= min_kernels:
            starts.append(i)
            last = i
    return [rows[a:b] for a, b in zip(starts, starts[1:] + [len(rows)])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    fw = forwards(load(a.trace))
    # Decode forwards have the most common kernel count; keep the last N of those.
    counts = collections.Counter(len(f) for f in fw)
    if not counts:
        print("no forwards found")
        return
    n_common = counts.most_common(1)[0][0]
    decode = [f for f in fw if len(f) == n_common][-a.steps:]
    print(f"{len(fw)} forwards; {len(decode)} of {n_common} kernels summarised")
    # Per forward, the chain share and run time summed by key; a key absent from a forward counts 0
    # there, so that kernels whose grid changes with the context (QSA splits) are not counted twice.
    # The grid's z (the splits) is left out of the key for the same reason.
    shares, durs, calls = [], [], []
    totals, gaps, idles = [], [], []
    for f in decode:
        share, dur, n = collections.Counter(), collections.Counter(), collections.Counter()
        prev_end = f[0][0]
        idle = []  # the device idle inside the forward: a kernel starting after the last one ended
        for r in f:
            key = f"{r[5]} [{r[2][0]}x{r[2][1]}] {r[3]}t {r[4]}r"
            if r[0] > prev_end:
                idle.append(r[0] - prev_end)
            end = max(r[1], prev_end)
            share[key] += end - prev_end
            dur[key] += r[1] - r[0]
            n[key] += 1
            prev_end = end
        shares.append(share), durs.append(dur), calls.append(n)
        totals.append(prev_end - f[0][0])
        idles.append(idle)
    keys = set().union(*calls)
    med = lambda per_forward, k: statistics.median(c[k] for c in per_forward)
    per = {k: (med(shares, k), med(durs, k), max(c[k] for c in calls)) for k in keys}
    # Gaps: from a forward's last end to the next forward's first start.
    for f, g in zip(decode, decode[1:]):
        gaps.append(g[0][0] - max(r[1] for r in f))
    tot = statistics.median(totals)
    print(f"forward (first start to last end): median {tot / 1e3:.1f} us; gap to the next: median "
          f"{statistics.median(gaps) / 1e3 if gaps else 0:.1f} us")
    # Idle stretches (a step graph's pieces start after the previous piece ended, without the
    # programmatic overlap of kernels inside a piece or a stream).
    idle_sum = statistics.median(sum(i) for i in idles)
    idle_n = statistics.median(len(i) for i in idles)
    long_idles = [x for i in idles for x in i if x > 1000]
    print(f"device idle inside a forward: median {idle_sum / 1e3:.1f} us in {idle_n:.0f} stretches; stretches over 1 us: "
          f"{len(long_idles) / len(idles):.1f} a forward, median {statistics.median(long_idles) / 1e3 if long_idles else 0:.2f} us")
    print(f"{'kernel [grid] threads regs':68s} {'calls':>5s} {'chain us':>9s} {'%':>5s} {'us/call':>8s} {'run us/call':>11s}")
    rows = sorted(per.items(), key=lambda kv: -kv[1][0])
    for k, (s, d, n) in rows[: a.top]:
        print(f"{k[:68]:68s} {n:5d} {s / 1e3:9.1f} {100 * s / tot:5.1f} {s / n / 1e3:8.2f} {d / n / 1e3:11.2f}")
    rest = sum(v[0] for _, v in rows[a.top:])
    print(f"{'(the rest)':68s} {'':5s} {rest / 1e3:9.1f} {100 * rest / tot:5.1f}")
    print("\nby kernel name (median over forwards of the per-forward sums):")
    names = {k.split(" ")[0] for k in keys}
    by_name = {nm: (statistics.median(sum(v for k, v in c.items() if k.split(" ")[0] == nm) for c in shares),
                    max(sum(v for k, v in c.items() if k.split(" ")[0] == nm) for c in calls)) for nm in names}
    for nm, (s, n) in sorted(by_name.items(), key=lambda kv: -kv[1][0]):
        print(f"  {nm:40s} {n:5d} {s / 1e3:9.1f} us {100 * s / tot:5.1f}%")


if __name__ == "__main__":
    main()
