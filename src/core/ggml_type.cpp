#include "core/ggml_type.h"

#include <array>
#include <cctype>

#include "core/error.h"

namespace regolith {
namespace {

// Block sizes and byte sizes from ggml's type_traits table (ggml/src/ggml.c, v0.5.0).
constexpr uint32_t kTypeSlots = 43;
constexpr std::array<GgmlTypeTraits, kTypeSlots> kTraits = [] {
  std::array<GgmlTypeTraits, kTypeSlots> t{};
  auto set = [&](GgmlType id, std::string_view name, uint32_t bs, uint32_t bb) {
    t[static_cast<uint32_t>(id)] = {name, bs, bb};
  };
  set(GgmlType::F32, "f32", 1, 4);
  set(GgmlType::F16, "f16", 1, 2);
  set(GgmlType::Q4_0, "q4_0", 32, 18);
  set(GgmlType::Q4_1, "q4_1", 32, 20);
  set(GgmlType::Q5_0, "q5_0", 32, 22);
  set(GgmlType::Q5_1, "q5_1", 32, 24);
  set(GgmlType::Q8_0, "q8_0", 32, 34);
  set(GgmlType::Q8_1, "q8_1", 32, 36);
  set(GgmlType::Q2_K, "q2_k", 256, 84);
  set(GgmlType::Q3_K, "q3_k", 256, 110);
  set(GgmlType::Q4_K, "q4_k", 256, 144);
  set(GgmlType::Q5_K, "q5_k", 256, 176);
  set(GgmlType::Q6_K, "q6_k", 256, 210);
  set(GgmlType::Q8_K, "q8_k", 256, 292);
  set(GgmlType::IQ2_XXS, "iq2_xxs", 256, 66);
  set(GgmlType::IQ2_XS, "iq2_xs", 256, 74);
  set(GgmlType::IQ3_XXS, "iq3_xxs", 256, 98);
  set(GgmlType::IQ1_S, "iq1_s", 256, 50);
  set(GgmlType::IQ4_NL, "iq4_nl", 32, 18);
  set(GgmlType::IQ3_S, "iq3_s", 256, 110);
  set(GgmlType::IQ2_S, "iq2_s", 256, 82);
  set(GgmlType::IQ4_XS, "iq4_xs", 256, 136);
  set(GgmlType::I8, "i8", 1, 1);
  set(GgmlType::I16, "i16", 1, 2);
  set(GgmlType::I32, "i32", 1, 4);
  set(GgmlType::I64, "i64", 1, 8);
  set(GgmlType::F64, "f64", 1, 8);
  set(GgmlType::IQ1_M, "iq1_m", 256, 56);
  set(GgmlType::BF16, "bf16", 1, 2);
  set(GgmlType::TQ1_0, "tq1_0", 256, 54);
  set(GgmlType::TQ2_0, "tq2_0", 256, 66);
  set(GgmlType::MXFP4, "mxfp4", 32, 17);
  set(GgmlType::NVFP4, "nvfp4", 64, 36);
  set(GgmlType::Q1_0, "q1_0", 128, 18);
  set(GgmlType::Q2_0, "q2_0", 64, 18);
  return t;
}();

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  if (id >= kTypeSlots || kTraits[id].block_size == 0) return std::nullopt;
  return kTraits[id];
}

const GgmlTypeTraits& traits(GgmlType type) {
  uint32_t id = static_cast<uint32_t>(type);
  if (id >= kTypeSlots || kTraits[id].block_size == 0) fail("unknown ggml type id ", id);
  return kTraits[id];
}

std::string_view type_name(GgmlType type) { return traits(type).name; }

std::optional<GgmlType> type_from_name(std::string_view name) {
  for (uint32_t id = 0; id < kTypeSlots; ++id) {
    std::string_view known = kTraits[id].name;
    if (known.empty() || known.size() != name.size()) continue;
    bool same = true;
    for (size_t i = 0; i < name.size() && same; ++i)
      same = std::tolower(static_cast<unsigned char>(name[i])) == known[i];
    if (same) return static_cast<GgmlType>(id);
  }
  return std::nullopt;
}

uint64_t row_bytes(GgmlType type, int64_t n) {
  const GgmlTypeTraits& t = traits(type);
  if (n < 0 || n % t.block_size != 0)
    fail("a row of ", n, " values cannot be stored as ", t.name, " (blocks of ", t.block_size,
         " values)");
  return static_cast<uint64_t>(n / t.block_size) * t.block_bytes;
}

}  // namespace regolith
