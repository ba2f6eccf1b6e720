// GPT-2's byte-level alphabet: every byte maps to one printable code point, so that a BPE
// vocabulary over bytes can be written as text ("Ġthe" is " the"). Byte-level tokens in GGUF
// `tokenizer.ggml.tokens` are stored in this alphabet; control and added tokens are not.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace regolith::byte_level {

// The code point that stands for byte b.
char32_t byte_to_code_point(uint8_t b);

// The UTF-8 text of the code point for byte b ("Ġ" for 0x20).
const std::string& byte_to_text(uint8_t b);

// Raw bytes of a token written in the alphabet; nullopt when a character is not in it.
std::optional<std::string> decode(std::string_view text);

// The alphabet form of raw bytes.
std::string encode(std::string_view bytes);

}  // namespace regolith::byte_level
