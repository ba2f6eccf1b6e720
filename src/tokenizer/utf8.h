// UTF-8 helpers shared by the tokenizer, the streaming detokenizer and the Jinja interpreter.
// Decoding is strict (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF), because
// the pre-tokenizer and the normaliser must agree on where a character starts and ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace regolith::utf8 {

inline constexpr char32_t kReplacement = 0xFFFD;

// Length of the valid sequence starting at s[0], or 0 when s does not start with one
// (a truncated sequence at the end of s also gives 0).
size_t sequence_length(std::string_view s);

// Decodes the character at s[pos] and advances pos; an invalid byte decodes as U+FFFD and
// advances one byte.
char32_t decode(std::string_view s, size_t& pos);

void append(std::string& out, char32_t cp);

bool is_valid(std::string_view s);

// How many leading bytes of s form complete characters, leaving out a trailing sequence that is
// valid so far but unfinished (it may complete with later bytes). Invalid bytes count as
// complete: waiting would never fix them.
size_t complete_prefix_length(std::string_view s);

// s with invalid bytes replaced by U+FFFD, one per maximal ill-formed subpart (Unicode's
// recommended practice, which Rust's from_utf8_lossy and Python's errors="replace" follow).
std::string sanitize(std::string_view s);

}  // namespace regolith::utf8
