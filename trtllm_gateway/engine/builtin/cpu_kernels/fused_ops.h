// The eager ops around the projections, one pass each: RoPE with the KV-cache store, and SwiGLU's
// SiLU-and-multiply (fused_ops.cpp).
#pragma once

#include "tensor.h"

#include <tuple>

namespace trtllm_gateway {
std::tuple<at::Tensor, at::Tensor> rope_store(const at::Tensor& qkv,
                                                    const at::Tensor& cos,
                                                    const at::Tensor& signed_sin,
                                                    const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache,
                                                    const at::Tensor& slots, int64_t nq,
                                                    int64_t nkv);
at::Tensor silu_mul(const at::Tensor& gate_up);
}  // namespace trtllm_gateway
