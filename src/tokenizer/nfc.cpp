// NFC through ICU's UTF-8 normaliser, with fast exits for ASCII and already-normal text
// (nearly all input), so the common case costs one scan.

#include "tokenizer/nfc.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace regolith {
namespace {

const icu::Normalizer2& nfc_instance() {
  static const icu::Normalizer2* instance = [] {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status)) fail("ICU: NFC normaliser unavailable: ", u_errorName(status));
    return n;
  }();
  return *instance;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

// Normalises valid UTF-8 and appends it to out.
void normalize_valid(std::string_view run, std::string& out) {
  if (run.empty()) return;
  const icu::Normalizer2& nfc = nfc_instance();
  UErrorCode status = U_ZERO_ERROR;
  icu::StringPiece piece(run.data(), static_cast<int32_t>(run.size()));
  if (nfc.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
    out.append(run);
    return;
  }
  status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(&out);
  nfc.normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) fail("ICU: NFC normalisation failed: ", u_errorName(status));
}

}  // namespace

std::string nfc_normalize(std::string_view text) {
  if (is_ascii(text)) return std::string(text);
  if (text.size() > static_cast<size_t>(INT32_MAX)) fail("text of ", text.size(), " bytes is too long to normalise");
  std::string out;
  out.reserve(text.size());
  size_t run_start = 0, pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t n = utf8::sequence_length(text.substr(pos));
    if (n > 0) {
      pos += n;
      continue;
    }
    normalize_valid(text.substr(run_start, pos - run_start), out);
    out += text[pos];  // an invalid byte passes through untouched
    run_start = ++pos;
  }
  normalize_valid(text.substr(run_start), out);
  return out;
}

}  // namespace regolith
