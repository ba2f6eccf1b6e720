#!/usr/bin/env python3
"""Where a kernel's instructions and stalls are, by SASS line, from Nsight Compute's source page.

    ncu -i REPORT --page source --csv --print-source sass > source.csv
    tools/cuda/sass_summary.py source.csv [--kernel REGEX] [--listing] [--top N]

The csv holds one block per profiled launch: a "Kernel Name" row, a header row, then one row per
SASS instruction (its address, text, executions, stall samples). Launches of the same kernel
instantiation are summed; --kernel matches its name with template arguments, without
namespaces or parameters. Per kernel: warps (the executions of its first instruction, which
every warp runs once), instructions executed per warp, the opcode mix, and the lines with the
most stall samples and the most executions. With
--listing, every executed line of the matching kernels: executions, samples, SASS text.
Sessions 40 and 41 (tools/cuda/NOTES.md) found 64-bit index arithmetic and spills this way.
"""
import argparse
import collections
import csv
import re
import sys


def launches(path):
    """(kernel name, [instruction rows as dicts]) for each launch in the csv."""
    name, header, rows = None, None, []
    for rec in csv.reader(open(path, newline="")):
        if rec and rec[0] == "Kernel Name":
            if name is not None:
                yield name, rows
            name, header, rows = rec[1], None, []
        elif name is not None and header is None:
            header = rec
        elif name is not None and len(rec) == len(header):
            rows.append(dict(zip(header, rec)))
    if name is not None:
        yield name, rows


def label(name):
    """The kernel's name with its template arguments, without namespaces and parameters."""
    name = re.sub(r"^void ", "", name.replace("<unnamed>::", "").replace("(anonymous namespace)::", ""))
    name = re.sub(r"\b(regolith|cuda)::", "", name)
    depth = 0
    for i, c in enumerate(name):  # cut at the parameter list: the first '(' outside template brackets
        depth += {"<": 1, ">": -1}.get(c, 0)
        if c == "(" and depth == 0:
            return name[:i]
    return name


def number(text):
    return float(text.replace(",", "")) if text else 0.0


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):  # a predicate
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--kernel", default="", help="only kernels whose name (with template arguments) matches this regex")
    ap.add_argument("--listing", action="store_true", help="print every executed SASS line")
    ap.add_argument("--top", type=int, default=8, help="lines shown by samples and by executions")
    a = ap.parse_args()
    kernels = collections.OrderedDict()  # instantiation -> (launch count, summed rows by address order)
    for name, rows in launches(a.csv):
        key = label(name)
        if not re.search(a.kernel, key):
            continue
        n, acc = kernels.get(key, (0, None))
        if acc is None:
            acc = [{"sass": r.get("Source", ""), "exec": 0.0, "samples": 0.0} for r in rows]
        for line, r in zip(acc, rows):
            line["exec"] += number(r.get("Instructions Executed", ""))
            line["samples"] += number(r.get("Warp Stall Sampling (All Samples)", ""))
        kernels[key] = (n + 1, acc)
    if not kernels:
        sys.exit("no kernel in the csv matches")
    for name, (n, lines) in kernels.items():
        total = sum(l["exec"] for l in lines)
        samples = sum(l["samples"] for l in lines)
        warps = lines[0]["exec"] if lines else 0
        print(f"{name}: {n} launch(es), {len(lines)} SASS lines, {total / n:.0f} warp instructions a launch, "
              f"{warps / n:.0f} warps, {total / warps if warps else 0:.0f} a warp, {samples:.0f} stall samples")
        mix = collections.Counter()
        for l in lines:
            mix[opcode(l["sass"])] += l["exec"]
        print("  mix: " + " ".join(f"{op} {v / total * 100:.1f}%" for op, v in mix.most_common(14)))
        indexed = list(enumerate(lines))
        for title, key in (("samples", "samples"), ("executions", "exec")):
            print(f"  most {title}:")
            for i, l in sorted(indexed, key=lambda il: -il[1][key])[:a.top]:
                print(f"    {i:5d} {l['exec'] / n:10.0f} exec {l['samples']:6.0f} samples  {l['sass'][:80]}")
        if a.listing:
            for i, l in indexed:
                if l["exec"]:
                    print(f"  {i:5d} {l['exec'] / n:10.0f} {l['samples']:6.0f}  {l['sass'][:100]}")


if __name__ == "__main__":
    main()
