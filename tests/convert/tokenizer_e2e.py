#!/usr/bin/python3
"""`regolith convert` with a real tokenizer: builds a checkpoint from a reference fixture whose
vocabulary is widened to Qwen3's (151,936 rows; the n-gram hash buffers are dropped, since they
depend on the vocabulary size, so the converter recomputes them), puts Qwen3's tokenizer.json
and tokenizer_config.json beside it, converts, and requires `regolith tokenize` on the converted
GGUF to give Hugging Face's ids (tests/data/tokenizer/expected_qwen2.jsonl) for corpus documents,
and the chat template to survive the import.

usage: tokenizer_e2e.py REGOLITH FIXTURE_HF_DIR QWEN3_TOKENIZER_DIR DATA_DIR WORK_DIR
Exit 77 (skipped) when the Qwen3 tokenizer was not fetched (npm unreachable).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np

ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/"
VOCAB = 151936


def unpack(s):
    v = [ALPHABET.index(c) for c in s]
    return [(v[i] << 12) | (v[i + 1] << 6) | v[i + 2] for i in range(0, len(v), 3)]


def read_checkpoint(hf_dir):
    index = json.load(open(os.path.join(hf_dir, "model.safetensors.index.json")))["weight_map"]
    out = {}
    for shard in sorted(set(index.values())):
        data = open(os.path.join(hf_dir, shard), "rb").read()
        (n,) = struct.unpack_from("<Q", data, 0)
        header = json.loads(data[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            out[name] = (info["dtype"], info["shape"], data[8 + n + b:8 + n + e])
    return out


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        blobs.append(raw)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def main(regolith, fixture_hf, tok_dir, data_dir, work):
    if not os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
        print(f"skipped: {tok_dir}/tokenizer.json is absent (npm unreachable when it was fetched)")
        return 77
    shutil.rmtree(work, ignore_errors=True)
    hf = os.path.join(work, "hf")
    os.makedirs(hf)
    cfg = json.load(open(os.path.join(fixture_hf, "config.json")))
    tc = cfg["text_config"]
    tc["vocab_size"] = VOCAB
    tc["eos_token_id"] = tc["bos_token_id"] = 151643  # <|endoftext|>
    for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
        cfg.pop(k, None)
    json.dump(cfg, open(os.path.join(hf, "config.json"), "w"))

    rng = np.random.default_rng(7)
    tensors = {}
    for name, (dtype, shape, raw) in read_checkpoint(fixture_hf).items():
        if "ple_embedding.layer_multipliers" in name or "ngram_heads_" in name:
            continue
        if name.endswith("embed_tokens.weight") or name == "lm_head.weight":
            shape = [VOCAB, shape[1]]
            raw = rng.standard_normal(shape, dtype=np.float32).tobytes()
            dtype = "F32"
        tensors[name] = (dtype, shape, raw)
    write_safetensors(os.path.join(hf, "model.safetensors"), tensors)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, f), hf)

    gguf = os.path.join(work, "model.gguf")
    subprocess.run([regolith, "convert", hf, "-o", gguf, "--outtype", "f16"], check=True)

    expected = {}
    for line in open(os.path.join(data_dir, "expected_qwen2.jsonl")):
        d = json.loads(line)
        expected[d["name"]] = unpack(d["ids"])
    checked = mismatched = 0
    text_file = os.path.join(work, "doc.txt")
    for line in open(os.path.join(data_dir, "corpus.jsonl")):
        doc = json.loads(line)
        if checked >= 60:
            break
        open(text_file, "w", encoding="utf-8", newline="").write(doc["text"])
        out = subprocess.run([regolith, "tokenize", "-m", gguf, "-f", text_file, "--ids"],
                             capture_output=True, text=True, check=True).stdout
        ids = json.loads(out)
        checked += 1
        if ids != expected[doc["name"]]:
            mismatched += 1
            print(f"MISMATCH {doc['name']}: {len(ids)} ids vs {len(expected[doc['name']])} expected")
    chat = subprocess.run([regolith, "tokenize", "-m", gguf, "-p", "hi", "--chat"], capture_output=True, text=True)
    if chat.returncode != 0 or "<|im_start|>" not in chat.stdout:
        print(f"chat template did not survive the import: rc={chat.returncode} {chat.stdout[:200]} {chat.stderr[:200]}")
        mismatched += 1
    print(f"{checked} documents tokenized through the converted GGUF, {mismatched} mismatches")
    return 1 if mismatched else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
