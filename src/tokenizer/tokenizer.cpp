// Loading the vocabulary from GGUF metadata, and the encode/decode paths.

#include "tokenizer/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "gguf/gguf.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/nfc.h"

namespace regolith {
namespace {

constexpr const char* kKeyModel = "tokenizer.ggml.model";
constexpr const char* kKeyPre = "tokenizer.ggml.pre";
constexpr const char* kKeyTokens = "tokenizer.ggml.tokens";
constexpr const char* kKeyTypes = "tokenizer.ggml.token_type";
constexpr const char* kKeyMerges = "tokenizer.ggml.merges";

int32_t optional_id(const GgufFile& f, const char* key, int32_t n_vocab) {
  const GgufValue* v = f.find(key);
  if (!v) return kNoToken;
  int64_t id = v->as_int(key);
  // llama.cpp writes -1 (as uint32 0xFFFFFFFF in some files) for "none"
  if (id < 0 || id == 0xFFFFFFFF) return kNoToken;
  if (id >= n_vocab) fail(f.source(), ": ", key, " = ", id, " is outside the vocabulary of ", n_vocab, " tokens");
  return static_cast<int32_t>(id);
}

bool optional_bool(const GgufFile& f, const char* key, bool fallback) {
  const GgufValue* v = f.find(key);
  return v ? v->as_bool(key) : fallback;
}

// "<0xAB>" -> 0xAB, for byte-fallback tokens.
int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value;
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& model = f.get(kKeyModel).as_string(kKeyModel);
  if (model != "gpt2")
    fail(f.source(), ": ", kKeyModel, " is '", model, "'; only byte-level BPE ('gpt2') is supported");
  const GgufValue* pre_value = f.find(kKeyPre);
  std::string pre_name = pre_value ? pre_value->as_string(kKeyPre) : std::string("(missing)");
  const PreTypeInfo* pre = find_pre_type_by_name(pre_name);
  if (!pre) fail(f.source(), ": ", kKeyPre, " is '", pre_name, "'; supported pre-tokenizers: qwen2, qwen35");

  Tokenizer tok(pre->type);
  tok.nfc_ = pre->nfc;
  tok.tokens_ = f.get(kKeyTokens).as_string_array(kKeyTokens);
  const auto n_vocab = static_cast<int32_t>(tok.tokens_.size());
  if (n_vocab == 0) fail(f.source(), ": ", kKeyTokens, " is empty");

  tok.types_.assign(n_vocab, TokenType::normal);
  if (const GgufValue* types = f.find(kKeyTypes)) {
    std::vector<int64_t> t = types->as_int_array(kKeyTypes);
    if (t.size() != tok.tokens_.size())
      fail(f.source(), ": ", kKeyTypes, " has ", t.size(), " entries for ", n_vocab, " tokens");
    for (int32_t i = 0; i < n_vocab; ++i) {
      if (t[i] < 0 || t[i] > static_cast<int64_t>(TokenType::byte))
        fail(f.source(), ": ", kKeyTypes, "[", i, "] = ", t[i], " is not a token type (0..6)");
      tok.types_[i] = static_cast<TokenType>(t[i]);
    }
  }

  tok.bytes_.resize(n_vocab);
  tok.text_to_id_.reserve(n_vocab);
  for (int32_t i = 0; i < n_vocab; ++i) {
    const std::string& text = tok.tokens_[i];
    tok.text_to_id_.emplace(text, i);
    switch (tok.types_[i]) {
      case TokenType::control:
        tok.all_added_.add(text, i);
        tok.bytes_[i] = text;
        break;
      case TokenType::user_defined:
        tok.all_added_.add(text, i);
        tok.user_defined_.add(text, i);
        tok.bytes_[i] = text;
        break;
      case TokenType::unused:
        break;
      case TokenType::byte: {
        int b = parse_byte_token(text);
        if (b < 0) fail(f.source(), ": byte token ", i, " '", text, "' is not of the form <0xAB>");
        tok.bytes_[i] = std::string(1, static_cast<char>(b));
        break;
      }
      default: {
        // Vocabulary tokens are written in the byte-level alphabet; one that is not is kept as
        // its own text rather than rejected, as llama.cpp does.
        std::optional<std::string> raw = byte_level::decode(text);
        tok.bytes_[i] = raw ? std::move(*raw) : text;
      }
    }
  }

