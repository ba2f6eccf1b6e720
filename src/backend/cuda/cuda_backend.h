// The CUDA backend's public face: plain C++ (no CUDA headers), so that registry.cpp and the rest
// of the project compile without nvcc. Everything else of the backend lives in .cu files here.
#pragma once

#include <memory>

#include "backend/ops.h"

namespace regolith {

// The backend on CUDA device 0 (of options, exact_products). Throws Error naming the cause when no
// usable device is present.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options = {});

}  // namespace regolith
