#include "core/text_file.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace regolith {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, ": cannot read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace regolith
