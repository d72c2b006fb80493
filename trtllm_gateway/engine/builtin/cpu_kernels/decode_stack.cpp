// The decoder stack of a pure decode step (every row one new token) in one call: per layer
// RMSNorm, the packed QKV projection, RoPE with the KV store, paged decode attention, the o
// projection added into the residual stream, RMSNorm, gate_up, SiLU * up, down added in. The
// same kernels in the same order as model.py's eager forward with the CPU kernels, so the result
// is that forward's bit for bit; what goes is the Python around them (about 330 kernel calls
// through pybind, nn.Module dispatch, reshapes and the thread sizing of each call: 3-5 ms of a
// batch-1 step, issue 36, docs/cpu_step_profile.md).
// Threads as cpu_threads.call_sized sizes them: a call below min_parallel_fmas multiply-adds runs
// on this thread, larger ones on torch's; the kernels split by output columns or (row, KV head),
// so the thread count never changes a result's bits.
#include "decode_stack.h"

#include <ATen/Parallel.h>

#include <utility>

#include "block_gemm.h"
#include "decode_attention.h"
#include "fused_ops.h"
#include "rms_norm.h"

namespace trtllm_gateway {
namespace {

// fn() on this thread alone when it is small (and torch has more than one), else as it is.
template <class F>
at::Tensor sized(int64_t fmas, int64_t min_parallel, F&& fn) {
  const int n = at::get_num_threads();
  if (n == 1 || fmas >= min_parallel) return fn();
  struct Restore {
    int n;
    ~Restore() { at::set_num_threads(n); }
  } restore{n};
  at::set_num_threads(1);
  return fn();
}

at::Tensor project(const at::Tensor& x, const PackedWeight& w, int64_t min_parallel) {
  return sized(x.size(0) * w.fmas_per_row, min_parallel, [&] {
    return w.q4_1 ? q4_1_mm(x, w.qs, w.scales) : q8_0_mm(x, w.qs, w.scales);
  });
}

PackedWeight packed(const at::Tensor& qs, const at::Tensor& scales, bool q4_1) {
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() && scales.is_contiguous());
  const int64_t in = q4_1 ? qs.size(1) * 2 : qs.size(1);
  return {qs, scales, q4_1, qs.size(0) * in};
}
}  // namespace

DecodeStack::DecodeStack(std::vector<at::Tensor> norms, at::Tensor final_norm,
                         std::vector<at::Tensor> qs, std::vector<at::Tensor> scales,
                         std::vector<bool> q4_1, std::vector<at::Tensor> caches, int64_t nq,
                         int64_t nkv, double eps, double scale, int64_t block_size,
                         int64_t attn_fma_cost)
    : final_norm_(std::move(final_norm)),
      nq_(nq),
      nkv_(nkv),
      block_size_(block_size),
      attn_fma_cost_(attn_fma_cost),
      eps_(eps),
      scale_(scale) {
  const size_t L = norms.size() / 2;
  TORCH_CHECK(norms.size() == 2 * L && qs.size() == 4 * L && scales.size() == 4 * L &&
                  q4_1.size() == 4 * L && caches.size() == 2 * L,
              "per layer: 2 norms, 4 projections, a K and a V cache");
  for (size_t i = 0; i < L; ++i) {
    const auto p = [&](size_t j) { return packed(qs[4 * i + j], scales[4 * i + j], q4_1[4 * i + j]); };
    const at::Tensor& k = caches[2 * i];
    TORCH_CHECK(k.scalar_type() == at::kFloat && k.dim() == 3 && k.size(1) == nkv,
                "a float32 [slots, kv heads, head dim] cache");
    layers_.push_back(
        {norms[2 * i], norms[2 * i + 1], k, caches[2 * i + 1], p(0), p(1), p(2), p(3)});
  }
}

at::Tensor DecodeStack::forward(at::Tensor h, const at::Tensor& cos,
                                   const at::Tensor& signed_sin, const at::Tensor& slots,
                                   const at::Tensor& tables, const at::Tensor& lens,
                                   int64_t decode_len, int64_t min_parallel_fmas) const {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == at::kFloat && h.is_contiguous());
  const int64_t T = h.size(0);
  for (const Layer& l : layers_) {
    const int64_t D = l.k_cache.size(2);
    at::Tensor x = rms_norm(h, l.in_norm, eps_);
    const at::Tensor qkv = project(x, l.qkv, min_parallel_fmas);
    const at::Tensor q =
        std::get<0>(rope_store(qkv, cos, signed_sin, l.k_cache, l.v_cache, slots, nq_, nkv_));
    const int64_t attn = attn_fma_cost_ * 2 * q.numel() * decode_len;
    const at::Tensor o = sized(attn, min_parallel_fmas, [&] {
      return decode_attention(q, l.k_cache, l.v_cache, tables, lens, block_size_, scale_);
    });
    h.add_(project(o.view({T, nq_ * D}), l.o, min_parallel_fmas));
    x = rms_norm(h, l.post_norm, eps_);
    const at::Tensor act = silu_mul(project(x, l.gate_up, min_parallel_fmas));
    h.add_(project(act, l.down, min_parallel_fmas));
  }
  return rms_norm(h, final_norm_, eps_);
}

}  // namespace trtllm_gateway
