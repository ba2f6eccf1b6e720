// Parsing of `--tokens 1,2,3` lists shared by the engine subcommands.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace regolith::cli {

// "1,2, 3" -> {1, 2, 3}; throws Error on anything that is not a non-negative integer list.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace regolith::cli
