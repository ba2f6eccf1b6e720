// Generated token ids -> final text for one choice: UTF-8 safe streaming detokenization plus stop
// strings. Text that might be the start of a stop string is held back until it is known not to be;
// a matched stop string and everything after it are never returned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"

namespace regolith {
class Tokenizer;
}

namespace regolith::server {

class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stops);

  std::string push(int32_t id);  // text that became final; empty once stopped()
  std::string finish();          // whatever is still held back (nothing after a stop)
  bool stopped() const { return stopped_; }

 private:
  StreamingDetokenizer detokenizer_;
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace regolith::server
