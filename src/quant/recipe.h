// Quantization recipes for qwen4exp models: a storage type per tensor class (routed experts
// gate/up and down, shared expert, attention/GDN/QSA projections, hyper-connections, router,
// embeddings, output, n-gram table), plus the rules every recipe obeys: vectors and
// convolutions keep their type, the router keeps its float type, and a row the chosen type's
// block does not divide (640-wide routed down rows, 160-wide table rows under 256-value types)
// falls back to a 32-value type.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "model/qwen4exp_tensors.h"

namespace regolith {

struct QuantRecipe {
  std::string name;
  std::map<TensorClass, GgmlType> types;  // classes not listed keep their source type
};

// Named presets mirroring the published quantizations of this model (see recipe.cpp).
std::vector<std::string> quant_recipe_names();
const char* quant_recipe_description(const std::string& name);
// Throws Error listing the names when `name` is unknown.
QuantRecipe quant_recipe(const std::string& name);
// Every weight matrix as `type` (router and control vectors as above).
QuantRecipe single_type_recipe(GgmlType type);

// Parses "class=type" (class as tensor_class_name spells it, case-insensitive).
std::pair<TensorClass, GgmlType> parse_class_override(const std::string& text);

// The type a tensor gets: the recipe's choice for its class, unless a rule keeps or changes it.
// `note` says why when the result differs from the recipe's choice.
struct TypeChoice {
  GgmlType type;
  std::string note;
};
TypeChoice choose_type(const TensorSpec& spec, GgmlType source, const QuantRecipe& recipe,
                       const GgmlType* tensor_override = nullptr);

// The 32-value type used when a 256-value type does not divide a row (as llama.cpp falls back).
GgmlType row_fallback_type(GgmlType type);

}  // namespace regolith
