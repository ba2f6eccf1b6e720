// Parity with llama.cpp v0.5.0's libggml, loaded at run time (see ggml_ref.h):
//  - dequantization is bit-identical for every type on random blocks, on blocks our quantizer
//    wrote, and on blocks whose scales are extreme but finite (zero, subnormal, largest);
//  - our quantizer's weighted RMSE is no worse than ggml_quantize_chunk's, with and without an
//    importance matrix, on Gaussian and heavy-tailed rows.
// Skips (with the reason) when the library could not be fetched.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/ggml_type.h"
#include "core/half.h"
#include "ggml_ref.h"
#include "quant/blocks.h"
#include "quant/dot.h"
#include "quant/rows.h"
#include "quant_test_util.h"

using namespace regolith;
using regolith::test::GgmlRef;

namespace {

const GgmlRef* ref_or_skip() {
  std::string error;
  const GgmlRef* ref = GgmlRef::load(error);
  if (!ref) std::printf("[  SKIPPED ] %s\n", error.c_str());
  return ref;
}

#define REQUIRE_GGML(ref)                         \
  const GgmlRef* ref = ref_or_skip();             \
  if (!ref) GTEST_SKIP() << "llama.cpp's libggml is unavailable"

// Where a block keeps its scales; every other byte may hold any value.
enum class Field { f16, f32, e8m0 };
struct ScaleField {
  int offset;
  Field kind;
};

std::vector<ScaleField> scale_fields(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_1:
    case GgmlType::Q5_1:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
      return {{0, Field::f16}, {2, Field::f16}};
    case GgmlType::Q2_K: return {{80, Field::f16}, {82, Field::f16}};
    case GgmlType::Q3_K: return {{108, Field::f16}};
    case GgmlType::Q6_K: return {{208, Field::f16}};
    case GgmlType::Q8_K: return {{0, Field::f32}};
    case GgmlType::MXFP4: return {{0, Field::e8m0}};
    default: return {{0, Field::f16}};
  }
}

const uint16_t kExtremeF16[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x1000};
const float kExtremeF32[] = {0.0f, -0.0f, 1e-45f, FLT_MIN, 1.0f, -1.0f, FLT_MAX, -FLT_MAX, 3e-20f};

uint16_t random_finite_f16(std::mt19937& rng) {
  for (;;) {
    uint16_t h = static_cast<uint16_t>(rng());
    if ((h & 0x7c00) != 0x7c00) return h;
  }
}

// Random bytes with scale fields set to extreme or random finite values; float formats get
// random finite elements.
std::vector<uint8_t> adversarial_row(GgmlType t, int64_t n, std::mt19937& rng) {
  std::vector<uint8_t> row(row_bytes(t, n));
  for (uint8_t& b : row) b = static_cast<uint8_t>(rng());
  if (t == GgmlType::F16) {
    for (size_t i = 0; i < row.size(); i += 2) {
      uint16_t h = random_finite_f16(rng);
      std::memcpy(&row[i], &h, 2);
    }
  } else if (t == GgmlType::BF16) {
    for (size_t i = 0; i < row.size(); i += 2)
      if ((row[i + 1] & 0x7f) == 0x7f && (row[i] & 0x80)) row[i + 1] &= 0xbf;  // no NaN/Inf
  } else if (t == GgmlType::F32) {
    for (size_t i = 0; i < row.size(); i += 4)
      if ((row[i + 3] & 0x7f) == 0x7f && (row[i + 2] & 0x80)) row[i + 3] &= 0xbf;
  } else {
    const GgmlTypeTraits& tr = traits(t);
    for (size_t b = 0; b < row.size(); b += tr.block_bytes) {
      for (const ScaleField& f : scale_fields(t)) {
        uint8_t* p = &row[b + f.offset];
        bool extreme = rng() % 2;
        if (f.kind == Field::f16) {
          uint16_t h = extreme ? kExtremeF16[rng() % std::size(kExtremeF16)] : random_finite_f16(rng);
          std::memcpy(p, &h, 2);
        } else if (f.kind == Field::f32) {
          float v = extreme ? kExtremeF32[rng() % std::size(kExtremeF32)] : std::ldexp(static_cast<float>(rng() % 1000) - 500, static_cast<int>(rng() % 40) - 20);
          std::memcpy(p, &v, 4);
        }
        // An E8M0 byte has no invalid values for ggml (255 decodes as 2^127).
      }
    }
  }
  return row;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, GgmlType t, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0 && mismatches++ == 0) first = i;
  EXPECT_EQ(mismatches, 0u) << type_name(t) << " " << what << ": first difference at value " << first << ": ours "
                            << a[first] << ", ggml " << b[first];
}

}  // namespace

