#include "server/text_stream.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace regolith::server {

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops)
    : detokenizer_(tokenizer, /*skip_special=*/true), stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  held_ += detokenizer_.push(id);
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, held_.find(stop));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that could still grow into a stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_)
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string TextStream::finish() {
  if (stopped_) return {};
  std::string out = held_ + detokenizer_.finish();
  held_.clear();
  // A stop string may complete inside the detokenizer's last flushed bytes.
  for (const std::string& stop : stops_)
    if (size_t p = out.find(stop); p != std::string::npos) out.resize(p), stopped_ = true;
  return out;
}

}  // namespace regolith::server
