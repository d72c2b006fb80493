// RMSNorm of float32 rows in one pass per row: rms_norm.cpp.
#pragma once

#include "tensor.h"

namespace trtllm_gateway {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
}  // namespace trtllm_gateway
