// y[M, N] = x[M, K] @ W^T for M up to PACKED_MAX_ROWS (packed_linear.py), with W kept in GGUF's
// 32-weight blocks (Q4_1, Q8_0) and float32 activations and accumulation. The weights are the
// model's own float values, stored exactly (packed_linear.py checks every block before packing)
// and widened in registers back to those exact floats, so only the order of the float additions
// differs from a dense float32 matmul. A batch-1 step reads ~5x fewer bytes than float32 weights.
// Threads: at::parallel_for over pairs of output columns (AVX2 above 2 rows: groups of 3), on the
// OpenMP runtime torch loaded.
// Written once in simd.h's vectors: AVX-512 and AVX2 builds compute the same bits.
#include "block_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "simd.h"

namespace trtllm_gateway {
namespace {
constexpr int64_t QK = 32;  // weights per block, as in GGUF
// Rows of x per pass over a column pair's blocks: the accumulators (ROWS x 2 columns x H native
// vectors), the widened weights (2 x 2) and two x vectors fit AVX-512's 32 registers at 8 rows
// and AVX2's 16 at 2 (4 rows spilled and measured slower, docs/benchmarks.md).
constexpr int64_t ROWS = W == 16 ? 8 : 2;

void check(const at::Tensor& x, const at::Tensor& qs, int64_t qs_cols) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 matrix");
  TORCH_CHECK(x.size(1) % QK == 0 && qs.size(1) == qs_cols && qs.is_contiguous(),
              "weight blocks do not match x");
}

// Up to C adjacent columns against rows r0 .. r0 + R. A block's 32 weights are two logical
// 16-float vectors (j = 0, 1), each H native vectors; per native slot h the block is widened to
// its exact float weights once (w[c][j]) and each x load feeds C columns, while the R x C x H
// accumulators stay in registers. Lane (h, l) of an accumulator adds x * w of weight
// j * 16 + h * W + l for j = 0 then 1, block after block, whatever W is.
template <int C, int R, class Widen>
inline void columns(const float* xp, int64_t K, int64_t r0, int64_t n, int64_t N,
                    Widen widen_block, float* yp) {
  vf acc[R][C][H];
  for (auto& a : acc)
    for (auto& b : a)
      for (auto& v : b) v = vzero();
  for (int64_t b = 0; b < K / QK; ++b)
#pragma GCC unroll 2
    for (int h = 0; h < H; ++h) {
      vf w[C][2];
#pragma GCC unroll 2
      for (int c = 0; c < C; ++c) widen_block(n + c, b, h, w[c]);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float* xr = xp + (r0 + r) * K + b * QK + h * W;
        const vf x0 = vload(xr), x1 = vload(xr + 16);
#pragma GCC unroll 2
        for (int c = 0; c < C; ++c)
          acc[r][c][h] = vfma(x1, w[c][1], vfma(x0, w[c][0], acc[r][c][h]));
      }
    }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) yp[(r0 + r) * N + n + c] = hsum16(acc[r][c]);
}

// columns<C, R> for a row count known only at run time (1 .. ROWS), so R is a constant inside.
template <int C, class Widen>
inline void rows(int64_t R, const float* xp, int64_t K, int64_t r0, int64_t n, int64_t N,
                 Widen widen_block, float* yp) {
  switch (R) {
    case 1: return columns<C, 1>(xp, K, r0, n, N, widen_block, yp);
#if defined(GW_AVX2)
    default: return columns<C, 2>(xp, K, r0, n, N, widen_block, yp);
#else
    case 2: return columns<C, 2>(xp, K, r0, n, N, widen_block, yp);
    case 3: return columns<C, 3>(xp, K, r0, n, N, widen_block, yp);
    case 4: return columns<C, 4>(xp, K, r0, n, N, widen_block, yp);
    case 5: return columns<C, 5>(xp, K, r0, n, N, widen_block, yp);
    case 6: return columns<C, 6>(xp, K, r0, n, N, widen_block, yp);
    case 7: return columns<C, 7>(xp, K, r0, n, N, widen_block, yp);
    default: return columns<C, 8>(xp, K, r0, n, N, widen_block, yp);
#endif
  }
}

// AVX2 at more than 2 rows: the widening (7 instructions a native vector) costs more than the 2
// FMAs per row it feeds, so a group of CT columns' blocks is widened once into an L1 buffer (in
// the weights' own order) and tiles of up to RT rows read it. Native slot h is the outer loop, so
// only a tile's R x C accumulators are live: 12 of AVX2's 16 registers, the 3 weight vectors and
// an x vector the rest (pinned there, else GCC folds the loads into the FMAs and reloads them per
// row): per block half, C + R loads feed R x C FMAs (the 2-column, 3-row tiles before this loaded
// 6 + 12 for 12). A step's projections at 32 rows on one core: 162.5 -> 111.7 ms (docs/benchmarks.md).
// Lane (h, l) adds the same products in the same order as columns<>, so the bits are the same.
constexpr int64_t CT = 3, RT = 4;

