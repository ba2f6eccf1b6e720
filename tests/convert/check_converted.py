#!/usr/bin/python3
"""Independent check of `regolith convert`: reads the Hugging Face checkpoint and the GGUF
with parsers written here (numpy only), applies the transforms of model-spec §6.3 in the
forward direction (HF -> GGUF) and requires every GGUF tensor to equal its transformed
source exactly (F32 output), every source tensor but the vision tower to be used, and the
hash-constant metadata to equal the checkpoint's buffers.

usage: check_converted.py HF_DIR FILE.gguf
"""
import json
import os
import re
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- readers

ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "BF16": "bf16"}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = data[base + b:base + e]
        if info["dtype"] == "BF16":
            arr = (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, ST_DTYPES[info["dtype"]])
        out[name] = arr.reshape(info["shape"])
    return out


def read_checkpoint(hf_dir):
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(os.path.join(hf_dir, f)))
    return tensors


GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    with open(path, "rb") as f:
        data = f.read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v[0]

    def string():
        n = take("<Q")
        nonlocal pos
        s = data[pos:pos + n].decode("utf-8")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        return take(GGUF_SCALARS[t])

    assert take("<I") == 0x46554747, "bad magic"
    assert take("<I") == 3, "not GGUF v3"
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, ne, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    start = (pos + align - 1) // align * align
    tensors = {}
    for name, ne, typ, off in infos:
        assert typ == 0, f"{name}: expected F32 (type 0), got {typ}"
        count = int(np.prod(ne))
        tensors[name] = np.frombuffer(data, np.float32, count, start + off).reshape(list(reversed(ne)))
    return meta, tensors

# ---------------------------------------------------------------- HF -> GGUF transforms


