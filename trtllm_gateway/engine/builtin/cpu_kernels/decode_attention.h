// Paged decode attention over the float32 KV cache, read in place: decode_attention.cpp.
#pragma once

#include <torch/extension.h>

namespace trtllm_gateway {
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& tables,
                               const torch::Tensor& lens, int64_t block_size, double scale);
}  // namespace trtllm_gateway
