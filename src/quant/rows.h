// Row encoding between float32 and stored tensor types. A "row" is ne[0] consecutive values,
// a whole number of blocks. Layouts match ggml's byte for byte (ggml/src/ggml-common.h) and
// dequantization is bit-exact with llama.cpp v0.5.0's libggml. Types without a codec here, and
// rows that are not a whole number of blocks, throw an Error naming the type.
#pragma once

#include <cstdint>

#include "core/ggml_type.h"

namespace regolith {

bool can_quantize(GgmlType type);
bool can_dequantize(GgmlType type);

// Throws Error unless a row of n values can be stored as `type` (n a positive multiple of its
// block: 32 for Q4_0…Q8_0, IQ4_NL, MXFP4; 64 for Q2_0; 256 for the K- and 256-wide I-quants).
void check_row_length(GgmlType type, int64_t n);

// n values from x into out (row_bytes(type, n) bytes). `importance`, when not null, holds n
// non-negative weights (an importance-matrix row: the mean squared activation met by each
// column); quantizers that can use it minimize the error weighted by it. Thread-safe.
void quantize_row(GgmlType type, const float* x, int64_t n, uint8_t* out, const float* importance = nullptr);
// n values from in (row_bytes(type, n) bytes) into y.
void dequantize_row(GgmlType type, const uint8_t* in, int64_t n, float* y);

}  // namespace regolith
