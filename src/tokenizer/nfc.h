// Unicode NFC normalisation, which the Qwen tokenizers declare (tokenizer.json "normalizer":
// {"type": "NFC"}). The decomposition and composition tables come from ICU (Debian libicu-dev)
// rather than being regenerated here: they are large, versioned data that ICU keeps current.
#pragma once

#include <string>
#include <string_view>

namespace regolith {

// NFC of text. Invalid UTF-8 bytes are kept as they are, and the valid runs between them are
// normalised separately, so no byte of the input is lost.
std::string nfc_normalize(std::string_view text);

}  // namespace regolith
