// The host's available memory, the default Backend::memory_available: MemAvailable of
// /proc/meminfo (free memory plus what the kernel can reclaim at once), else free pages.
#include <unistd.h>

#include <fstream>
#include <string>

#include "backend/ops.h"

namespace regolith {

std::optional<uint64_t> Backend::memory_available() const {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(64, '\n');  // the unit
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return std::nullopt;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

}  // namespace regolith
