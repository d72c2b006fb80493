// A pure decode step's whole decoder stack in one call from Python: decode_stack.cpp.
#pragma once

#include "tensor.h"

#include <vector>

namespace trtllm_gateway {

// One packed projection: GGUF blocks (Q4_1: qs + (d, m); Q8_0: qs + d) and its size.
struct PackedWeight {
  at::Tensor qs, scales;
  bool q4_1;
  int64_t fmas_per_row;
};

class DecodeStack {
 public:
  // Per layer, in order: input norm, post-attention norm (weights), then the qkv, o, gate_up and
  // down projections (qs, scales, is Q4_1) and the layer's (K, V) cache.
  DecodeStack(std::vector<at::Tensor> norms, at::Tensor final_norm,
              std::vector<at::Tensor> qs, std::vector<at::Tensor> scales,
              std::vector<bool> q4_1, std::vector<at::Tensor> caches, int64_t nq, int64_t nkv,
              double eps, double scale, int64_t block_size, int64_t attn_fma_cost);

  // h [T, hidden]: the embedded tokens, updated in place as the residual stream. Returns the
  // final norm of it. min_parallel_fmas: calls below it run on this thread (cpu_threads.py).
  at::Tensor forward(at::Tensor h, const at::Tensor& cos, const at::Tensor& signed_sin,
                        const at::Tensor& slots, const at::Tensor& tables,
                        const at::Tensor& lens, int64_t decode_len,
                        int64_t min_parallel_fmas) const;

 private:
  struct Layer {
    at::Tensor in_norm, post_norm, k_cache, v_cache;
    PackedWeight qkv, o, gate_up, down;
  };
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  int64_t nq_, nkv_, block_size_, attn_fma_cost_;
  double eps_, scale_;
};

}  // namespace trtllm_gateway
