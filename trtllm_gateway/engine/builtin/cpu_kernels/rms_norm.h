// RMSNorm of float32 rows in one pass per row: rms_norm.cpp.
#pragma once

#include <torch/extension.h>

namespace trtllm_gateway {
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
}  // namespace trtllm_gateway
