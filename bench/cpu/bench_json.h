// regolith-bench-cpu json: the JSON modes' token masks (src/server/json_constraint.h) on a GGUF's
// vocabulary, at points of a reply where they cost the most and the least.
#pragma once

#include <string>

namespace regolith::bench {

void bench_json(const std::string& model_path);

}  // namespace regolith::bench
