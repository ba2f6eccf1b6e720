// Hugging Face tokenizer -> GGUF metadata. Mirrors llama.cpp's convert_hf_to_gguf.py
// (get_vocab_base + gguf.SpecialVocab) in what it writes, and refuses anything the engine's
// tokenizer would not reproduce exactly: another model type, an unknown pre-tokenizer regex,
// or a normaliser other than the one the pre type implies.

#include "convert/tokenizer_import.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace regolith {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json read_json(const fs::path& path, bool required) {
  std::optional<std::string> text = read_text(path);
  if (!text) {
    if (required) fail(path.string(), ": cannot read");
    return json();
  }
  try {
    return json::parse(*text);
  } catch (const json::exception& e) {
    fail(path.string(), ": invalid JSON: ", e.what());
  }
}

// The Split regex of the pre-tokenizer; the rest of the chain must be byte-level.
std::string split_regex(const json& pre, const std::string& source) {
  std::string regex;
  bool byte_level = false;
  auto visit = [&](const json& p) {
    std::string type = p.value("type", "");
    if (type == "Split") {
      if (!p.contains("pattern") || !p["pattern"].contains("Regex"))
        fail(source, ": pre_tokenizer Split without a Regex pattern");
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
        fail(source, ": pre_tokenizer Split must be Isolated and not inverted");
      regex = p["pattern"]["Regex"].get<std::string>();
    } else if (type == "ByteLevel") {
      if (p.value("use_regex", true) || p.value("add_prefix_space", false))
        fail(source, ": ByteLevel pre_tokenizer with use_regex or add_prefix_space is not supported");
      byte_level = true;
    } else {
      fail(source, ": pre_tokenizer type '", type, "' is not supported");
    }
  };
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    for (const json& p : pre["pretokenizers"]) visit(p);
  } else if (pre.is_object()) {
    visit(pre);
  }
  if (regex.empty() || !byte_level) fail(source, ": expected a Split regex followed by a ByteLevel pre_tokenizer");
  return regex;
}

// A special-token entry of tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> token_content(const json& config, const std::string& key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// llama.cpp's does_token_look_special: added tokens that models forgot to mark special.
bool looks_special(const std::string& t) {
  auto wrapped = [&](const std::string& open, const std::string& close) {
    return t.size() >= open.size() + close.size() && t.compare(0, open.size(), open) == 0 &&
           t.compare(t.size() - close.size(), close.size(), close) == 0;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wrapped("<|", "|>") ||
         wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") || wrapped("<unused", ">");
}

}  // namespace

