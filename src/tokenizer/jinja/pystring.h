// Python str methods over UTF-8, by code point, as chat templates call them through Jinja
// (strip with a character set, split with and without a separator, splitlines, case mapping).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace regolith::jinja::py {

std::u32string to_u32(std::string_view s);
std::string from_u32(std::u32string_view s);
size_t length(std::string_view s);  // code points

bool is_space(char32_t c);  // str.isspace()
// mode: 0 both, 1 left, 2 right; chars == nullptr strips whitespace.
std::string strip(std::string_view s, const std::string* chars, int mode);
std::vector<std::string> split(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> rsplit(std::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view with, int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
// str.isdigit / isalpha / isalnum / isspace / isupper / islower
bool is_class(std::string_view s, std::string_view method);

}  // namespace regolith::jinja::py
