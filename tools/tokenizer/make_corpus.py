#!/usr/bin/python3
"""Writes tests/data/tokenizer/corpus.jsonl: the tokenizer test corpus (about 1.1 MB of text).

Each line is {"name": ..., "text": ...}; every document is tokenized on its own. The text comes
from freely redistributable files that Debian installs (license texts, Python's own
documentation topics and standard library, C headers) and from seeded generators for the
categories those lack (numbers, CJK, emoji, other scripts, NFC/NFD forms, whitespace, special
tokens). Generated characters are limited to those assigned in Unicode 14 (this Python's
unicodedata), because PCRE2 10.42 knows no later ones and the references know later versions.

Run with Debian's python3 (3.11): /usr/bin/python3 tools/tokenizer/make_corpus.py
"""
import glob
import json
import os
import random
import sys
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer", "corpus.jsonl")
rng = random.Random(20251130)
docs = []


def add(name, text):
    if text:
        docs.append({"name": name, "text": text})


def chunks(name, text, lo=1500, hi=6000):
    """Cuts text into documents of varied size at arbitrary points (mid-word too)."""
    pos, i = 0, 0
    while pos < len(text):
        n = rng.randint(lo, hi)
        add(f"{name}/{i}", text[pos:pos + n])
        pos += n
        i += 1


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


# --- English prose: licenses and Python's documentation topics -------------------------------
for lic in ["GPL-3", "Apache-2.0", "MPL-2.0", "Artistic", "CC0-1.0", "BSD"]:
    chunks(f"license/{lic}", read(f"/usr/share/common-licenses/{lic}"))
topics = read("/usr/lib/python3.11/pydoc_data/topics.py")
chunks("english/pydoc", topics[20000:220000])

# --- Code: Python, C/C++ headers, JSON ------------------------------------------------------
for mod in ["textwrap", "json/decoder", "heapq", "bisect", "string", "fractions", "argparse"]:
    chunks(f"code/python/{mod}", read(f"/usr/lib/python3.11/{mod}.py")[:20000])
for hdr in ["stdio.h", "stdlib.h", "string.h", "math.h", "pthread.h"]:
    path = f"/usr/include/{hdr}"
    if os.path.exists(path):
        chunks(f"code/c/{hdr}", read(path)[:10000])
for hdr in sorted(glob.glob("/usr/include/c++/12/bits/stl_*.h"))[:3]:
    chunks(f"code/cpp/{os.path.basename(hdr)}", read(hdr)[:12000])
obj = {"model": {"type": "BPE", "dropout": None, "vocab": {f"tok{i}": i for i in range(300)}},
       "values": [rng.random() * 10 ** rng.randint(-8, 12) for _ in range(200)],
       "ünïcödé": "naïve café — “quotes” ‘single’ …", "nested": [[1, [2, [3, {"a": None}]]]]}