def main(hf_dir, gguf_path):
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    tc = cfg.get("text_config", cfg)
    hf = read_checkpoint(hf_dir)
    meta, gg = read_gguf(gguf_path)
    P = "model.language_model." if "model.language_model.embed_tokens.weight" in hf else "model."
    n_k, n_v = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    ratio = n_v // n_k
    # GGUF v-head slot for each HF v-head: HF groups by k-head (g*ratio + j), GGUF tiles (j*n_k + g).
    hf_to_gguf_head = [(h % ratio) * n_k + h // ratio for h in range(n_v)]

    def reorder_heads(x, head_width, axis=0, offset=0):
        x = np.array(x, copy=True)
        src = np.moveaxis(x, axis, 0)
        out = src.copy()
        for h in range(n_v):
            g = hf_to_gguf_head[h]
            out[offset + g * head_width:offset + (g + 1) * head_width] = src[offset + h * head_width:offset + (h + 1) * head_width]
        return np.moveaxis(out, 0, axis)

    expected = {}
    used = set()

    def put(gguf_name, arr):
        expected[gguf_name] = np.asarray(arr, np.float32)

    def src(name):
        used.add(name)
        return hf[name].astype(np.float32)

    put("token_embd.weight", src(P + "embed_tokens.weight"))
    if "lm_head.weight" in hf:
        put("output.weight", src("lm_head.weight"))
    for part, gname in [("hc_norm.weight", "norm"), ("input_mix_weight_down.weight", "down"), ("input_mix_weight_up.weight", "up")]:
        x = src(P + "hyper_connection_mixer." + part)
        put(f"output_hc_{gname}.weight", x + 1 if gname == "norm" else x)

    hc_parts = [("hc_norm.weight", "norm"), ("input_mix_weight_down.weight", "down"),
                ("input_mix_weight_up.weight", "up"), ("block_inject_weight.weight", "inject")]
    n_layer = tc["num_hidden_layers"]
    has_mtp = "mtp.fc_hidden.weight" in hf
    for name in list(hf):
        m = re.match(re.escape(P) + r"layers\.(\d+)\.(.*)$", name)
        mtp = re.match(r"mtp\.layers\.0\.(.*)$", name)  # the MTP block follows the trunk
        if not m and not mtp:
            continue
        il, rest = (int(m.group(1)), m.group(2)) if m else (n_layer, mtp.group(1))
        layer_prefix = f"{P}layers.{il}." if m else "mtp.layers.0."
        b = f"blk.{il}."
        for mod, gmod in [("attn_hyper_connection.", "hc_attn_"), ("mlp_hyper_connection.", "hc_ffn_")]:
            for part, gname in hc_parts:
                if rest == mod + part:
                    x = src(name)
                    put(b + gmod + gname + ".weight", x + 1 if gname == "norm" else x)
        simple = {
            "self_attn.q_proj.weight": ("attn_q.weight", 0), "self_attn.k_proj.weight": ("attn_k.weight", 0),
            "self_attn.v_proj.weight": ("attn_v.weight", 0), "self_attn.o_proj.weight": ("attn_output.weight", 0),
            "self_attn.q_norm.weight": ("attn_q_norm.weight", 1), "self_attn.k_norm.weight": ("attn_k_norm.weight", 1),
            "self_attn.indexer.q_layernorm.weight": ("indexer.q_norm.weight", 1),
            "self_attn.indexer.k_layernorm.weight": ("indexer.k_norm.weight", 1),
            "linear_attn.norm.weight": ("ssm_norm.weight", 0),
            "mlp.gate.weight": ("ffn_gate_inp.weight", 0),
            "mlp.shared_expert_gate.weight": ("ffn_gate_inp_shexp.weight", 0),
            "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", 0),
            "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", 0),
            "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", 0),
            "ple.key_proj.weight": ("ple_key.weight", 0), "ple.value_proj.weight": ("ple_value.weight", 0),
            "ple.norm_key.weight": ("ple_norm_key.weight", 1), "ple.norm_query.weight": ("ple_norm_query.weight", 1),
            "ple.norm_conv.weight": ("ple_norm_conv.weight", 1),
        }
        if rest in simple:
            gname, plus = simple[rest]
            x = src(name)
            put(b + gname, (x + 1 if plus else x).reshape(-1) if x.ndim == 2 and x.shape[0] == 1 else (x + 1 if plus else x))
        elif rest == "ple.conv1d.weight":
            put(b + "ple_conv1d.weight", src(name)[:, 0, :])
        elif rest == "self_attn.indexer.index_qk_proj.weight":
            x = src(name)
            nq = tc["indexer_n_heads"] * tc["indexer_head_dim"]
            put(b + "indexer.q_proj.weight", x[:nq])
            put(b + "indexer.k_proj.weight", x[nq:])
        elif rest == "linear_attn.in_proj_qkv.weight":
            put(b + "attn_qkv.weight", reorder_heads(src(name), dv, 0, 2 * n_k * dk))
        elif rest == "linear_attn.in_proj_z.weight":
            put(b + "attn_gate.weight", reorder_heads(src(name), dv))
        elif rest == "linear_attn.in_proj_a.weight":
            put(b + "ssm_alpha.weight", reorder_heads(src(name), 1))
        elif rest == "linear_attn.in_proj_b.weight":
            put(b + "ssm_beta.weight", reorder_heads(src(name), 1))
        elif rest == "linear_attn.A_log":
            put(b + "ssm_a", reorder_heads((-np.exp(src(name).astype(np.float64))).astype(np.float32), 1))
        elif rest == "linear_attn.dt_bias":
            put(b + "ssm_dt.bias", reorder_heads(src(name), 1))
        elif rest == "linear_attn.conv1d.weight":
            put(b + "ssm_conv1d.weight", reorder_heads(src(name)[:, 0, :], dv, 0, 2 * n_k * dk))
        elif rest == "linear_attn.out_proj.weight":
            put(b + "ssm_out.weight", reorder_heads(src(name), dv, axis=1))
        elif re.match(r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$", rest):
            used.add(name)
        elif rest.startswith("ple.ple_embedding."):
            used.add(name)
        # expert stacks are assembled below
        if rest == "mlp.gate.weight":
            n_exp = tc["num_experts"]
            for which, gname in [("gate", "ffn_gate_exps"), ("up", "ffn_up_exps"), ("down", "ffn_down_exps")]:
                stack = np.stack([hf[f"{layer_prefix}mlp.experts.{e}.{which}_proj.weight"].astype(np.float32)
                                  for e in range(n_exp)])
                put(f"{b}{gname}.weight", stack)

    if has_mtp:
        b = f"blk.{n_layer}."
        put(b + "nextn.enorm.weight", src("mtp.pre_fc_norm_embedding.weight") + 1)
        put(b + "nextn.hnorm.weight", src("mtp.pre_fc_norm_hidden.weight") + 1)
        put(b + "nextn.eh_proj.weight", np.concatenate([src("mtp.fc_embedding.weight"), src("mtp.fc_hidden.weight")], axis=1))
        put(b + "nextn.hc_head_norm.weight", src("mtp.hyper_connection_mixer.hc_norm.weight") + 1)
        put(b + "nextn.hc_head_down.weight", src("mtp.hyper_connection_mixer.input_mix_weight_down.weight"))
        put(b + "nextn.hc_head_up.weight", src("mtp.hyper_connection_mixer.input_mix_weight_up.weight"))
        if meta.get("qwen4exp.nextn_predict_layers") != 1:
            errors_mtp = "qwen4exp.nextn_predict_layers must be 1 when the checkpoint has an MTP head"
            print(errors_mtp)
            return 1

    if tc.get("ple_layer_ids"):
        pl = tc["ple_layer_ids"][0] - 1
        base = f"{P}layers.{pl}.ple.ple_embedding."
        shards = [hf[f"{base}ngram_embedding.shard_{k}.weight"].astype(np.float32) for k in range(tc["split_ngram_parts"])]
        put("per_layer_token_embd.weight", np.concatenate(shards))
        for buf, key in [("layer_multipliers", "ple.layer_multipliers"), ("ngram_heads_offsets", "ple.head_offsets"),
                         ("ngram_heads_vocab_sizes", "ple.head_vocab_sizes")]:
            stored = [int(v) for v in hf[base + buf]]
            assert meta["qwen4exp." + key] == stored, f"{key}: {meta['qwen4exp.' + key]} != checkpoint {stored}"
        assert meta["qwen4exp.ple.layers"] == [pl]

    errors = []
    for name, want in expected.items():
        if name not in gg:
            errors.append(f"missing in GGUF: {name}")
            continue
        got = gg[name]
        if got.shape != want.shape:
            errors.append(f"{name}: shape {got.shape} != expected {want.shape}")
        elif not np.array_equal(got, want):
            errors.append(f"{name}: values differ (max |d| {np.max(np.abs(got - want))})")
    for name in gg:
        if name not in expected:
            errors.append(f"GGUF tensor with no source: {name}")
    unused = [n for n in hf if n not in used and not n.startswith("model.visual.")]
    for n in unused:
        errors.append(f"checkpoint tensor not converted: {n}")
    if tc.get("layer_types"):
        ratios = [0 if t == "linear_attention" else tc["indexer_compress_ratio"] for t in tc["layer_types"]]
        ratios += [0] * has_mtp  # the MTP block attends densely
        if meta["qwen4exp.attention.compress_ratios"] != ratios:
            errors.append(f"compress_ratios {meta['qwen4exp.attention.compress_ratios']} != {ratios}")
    checks = {"embedding_length": tc["hidden_size"], "block_count": n_layer + has_mtp,
              "expert_count": tc["num_experts"], "expert_used_count": tc["num_experts_per_tok"],
              "ssm.time_step_rank": n_v, "ssm.group_count": n_k, "ssm.state_size": dk, "ssm.inner_size": n_v * dv,
              "hyper_connection.count": tc["hc_count"], "hyper_connection.low_rank": tc["hc_lowrank"],
              "attention.indexer.top_k": tc["indexer_budget"], "attention.head_count": tc["num_attention_heads"],
              "attention.head_count_kv": tc["num_key_value_heads"]}
    for key, want in checks.items():
        if meta["qwen4exp." + key] != want:
            errors.append(f"qwen4exp.{key} = {meta['qwen4exp.' + key]}, expected {want}")
    if errors:
        print("\n".join(errors))
        return 1
    print(f"ok: {len(expected)} tensors equal their transformed sources; {len(used)} checkpoint tensors used")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
