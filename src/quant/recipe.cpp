#include "quant/recipe.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace regolith {
namespace {

struct Preset {
  const char* name;
  const char* description;
  GgmlType gate_up, down, shared, dense, control, embedding, output, table;
};

constexpr GgmlType BF16 = GgmlType::BF16, Q8_0 = GgmlType::Q8_0;

// Dense = attention, indexer, GDN, PLE and MTP projections; control = hyper-connections. The
// router and the shared-expert gate always keep their float type.
const Preset kPresets[] = {
    {"q8_0", "every matrix Q8_0 (hyper-connections included)", Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0, Q8_0},
    {"q4_k-iq4_nl", "routed gate/up Q4_K, routed down IQ4_NL, dense/shared/output Q8_0, hyper-connections and "
                    "embeddings BF16, n-gram table Q4_1 (DS4-style)",
     GgmlType::Q4_K, GgmlType::IQ4_NL, Q8_0, Q8_0, BF16, BF16, Q8_0, GgmlType::Q4_1},
    {"q4_0", "routed experts Q4_0, dense/shared/output Q8_0, hyper-connections and embeddings BF16, n-gram table Q4_1",
     GgmlType::Q4_0, GgmlType::Q4_0, Q8_0, Q8_0, BF16, BF16, Q8_0, GgmlType::Q4_1},
    {"iq2_xxs-q2_0", "routed gate/up IQ2_XXS, routed down Q2_0, dense/shared/output Q8_0, hyper-connections and "
                     "embeddings BF16, n-gram table Q4_1 (use with an importance matrix)",
     GgmlType::IQ2_XXS, GgmlType::Q2_0, Q8_0, Q8_0, BF16, BF16, Q8_0, GgmlType::Q4_1},
    {"iq2_xxs-iq4_nl", "routed gate/up IQ2_XXS, routed down IQ4_NL, the rest as iq2_xxs-q2_0",
     GgmlType::IQ2_XXS, GgmlType::IQ4_NL, Q8_0, Q8_0, BF16, BF16, Q8_0, GgmlType::Q4_1},
    {"iq2_s-mxfp4", "routed gate/up IQ2_S, routed down MXFP4, n-gram table Q5_1, the rest as q4_k-iq4_nl",
     GgmlType::IQ2_S, GgmlType::MXFP4, Q8_0, Q8_0, BF16, BF16, Q8_0, GgmlType::Q5_1},
};

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

const TensorClass kMatrixClasses[] = {
    TensorClass::TokenEmbedding, TensorClass::Output,    TensorClass::HyperConnection, TensorClass::AttentionProj,
    TensorClass::IndexerProj,    TensorClass::GdnProj,   TensorClass::ExpertGateUp,    TensorClass::ExpertDown,
    TensorClass::SharedExpert,   TensorClass::PleProj,   TensorClass::NgramTable,      TensorClass::MtpProj,
};

}  // namespace

std::vector<std::string> quant_recipe_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.push_back(p.name);
  return names;
}

const char* quant_recipe_description(const std::string& name) {
  const Preset* p = find_preset(name);
  return p ? p->description : "";
}

QuantRecipe quant_recipe(const std::string& name) {
  const Preset* p = find_preset(name);
  if (!p) {
    std::string known;
    for (const Preset& q : kPresets) known += std::string(known.empty() ? "" : ", ") + q.name;
    fail("unknown quantization recipe '", name, "' (known: ", known, ")");
  }
  QuantRecipe r{p->name, {}};
  r.types[TensorClass::ExpertGateUp] = p->gate_up;
  r.types[TensorClass::ExpertDown] = p->down;
  r.types[TensorClass::SharedExpert] = p->shared;
  for (TensorClass c : {TensorClass::AttentionProj, TensorClass::IndexerProj, TensorClass::GdnProj, TensorClass::PleProj,
                        TensorClass::MtpProj})
    r.types[c] = p->dense;
  r.types[TensorClass::HyperConnection] = p->control;
  r.types[TensorClass::TokenEmbedding] = p->embedding;
  r.types[TensorClass::Output] = p->output;
  r.types[TensorClass::NgramTable] = p->table;
  return r;
}

QuantRecipe single_type_recipe(GgmlType type) {
  QuantRecipe r{std::string(type_name(type)), {}};
  for (TensorClass c : kMatrixClasses) r.types[c] = type;
  return r;
}

std::pair<TensorClass, GgmlType> parse_class_override(const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos) fail("expected CLASS=TYPE, got '", text, "'");
  std::string cls = text.substr(0, eq), type = text.substr(eq + 1);
  std::transform(cls.begin(), cls.end(), cls.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  auto t = type_from_name(type);
  if (!t) fail("unknown type '", type, "' in '", text, "'");
  for (int c = 0; c <= static_cast<int>(TensorClass::MtpProj); ++c)
    if (tensor_class_name(static_cast<TensorClass>(c)) == cls) return {static_cast<TensorClass>(c), *t};
  std::string known;
  for (TensorClass c : kMatrixClasses) known += std::string(known.empty() ? "" : ", ") + std::string(tensor_class_name(c));
  fail("unknown tensor class '", cls, "' (matrix classes: ", known, ")");
}

GgmlType row_fallback_type(GgmlType type) {
  switch (type) {
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ4_XS:
      return GgmlType::IQ4_NL;
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return type;
  }
}

TypeChoice choose_type(const TensorSpec& spec, GgmlType source, const QuantRecipe& recipe, const GgmlType* tensor_override) {
  GgmlType requested;
  if (tensor_override) {
    requested = *tensor_override;
  } else {
    auto it = recipe.types.find(spec.cls);
    if (it == recipe.types.end()) return {source, ""};
    requested = it->second;
  }
  if (requested == source) return {source, ""};
  if (spec.ne.size() == 1 || spec.cls == TensorClass::Conv) return {source, "vectors and convolutions keep their type"};
  if (spec.cls == TensorClass::Router && !is_float(requested) && is_float(source))
    return {source, "the router keeps its float type (top-k selection is sensitive to it)"};
  const int64_t row = spec.ne[0];
  if (row % traits(requested).block_size != 0) {
    GgmlType fallback = row_fallback_type(requested);
    if (row % traits(fallback).block_size == 0)
      return {fallback, cat("rows of ", row, " do not fit ", type_name(requested), " blocks")};
    return {source, cat("rows of ", row, " fit no block of ", type_name(requested))};
  }
  return {requested, ""};
}

}  // namespace regolith