  std::array<int32_t, 256> byte_ids{};
  for (int b = 0; b < 256; ++b) {
    int32_t id = tok.find_token(byte_level::byte_to_text(static_cast<uint8_t>(b)));
    // Bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5..0xFF) may lack a token in tiny test
    // vocabularies; text containing one then fails to encode with an error.
    bool never_in_utf8 = b == 0xC0 || b == 0xC1 || b >= 0xF5;
    if (id == kNoToken && !never_in_utf8)
      fail(f.source(), ": the vocabulary has no token for byte 0x", std::hex, b,
           " (a byte-level BPE vocabulary must cover every byte that occurs in UTF-8)");
    byte_ids[b] = id;
  }
  tok.merges_ = BpeMerges(byte_ids);
  const GgufValue& merges_value = f.get(kKeyMerges);
  const GgufArray& merges = merges_value.as_array(kKeyMerges);
  std::string joined;
  for (size_t r = 0; r < merges.items.size(); ++r) {
    const std::string& m = merges.items[r].as_string(kKeyMerges);
    size_t space = m.find(' ', 1);  // the left part is never empty; a space is never inside a part
    if (space == std::string::npos || space + 1 >= m.size())
      fail(f.source(), ": merge ", r, " '", m, "' is not two tokens separated by a space");
    std::string_view left(m.data(), space), right(m.data() + space + 1, m.size() - space - 1);
    joined.assign(left).append(right);
    int32_t l = tok.find_token(left), rt = tok.find_token(right), merged = tok.find_token(joined);
    if (l == kNoToken || rt == kNoToken || merged == kNoToken)
      fail(f.source(), ": merge ", r, " '", m, "' refers to a token that is not in the vocabulary");
    tok.merges_.add(l, rt, merged);
  }

  tok.bos_id_ = optional_id(f, "tokenizer.ggml.bos_token_id", n_vocab);
  tok.eos_id_ = optional_id(f, "tokenizer.ggml.eos_token_id", n_vocab);
  tok.eot_id_ = optional_id(f, "tokenizer.ggml.eot_token_id", n_vocab);
  tok.pad_id_ = optional_id(f, "tokenizer.ggml.padding_token_id", n_vocab);
  tok.add_bos_ = optional_bool(f, "tokenizer.ggml.add_bos_token", false);
  tok.add_eos_ = optional_bool(f, "tokenizer.ggml.add_eos_token", false);
  if (tok.add_bos_ && tok.bos_id_ == kNoToken) fail(f.source(), ": add_bos_token is set but there is no bos_token_id");
  if (tok.add_eos_ && tok.eos_id_ == kNoToken) fail(f.source(), ": add_eos_token is set but there is no eos_token_id");
  if (const GgufValue* eog = f.find("tokenizer.ggml.eog_token_ids"))
    for (int64_t id : eog->as_int_array("tokenizer.ggml.eog_token_ids")) {
      if (id < 0 || id >= n_vocab) fail(f.source(), ": eog token id ", id, " is outside the vocabulary");
      tok.eog_ids_.push_back(static_cast<int32_t>(id));
    }
  if (const GgufValue* t = f.find("tokenizer.chat_template")) tok.chat_template_ = t->as_string("tokenizer.chat_template");
  return tok;
}

void Tokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= n_vocab()) fail("token id ", id, " is outside the vocabulary of ", n_vocab(), " tokens");
}

TokenType Tokenizer::token_type(int32_t id) const {
  check_id(id);
  return types_[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return tokens_[id];
}

int32_t Tokenizer::find_token(std::string_view text) const {
  auto it = text_to_id_.find(text);
  return it == text_to_id_.end() ? kNoToken : it->second;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  if (id == kNoToken) return false;
  return id == eos_id_ || id == eot_id_ || std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  pre_.split(text, [&](std::string_view piece) { merges_.encode_piece(piece, out); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (options.add_special && add_bos_) out.push_back(bos_id_);
  const SpecialTokenMatcher& added = options.parse_special ? all_added_ : user_defined_;
  if (added.empty()) {
    encode_plain(text, out);
  } else {
    for (const SpecialTokenMatcher::Segment& s : added.split(text)) {
      if (s.id >= 0)
        out.push_back(s.id);
      else
        encode_plain(s.text, out);
    }
  }
  if (options.add_special && add_eos_) out.push_back(eos_id_);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id, bool skip_special) const {
  check_id(id);
  if (skip_special && types_[id] == TokenType::control) return {};
  return bytes_[id];
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) out.append(token_bytes(id, skip_special));
  return out;
}

}  // namespace regolith
