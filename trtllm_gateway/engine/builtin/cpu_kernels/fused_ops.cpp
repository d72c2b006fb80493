// rope_store: the fused QKV projection's output [T, (nq + 2 nkv) * D] -> rotated Q [T, nq, D] and
// K [T, nkv, D], with K and V written into the paged cache at each token's slot, in one pass
// (instead of roll, two multiplies, an add, two index copies and a contiguous copy of Q, each
// over all layers). The same float operations as rope.py's rotate, in the same order and without
// FMA contraction, so the rotated values are bit for bit the portable path's.
// silu_mul: [T, 2I] (gate, up) -> silu(gate) * up, silu(g) = g / (1 + e^-g) as torch computes
// it, with a vector exp (within 2 ulp of expf, so within a few ulp of torch's SiLU). Both in
// simd.h's vectors: the AVX-512 and AVX2 builds compute the same bits.
#include "fused_ops.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>

#include "simd.h"

namespace trtllm_gateway {
namespace {

// out = x * cos + roll(x, D / 2) * signed_sin, rounded after each multiply and the add.
__attribute__((optimize("fp-contract=off"))) void rotate_row(const float* x, const float* c,
                                                             const float* s, int64_t D,
                                                             float* out) {
  const int64_t h = D / 2;
  if (h % 16 == 0) {
    for (int64_t j = 0; j < h; j += W) {
      const vf lo = vload(x + j), hi = vload(x + h + j);
      vstore(out + j, vadd(vmul(lo, vload(c + j)), vmul(hi, vload(s + j))));
      vstore(out + h + j, vadd(vmul(hi, vload(c + h + j)), vmul(lo, vload(s + h + j))));
    }
    return;
  }
  for (int64_t j = 0; j < D; ++j) {
    const float a = x[j] * c[j], b = x[(j + h) % D] * s[j];
    out[j] = a + b;
  }
}
}  // namespace

std::tuple<at::Tensor, at::Tensor> rope_store(const at::Tensor& qkv,
                                                    const at::Tensor& cos,
                                                    const at::Tensor& signed_sin,
                                                    const at::Tensor& k_cache,
                                                    const at::Tensor& v_cache,
                                                    const at::Tensor& slots, int64_t nq,
                                                    int64_t nkv) {
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.is_contiguous());
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes() &&
              k_cache.size(1) == nkv);
  const int64_t T = qkv.size(0), D = k_cache.size(2), W = qkv.size(1);
  TORCH_CHECK(W == (nq + 2 * nkv) * D && D % 2 == 0, "qkv does not match the heads");
  TORCH_CHECK(cos.is_contiguous() && signed_sin.is_contiguous() && cos.numel() == T * D &&
              signed_sin.numel() == T * D && cos.scalar_type() == at::kFloat);
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.numel() == T);
  at::Tensor q = at::empty({T, nq, D}, qkv.options());
  at::Tensor k = at::empty({T, nkv, D}, qkv.options());
  const float* xp = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = signed_sin.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  float* qp = q.data_ptr<float>();
  float* kp = k.data_ptr<float>();
  float* kc = k_cache.data_ptr<float>();
  float* vc = v_cache.data_ptr<float>();
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* row = xp + t * W;
      for (int64_t h = 0; h < nq; ++h)
        rotate_row(row + h * D, cp + t * D, sp + t * D, D, qp + (t * nq + h) * D);
      float* kt = kp + t * nkv * D;
      for (int64_t h = 0; h < nkv; ++h)
        rotate_row(row + (nq + h) * D, cp + t * D, sp + t * D, D, kt + h * D);
      std::memcpy(kc + slot[t] * nkv * D, kt, nkv * D * sizeof(float));
      std::memcpy(vc + slot[t] * nkv * D, row + (nq + nkv) * D, nkv * D * sizeof(float));
    }
  });
  return {q, k};
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat &&
              gate_up.is_contiguous() && gate_up.size(1) % 2 == 0);
  const int64_t T = gate_up.size(0), I = gate_up.size(1) / 2;
  at::Tensor out = at::empty({T, I}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, T, 8, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* g = gp + t * 2 * I;
      const float* u = g + I;
      float* o = op + t * I;
      int64_t j = 0;
      for (; j + W <= I; j += W) {
        const vf x = vload(g + j);
        const vf s = vdiv(x, vadd(vset(1.f), vexp(vsub(vzero(), x))));
        vstore(o + j, vmul(s, vload(u + j)));
      }
      for (; j < I; ++j) o[j] = g[j] / (1.f + std::exp(-g[j])) * u[j];
    }
  });
  return out;
}

}  // namespace trtllm_gateway
