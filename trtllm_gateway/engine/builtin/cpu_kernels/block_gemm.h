// x @ W^T with W in GGUF's 32-weight blocks (Q4_1, Q8_0), float32 activations: block_gemm.cpp.
#pragma once

#include <torch/extension.h>

namespace trtllm_gateway {
torch::Tensor q4_1_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& dm);
torch::Tensor q8_0_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& d);
}  // namespace trtllm_gateway