add("code/json/pretty", json.dumps(obj, indent=2, ensure_ascii=False))
add("code/json/compact", json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
add("code/json/ascii", json.dumps(obj, indent="\t"))


# --- Numbers ---------------------------------------------------------------------------------
def numbers_doc():
    parts = []
    for _ in range(rng.randint(100, 300)):
        k = rng.randint(0, 9)
        if k == 0:
            parts.append(str(rng.randint(0, 10 ** rng.randint(1, 30))))
        elif k == 1:
            parts.append(f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 9)}f}")
        elif k == 2:
            parts.append(f"{rng.randint(1900, 2100)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        elif k == 3:
            parts.append(f"+{rng.randint(1, 99)} ({rng.randint(100, 999)}) {rng.randint(100, 999)}-{rng.randint(1000, 9999)}")
        elif k == 4:
            parts.append(f"{rng.random():.3e}")
        elif k == 5:
            parts.append(f"{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}")
        elif k == 6:
            parts.append(f"{rng.randint(0, 10**9):,}")
        elif k == 7:
            parts.append(f"0x{rng.getrandbits(64):x}")
        elif k == 8:
            parts.append("".join(rng.choice("٠١٢٣٤٥٦٧٨٩०१२३४५६७८९０１２３４５６７８９①②③¼½¾²³") for _ in range(rng.randint(1, 12))))
        else:
            parts.append(f"{rng.randint(1, 100)}%")
        parts.append(rng.choice([" ", " ", ", ", "\n", "\t", "; ", " | ", ""]))
    return "".join(parts)


for i in range(25):
    add(f"numbers/{i}", numbers_doc())


# --- Unicode text generated from the Unicode 14 repertoire -------------------------------------
def assigned(lo, hi, cats=None):
    out = []
    for cp in range(lo, hi + 1):
        ch = chr(cp)
        cat = unicodedata.category(ch)
        if cat in ("Cn", "Cs", "Co"):
            continue
        if cats and cat[0] not in cats:
            continue
        out.append(ch)
    return out


CJK = assigned(0x4E00, 0x9FFF)
COMMON_CJK = CJK[:3500]  # the lower part of the block holds the frequent characters
KANA = assigned(0x3041, 0x30FF)
HANGUL = assigned(0xAC00, 0xD7A3)
CJK_PUNCT = list("，。！？、；：「」『』（）《》【】…—～·")
SCRIPTS = {
    "cyrillic": assigned(0x0410, 0x044F), "greek": assigned(0x0391, 0x03C9, "L"),
    "arabic": assigned(0x0621, 0x064A), "hebrew": assigned(0x05D0, 0x05EA),
    "devanagari": assigned(0x0905, 0x0939) + assigned(0x093E, 0x094D), "thai": assigned(0x0E01, 0x0E3A),
    "georgian": assigned(0x10D0, 0x10FA), "armenian": assigned(0x0561, 0x0586),
    "latin-ext": assigned(0x00C0, 0x024F, "L"), "ipa": assigned(0x0250, 0x02AF),
}
EMOJI = assigned(0x1F300, 0x1F5FF) + assigned(0x1F600, 0x1F64F) + assigned(0x1F680, 0x1F6C5) + assigned(0x1F900, 0x1F9FF)
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
FLAGS = ["🇺🇸", "🇯🇵", "🇫🇷", "🇧🇷", "🇨🇳", "🇩🇪", "🇮🇳", "🏳️‍🌈", "🏴‍☠️"]
ZWJ_SEQ = ["👨‍👩‍👧‍👦", "👩🏽‍💻", "🧑‍🚀", "❤️‍🔥", "🐻‍❄️", "1️⃣", "#️⃣", "©️", "☺️"]


def cjk_doc():
    out = []
    for _ in range(rng.randint(150, 600)):
        r = rng.random()
        if r < 0.55:
            out.append("".join(rng.choice(COMMON_CJK) for _ in range(rng.randint(1, 12))))
        elif r < 0.7:
            out.append("".join(rng.choice(KANA) for _ in range(rng.randint(1, 8))))
        elif r < 0.8:
            out.append("".join(rng.choice(HANGUL) for _ in range(rng.randint(1, 5))) + rng.choice([" ", ""]))
        elif r < 0.85:
            out.append(rng.choice(["Python", "GPU", "API", " 2025年", "3.14", "Qwen3", " OK", "AI"]))
        else:
            out.append(rng.choice(CJK_PUNCT + ["\n", " ", "\n\n"]))
    return "".join(out)


def script_doc(chars):
    words = []
    for _ in range(rng.randint(200, 600)):
        w = "".join(rng.choice(chars) for _ in range(rng.randint(1, 9)))
        words.append(w + rng.choice([" ", " ", " ", ", ", ". ", "\n", "-", "'s "]))
    return "".join(words)


def emoji_doc():
    out = []
    for _ in range(rng.randint(200, 500)):
        r = rng.random()
        if r < 0.45:
            out.append(rng.choice(EMOJI))
        elif r < 0.55:
            out.append(rng.choice(EMOJI[:300]) + rng.choice(SKIN))
        elif r < 0.65:
            out.append(rng.choice(FLAGS + ZWJ_SEQ))
        elif r < 0.85:
            out.append(rng.choice([" great", " 😂😂", "!!", " lol", " ok", "🎉 done", " 你好"]))
        else:
            out.append(rng.choice([" ", "\n", "\uFE0F", "\u200D", " "]))
    return "".join(out)


for i in range(30):
    add(f"cjk/{i}", cjk_doc())
for name, chars in SCRIPTS.items():
    for i in range(3):
        add(f"script/{name}/{i}", script_doc(chars))
for i in range(20):
    add(f"emoji/{i}", emoji_doc())


# --- Normalisation: decomposed forms, singletons, Hangul jamo, combining marks ----------------
def nfc_doc():
    base = topics[rng.randint(0, 600000):][:2000]
    accented = "àáâãäåçèéêëìíîïñòóôõöùúûüýÿĀāĂăĄąĆćČčĎďĒēĚěĞğĪīŁłŃńŇňŌōŘřŚśŠšŤťŪūŮůŹźŽžǍǎǏǐǑǒǓǔ"
    out = []
    for ch in base:
        r = rng.random()
        if ch.isalpha() and r < 0.15:
            out.append(unicodedata.normalize("NFD", rng.choice(accented)))
        elif r < 0.17:
            out.append(rng.choice(["\u212B", "\u2126", "\u212A", "\uF900", "\uFA10", "\u1E9B\u0323", "\u0344", "\u0958", "\u2FA1D"]))
        elif r < 0.19:
            out.append(rng.choice(["\u1100\u1161", "\u1100\u1161\u11A8", "\u110B\u1173", "e\u0301\u0327", "a\u0328\u0301", "o\u0308\u0304", "\u0928\u093C", "\u0915\u094D\u0937"]))
        elif r < 0.2:
            out.append(rng.choice(["\u0301", "\u0308", "\u0327", "\u20DD", "\u0300\u0316"]))
        out.append(ch)
    return "".join(out)


for i in range(30):
    add(f"nfc/{i}", nfc_doc())

# --- Whitespace, contractions and random Unicode -----------------------------------------------
WS = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", "\u00A0", "\u3000", "\u2028", "\u2029",
      "\u0085", "\u000B", "\u000C", "\u2003", "\u202F", "\u205F", "\u1680", "\u180E", "\u200B", " \n ", "\n  \n"]
