// The eager ops around the projections, one pass each: RoPE with the KV-cache store, and SwiGLU's
// SiLU-and-multiply (fused_ops.cpp).
#pragma once

#include <torch/extension.h>

#include <tuple>

namespace trtllm_gateway {
std::tuple<torch::Tensor, torch::Tensor> rope_store(const torch::Tensor& qkv,
                                                    const torch::Tensor& cos,
                                                    const torch::Tensor& signed_sin,
                                                    const torch::Tensor& k_cache,
                                                    const torch::Tensor& v_cache,
                                                    const torch::Tensor& slots, int64_t nq,
                                                    int64_t nkv);
torch::Tensor silu_mul(const torch::Tensor& gate_up);
}  // namespace trtllm_gateway
