// Backend-independent pieces of ops.h: tensor views, argument checks, host reads, products that
// share an input, and the prefill/decode dispatch of the GDN scan.
#include <cstring>

#include "backend/ops.h"
#include "core/error.h"

namespace regolith {

Tensor Tensor::reshaped(std::array<int64_t, 4> ne) const {
  if (ne[0] * ne[1] * ne[2] * ne[3] != n_elements())
    fail("cannot view tensor ", shape_string(), " as {", ne[0], ", ", ne[1], ", ", ne[2], ", ", ne[3], "}");
  return Tensor(dtype_, ne, storage_, offset_);
}

std::string Tensor::shape_string() const { return cat("{", ne_[0], ", ", ne_[1], ", ", ne_[2], ", ", ne_[3], "}"); }

void expect_shape(const Tensor& t, std::array<int64_t, 4> ne, const char* op, const char* what) {
  if (t.empty() || t.ne() != ne)
    fail(op, ": ", what, " is ", t.empty() ? std::string("missing") : t.shape_string(), ", expected {", ne[0], ", ",
         ne[1], ", ", ne[2], ", ", ne[3], "}");
}

void expect_elements(const Tensor& t, int64_t n, const char* op, const char* what) {
  if (t.empty() || t.n_elements() != n) fail(op, ": ", what, " has ", t.n_elements(), " values, expected ", n);
}

std::vector<float> Backend::read_f32(const Tensor& t) {
  if (t.dtype() != DType::F32) fail("read_f32 on a non-F32 tensor");
  std::vector<float> out(t.n_elements());
  read(t, out.data(), out.size() * sizeof(float));
  return out;
}

std::vector<int32_t> Backend::read_i32(const Tensor& t) {
  if (t.dtype() != DType::I32) fail("read_i32 on a non-I32 tensor");
  std::vector<int32_t> out(t.n_elements());
  read(t, out.data(), out.size() * sizeof(int32_t));
  return out;
}

void Backend::mul_mat_shared_input(std::span<const Weight* const> ws, const Tensor& x, std::span<Tensor* const> outs) {
  if (ws.size() != outs.size()) fail("mul_mat_shared_input: ", ws.size(), " weights for ", outs.size(), " outputs");
  for (size_t i = 0; i < ws.size(); ++i) mul_mat(*ws[i], x, *outs[i]);
}

void Backend::gdn_scan(const GdnScanArgs& a) {
  if (a.qkv->ne(1) == 1)
    gdn_recurrent(a);
  else
    gdn_chunked(a);
}

}  // namespace regolith
