// The text <-> token id boundary: a byte-level BPE tokenizer loaded from GGUF `tokenizer.ggml.*`
// metadata (model "gpt2", pre-tokenizer types of pretokenizer.h). It agrees with Hugging Face's
// `tokenizers` on the same vocabulary: added tokens are split out first, the rest is NFC-
// normalised (where the pre type declares it), pre-tokenized, and BPE-merged.
// It does not handle SentencePiece ("llama") or WordPiece vocabularies.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/special_tokens.h"

namespace regolith {

class GgufFile;

// llama.cpp's token types (`tokenizer.ggml.token_type`).
enum class TokenType : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,       // special tokens: <|im_start|>, <|endoftext|>, ...
  user_defined = 4,  // added tokens that are not special: <think>, <tool_call>, ...
  unused = 5,        // padding rows beyond the tokenizer's vocabulary
  byte = 6,          // byte-fallback tokens "<0xAB>"
};

struct EncodeOptions {
  bool add_special = true;    // prepend BOS / append EOS where the metadata asks for it
  bool parse_special = true;  // recognise control tokens in the text; user-defined ones always are
};

inline constexpr int32_t kNoToken = -1;

class Tokenizer {
 public:
  static Tokenizer from_gguf(const GgufFile& gguf);

  std::vector<int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // The bytes of the tokens, concatenated: byte-exact, so it may end inside a UTF-8 character
  // (use StreamingDetokenizer for text meant for people). skip_special drops control tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // The bytes of one token; empty for unused tokens and, with skip_special, control tokens.
  std::string_view token_bytes(int32_t id, bool skip_special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  TokenType token_type(int32_t id) const;
  const std::string& token_text(int32_t id) const;  // as stored in the GGUF
  int32_t find_token(std::string_view text) const;   // by stored text; kNoToken if absent
  bool is_control(int32_t id) const { return token_type(id) == TokenType::control; }

  PreType pre_type() const { return pre_.type(); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  int32_t pad_id() const { return pad_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // True for ids that end a generation: EOS, EOT and the `tokenizer.ggml.eog_token_ids` list.
  bool is_end_of_generation(int32_t id) const;
  const std::string& chat_template() const { return chat_template_; }

 private:
  explicit Tokenizer(PreType pre) : pre_(pre) {}
  void check_id(int32_t id) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;

  PreTokenizer pre_;
  bool nfc_ = true;
  BpeMerges merges_;
  std::vector<std::string> tokens_;      // stored text
  std::vector<std::string> bytes_;       // decoded bytes
  std::vector<TokenType> types_;
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> text_to_id_;  // first id wins
  SpecialTokenMatcher all_added_;        // control + user-defined
  SpecialTokenMatcher user_defined_;     // user-defined only
  int32_t bos_id_ = kNoToken, eos_id_ = kNoToken, eot_id_ = kNoToken, pad_id_ = kNoToken;
  std::vector<int32_t> eog_ids_;
  bool add_bos_ = false, add_eos_ = false;
  std::string chat_template_;
};

}  // namespace regolith
