#!/usr/bin/python3
"""`regolith convert` on damaged copies of a reference checkpoint: each must fail with exit
code 1 and a message naming the problem, never crash or write an output file.

usage: bad_checkpoints.py REGOLITH HF_DIR
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main(regolith, hf_dir):
    failures = []

    def case(name, damage, expect):
        with tempfile.TemporaryDirectory() as tmp:
            work = os.path.join(tmp, "hf")
            shutil.copytree(hf_dir, work)
            damage(work)
            out = os.path.join(tmp, "out.gguf")
            r = subprocess.run([regolith, "convert", work, "-o", out], capture_output=True, text=True)
            ok = r.returncode == 1 and expect in r.stderr and not os.path.exists(out)
            print(f"{'ok  ' if ok else 'FAIL'} {name}: rc={r.returncode} {r.stderr.strip()[:160]}")
            if not ok:
                failures.append(name)

    def edit_config(fn):
        def damage(d):
            p = os.path.join(d, "config.json")
            cfg = json.load(open(p))
            fn(cfg)
            json.dump(cfg, open(p, "w"))
        return damage

    def first_shard(d):
        return sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))[0]

    def truncate_shard(d):
        p = os.path.join(d, first_shard(d))
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(size // 2)

    def garbage_header(d):
        p = os.path.join(d, first_shard(d))
        with open(p, "r+b") as f:
            f.seek(8)
            f.write(b"\x00garbage")

    def drop_from_index(d):
        p = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(p))
        shard = idx["weight_map"].pop("model.language_model.layers.0.linear_attn.A_log")
        os.remove(os.path.join(d, shard))
        idx["weight_map"] = {k: v for k, v in idx["weight_map"].items() if v != shard}
        json.dump(idx, open(p, "w"))

    case("no config", lambda d: os.remove(os.path.join(d, "config.json")), "config.json")
    case("config not JSON", lambda d: open(os.path.join(d, "config.json"), "w").write("{oops"), "not valid JSON")
    case("unknown architecture", edit_config(lambda c: c.update(architectures=["LlamaForCausalLM"])), "architecture")
    case("unknown layer type", edit_config(lambda c: c["text_config"]["layer_types"].__setitem__(0, "mamba")), "unknown layer type")
    case("missing field", edit_config(lambda c: c["text_config"].pop("hc_lowrank")), "hc_lowrank")
    case("field of wrong type", edit_config(lambda c: c["text_config"].update(num_experts="ten")), "num_experts")
    case("hash seed differs from buffers", edit_config(lambda c: c["text_config"].update(seed=1)), "hash constants")
    case("hidden size mismatch", edit_config(lambda c: c["text_config"].update(hidden_size=64, ple_embed_dim=64)), "needs")
    case("silu gate", edit_config(lambda c: c["text_config"].update(output_gate_type="silu")), "output_gate_type")
    case("truncated shard", truncate_shard, "truncated")
    case("garbage shard header", garbage_header, "safetensors header")
    case("missing shard and tensors", drop_from_index, "missing tensor 'model.language_model.")
    if failures:
        print(f"{len(failures)} case(s) failed: {failures}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
