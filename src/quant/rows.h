// Row encoding between float32 and stored tensor types. A "row" is ne[0] consecutive values,
// a whole number of blocks. Layouts match ggml's byte for byte (ggml/src/ggml-common.h).
// Types without an encoder here throw an Error naming the type.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace regolith {

bool can_quantize(GgmlType type);
bool can_dequantize(GgmlType type);

// n values from x into out (row_bytes(type, n) bytes).
void quantize_row(GgmlType type, const float* x, int64_t n, uint8_t* out);
// n values from in (row_bytes(type, n) bytes) into y.
void dequantize_row(GgmlType type, const uint8_t* in, int64_t n, float* y);

}  // namespace regolith