void import_hf_tokenizer(const std::string& hf_dir, GgufWriter& writer, int64_t n_vocab) {
  const fs::path dir(hf_dir);
  const std::string tj_source = (dir / "tokenizer.json").string();
  const json tj = read_json(dir / "tokenizer.json", true);
  const json config = read_json(dir / "tokenizer_config.json", false);
  const json model_config = read_json(dir / "config.json", false);

  const json& model = tj.at("model");
  if (model.value("type", "") != "BPE") fail(tj_source, ": model type must be BPE");
  if (model.value("byte_fallback", false)) fail(tj_source, ": byte_fallback BPE is not supported");

  const std::string regex = split_regex(tj.value("pre_tokenizer", json()), tj_source);
  const PreTypeInfo* pre = find_pre_type_by_hf_regex(regex);
  if (!pre) fail(tj_source, ": unknown pre-tokenizer regex (not qwen2 or qwen35): ", regex);
  const json normalizer = tj.value("normalizer", json());
  const bool nfc = normalizer.is_object() && normalizer.value("type", "") == "NFC";
  if (nfc != pre->nfc || (!nfc && !normalizer.is_null()))
    fail(tj_source, ": normalizer ", normalizer.dump(), " does not match the '", pre->gguf_name,
         "' pre-tokenizer (which ", pre->nfc ? "applies NFC" : "does not normalise", ")");

  // id -> (text, type)
  std::map<int64_t, std::pair<std::string, TokenType>> by_id;
  std::map<std::string, int64_t> id_of;
  for (const auto& [text, id] : model.at("vocab").items()) {
    by_id[id.get<int64_t>()] = {text, TokenType::normal};
    id_of.emplace(text, id.get<int64_t>());
  }
  for (const json& added : tj.value("added_tokens", json::array())) {
    int64_t id = added.at("id").get<int64_t>();
    std::string text = added.at("content").get<std::string>();
    bool special = added.value("special", false) || looks_special(text);
    by_id[id] = {text, special ? TokenType::control : TokenType::user_defined};
    id_of[text] = id;
  }
  if (by_id.empty()) fail(tj_source, ": empty vocabulary");
  const int64_t n_defined = by_id.rbegin()->first + 1;
  if (by_id.begin()->first < 0) fail(tj_source, ": negative token id");
  if (n_vocab == 0) n_vocab = n_defined;
  if (n_vocab < n_defined)
    fail(tj_source, ": the tokenizer defines id ", n_defined - 1, " but the model has only ", n_vocab, " rows");

  std::vector<std::string> tokens(n_vocab);
  std::vector<int32_t> types(n_vocab);
  for (int64_t i = 0; i < n_vocab; ++i) {
    auto it = by_id.find(i);
    if (it == by_id.end()) {
      tokens[i] = cat("[PAD", i, "]");
      types[i] = static_cast<int32_t>(TokenType::unused);
    } else {
      tokens[i] = it->second.first;
      types[i] = static_cast<int32_t>(it->second.second);
    }
  }

  std::vector<std::string> merges;
  for (const json& m : model.at("merges")) {
    if (m.is_string())
      merges.push_back(m.get<std::string>());
    else if (m.is_array() && m.size() == 2)
      merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    else
      fail(tj_source, ": merge entry ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
  }

  writer.set("tokenizer.ggml.model", "gpt2");
  writer.set("tokenizer.ggml.pre", pre->gguf_name);
  writer.set("tokenizer.ggml.tokens", GgufValue::array(GgufType::STRING, tokens));
  writer.set("tokenizer.ggml.token_type", GgufValue::array(GgufType::INT32, types));
  writer.set("tokenizer.ggml.merges", GgufValue::array(GgufType::STRING, merges));

  // Special ids: tokenizer_config.json names them by text; config.json's *_token_id fills the
  // ones still missing (gguf-py SpecialVocab's order).
  const std::pair<const char*, const char*> specials[] = {
      {"bos", "tokenizer.ggml.bos_token_id"},
      {"eos", "tokenizer.ggml.eos_token_id"},
      {"unk", "tokenizer.ggml.unknown_token_id"},
      {"pad", "tokenizer.ggml.padding_token_id"},
  };
  for (const auto& [name, key] : specials) {
    std::optional<int64_t> id;
    if (std::optional<std::string> text = token_content(config, cat(name, "_token"))) {
      auto it = id_of.find(*text);
      if (it != id_of.end()) id = it->second;
    }
    if (!id && model_config.is_object()) {
      const json v = model_config.value(cat(name, "_token_id"), json());
      if (v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < n_vocab) id = v.get<int64_t>();
    }
    if (id) writer.set(key, static_cast<uint32_t>(*id));
  }
  if (config.is_object()) {
    writer.set("tokenizer.ggml.add_bos_token", config.value("add_bos_token", false));
    if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
      writer.set("tokenizer.ggml.add_eos_token", config["add_eos_token"].get<bool>());
  } else {
    writer.set("tokenizer.ggml.add_bos_token", false);
  }

  // chat_template.jinja (transformers' current layout) wins over the config's copy.
  if (std::optional<std::string> jinja = read_text(dir / "chat_template.jinja")) {
    writer.set("tokenizer.chat_template", *jinja);
  } else if (config.is_object() && config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      writer.set("tokenizer.chat_template", t.get<std::string>());
    } else if (t.is_array()) {  // named templates: [{"name": ..., "template": ...}]
      for (const json& named : t) {
        std::string name = named.value("name", "");
        std::string key = name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name;
        writer.set(key, named.value("template", ""));
      }
    }
  }
}

}  // namespace regolith