TEST(GgmlParity, DequantizationIsBitExact) {
  REQUIRE_GGML(ref);
  std::mt19937 rng(7);
  for (GgmlType t : quant_test::all_types()) {
    const auto* tr = ref->type_traits(static_cast<int>(t));
    ASSERT_NE(tr, nullptr);
    if (!tr->to_float) continue;  // ggml cannot read it either (Q8_1)
    ASSERT_EQ(static_cast<uint64_t>(tr->type_size), traits(t).block_bytes) << type_name(t);
    ASSERT_EQ(static_cast<uint64_t>(tr->blck_size), traits(t).block_size) << type_name(t);
    const int64_t n = 16 * static_cast<int64_t>(traits(t).block_size == 1 ? 256 : traits(t).block_size);
    std::vector<float> ours(n), theirs(n);
    for (int rep = 0; rep < 40; ++rep) {
      std::vector<uint8_t> row = adversarial_row(t, n, rng);
      dequantize_row(t, row.data(), n, ours.data());
      tr->to_float(row.data(), theirs.data(), n);
      expect_same_bits(ours, theirs, t, "random/extreme blocks");
    }
    // Blocks written by our own quantizer, from Gaussian and from tiny and huge inputs.
    for (float scale : {1.0f, 1e-6f, 3e4f}) {
      std::vector<float> x = quant_test::gaussian_row(n, rng, scale);
      std::vector<uint8_t> row(row_bytes(t, n));
      quantize_row(t, x.data(), n, row.data());
      dequantize_row(t, row.data(), n, ours.data());
      tr->to_float(row.data(), theirs.data(), n);
      expect_same_bits(ours, theirs, t, "quantized blocks");
    }
  }
}

// One case per type, so that CTest can run them in parallel (ggml's first IQ2 quantization
// builds its search tables for seconds).
class QuantizerError : public ::testing::TestWithParam<GgmlType> {};

