// Dot kernels: every ISA path this CPU runs against the scalar reference, on quantized Gaussian
// rows and on random blocks with extreme scales, at the row lengths this model uses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "quant/dot.h"
#include "quant/dot_kernels.h"
#include "quant/rows.h"
#include "quant_test_util.h"

using namespace regolith;

namespace {

std::vector<GgmlType> dot_types() {
  std::vector<GgmlType> t = quant_test::weight_types();
  t.insert(t.begin(), {GgmlType::F32, GgmlType::F16, GgmlType::BF16});
  return t;
}

// Row lengths: the model's 160, 640, 2560, plus small and odd multiples of the block.
std::vector<int64_t> lengths(GgmlType t) {
  switch (traits(t).block_size) {
    case 256: return {256, 512, 2560, 6144};
    case 64: return {64, 192, 640, 2560};
    case 32: return {32, 96, 160, 640, 2560};
    default: return {1, 7, 33, 160, 640, 2561};
  }
}

// Σ |w_i·a_i| from dequantized values: the scale of the rounding error any kernel may make.
double magnitude(GgmlType t, int64_t n, const uint8_t* row, const uint8_t* act) {
  std::vector<float> w(n), a(n);
  dequantize_row(t, row, n, w.data());
  dequantize_row(quant::activation_type(t), act, n, a.data());
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m += std::fabs(static_cast<double>(w[i]) * a[i]);
  return m;
}

void check_all_isas(GgmlType t, int64_t n, const std::vector<uint8_t>& row, const std::vector<uint8_t>& act, const char* what) {
  const float ref = quant::vec_dot_kernel(t, quant::Isa::scalar)(n, row.data(), act.data());
  const double tol = 2e-6 * magnitude(t, n, row.data(), act.data()) + 1e-30;
  for (quant::Isa isa : {quant::Isa::avx2, quant::Isa::avx512}) {
    if (!quant::isa_supported(isa)) continue;
    const float got = quant::vec_dot_kernel(t, isa)(n, row.data(), act.data());
    EXPECT_NEAR(got, ref, tol) << type_name(t) << " n=" << n << " " << quant::isa_name(isa) << " " << what;
  }
}

}  // namespace

TEST(Dot, EveryTypeHasASimdKernel) {
  for (GgmlType t : dot_types()) {
    EXPECT_TRUE(quant::has_vec_dot(t)) << type_name(t);
    EXPECT_NE(quant::avx2_dot_table()[static_cast<int>(t)], nullptr) << type_name(t);
    EXPECT_NE(quant::avx512_dot_table()[static_cast<int>(t)], nullptr) << type_name(t);
  }
  std::printf("best ISA on this machine: %s\n", quant::isa_name(quant::best_isa()));
}

TEST(Dot, SimdMatchesScalarOnQuantizedRows) {
  std::mt19937 rng(3);
  for (GgmlType t : dot_types()) {
    for (int64_t n : lengths(t)) {
      std::vector<float> w = quant_test::heavy_tailed_row(n, rng), x = quant_test::gaussian_row(n, rng, 0.5f);
      std::vector<uint8_t> row(row_bytes(t, n)), act(quant::activation_bytes(t, n));
      quantize_row(t, w.data(), n, row.data());
      quant::quantize_activations(t, x.data(), n, act.data());
      check_all_isas(t, n, row, act, "quantized");
      // And the scalar reference against a float64 dot of the dequantized values.
      std::vector<float> wd(n), ad(n);
      dequantize_row(t, row.data(), n, wd.data());
      dequantize_row(quant::activation_type(t), act.data(), n, ad.data());
      double exact = 0;
      for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(wd[i]) * ad[i];
      EXPECT_NEAR(quant::vec_dot(t, n, row.data(), act.data()), exact, 2e-6 * magnitude(t, n, row.data(), act.data()) + 1e-30)
          << type_name(t) << " n=" << n;
    }
  }
}

TEST(Dot, SimdMatchesScalarOnRandomBlocks) {
  std::mt19937 rng(5);
  for (GgmlType t : dot_types()) {
    const int64_t n = lengths(t)[2];
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<uint8_t> row(row_bytes(t, n));
      for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
      // Keep float scales finite: rewrite every fp16/bf16/f32 element or scale with a sane one.
      std::vector<float> probe(n);
      dequantize_row(t, row.data(), n, probe.data());
      bool finite = true;
      for (float v : probe) finite = finite && std::isfinite(v) && std::fabs(v) < 1e30f;
      if (!finite) continue;
      std::vector<float> x = quant_test::gaussian_row(n, rng, 1.0f);
      std::vector<uint8_t> act(quant::activation_bytes(t, n));
      quant::quantize_activations(t, x.data(), n, act.data());
      check_all_isas(t, n, row, act, "random bytes");
    }
  }
}

TEST(Dot, ZeroActivationsGiveZero) {
  for (GgmlType t : dot_types()) {
    const int64_t n = lengths(t)[1];
    std::mt19937 rng(1);
    std::vector<float> w = quant_test::gaussian_row(n, rng, 1.0f), x(n, 0.0f);
    std::vector<uint8_t> row(row_bytes(t, n)), act(quant::activation_bytes(t, n));
    quantize_row(t, w.data(), n, row.data());
    quant::quantize_activations(t, x.data(), n, act.data());
    for (quant::Isa isa : {quant::Isa::scalar, quant::Isa::avx2, quant::Isa::avx512}) {
      if (!quant::isa_supported(isa)) continue;
      EXPECT_EQ(quant::vec_dot_kernel(t, isa)(n, row.data(), act.data()), 0.0f) << type_name(t);
    }
  }
}

TEST(Dot, RowLengthsAreChecked) {
  std::vector<uint8_t> buf(4096);
  EXPECT_THROW(quant::vec_dot(GgmlType::Q4_K, 640, buf.data(), buf.data()), Error);
  EXPECT_THROW(quant::activation_bytes(GgmlType::IQ2_XXS, 160), Error);
  EXPECT_THROW(quant::activation_bytes(GgmlType::Q2_0, 32), Error);
  EXPECT_THROW(quant::vec_dot_kernel(GgmlType::IQ1_S), Error);
  EXPECT_EQ(quant::activation_type(GgmlType::Q4_1), GgmlType::Q8_0);
  EXPECT_EQ(quant::activation_type(GgmlType::IQ4_XS), GgmlType::Q8_K);
  EXPECT_EQ(quant::activation_type(GgmlType::Q2_0), GgmlType::Q8_0);
  EXPECT_EQ(quant::activation_type(GgmlType::BF16), GgmlType::F32);
}
