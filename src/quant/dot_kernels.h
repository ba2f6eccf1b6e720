// Kernel tables behind dot.h, one per instruction set, indexed by ggml type id (null where a
// type has no kernel in that set). The SIMD tables live in translation units compiled with their
// target flags and only run after dot.cpp has checked the CPU.
#pragma once

#include <array>

#include "quant/dot.h"

namespace regolith::quant {

constexpr int kTypeSlots = 43;
using DotTable = std::array<VecDot, kTypeSlots>;

const DotTable& scalar_dot_table();

// fp16 → float for all 65536 bit patterns (bit-exact with f16_to_f32), built on first use.
const float* f16_to_f32_table();
const DotTable& avx2_dot_table();
const DotTable& avx512_dot_table();

}  // namespace regolith::quant
