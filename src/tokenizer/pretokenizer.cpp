// Pre-tokenizer regexes, compiled with PCRE2.
//
// Hugging Face compiles these patterns with Oniguruma, whose Unicode `\s` is the White_Space
// property. PCRE2's UCP `\s` also takes U+180E and other "horizontal space" characters, so the
// PCRE2 forms below spell `\s` as \p{White_Space} (and `\S` as \P{White_Space}); otherwise
// they are the Hugging Face patterns verbatim.

#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include "core/error.h"

namespace regolith {
namespace {

struct PatternEntry {
  PreTypeInfo info;
  const char* pcre2_regex;
};

const std::array<PatternEntry, 2> kPatterns = {{
    {{PreType::qwen2, "qwen2",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      true},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\p{White_Space}\p{L}\p{N}]+[\r\n]*|\p{White_Space}*[\r\n]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)"},
    {{PreType::qwen35, "qwen35",
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      true},
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\p{White_Space}\p{L}\p{M}\p{N}]+[\r\n]*|\p{White_Space}*[\r\n]+|\p{White_Space}+(?!\P{White_Space})|\p{White_Space}+)"},
}};

const PatternEntry& entry(PreType type) {
  for (const PatternEntry& e : kPatterns)
    if (e.info.type == type) return e;
  fail("unknown pre-tokenizer type ", static_cast<int>(type));
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

const PreTypeInfo& pre_type_info(PreType type) { return entry(type).info; }

const PreTypeInfo* find_pre_type_by_name(std::string_view gguf_name) {
  for (const PatternEntry& e : kPatterns)
    if (gguf_name == e.info.gguf_name) return &e.info;
  return nullptr;
}

const PreTypeInfo* find_pre_type_by_hf_regex(std::string_view hf_regex) {
  for (const PatternEntry& e : kPatterns)
    if (hf_regex == e.info.hf_regex) return &e.info;
  return nullptr;
}

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(PreType type) : type_(type), compiled_(std::make_unique<Compiled>()) {
  const char* pattern = entry(type).pcre2_regex;
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: invalid bytes never match and fall into the gaps between matches,
  // instead of failing the whole match.
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                  PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!compiled_->code)
    fail("pre-tokenizer '", entry(type).info.gguf_name, "': PCRE2 compile error at offset ", offset, ": ",
         pcre2_message(error));
  // JIT is an optimisation; the interpreter gives identical matches if it is unavailable.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, const std::function<void(std::string_view)>& emit) const {
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
  if (!match) fail("pre-tokenizer: out of memory");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(compiled_->code, subject, text.size(), pos, 0, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("pre-tokenizer: PCRE2 match error: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match.get());
    size_t begin = ov[0], end = ov[1];
    if (begin > pos) emit(text.substr(pos, begin - pos));
    if (end == begin) {  // none of the patterns matches empty; guard against looping anyway
      if (begin >= text.size()) break;
      end = begin + 1;
    }
    emit(text.substr(begin, end - begin));
    pos = end;
  }
  if (pos < text.size()) emit(text.substr(pos));
}

}  // namespace regolith
