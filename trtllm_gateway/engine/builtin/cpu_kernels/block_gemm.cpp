// y[M, N] = x[M, K] @ W^T for M up to PACKED_MAX_ROWS (packed_linear.py), with W kept in GGUF's
// 32-weight blocks (Q4_1, Q8_0) and float32 activations and accumulation. The weights are the
// model's own float values, stored exactly (packed_linear.py checks every block before packing)
// and widened in registers back to those exact floats, so only the order of the float additions
// differs from a dense float32 matmul. A batch-1 step reads ~5x fewer bytes than float32 weights.
// Threads: at::parallel_for over pairs of output columns, on the OpenMP runtime torch loaded.
#include "block_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "simd.h"

namespace trtllm_gateway {
namespace {
constexpr int64_t QK = 32;   // weights per block, as in GGUF
constexpr int64_t ROWS = 8;  // rows of x per pass over a column pair's blocks

void check(const torch::Tensor& x, const torch::Tensor& qs, int64_t qs_cols) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 matrix");
  TORCH_CHECK(x.size(1) % QK == 0 && qs.size(1) == qs_cols && qs.is_contiguous(),
              "weight blocks do not match x");
}

// Up to C adjacent columns against rows r0 .. r0 + R: each block is widened once per pass (to its
// exact float weights), each x load feeds C columns, and the R x C accumulators stay in registers.
template <int C, int R, class Widen>
inline void columns(const float* xp, int64_t K, int64_t r0, int64_t n, int64_t N,
                    Widen widen_block, float* yp) {
  f32x16 acc[R][C] = {};
  for (int64_t b = 0; b < K / QK; ++b) {
    f32x16 w[C][2];
    for (int c = 0; c < C; ++c) widen_block(n + c, b, w[c]);
    for (int r = 0; r < R; ++r) {
      const float* xr = xp + (r0 + r) * K + b * QK;
      const f32x16 x0 = load16(xr), x1 = load16(xr + 16);
      for (int c = 0; c < C; ++c) acc[r][c] += x0 * w[c][0] + x1 * w[c][1];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) yp[(r0 + r) * N + n + c] = hsum(acc[r][c]);
}

// columns<C, R> for a row count known only at run time (1 .. ROWS), so R is a constant inside.
template <int C, class Widen>
inline void rows(int64_t R, const float* xp, int64_t K, int64_t r0, int64_t n, int64_t N,
                 Widen widen_block, float* yp) {
  switch (R) {
    case 1: return columns<C, 1>(xp, K, r0, n, N, widen_block, yp);
    case 2: return columns<C, 2>(xp, K, r0, n, N, widen_block, yp);
    case 3: return columns<C, 3>(xp, K, r0, n, N, widen_block, yp);
    case 4: return columns<C, 4>(xp, K, r0, n, N, widen_block, yp);
    case 5: return columns<C, 5>(xp, K, r0, n, N, widen_block, yp);
    case 6: return columns<C, 6>(xp, K, r0, n, N, widen_block, yp);
    case 7: return columns<C, 7>(xp, K, r0, n, N, widen_block, yp);
    default: return columns<C, 8>(xp, K, r0, n, N, widen_block, yp);
  }
}

template <class Widen>
torch::Tensor block_mm(const torch::Tensor& x, int64_t N, Widen widen_block) {
  const int64_t M = x.size(0), K = x.size(1);
  torch::Tensor y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, (N + 1) / 2, 8, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = 2 * p;
      for (int64_t r0 = 0; r0 < M; r0 += ROWS) {  // the pair's blocks stay in L1 meanwhile
        const int64_t R = std::min(ROWS, M - r0);
        if (n + 1 < N) {
          rows<2>(R, xp, K, r0, n, N, widen_block, yp);
        } else {
          rows<1>(R, xp, K, r0, n, N, widen_block, yp);
        }
      }
    }
  });
  return y;
}
}  // namespace

// Q4_1: qs [N, K/2] uint8 where byte j of a block holds q[j] | q[j + 16] << 4; dm [N, K/32, 2]
// float (d, m). w = d * q + m is exact in float32 (d * q needs at most 15 bits, so its one
// rounding is the one the GGUF reader's dequantization does).
torch::Tensor q4_1_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& dm) {
  check(x, qs, x.size(1) / 2);
  const int64_t K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(dm.is_contiguous() && dm.size(0) == N && dm.size(1) == B && dm.size(2) == 2);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const float* dmp = dm.data_ptr<float>();
  const __m128i nibble = _mm_set1_epi8(15);
  return block_mm(x, N, [=](int64_t n, int64_t b, f32x16* w) {
    const auto* src = reinterpret_cast<const __m128i*>(qp + n * (K / 2) + b * (QK / 2));
    const __m128i raw = _mm_loadu_si128(src);
    const float d = dmp[(n * B + b) * 2], m = dmp[(n * B + b) * 2 + 1];
    w[0] = widen<false>(_mm_and_si128(raw, nibble)) * d + m;
    w[1] = widen<false>(_mm_and_si128(_mm_srli_epi16(raw, 4), nibble)) * d + m;
  });
}

// Q8_0: qs [N, K] int8; d [N, K/32] float. w = d * q, exact in float32 (at most 19 bits).
torch::Tensor q8_0_mm(const torch::Tensor& x, const torch::Tensor& qs, const torch::Tensor& d) {
  check(x, qs, x.size(1));
  const int64_t K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(d.is_contiguous() && d.size(0) == N && d.size(1) == B);
  const int8_t* qp = qs.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  return block_mm(x, N, [=](int64_t n, int64_t b, f32x16* w) {
    const auto* src = reinterpret_cast<const __m128i*>(qp + n * K + b * QK);
    w[0] = widen<true>(_mm_loadu_si128(src)) * dp[n * B + b];
    w[1] = widen<true>(_mm_loadu_si128(src + 1)) * dp[n * B + b];
  });
}

}  // namespace trtllm_gateway
