// The embedded default model: until the project ships a trained one, commands run without -m use
// a tiny deterministic random-weight qwen4exp model, written once to the user's cache directory.
// Its output is noise; it exists so every part of the engine can be run out of the box.
#pragma once

#include <string>

namespace regolith::cli {

// The model path to use: `requested` if given, else the default model (made on first use).
std::string model_or_default(const std::string& requested);

}  // namespace regolith::cli
