#!/usr/bin/python3
"""The MTP head through `regolith convert`: transformers saves no mtp.* tensors, so this adds a
synthetic MTP head (a QSA decoder layer under mtp.layers.0. with its own random values, the fc
projections, pre-fc norms and mixer, in an extra shard listed in the index) to a copy of a
reference checkpoint, converts it, checks every tensor with check_converted.py (the trailing
blk.N with nextn.* tensors), and requires the trunk's logits to be unchanged by the extra block.

usage: mtp_e2e.py REGOLITH FIXTURE_HF_DIR WORK_DIR
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def read_header(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    return json.loads(data[8:8 + n])


def main(regolith, fixture_hf, work):
    shutil.rmtree(work, ignore_errors=True)
    hf = os.path.join(work, "hf")
    shutil.copytree(fixture_hf, hf)
    cfg = json.load(open(os.path.join(hf, "config.json")))
    tc = cfg["text_config"]
    H, S = tc["hidden_size"], tc["hc_count"]
    qsa_layer = next(i for i, t in enumerate(tc["layer_types"]) if t != "linear_attention")
    index_path = os.path.join(hf, "model.safetensors.index.json")
    index = json.load(open(index_path))
    prefix = f"model.language_model.layers.{qsa_layer}."
    rng = np.random.default_rng(11)
    shapes = {}
    for name, shard in index["weight_map"].items():
        if name.startswith(prefix):
            shapes["mtp.layers.0." + name[len(prefix):]] = read_header(os.path.join(hf, shard))[name]["shape"]
    mixer = "model.language_model.hyper_connection_mixer."
    for part in ("hc_norm.weight", "input_mix_weight_down.weight", "input_mix_weight_up.weight"):
        shapes["mtp.hyper_connection_mixer." + part] = read_header(os.path.join(hf, index["weight_map"][mixer + part]))[mixer + part]["shape"]
    shapes.update({"mtp.pre_fc_norm_embedding.weight": [H], "mtp.pre_fc_norm_hidden.weight": [S * H],
                   "mtp.fc_embedding.weight": [H, H], "mtp.fc_hidden.weight": [H, H]})
    header, blobs, offset = {}, [], 0
    for name, shape in sorted(shapes.items()):
        raw = (rng.standard_normal(shape, dtype=np.float32) * 0.3).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
        index["weight_map"][name] = "model-mtp.safetensors"
    h = json.dumps(header).encode()
    with open(os.path.join(hf, "model-mtp.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    json.dump(index, open(index_path, "w"))
    tc["mtp_num_hidden_layers"] = 1
    json.dump(cfg, open(os.path.join(hf, "config.json"), "w"))

    with_mtp, without = os.path.join(work, "mtp.gguf"), os.path.join(work, "plain.gguf")
    subprocess.run([regolith, "convert", hf, "-o", with_mtp, "--outtype", "f32"], check=True)
    subprocess.run([regolith, "convert", fixture_hf, "-o", without, "--outtype", "f32"], check=True)
    rc = subprocess.run([sys.executable, os.path.join(HERE, "check_converted.py"), hf, with_mtp]).returncode
    if rc != 0:
        return rc
    outs = []
    for model in (with_mtp, without):
        out = os.path.join(work, os.path.basename(model) + ".f32")
        subprocess.run([regolith, "logits", "-m", model, "--tokens", "1,2,3,4,5,6", "--out", out],
                       check=True, capture_output=True)
        outs.append(np.fromfile(out, np.float32))
    if not np.array_equal(outs[0], outs[1]):
        print(f"the MTP block changed the trunk's logits: max |d| {np.max(np.abs(outs[0] - outs[1]))}")
        return 1
    print(f"MTP head converted to blk.{tc['num_hidden_layers']} (nextn.*); trunk logits unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
