#include "quant/model_quantize.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/parallel.h"
#include "core/progress.h"
#include "gguf/gguf.h"
#include "model/qwen4exp_hparams.h"
#include "model/qwen4exp_tensors.h"
#include "quant/rows.h"

namespace regolith {
namespace {

bool is_float(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// llama.cpp's llama_ftype for a file whose weights are mostly `t` (include/llama.h, v0.5.0).
uint32_t llama_file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q2_K: return 10;
    case GgmlType::Q3_K: return 12;
    case GgmlType::Q4_K: return 15;
    case GgmlType::Q5_K: return 17;
    case GgmlType::Q6_K: return 18;
    case GgmlType::IQ2_XXS: return 19;
    case GgmlType::IQ2_XS: return 20;
    case GgmlType::IQ3_XXS: return 23;
    case GgmlType::IQ4_NL: return 25;
    case GgmlType::IQ3_S: return 26;
    case GgmlType::IQ2_S: return 28;
    case GgmlType::IQ4_XS: return 30;
    case GgmlType::BF16: return 32;
    case GgmlType::MXFP4: return 38;
    case GgmlType::Q2_0: return 41;
    default: return 1024;  // LLAMA_FTYPE_GUESSED
  }
}

std::vector<float> read_f32(const GgufTensor& t) {
  if (t.type != GgmlType::F32) fail(t.name, " is ", type_name(t.type), ", expected f32");
  std::vector<float> v(static_cast<size_t>(t.n_elements()));
  std::memcpy(v.data(), t.data, v.size() * 4);
  return v;
}

// Rows per expert matrix and number of matrices of a 2-D or 3-D weight.
void matrix_layout(const std::vector<int64_t>& ne, int64_t& rows_per_matrix, int64_t& n_matrices) {
  rows_per_matrix = ne.size() > 1 ? ne[1] : 1;
  n_matrices = 1;
  for (size_t i = 2; i < ne.size(); ++i) n_matrices *= ne[i];
}

}  // namespace

ImportanceMatrix ImportanceMatrix::load(const std::string& path) {
  GgufFile file = GgufFile::open(path);
  ImportanceMatrix m;
  m.source_ = path;
  const std::string sums_suffix = ".in_sum2", counts_suffix = ".counts";
  for (const GgufTensor& t : file.tensors()) {
    if (t.name.size() <= sums_suffix.size() || t.name.compare(t.name.size() - sums_suffix.size(), sums_suffix.size(), sums_suffix))
      continue;
    const std::string name = t.name.substr(0, t.name.size() - sums_suffix.size());
    const GgufTensor* counts_t = file.find_tensor(name + counts_suffix);
    if (!counts_t) fail(path, ": ", t.name, " has no ", name + counts_suffix);
    std::vector<float> sums = read_f32(t), counts = read_f32(*counts_t);
    if (counts.empty() || sums.size() % counts.size() != 0)
      fail(path, ": ", t.name, " holds ", sums.size(), " values for ", counts.size(), " counts");
    const size_t row_len = sums.size() / counts.size();
    // Mean squared activation: sums over counted tokens; a matrix never hit gets uniform weights.
    for (size_t j = 0; j < counts.size(); ++j)
      for (size_t i = 0; i < row_len; ++i) sums[j * row_len + i] = counts[j] > 0 ? sums[j * row_len + i] / counts[j] : 1.0f;
    m.values_[name] = {static_cast<int64_t>(counts.size()), std::move(sums)};
  }
  if (m.values_.empty()) fail(path, ": no importance entries (expected llama.cpp imatrix GGUF tensors NAME.in_sum2 and NAME.counts)");
  return m;
}

const float* ImportanceMatrix::row_weights(const std::string& tensor, int64_t row_len, int64_t rows_per_matrix,
                                           int64_t n_matrices, int64_t row) const {
  auto it = values_.find(tensor);
  if (it == values_.end()) return nullptr;
  const Entry& e = it->second;
  if (static_cast<int64_t>(e.values.size()) != e.n_matrices * row_len || (e.n_matrices != 1 && e.n_matrices != n_matrices))
    fail(source_, ": the importance entry of ", tensor, " (", e.values.size(), " values for ", e.n_matrices,
         " matrices) does not match its rows of ", row_len, " values in ", n_matrices, " matrices");
  const int64_t matrix = e.n_matrices == 1 ? 0 : row / rows_per_matrix;
  return e.values.data() + matrix * row_len;
}

