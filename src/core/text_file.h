// A whole file read into a string.
#pragma once

#include <string>

namespace regolith {

std::string read_text_file(const std::string& path);  // throws Error naming the path

}  // namespace regolith
