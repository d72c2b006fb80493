// Paged decode attention over the float32 KV cache, read in place: decode_attention.cpp.
#pragma once

#include "tensor.h"

namespace trtllm_gateway {
at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& tables,
                               const at::Tensor& lens, int64_t block_size, double scale);
}  // namespace trtllm_gateway