std::vector<QuantizePlanEntry> plan_model_quantization(const GgufFile& input, const QuantizeModelOptions& options,
                                                       const ImportanceMatrix* imatrix) {
  const Qwen4ExpHparams hp = read_hparams(input);
  const GgufTensor* table = input.find_tensor("per_layer_token_embd.weight");
  const int64_t table_rows = table && table->ne.size() == 2 ? table->ne[1] : 0;
  std::map<std::string, TensorSpec> specs;
  for (TensorSpec& s : qwen4exp_tensor_specs(hp, table_rows)) specs.emplace(s.name, std::move(s));
  for (const auto& [name, type] : options.tensor_types)
    if (!input.find_tensor(name)) fail(input.source(), ": --tensor-type names '", name, "', which the file does not hold");

  std::vector<QuantizePlanEntry> plan;
  for (const GgufTensor& t : input.tensors()) {
    QuantizePlanEntry e{t.name, "unknown", t.type, t.type, t.n_bytes, t.n_bytes, false, ""};
    auto over = options.tensor_types.find(t.name);
    const GgmlType* override_type = over == options.tensor_types.end() ? nullptr : &over->second;
    auto it = specs.find(t.name);
    TensorSpec spec = it != specs.end() ? it->second : TensorSpec{t.name, t.ne, TensorClass::NormPlain};
    if (it != specs.end()) {
      e.cls = std::string(tensor_class_name(spec.cls));
      if (spec.ne != t.ne) fail(input.source(), ": ", t.name, " has shape ", t.shape_string(), ", the qwen4exp table expects another");
    }
    if (override_type && options.exact_tensor_types) {
      if (t.ne[0] % traits(*override_type).block_size != 0)
        fail(input.source(), ": ", t.name, "'s rows of ", t.ne[0], " do not fit ", type_name(*override_type), " blocks");
      e.to = *override_type;
    } else if (it != specs.end() || override_type) {
      spec.ne = t.ne;
      TypeChoice c = choose_type(spec, t.type, options.recipe, override_type);
      e.to = c.type;
      e.note = c.note;
    } else {
      e.note = "not a qwen4exp tensor: copied";
    }
    if (e.to != e.from) {
      if (!can_dequantize(e.from)) fail(input.source(), ": ", t.name, " is ", type_name(e.from), ", which regolith cannot read");
      if (!can_quantize(e.to)) fail("cannot quantize to ", type_name(e.to), " (", t.name, ")");
      e.bytes_to = row_bytes(e.to, t.ne[0]) * static_cast<uint64_t>(t.n_elements() / t.ne[0]);
      if (!is_float(e.from)) e.note += std::string(e.note.empty() ? "" : "; ") + "re-quantized from " + std::string(type_name(e.from));
      if (imatrix && !is_float(e.to)) e.importance = imatrix->has(t.name);
    }
    plan.push_back(std::move(e));
  }
  return plan;
}

