#!/usr/bin/env python3
"""Checks that every CUDA kernel calls grid_dependency_wait() exactly once.

With programmatic dependent launch (src/backend/cuda/cuda_launch.cuh) a kernel may start while its
predecessor still runs; only grid_dependency_wait() orders it after that kernel. A kernel without
the call reads stale activations on the GPU, and nothing on a machine without a GPU notices (a
session lost a device run to exactly that). What a kernel does before the call (index arithmetic,
weight prefetches) is left to review.

usage: cuda_kernels_wait.py SRC_DIR (the CUDA backend's sources)
"""
import pathlib
import re
import sys


def kernel_bodies(text):
    """(name, body) of every __global__ function: the braces after its parameter list."""
    for m in re.finditer(r"__global__", text):
        paren = text.index("(", m.end())
        name = re.findall(r"(\w+)\s*$", text[m.end():paren])[0]
        depth, i = 0, paren
        while True:  # the parameter list
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        start = text.index("{", i)
        depth, i = 0, start
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
            if depth == 0:
                break
        yield name, text[start + 1:i - 1]


def main():
    src = pathlib.Path(sys.argv[1])
    problems, kernels = [], 0
    for path in sorted(list(src.glob("*.cu")) + list(src.glob("*.cuh"))):
        for name, body in kernel_bodies(path.read_text()):
            kernels += 1
            calls = body.count("grid_dependency_wait();")
            if calls != 1:
                problems.append(f"{path.name}: {name} calls grid_dependency_wait() {calls} times")
    if kernels == 0:
        problems.append(f"no __global__ functions found under {src}")
    for p in problems:
        print(p)
    print(f"{kernels} kernels checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
