// `regolith quantize`'s driver on small random qwen4exp models: types per class and the rules
// (vectors, router, row fallbacks), values close to the source, metadata kept, importance
// matrices applied and checked, dry runs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "convert/random_model.h"
#include "core/error.h"
#include "gguf/gguf.h"
#include "model/qwen4exp_hparams.h"
#include "model/qwen4exp_tensors.h"
#include "quant/model_quantize.h"
#include "quant/rows.h"

using namespace regolith;
namespace fs = std::filesystem;

namespace {

class ModelQuantize : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("regolith_quantize_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    RandomModelOptions o;
    o.hparams = preset_hparams("tiny", 4);
    o.hparams.n_embd = 256;  // so that 256-value types fit the routed gate/up rows
    o.hparams.n_ff_exp = 64;
    o.hparams.ple_row_dim = 64;  // PLE heads × row width = n_embd
    o.seed = 5;
    source_ = (dir_ / "f32.gguf").string();
    write_random_model(source_, o);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const char* name) const { return (dir_ / name).string(); }

  fs::path dir_;
  std::string source_;
};

// Relative RMS difference between a tensor of two files.
double relative_error(const GgufFile& a, const GgufFile& b, const std::string& name) {
  const GgufTensor& ta = a.tensor(name);
  const GgufTensor& tb = b.tensor(name);
  const int64_t n = ta.n_elements(), row = ta.ne[0];
  std::vector<float> x(row), y(row);
  double num = 0, den = 0;
  for (int64_t r = 0; r < n / row; ++r) {
    dequantize_row(ta.type, ta.data + r * row_bytes(ta.type, row), row, x.data());
    dequantize_row(tb.type, tb.data + r * row_bytes(tb.type, row), row, y.data());
    for (int64_t i = 0; i < row; ++i) {
      num += (x[i] - y[i]) * (x[i] - y[i]);
      den += x[i] * x[i];
    }
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST_F(ModelQuantize, RecipeAssignsTypesByClass) {
  QuantizeModelOptions o{source_, path("q.gguf"), quant_recipe("q4_k-iq4_nl"), {}, "", false};
  FILE* log = std::tmpfile();
  quantize_model(o, log);
  std::fclose(log);
  GgufFile in = GgufFile::open(source_), out = GgufFile::open(o.output);
  ASSERT_EQ(in.tensors().size(), out.tensors().size());
  const Qwen4ExpHparams hp = read_hparams(out);
  for (const TensorSpec& s : qwen4exp_tensor_specs(hp, in.tensor("per_layer_token_embd.weight").ne[1])) {
    const GgufTensor& t = out.tensor(s.name);
    SCOPED_TRACE(s.name);
    switch (s.cls) {
      case TensorClass::ExpertGateUp: EXPECT_EQ(t.type, GgmlType::Q4_K); break;
      case TensorClass::ExpertDown: EXPECT_EQ(t.type, GgmlType::IQ4_NL); break;  // rows of 64
      case TensorClass::SharedExpert:
      case TensorClass::AttentionProj:
      case TensorClass::GdnProj:
      case TensorClass::Output: EXPECT_EQ(t.type, GgmlType::Q8_0); break;
      case TensorClass::HyperConnection:
      case TensorClass::TokenEmbedding: EXPECT_EQ(t.type, GgmlType::BF16); break;
      case TensorClass::NgramTable: EXPECT_EQ(t.type, GgmlType::Q4_1); break;
      case TensorClass::Router:
      case TensorClass::Conv:
      case TensorClass::NormOffset: EXPECT_EQ(t.type, GgmlType::F32); break;
      default: break;
    }
    if (t.ne.size() >= 2 && t.type != GgmlType::F32) {
      const double limit = t.type == GgmlType::Q8_0 || t.type == GgmlType::BF16 ? 0.01 : 0.15;
      EXPECT_LT(relative_error(in, out, s.name), limit);
    }
  }
  // The quantized type with the most bytes names the file: here the dense Q8_0 matrices outweigh
  // four tiny experts (LLAMA_FTYPE_MOSTLY_Q8_0).
  EXPECT_EQ(out.get("general.file_type").as_uint(), 7u);
  EXPECT_EQ(out.get("general.quantization_version").as_uint(), 2u);
  EXPECT_EQ(read_hparams(out).n_embd, 256);
}

TEST_F(ModelQuantize, SingleTypeFallsBackWhereRowsDoNotFit) {
  QuantizeModelOptions o{source_, path("q.gguf"), single_type_recipe(GgmlType::Q3_K), {}, "", false};
  o.tensor_types["output.weight"] = GgmlType::Q6_K;
  FILE* log = std::tmpfile();
  quantize_model(o, log);
  std::fclose(log);
  GgufFile out = GgufFile::open(o.output);
  EXPECT_EQ(out.tensor("blk.0.ffn_gate_exps.weight").type, GgmlType::Q3_K);
  EXPECT_EQ(out.tensor("blk.0.ffn_down_exps.weight").type, GgmlType::IQ4_NL);  // rows of 64
  EXPECT_EQ(out.tensor("per_layer_token_embd.weight").type, GgmlType::IQ4_NL);  // rows of 64
  EXPECT_EQ(out.tensor("output.weight").type, GgmlType::Q6_K);
  EXPECT_EQ(out.tensor("blk.0.ffn_gate_inp.weight").type, GgmlType::F32);  // the router
}

TEST_F(ModelQuantize, ImportanceMatrixIsUsedAndChecked) {
  GgufFile in = GgufFile::open(source_);
  const GgufTensor& gate = in.tensor("blk.0.ffn_gate_exps.weight");  // {256, 64, 4}
  const std::string imat = path("imatrix.gguf");
  {
    GgufWriter w(imat);
    w.set("imatrix.chunk_count", uint32_t{1});
    w.add_tensor(gate.name + ".in_sum2", GgmlType::F32, {gate.ne[0], gate.ne[2]});
    w.add_tensor(gate.name + ".counts", GgmlType::F32, {gate.ne[2]});
    w.write_header();
    std::vector<float> sums(gate.ne[0] * gate.ne[2]);
    for (size_t i = 0; i < sums.size(); ++i) sums[i] = 1.0f + static_cast<float>(i % 7);
    std::vector<float> counts(gate.ne[2], 2.0f);
    w.write_data({reinterpret_cast<const uint8_t*>(sums.data()), sums.size() * 4});
    w.write_data({reinterpret_cast<const uint8_t*>(counts.data()), counts.size() * 4});
    w.finish();
  }
  QuantizeModelOptions o{source_, path("q.gguf"), quant_recipe("iq2_xxs-q2_0"), {}, imat, false};
  ImportanceMatrix m = ImportanceMatrix::load(imat);
  auto plan = plan_model_quantization(in, o, &m);
  for (const QuantizePlanEntry& e : plan) EXPECT_EQ(e.importance, e.name == gate.name) << e.name;
  // Row 64 belongs to expert 1: mean squared activation = sums / counts of that expert.
  const float* w = m.row_weights(gate.name, gate.ne[0], gate.ne[1], gate.ne[2], 64);
  ASSERT_NE(w, nullptr);
  EXPECT_FLOAT_EQ(w[0], (1.0f + (256 % 7)) / 2.0f);
  EXPECT_THROW(m.row_weights(gate.name, 128, 64, 4, 0), Error);
  FILE* log = std::tmpfile();
  quantize_model(o, log);
  std::fclose(log);
  GgufFile out = GgufFile::open(o.output);
  EXPECT_EQ(out.tensor(gate.name).type, GgmlType::IQ2_XXS);
  EXPECT_EQ(out.tensor("blk.0.ffn_down_exps.weight").type, GgmlType::Q2_0);
  EXPECT_LT(relative_error(in, out, gate.name), 0.6);
}

TEST_F(ModelQuantize, DryRunWritesNothingAndErrorsAreClear) {
  QuantizeModelOptions o{source_, path("q.gguf"), quant_recipe("q8_0"), {}, "", true};
  FILE* log = std::tmpfile();
  quantize_model(o, log);
  std::fclose(log);
  EXPECT_FALSE(fs::exists(o.output));
  EXPECT_THROW(quant_recipe("q3_x"), Error);
  EXPECT_THROW(parse_class_override("experts=q4_k"), Error);
  EXPECT_EQ(parse_class_override("Expert_Down=iq4_nl").first, TensorClass::ExpertDown);
  o.tensor_types["no.such.tensor"] = GgmlType::Q8_0;
  GgufFile in = GgufFile::open(source_);
  EXPECT_THROW(plan_model_quantization(in, o, nullptr), Error);
}