void quantize_model(const QuantizeModelOptions& options, FILE* log) {
  GgufFile input = GgufFile::open(options.input);
  ImportanceMatrix imatrix;
  const bool have_imatrix = !options.imatrix.empty();
  if (have_imatrix) imatrix = ImportanceMatrix::load(options.imatrix);
  std::vector<QuantizePlanEntry> plan = plan_model_quantization(input, options, have_imatrix ? &imatrix : nullptr);

  uint64_t total_from = 0, total_to = 0;
  std::map<GgmlType, uint64_t> bytes_by_type;
  for (const QuantizePlanEntry& e : plan) {
    total_from += e.bytes_from;
    total_to += e.bytes_to;
    if (input.tensor(e.name).ne.size() >= 2) bytes_by_type[e.to] += e.bytes_to;
    if (options.dry_run || !e.note.empty())
      std::fprintf(log, "%-44s %-17s %-7s -> %-7s %10.2f MiB%s%s%s\n", e.name.c_str(), e.cls.c_str(),
                   std::string(type_name(e.from)).c_str(), std::string(type_name(e.to)).c_str(), e.bytes_to / 1048576.0,
                   e.importance ? "  [imatrix]" : "", e.note.empty() ? "" : "  ", e.note.c_str());
  }
  std::fprintf(log, "recipe %s: %.2f MiB -> %.2f MiB\n", options.recipe.name.c_str(), total_from / 1048576.0, total_to / 1048576.0);
  for (const QuantizePlanEntry& e : plan)
    if (have_imatrix && !e.importance && e.to != e.from && !is_float(e.to))
      std::fprintf(log, "note: no importance entry for %s\n", e.name.c_str());
  for (const QuantizePlanEntry& e : plan)
    if (!have_imatrix && (e.to == GgmlType::IQ2_XXS || e.to == GgmlType::IQ2_XS)) {
      std::fprintf(log, "note: %s below 2.5 bits per weight without an importance matrix loses much more quality\n",
                   std::string(type_name(e.to)).c_str());
      break;
    }
  if (options.dry_run) return;

  // The file type names the quantized type holding the most bytes (a float type if none).
  GgmlType dominant = GgmlType::F32;
  uint64_t most = 0;
  for (bool quantized : {true, false}) {
    for (const auto& [type, bytes] : bytes_by_type)
      if (is_float(type) != quantized && bytes > most) {
        most = bytes;
        dominant = type;
      }
    if (most) break;
  }

  GgufWriter w(options.output);
  for (const auto& [key, value] : input.metadata())
    if (key != "general.alignment" && key != "general.file_type" && key != "general.quantization_version") w.set(key, value);
  if (input.alignment() != kGgufDefaultAlignment) w.set_alignment(static_cast<uint32_t>(input.alignment()));
  w.set("general.quantization_version", uint32_t{2});
  w.set("general.file_type", llama_file_type(dominant));
  for (const QuantizePlanEntry& e : plan) w.add_tensor(e.name, e.to, input.tensor(e.name).ne);
  w.write_header();

  Progress progress("quantize", total_to);
  const int64_t chunk_bytes = 64 << 20;
  std::vector<uint8_t> buffer;
  for (const QuantizePlanEntry& e : plan) {
    const GgufTensor& t = input.tensor(e.name);
    if (e.to == e.from) {
      for (uint64_t off = 0; off < t.n_bytes; off += chunk_bytes) {
        const uint64_t n = std::min<uint64_t>(chunk_bytes, t.n_bytes - off);
        w.write_data({t.data + off, static_cast<size_t>(n)});
        progress.advance(n);
      }
      continue;
    }
    const int64_t row_len = t.ne[0], n_rows = t.n_elements() / row_len;
    const uint64_t rb_from = row_bytes(e.from, row_len), rb_to = row_bytes(e.to, row_len);
    int64_t rows_per_matrix, n_matrices;
    matrix_layout(t.ne, rows_per_matrix, n_matrices);
    const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(std::max<uint64_t>(rb_to, 4 * row_len)));
    for (int64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
      const int64_t nr = std::min(rows_per_chunk, n_rows - r0);
      buffer.resize(static_cast<size_t>(nr) * rb_to);
      parallel_for(nr, [&](int64_t begin, int64_t end) {
        std::vector<float> row(row_len);
        for (int64_t r = begin; r < end; ++r) {
          dequantize_row(e.from, t.data + (r0 + r) * rb_from, row_len, row.data());
          const float* imp = e.importance ? imatrix.row_weights(e.name, row_len, rows_per_matrix, n_matrices, r0 + r) : nullptr;
          quantize_row(e.to, row.data(), row_len, buffer.data() + r * rb_to, imp);
        }
      }, 16);
      w.write_data(buffer);
      progress.advance(buffer.size());
    }
  }
  w.finish();
}

}  // namespace regolith
