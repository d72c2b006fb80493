// y[M, N] = x[M, K] @ W^T for small M, with W kept in GGUF's 32-weight blocks (Q4_1, Q8_0) and
// float32 activations and accumulation. The weights are the model's own float values, stored
// exactly (packed_linear.py checks every block before packing), so only the order of the float
// additions differs from a dense float32 matmul. Batch-1 decode reads ~5x fewer bytes than float32.
// Threads: at::parallel_for over output columns, on the OpenMP runtime torch already loaded.
#include "block_gemm.h"

#include <ATen/Parallel.h>

#include "simd.h"

namespace trtllm_gateway {
namespace {
constexpr int64_t QK = 32;  // weights per block, as in GGUF
void check(const torch::Tensor& x, const torch::Tensor& qs, int64_t qs_cols) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 matrix");
  TORCH_CHECK(x.size(0) <= MAX_ROWS, "at most ", MAX_ROWS, " rows");
  TORCH_CHECK(x.size(1) % QK == 0 && qs.size(1) == qs_cols && qs.is_contiguous(),
              "weight blocks do not match x");
}

// Q4_1: qs [N, K/2] uint8 where byte j of a block holds q[j] | q[j + 16] << 4; dm [N, K/32, 2]
// float (d, m). w = d * q + m, so x . w = d * (x . q) + m * sum(x) block by block.
}  // namespace

torch::Tensor q4_1_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& dm) {
  check(x, qs, x.size(1) / 2);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(dm.is_contiguous() && dm.size(0) == N && dm.size(1) == B && dm.size(2) == 2);
  const torch::Tensor xsum = x.view({M, B, QK}).sum(-1).contiguous();
  torch::Tensor y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* sp = xsum.data_ptr<float>();
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const float* dmp = dm.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    const __m128i nibble = _mm_set1_epi8(15);
    for (int64_t n = n0; n < n1; ++n) {
      f32x16 acc[MAX_ROWS];
      float accm[MAX_ROWS];
      for (int64_t r = 0; r < M; ++r) {
        acc[r] = f32x16{};
        accm[r] = 0.f;
      }
      for (int64_t b = 0; b < B; ++b) {
        const auto* src = reinterpret_cast<const __m128i*>(qp + n * (K / 2) + b * (QK / 2));
        const __m128i raw = _mm_loadu_si128(src);
        const f32x16 lo = widen<false>(_mm_and_si128(raw, nibble));
        const f32x16 hi = widen<false>(_mm_and_si128(_mm_srli_epi16(raw, 4), nibble));
        const float d = dmp[(n * B + b) * 2], m = dmp[(n * B + b) * 2 + 1];
        for (int64_t r = 0; r < M; ++r) {
          const float* xr = xp + r * K + b * QK;
          acc[r] += d * (load16(xr) * lo + load16(xr + 16) * hi);
          accm[r] += m * sp[r * B + b];
        }
      }
      for (int64_t r = 0; r < M; ++r) yp[r * N + n] = hsum(acc[r]) + accm[r];
    }
  });
  return y;
}

// Q8_0: qs [N, K] int8; d [N, K/32] float. w = d * q.
torch::Tensor q8_0_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& d) {
  check(x, qs, x.size(1));
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(d.is_contiguous() && d.size(0) == N && d.size(1) == B);
  torch::Tensor y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const int8_t* qp = qs.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      f32x16 acc[MAX_ROWS];
      for (int64_t r = 0; r < M; ++r) acc[r] = f32x16{};
      for (int64_t b = 0; b < B; ++b) {
        const auto* src = reinterpret_cast<const __m128i*>(qp + n * K + b * QK);
        const f32x16 q0 = widen<true>(_mm_loadu_si128(src));
        const f32x16 q1 = widen<true>(_mm_loadu_si128(src + 1));
        const float db = dp[n * B + b];
        for (int64_t r = 0; r < M; ++r) {
          const float* xr = xp + r * K + b * QK;
          acc[r] += db * (load16(xr) * q0 + load16(xr + 16) * q1);
        }
      }
      for (int64_t r = 0; r < M; ++r) yp[r * N + n] = hsum(acc[r]);
    }
  });
  return y;
}

}  // namespace trtllm_gateway
