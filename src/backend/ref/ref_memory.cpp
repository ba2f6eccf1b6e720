// Reference backend memory: zero-filled host allocations.
#include <cstdlib>
#include <cstring>

#include "backend/ref/ref_backend.h"
#include "core/error.h"

namespace regolith {

Tensor RefBackend::alloc(DType dtype, std::array<int64_t, 4> ne) {
  int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
  if (n < 0 || ne[0] < 0 || ne[1] < 0 || ne[2] < 0 || ne[3] < 0) fail("alloc: negative shape");
  void* p = std::calloc(static_cast<size_t>(std::max<int64_t>(n, 1)), dtype_bytes(dtype));
  if (!p) fail("alloc: out of memory for ", n, " values");
  return Tensor(dtype, ne, std::shared_ptr<void>(p, std::free));
}

void RefBackend::write(Tensor& dst, const void* src, size_t bytes) {
  if (bytes > dst.n_bytes()) fail("write: ", bytes, " bytes into ", dst.shape_string());
  std::memcpy(dst.data(), src, bytes);
}

void RefBackend::read(const Tensor& src, void* dst, size_t bytes) {
  if (bytes > src.n_bytes()) fail("read: ", bytes, " bytes from ", src.shape_string());
  std::memcpy(dst, src.data(), bytes);
}

void RefBackend::copy(const Tensor& src, int64_t src_off, Tensor& dst, int64_t dst_off, int64_t n) {
  if (src.dtype() != dst.dtype()) fail("copy: dtypes differ");
  if (n < 0 || src_off < 0 || dst_off < 0 || src_off + n > src.n_elements() || dst_off + n > dst.n_elements())
    fail("copy: range [", src_off, ", +", n, ") of ", src.shape_string(), " to [", dst_off, ", +", n, ") of ",
         dst.shape_string(), " is out of bounds");
  std::memmove(dst.data(dst_off), src.data(src_off), static_cast<size_t>(n) * dtype_bytes(src.dtype()));
}

}  // namespace regolith
