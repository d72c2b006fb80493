// x @ W^T with W in GGUF's 32-weight blocks (Q4_1, Q8_0), float32 activations: block_gemm.cpp.
#pragma once

#include "tensor.h"

namespace trtllm_gateway {
at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm);
at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d);
}  // namespace trtllm_gateway
