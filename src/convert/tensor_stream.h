// Streams tensors into a GGUF writer from row producers: each tensor is made a chunk of rows
// at a time (in parallel), encoded to its storage type and written, so memory stays bounded
// by the chunk size whatever the model size. Used by the converter and by mkmodel.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ggml_type.h"

namespace regolith {

class GgufWriter;

// Fills out[0 .. n_rows*ne[0]) with rows [first_row, first_row + n_rows) of the tensor, where a
// row is ne[0] values and rows run over the flattened outer dimensions. Called concurrently.
using RowProducer = std::function<void(int64_t first_row, int64_t n_rows, float* out)>;

struct PlannedTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne;
  RowProducer rows;
  // > 0: the rows repeat with this period (it must divide the row count), so only the first
  // period is produced and encoded; the rest are copies of its bytes.
  int64_t repeat_rows = 0;
};

// Declares the tensors, writes the header (metadata must be set already), streams the data and
// finishes the file.
void write_planned_tensors(GgufWriter& writer, const std::vector<PlannedTensor>& plan, const std::string& label);

}  // namespace regolith
