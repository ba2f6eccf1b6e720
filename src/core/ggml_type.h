// Tensor element types, numbered as ggml numbers them (ggml/include/ggml.h, enum ggml_type, as
// shipped with llama.cpp v0.5.0). The ids and block geometry are file-format data: they must
// match ggml exactly or files do not interoperate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace regolith {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39, NVFP4 = 40, Q1_0 = 41, Q2_0 = 42,
};

struct GgmlTypeTraits {
  std::string_view name;  // ggml's spelling, lower case ("q8_0")
  uint32_t block_size;    // values per block
  uint32_t block_bytes;   // bytes per block
};

// Traits of a known type id; std::nullopt for ids ggml never defined or has retired.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
const GgmlTypeTraits& traits(GgmlType type);
std::string_view type_name(GgmlType type);
std::optional<GgmlType> type_from_name(std::string_view name);  // case-insensitive

// Bytes of a row of n values; throws Error when n is not a multiple of the block size.
uint64_t row_bytes(GgmlType type, int64_t n);

}  // namespace regolith
