// llama.cpp v0.5.0's libggml (the prebuilt libraries of npm @node-llama-cpp/linux-x64@3.22.1),
// loaded with dlopen as the reference for parity tests and the benchmark. The structs below
// mirror ggml's public headers of that release: ggml_type_traits from ggml/include/ggml.h and
// ggml_type_traits_cpu from ggml/include/ggml-cpu.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace regolith::test {

struct GgmlTypeTraits {  // ggml.h: struct ggml_type_traits
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  void (*to_float)(const void* x, float* y, int64_t k);
  void (*from_float_ref)(const float* x, void* y, int64_t k);
};

struct GgmlTypeTraitsCpu {  // ggml-cpu.h: struct ggml_type_traits_cpu
  void (*from_float)(const float* x, void* y, int64_t k);
  void (*vec_dot)(int n, float* s, size_t bs, const void* x, size_t bx, const void* y, size_t by, int nrc);
  int vec_dot_type;
  int64_t nrows;
};

class GgmlRef {
 public:
  // Loads the libraries from the directory the test fixture unpacked them into; `error` says
  // why not when it returns null. The CPU library is the variant matching this machine.
  static const GgmlRef* load(std::string& error);

  const GgmlTypeTraits* (*type_traits)(int type) = nullptr;
  const GgmlTypeTraitsCpu* (*type_traits_cpu)(int type) = nullptr;  // null without a CPU library
  size_t (*quantize_chunk)(int type, const float* src, void* dst, int64_t start, int64_t nrows, int64_t n_per_row,
                           const float* imatrix) = nullptr;
  std::string cpu_variant;
};

}  // namespace regolith::test
