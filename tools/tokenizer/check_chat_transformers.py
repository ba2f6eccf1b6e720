#!/usr/bin/env python3
"""Re-renders tests/data/tokenizer/chat/cases.json with transformers' own template compiler.

make_chat_cases.py reproduces transformers' Jinja2 setup by hand; this confirms the expected
outputs equal what transformers itself renders (its _compile_jinja_template, same variables).
Usage (where transformers is installed): python3 tools/tokenizer/check_chat_transformers.py
"""
import json
import os
import sys

import transformers
from transformers.utils import chat_template_utils as ctu

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "..", "..", "tests", "data", "tokenizer", "chat")


def main():
    with open(os.path.join(CHAT, "cases.json"), encoding="utf-8") as f:
        data = json.load(f)
    sources = {}
    for key, file in data["templates"].items():
        with open(os.path.join(CHAT, file), encoding="utf-8") as f:
            sources[key] = f.read()
    same = differ = 0
    for case in data["cases"]:
        template = ctu._compile_jinja_template(sources[case["template"]])
        ctx = {"messages": case["messages"], "tools": case["tools"], "documents": None,
               "add_generation_prompt": case["add_generation_prompt"], **data["special_tokens"], **case["extra"]}
        try:
            got = {"expected": template.render(**ctx)}
        except Exception as e:
            got = {"error": f"{type(e).__name__}: {e}"}
        ok = ("expected" in case and got.get("expected") == case["expected"]) or ("error" in case and "error" in got)
        same += ok
        differ += not ok
        if not ok:
            print(f"{case['name']}: transformers {json.dumps(got)[:300]}")
    print(f"transformers {transformers.__version__}: {same}/{same + differ} cases agree with cases.json")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
