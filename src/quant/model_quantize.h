// `regolith quantize`: re-encodes a qwen4exp GGUF tensor by tensor under a recipe, optionally
// weighting the error by an importance matrix (llama.cpp's imatrix GGUF: "<tensor>.in_sum2" and
// "<tensor>.counts"). Streams: one chunk of rows at a time is dequantized, quantized in
// parallel and written, so memory stays bounded whatever the model size. Metadata is copied,
// with general.file_type and general.quantization_version set as llama.cpp sets them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/ggml_type.h"
#include "quant/recipe.h"

namespace regolith {

class GgufFile;

// Mean squared activation per input column of each weight matrix (per expert for stacked
// expert tensors), read from a llama.cpp imatrix GGUF.
class ImportanceMatrix {
 public:
  static ImportanceMatrix load(const std::string& path);
  bool has(const std::string& tensor) const { return values_.count(tensor) != 0; }
  // The weights for row `row` of `tensor` (rows of `row_len` values, `rows_per_matrix` rows per
  // expert matrix); null when the file has no entry for the tensor. Throws on a shape mismatch.
  const float* row_weights(const std::string& tensor, int64_t row_len, int64_t rows_per_matrix, int64_t n_matrices,
                           int64_t row) const;
  size_t size() const { return values_.size(); }

 private:
  struct Entry {
    int64_t n_matrices = 0;
    std::vector<float> values;  // n_matrices × row_len
  };
  std::string source_;
  std::map<std::string, Entry> values_;
};

struct QuantizeModelOptions {
  std::string input, output;
  QuantRecipe recipe;
  std::map<std::string, GgmlType> tensor_types;  // exact tensor name → type, over the recipe
  std::string imatrix;                           // optional
  bool dry_run = false;                          // print the plan, write nothing
  // tensor_types are taken as given, bypassing the recipe rules for vectors, convolutions and the
  // router (only the row/block fit is checked): to reproduce another file's types exactly.
  bool exact_tensor_types = false;
};

struct QuantizePlanEntry {
  std::string name;
  std::string cls;  // tensor class name, or "unknown" for tensors outside the qwen4exp table
  GgmlType from = GgmlType::F32, to = GgmlType::F32;
  uint64_t bytes_from = 0, bytes_to = 0;
  bool importance = false;  // an importance row is used
  std::string note;
};

std::vector<QuantizePlanEntry> plan_model_quantization(const GgufFile& input, const QuantizeModelOptions& options,
                                                       const ImportanceMatrix* imatrix);

// Plans, prints the plan's summary to `log`, and (unless dry_run) writes the output.
void quantize_model(const QuantizeModelOptions& options, FILE* log);

}  // namespace regolith
