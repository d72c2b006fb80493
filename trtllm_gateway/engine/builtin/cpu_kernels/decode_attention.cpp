#include "decode_attention.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "simd.h"

namespace trtllm_gateway {

// Decode attention over the paged cache, read in place: q [B, Hq, D]; caches [slots, Hk, D] with
// slot = block * block_size + offset; tables [B, nb] int64 block ids; lens [B] int32 context
// lengths (the new token included). Per (row, KV head): scores, softmax, weighted sum of V, in
// float32, for the Hq / Hk query heads that share the KV head. D must be a multiple of 16.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache,
                               const torch::Tensor& v_cache, const torch::Tensor& tables,
                               const torch::Tensor& lens, int64_t block_size, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous());
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes());
  TORCH_CHECK(tables.scalar_type() == at::kLong && tables.is_contiguous());
  TORCH_CHECK(lens.scalar_type() == at::kInt && lens.numel() == q.size(0));
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hk = k_cache.size(1);
  const int64_t nb = tables.size(1), G = Hq / Hk;
  TORCH_CHECK(D % 16 == 0 && Hq % Hk == 0 && k_cache.size(2) == D);
  torch::Tensor out = torch::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  const int64_t* tp = tables.data_ptr<int64_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float sc = static_cast<float>(scale);
  const int64_t nv = D / 16;
  at::parallel_for(0, B * Hk, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<f32x16> acc;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hk, h = i % Hk, len = lp[b];
      TORCH_CHECK(len >= 1 && (len + block_size - 1) / block_size <= nb, "bad context length");
      scores.assign(G * len, 0.f);
      acc.assign(G * nv, f32x16{});
      const float* qh = qp + (b * Hq + h * G) * D;  // the G query heads of KV head h
      for (int64_t t = 0; t < len; ++t) {
        const int64_t slot = tp[b * nb + t / block_size] * block_size + t % block_size;
        const float* k = kp + (slot * Hk + h) * D;
        for (int64_t g = 0; g < G; ++g) {
          f32x16 dot{};
          for (int64_t j = 0; j < nv; ++j) dot += load16(qh + g * D + j * 16) * load16(k + j * 16);
          scores[g * len + t] = hsum(dot) * sc;
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        float* s = scores.data() + g * len;
        float mx = s[0];
        for (int64_t t = 1; t < len; ++t) mx = s[t] > mx ? s[t] : mx;
        float sum = 0.f;
        for (int64_t t = 0; t < len; ++t) {
          s[t] = std::exp(s[t] - mx);
          sum += s[t];
        }
        for (int64_t t = 0; t < len; ++t) s[t] /= sum;
      }
      for (int64_t t = 0; t < len; ++t) {
        const int64_t slot = tp[b * nb + t / block_size] * block_size + t % block_size;
        const float* v = vp + (slot * Hk + h) * D;
        for (int64_t g = 0; g < G; ++g) {
          const float p = scores[g * len + t];
          for (int64_t j = 0; j < nv; ++j) acc[g * nv + j] += p * load16(v + j * 16);
        }
      }
      for (int64_t g = 0; g < G; ++g)
        std::memcpy(op + (b * Hq + h * G + g) * D, acc.data() + g * nv, D * sizeof(float));
    }
  });
  return out;
}

}  // namespace trtllm_gateway