WORDS = "the quick brown fox jumps over lazy dog I it you we they don't can't won't he's she'd we'll they've I'm".split()


def whitespace_doc():
    out = []
    for _ in range(rng.randint(300, 900)):
        r = rng.random()
        if r < 0.5:
            w = rng.choice(WORDS)
            out.append(w.upper() if rng.random() < 0.2 else w)
        elif r < 0.6:
            out.append(rng.choice(["'s", "'S", "'ll", "'LL", "'re", "'Ve", "'d", "'M", "’s", "'x", "''", "'"]))
        elif r < 0.7:
            out.append(rng.choice(list(".,;:!?()[]{}<>\"'`~@#$%^&*-_=+/\\|") + ["...", "->", "=>", "::", "//"]))
        else:
            out.append(rng.choice(WS))
    return "".join(out)


for i in range(40):
    add(f"whitespace/{i}", whitespace_doc())

UNICODE_ALL = [chr(c) for c in range(0x20, 0x30000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
for i in range(20):
    add(f"random-unicode/{i}", "".join(rng.choice(UNICODE_ALL) for _ in range(rng.randint(300, 1500))))

# --- Special tokens: chat transcripts, near misses, tokens glued to text ------------------------
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
           "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
           "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|file_sep|>", "<|repo_name|>"]
NEAR = ["<|im_start", "im_end|>", "<|im_end |>", "< think>", "<think", "<|endoftext", "<|<|im_end|>|>", "<<think>>",
        "<|IM_START|>", "</think >", "<tool_call", "<|", "|>"]


def special_doc():
    out = []
    for _ in range(rng.randint(30, 90)):
        r = rng.random()
        if r < 0.3:
            role = rng.choice(["system", "user", "assistant", "tool"])
            out.append(f"<|im_start|>{role}\n{rng.choice(topics[100000:400000].split('. '))[:300]}<|im_end|>\n")
        elif r < 0.55:
            out.append(rng.choice(SPECIAL))
        elif r < 0.7:
            out.append(rng.choice(NEAR))
        else:
            out.append(rng.choice(WORDS + ["\n", " ", "你好", "🎉", "x"]))
    return "".join(out)


for i in range(25):
    add(f"special/{i}", special_doc())

# --- Pathological: long runs ----------------------------------------------------------------
add("long/spaces", " " * 5000 + "x" + "\n" * 3000 + " \t" * 1000)
add("long/letters", "a" * 3000 + " " + "ab" * 2000 + " " + "é" * 500)
add("long/digits", "1234567890" * 300)
add("long/punct", "!?" * 1500 + "=" * 2000)
add("long/cjk", "的" * 2000 + "一二三" * 300)

os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w", encoding="utf-8", newline="\n") as f:
    for d in docs:
        f.write(json.dumps(d, ensure_ascii=False) + "\n")
total = sum(len(d["text"].encode("utf-8")) for d in docs)
print(f"{OUT}: {len(docs)} documents, {total} bytes of text", file=sys.stderr)