template <int R, int C>
inline void tile(const float* xp, int64_t K, int64_t r0, int64_t n, int64_t N, const float* buf,
                 float* yp) {
  vf sums[R][C][H];
#pragma GCC unroll 1
  for (int h = 0; h < H; ++h) {
    vf acc[R][C];
    for (auto& a : acc)
      for (auto& v : a) v = vzero();
    for (int64_t b = 0; b < K / QK; ++b)
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const int64_t k = b * QK + j * 16 + h * W;
        vf w[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) w[c] = in_register(vload(buf + c * K + k));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const vf x = in_register(vload(xp + (r0 + r) * K + k));
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c) acc[r][c] = vfma(x, w[c], acc[r][c]);
        }
      }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) sums[r][c][h] = acc[r][c];
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) yp[(r0 + r) * N + n + c] = hsum16(sums[r][c]);
}

// Every row of x against C (1 .. CT) staged columns, RT rows a tile and the rest in one.
template <int C>
inline void tiles(int64_t M, const float* xp, int64_t K, int64_t n, int64_t N, const float* buf,
                  float* yp) {
  int64_t r0 = 0;
  for (; r0 + RT <= M; r0 += RT) tile<RT, C>(xp, K, r0, n, N, buf, yp);
  switch (M - r0) {
    case 1: return tile<1, C>(xp, K, r0, n, N, buf, yp);
    case 2: return tile<2, C>(xp, K, r0, n, N, buf, yp);
    case 3: return tile<3, C>(xp, K, r0, n, N, buf, yp);
    default: return;
  }
}

// The AVX2 path above 2 rows: CT columns at a time widened into buf, then tiles<> over the rows.
template <class Widen>
void staged_mm(const float* xp, int64_t M, int64_t K, int64_t N, Widen widen_block, float* yp) {
  at::parallel_for(0, (N + CT - 1) / CT, 4, [&](int64_t g0, int64_t g1) {
    std::vector<float> buf(CT * K);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t n = g * CT, C = std::min(CT, N - n);
      for (int64_t c = 0; c < C; ++c)
        for (int64_t b = 0; b < K / QK; ++b)
          for (int h = 0; h < H; ++h) {
            vf w[2];
            widen_block(n + c, b, h, w);
            vstore(buf.data() + c * K + b * QK + h * W, w[0]);
            vstore(buf.data() + c * K + b * QK + 16 + h * W, w[1]);
          }
      if (C == 3) {
        tiles<3>(M, xp, K, n, N, buf.data(), yp);
      } else if (C == 2) {
        tiles<2>(M, xp, K, n, N, buf.data(), yp);
      } else {
        tiles<1>(M, xp, K, n, N, buf.data(), yp);
      }
    }
  });
}

template <class Widen>
at::Tensor block_mm(const at::Tensor& x, int64_t N, Widen widen_block) {
  const int64_t M = x.size(0), K = x.size(1);
  at::Tensor y = at::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  if (W == 8 && M > 2) {
    staged_mm(xp, M, K, N, widen_block, yp);
    return y;
  }
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
// rounding is the one the GGUF reader's dequantization does). Bytes h * W .. of a block widen to
// weights h * W .. (low nibbles, j = 0) and 16 + h * W .. (high nibbles, j = 1).
at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm) {
  check(x, qs, x.size(1) / 2);
  const int64_t K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(dm.is_contiguous() && dm.size(0) == N && dm.size(1) == B && dm.size(2) == 2);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  const float* dmp = dm.data_ptr<float>();
  return block_mm(x, N, [=](int64_t n, int64_t b, int h, vf* w) {
    const vi q = vu8(qp + n * (K / 2) + b * (QK / 2) + h * W);
    const vf d = vset(dmp[(n * B + b) * 2]), m = vset(dmp[(n * B + b) * 2 + 1]);
    w[0] = vfma(vcvt(vand(q, 15)), d, m);
    w[1] = vfma(vcvt(vshr(q, 4)), d, m);
  });
}

// Q8_0: qs [N, K] int8; d [N, K/32] float. w = d * q, exact in float32 (at most 19 bits).
at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d) {
  check(x, qs, x.size(1));
  const int64_t K = x.size(1), N = qs.size(0), B = K / QK;
  TORCH_CHECK(d.is_contiguous() && d.size(0) == N && d.size(1) == B);
  const int8_t* qp = qs.data_ptr<int8_t>();
  const float* dp = d.data_ptr<float>();
  return block_mm(x, N, [=](int64_t n, int64_t b, int h, vf* w) {
    const int8_t* src = qp + n * K + b * QK + h * W;
    const vf scale = vset(dp[n * B + b]);
    w[0] = vmul(vcvt(vs8(src)), scale);
    w[1] = vmul(vcvt(vs8(src + 16)), scale);
  });
}

}  // namespace trtllm_gateway
