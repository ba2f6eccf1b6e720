#!/usr/bin/env python3
"""Whether two commits compile a CUDA file to the same kernels, here (no GPU needed).

    tools/cuda/ptx_equal.py BASE_REV REV FILE... [--show NAME_PART]

FILE names a source under src/backend/cuda without its extension (e.g. cuda_moe). Each commit's
tree is extracted with `git archive`, the file compiled to PTX for compute_90 (as the build's
portable target, -O3), and the PTX split into functions. Functions are matched by name once the
file's hashed anonymous-namespace names are normalized and a defaulted `false` bool template
argument is dropped (a switch's template parameter added on a branch), and compared once comments,
.loc lines, register declarations, label numbers and register numbers (renamed in first-use order)
are set aside: equal means the same instructions on the same operands, in either of two compiles of
each commit (nvcc's PTX of a large kernel is not always the same from one compile to the next).
This is how a switch's measured instance is shown to be the one that lands without the switch.
Exit status 1 when a common function differs; --show prints the difference of the first function
whose name contains NAME_PART.
"""
import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ptx_of(rev, name, work, run):
    tree = os.path.join(work, rev.replace("/", "_"))
    if not os.path.isdir(tree):
        os.makedirs(tree)
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "src"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    out = os.path.join(tree, f"{name}.{run}.ptx")
    subprocess.run(["nvcc", "-I", os.path.join(tree, "src"), "-O3", "-DNDEBUG", "-std=c++20",
                    "--generate-code=arch=compute_90,code=[compute_90]", "-x", "cu", "-ptx",
                    os.path.join(tree, "src/backend/cuda", name + ".cu"), "-o", out], check=True)
    with open(out) as f:
        return f.read()


def functions(ptx):
    """Function name -> body, with the file-specific names and numbering taken out."""
    ptx = re.sub(r"_GLOBAL__N__[0-9a-f]+_[0-9]+_[a-z_]+_cu_[0-9a-f]{8}", "ANON", ptx)
    ptx = re.sub(r"_INTERNAL_[0-9a-f]+_[0-9]+_[a-z_]+_cu_[0-9a-f]{8}", "INTERNAL", ptx)
    ptx = re.sub(r"^\s*//.*$|^\s*\.(loc|file)\b.*$", "", ptx, flags=re.M)
    ptx = re.sub(r"\$L__BB[0-9]+_", "LBB_", ptx)
    ptx = re.sub(r"__local_depot[0-9]+", "DEPOT", ptx)
    ptx = ptx.replace("Lb0E", "")
    bodies = {}
    for piece in re.split(r"\n(?=(?:\.visible |\.weak )?\.(?:entry|func)\b)", ptx):
        m = re.match(r"(?:\.visible |\.weak )?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", piece)
        if m:
            bodies[m.group(1)] = canonical(piece)
    return bodies


def canonical(body):
    """Register declarations dropped, registers renamed in the order they first appear."""
    body = re.sub(r"\.reg [^;]+;", "", body)
    names = {}

    def rename(m):
        return names.setdefault(m.group(0), "%%%s%d" % (m.group(1), len(names)))

    return re.sub(r"%(rd|rs|r|fd|f|p)[0-9]+\b", rename, body)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("base")
    parser.add_argument("rev")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--show", help="print the difference of the first differing function whose name contains this")
    args = parser.parse_args()
    differ = False
    with tempfile.TemporaryDirectory() as work:
        for name in args.files:
            # nvcc 13.0's PTX of a file is not always the same (an instance or two of a large
            # kernel vectorizes some shared-memory loads differently from one compile to the next),
            # so each commit compiles twice and a function is equal when any pair of its compiles is.
            a = [functions(ptx_of(args.base, name, work, run)) for run in (1, 2)]
            b = [functions(ptx_of(args.rev, name, work, run)) for run in (1, 2)]
            common = sorted(set(a[0]) & set(b[0]))
            changed = [n for n in common if all(x.get(n) != y.get(n) for x in a for y in b)]
            print(f"{name}: {len(common)} functions in both, {len(common) - len(changed)} equal, {len(changed)} differ; "
                  f"{len(set(a[0]) - set(b[0]))} only in {args.base}, {len(set(b[0]) - set(a[0]))} only in {args.rev}")
            for n in changed:
                print("  differs:", n[:160])
            if args.show:
                shown = [n for n in changed if args.show in n]
                if shown:
                    print("\n".join(difflib.unified_diff(a[0][shown[0]].splitlines(), b[0][shown[0]].splitlines(),
                                                         args.base, args.rev, lineterm="", n=1)))
            differ = differ or bool(changed)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
