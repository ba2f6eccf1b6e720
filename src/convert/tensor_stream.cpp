#include "convert/tensor_stream.h"

#include <algorithm>

#include "core/error.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "gguf/gguf.h"
#include "quant/rows.h"

namespace regolith {

void write_planned_tensors(GgufWriter& w, const std::vector<PlannedTensor>& plan, const std::string& label) {
  uint64_t total = 0;
  for (const PlannedTensor& t : plan) {
    if (!can_quantize(t.type)) fail(t.name, ": writing ", type_name(t.type), " tensors is not supported yet");
    w.add_tensor(t.name, t.type, t.ne);
    total += w.tensors().back().n_bytes;
  }
  w.write_header();

  Progress progress(label, total);
  const int64_t chunk_bytes = 64 << 20;
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < plan.size(); ++i) {
    const PlannedTensor& t = plan[i];
    int64_t row_len = t.ne[0];
    int64_t n_rows = w.tensors()[i].n_elements() / row_len;
    uint64_t rb = row_bytes(t.type, row_len);
    int64_t produced = n_rows, copies = 1;
    if (t.repeat_rows > 0) {
      if (n_rows % t.repeat_rows) fail(t.name, ": ", n_rows, " rows do not repeat with period ", t.repeat_rows);
      produced = t.repeat_rows;
      copies = n_rows / t.repeat_rows;
    }
    // A chunk is bounded both in encoded bytes and in float32 scratch per thread; a repeating
    // period is encoded whole, then written as many times as it repeats.
    int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(std::max<uint64_t>(rb, 4 * row_len)));
    if (copies > 1) rows_per_chunk = produced;
    for (int64_t r0 = 0; r0 < produced; r0 += rows_per_chunk) {
      int64_t nr = std::min(rows_per_chunk, produced - r0);
      buffer.resize(static_cast<size_t>(nr) * rb);
      parallel_for(nr, [&](int64_t begin, int64_t end) {
        const int64_t batch = 64;
        std::vector<float> rows(static_cast<size_t>(batch * row_len));
        for (int64_t r = begin; r < end; r += batch) {
          int64_t n = std::min(batch, end - r);
          t.rows(r0 + r, n, rows.data());
          for (int64_t k = 0; k < n; ++k)
            quantize_row(t.type, rows.data() + k * row_len, row_len, buffer.data() + (r + k) * rb);
        }
      }, 64);
      for (int64_t c = 0; c < copies; ++c) {
        w.write_data(buffer);
        progress.advance(buffer.size());
      }
    }
  }
  w.finish();
}

}  // namespace regolith