TEST_P(QuantizerError, NoWorseThanLlamaCpp) {
  REQUIRE_GGML(ref);
  const GgmlType t = GetParam();
  const int64_t n = 2048, rows = 4;
  std::mt19937 rng(11);
  for (int dist = 0; dist < 2; ++dist) {
    std::vector<float> x;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row = dist == 0 ? quant_test::gaussian_row(n, rng, 1.0f) : quant_test::heavy_tailed_row(n, rng);
      x.insert(x.end(), row.begin(), row.end());
    }
    std::vector<float> importance = quant_test::importance_row(n, rng);
    std::vector<float> ones(n, 1.0f);
    for (bool with_importance : {false, true}) {
      const float* imp = with_importance ? importance.data() : nullptr;
      const uint64_t rb = row_bytes(t, n);
      std::vector<uint8_t> ours(rb * rows), theirs(rb * rows);
      for (int r = 0; r < rows; ++r) quantize_row(t, x.data() + r * n, n, ours.data() + r * rb, imp);
      // ggml insists on an importance matrix for IQ2_XXS/IQ2_XS; give it a uniform one.
      const bool needs = t == GgmlType::IQ2_XXS || t == GgmlType::IQ2_XS;
      ref->quantize_chunk(static_cast<int>(t), x.data(), theirs.data(), 0, rows, n, imp ? imp : needs ? ones.data() : nullptr);
      const float* metric_w = with_importance ? importance.data() : ones.data();
      const double e_ours = quant_test::weighted_rmse(t, x, ours, n, metric_w);
      const double e_theirs = quant_test::weighted_rmse(t, x, theirs, n, metric_w);
      std::printf("%-8s %-9s importance %-3s rmse ours %.6g ggml %.6g ratio %.4f\n", std::string(type_name(t)).c_str(),
                  dist == 0 ? "gaussian" : "student-t", with_importance ? "yes" : "no", e_ours, e_theirs, e_ours / e_theirs);
      EXPECT_LE(e_ours, e_theirs * 1.0005) << type_name(t) << (dist == 0 ? " gaussian" : " heavy-tailed")
                                           << (with_importance ? " with" : " without") << " importance";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(GgmlParity, QuantizerError, ::testing::ValuesIn(quant_test::weight_types()),
                         [](const ::testing::TestParamInfo<GgmlType>& info) { return std::string(type_name(info.param)); });

// Our dot kernels against ggml's vec_dot on the same weight bytes and, where the activation
// formats coincide (Q8_0, Q8_K), the same activation bytes. Q4_1/Q5_1 give ggml a Q8_1 made from
// our Q8_0 codes; float weights give ggml activations rounded to its F16/BF16.
TEST(GgmlParity, DotProductsAgreeWithVecDot) {
  REQUIRE_GGML(ref);
  if (!ref->type_traits_cpu) GTEST_SKIP() << "no libggml CPU library for this machine";
  std::mt19937 rng(19);
  std::vector<GgmlType> types = quant_test::weight_types();
  types.insert(types.begin(), {GgmlType::F32, GgmlType::F16, GgmlType::BF16});
  for (GgmlType t : types) {
    const int64_t n = traits(t).block_size == 256 ? 2560 : 640;
    const auto* cpu = ref->type_traits_cpu(static_cast<int>(t));
    ASSERT_NE(cpu->vec_dot, nullptr) << type_name(t);
    std::vector<float> w = quant_test::heavy_tailed_row(n, rng), x = quant_test::gaussian_row(n, rng, 1.0f);
    std::vector<uint8_t> row(row_bytes(t, n)), act(quant::activation_bytes(t, n));
    quantize_row(t, w.data(), n, row.data());
    quant::quantize_activations(t, x.data(), n, act.data());
    const GgmlType theirs_type = static_cast<GgmlType>(cpu->vec_dot_type);
    std::vector<uint8_t> theirs(row_bytes(theirs_type, n));
    double tol_scale = 1e-5;
    if (theirs_type == quant::activation_type(t)) {
      theirs = act;
    } else if (theirs_type == GgmlType::Q8_1) {
      const auto* q8 = reinterpret_cast<const quant::BlockQ8_0*>(act.data());
      auto* q81 = reinterpret_cast<quant::BlockQ8_1*>(theirs.data());
      for (int64_t b = 0; b < n / 32; ++b) {
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += q81[b].qs[j] = q8[b].qs[j];
        q81[b].d = q8[b].d;
        q81[b].s = f32_to_f16(f16_to_f32(q8[b].d) * sum);
      }
      tol_scale = 2e-3;  // Q8_1 carries d·Σq rounded to fp16
    } else {
      quantize_row(theirs_type, x.data(), n, theirs.data());
      tol_scale = 1e-2;  // ggml rounds the activations to 16 bits, we keep float32
    }
    float expected = 0;
    cpu->vec_dot(static_cast<int>(n), &expected, 0, row.data(), 0, theirs.data(), 0, 1);
    std::vector<float> wd(n);
    dequantize_row(t, row.data(), n, wd.data());
    double magnitude = 0;
    for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(wd[i] * x[i]);
    EXPECT_NEAR(quant::vec_dot(t, n, row.data(), act.data()), expected, tol_scale * magnitude) << type_name(t);
  }
}
