// y[M, N] = x[M, K] @ W^T with x quantized to int8 and W in GGUF blocks, multiplied with integer
// dot products: AVX512-VNNI vpdpbusd (64 byte products an instruction, against 16 float32 FMAs),
// AVX2's vpmaddubsw + vpmaddwd (or AVX-VNNI's 256-bit vpdpbusd), or a portable loop.
// This is llama.cpp's arithmetic (Q4_1 x Q8_1, Q8_0 x Q8_0), not the model's float32 one: y is
// the exact weights times the quantized activations, so greedy tokens can differ from float32's
// (packed_linear.py, docs/benchmarks.md).
//
// Activations (quantize_q8): per row and 32-value block, dx = max|x| / 127, qx = round(x / dx);
// xs[row, block] = (dx, dx * sum(qx)).
// Weights (packed_linear.py lays them out): 16 output columns x 32 inputs a block, as 8 groups of
// 4 inputs, each group one 64-byte register (lane c = column c's 4 bytes) of unsigned q (Q4_1:
// 0..15, two groups a byte, group i in the low nibble and i + 4 in the high one; Q8_0: q + 128).
// sc [N / 16, blocks, 2, 16] float: (d, m) per column (Q4_1: w = d * q + m; Q8_0: w = d * (u - 128),
// stored as m = -128 * d). A block adds d * dx * sum(u * qx) + m * dx * sum(qx), which is
// sum(w * dx * qx) up to float rounding.
#include "q8_gemm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "simd.h"

namespace trtllm_gateway {
namespace {
constexpr int64_t QK = 32;     // inputs per block
constexpr int64_t LANES = 16;  // output columns per group
constexpr int64_t ROWS = 8;    // rows per pass over a column group's blocks
constexpr int64_t PANEL = 128; // rows whose quantized activations stay in L2 across groups

#if defined(GW_PORTABLE)
void quantize_block(const float* x, int8_t* q, float* s) {
  float amax = 0.f;
  for (int i = 0; i < QK; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.f, id = d > 0.f ? 1.f / d : 0.f;
  int qsum = 0;
  for (int i = 0; i < QK; ++i) {
    const int v = static_cast<int>(std::nearbyint(x[i] * id));
    q[i] = static_cast<int8_t>(v);
    qsum += v;
  }
  s[0] = d;
  s[1] = d * static_cast<float>(qsum);
}
#else
// The portable loop's values bit for bit, in vectors: max|x| is exact in any order, x * id is the
// same one rounding, vround rounds to nearest even as nearbyint does, and the integer sum is
// exact. The scalar loop took ~1.5 ns a value (4.7 ms of a batch-32 int8 step on one AVX2 core;
// 1.8 ms now, docs/benchmarks.md).
void quantize_block(const float* x, int8_t* q, float* s) {
  constexpr int NV = QK / W;
  vf v[NV], m = vzero();
  for (int i = 0; i < NV; ++i) {
    v[i] = vload(x + i * W);
    m = vmax(m, vmax(v[i], vsub(vzero(), v[i])));
  }
  const float d = vmax_all(m) / 127.f, id = d > 0.f ? 1.f / d : 0.f;
  vi n[NV];
  for (int i = 0; i < NV; ++i) n[i] = vcvt_int(vround(vmul(v[i], vset(id))));
#if defined(GW_AVX512)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(n[0]));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(n[1]));
  const int qsum = _mm512_reduce_add_epi32(_mm512_add_epi32(n[0], n[1]));
#else
  // The packs work within 128-bit lanes: their bytes hold the values in groups of 4 in the
  // order 0 2 4 6 1 3 5 7, which the permute puts back.
  const __m256i b =
      _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i t = _mm256_add_epi32(_mm256_add_epi32(n[0], n[1]), _mm256_add_epi32(n[2], n[3]));
  __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4E));
  u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xB1));
  const int qsum = _mm_cvtsi128_si32(u);
#endif
  s[0] = d;
  s[1] = d * static_cast<float>(qsum);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
constexpr bool kNative = true;

struct Nibbles {  // Q4_1: 4 registers a block, each two groups
  const uint8_t* w;
  int64_t B;
  inline void operator()(int64_t g, int64_t b, __m512i* out) const {
    const uint8_t* p = w + (g * B + b) * 256;
    const __m512i mask = _mm512_set1_epi8(15);
    for (int i = 0; i < 4; ++i) {
      const __m512i v = _mm512_loadu_si512(p + i * 64);
      out[i] = _mm512_and_si512(v, mask);
      out[i + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
    }
  }
};

struct Bytes {  // Q8_0: 8 registers a block
  const uint8_t* w;
  int64_t B;
  inline void operator()(int64_t g, int64_t b, __m512i* out) const {
    const uint8_t* p = w + (g * B + b) * 512;
    for (int i = 0; i < 8; ++i) out[i] = _mm512_loadu_si512(p + i * 64);
  }
};

// Rows r0 .. r0 + R against column group g: a block's 8 weight registers are unpacked once and
// feed R rows, whose float accumulators stay in registers.
template <int R, class Unpack>
inline void tile(const int8_t* qx, const float* xs, int64_t K, int64_t r0, int64_t g, int64_t N,
                 const Unpack& unpack, const float* sc, float* y) {
  const int64_t B = K / QK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    __m512i w[8];
    unpack(g, b, w);
    const float* scb = sc + ((g * B + b) * 2) * LANES;
    const __m512 d = _mm512_loadu_ps(scb), m = _mm512_loadu_ps(scb + LANES);
    for (int r = 0; r < R; ++r) {
      const int8_t* xq = qx + (r0 + r) * K + b * QK;
      int32_t quads[8];
      std::memcpy(quads, xq, sizeof quads);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, w[j], _mm512_set1_epi32(quads[j]));
        s1 = _mm512_dpbusd_epi32(s1, w[j + 1], _mm512_set1_epi32(quads[j + 1]));
      }
      const float* x2 = xs + ((r0 + r) * B + b) * 2;
      const __m512 dot = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(d, _mm512_set1_ps(x2[0])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x2[1]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * N + g * LANES, acc[r]);
}

template <class Unpack>
inline void rows(int64_t R, const int8_t* qx, const float* xs, int64_t K, int64_t r0, int64_t g,
                 int64_t N, const Unpack& u, const float* sc, float* y) {
  switch (R) {
    case 1: return tile<1>(qx, xs, K, r0, g, N, u, sc, y);
    case 2: return tile<2>(qx, xs, K, r0, g, N, u, sc, y);
    case 3: return tile<3>(qx, xs, K, r0, g, N, u, sc, y);
    case 4: return tile<4>(qx, xs, K, r0, g, N, u, sc, y);
    case 5: return tile<5>(qx, xs, K, r0, g, N, u, sc, y);
    case 6: return tile<6>(qx, xs, K, r0, g, N, u, sc, y);
    case 7: return tile<7>(qx, xs, K, r0, g, N, u, sc, y);
    default: return tile<8>(qx, xs, K, r0, g, N, u, sc, y);
  }
}

template <class Unpack>
void gemm(const int8_t* qx, const float* xs, int64_t M, int64_t K, int64_t N, const Unpack& u,
          const float* sc, float* y) {
  at::parallel_for(0, N / LANES, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t p = 0; p < M; p += PANEL) {
      const int64_t pe = std::min(M, p + PANEL);
      for (int64_t g = g0; g < g1; ++g)
        for (int64_t r0 = p; r0 < pe; r0 += ROWS)
          rows(std::min(ROWS, pe - r0), qx, xs, K, r0, g, N, u, sc, y);
    }
  });
}
#elif defined(__AVX2__)
constexpr bool kNative = true;

// AVX2 (and AVX-VNNI where the CPU has it): the same layout read as two 32-byte halves of each
// 64-byte group register (columns 0-7, then 8-15). Without VNNI a 4-input dot product is
// vpmaddubsw (u8 x s8 pairs to int16) then vpmaddwd against ones (pairs to int32), the arithmetic
// of llama.cpp's AVX2 Q4_1 x Q8_1 dot product. Q4_1's u <= 15 lets the int16 pair sums of all
// 8 groups add up before widening (8 x 2 x 15 x 127 < 2^15); Q8_0's u <= 255 would saturate, so
// its bytes are split into nibbles (u = lo + 16 hi) and summed the same way. The integer sums
// are exact, and the float steps after them are AVX-512's, so both compute the same bits.
constexpr int64_t HALF = 8;  // columns of a 32-byte half

inline __m256i quad(const int8_t* xq, int j) {  // x's inputs 4j .. 4j + 3 in every lane
  int32_t v;
  std::memcpy(&v, xq + 4 * j, 4);
  return _mm256_set1_epi32(v);
}

#if !defined(__AVXVNNI__)
// sum over 8 groups of u[j] . x[j] for u <= 15, in int16 lanes, then to int32.
inline __m256i dot_small(const __m256i* u, const int8_t* xq) {
  __m256i s = _mm256_maddubs_epi16(u[0], quad(xq, 0));
  for (int j = 1; j < 8; ++j) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(u[j], quad(xq, j)));
  return _mm256_madd_epi16(s, _mm256_set1_epi16(1));
}
#endif

// The int32 dot products of 8 columns' 32 unsigned weights with a row's 32 int8 inputs.
template <bool Nibbles>
inline __m256i dot_block(const __m256i* w, const int8_t* xq) {
#if defined(__AVXVNNI__)
  __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
  for (int j = 0; j < 8; j += 2) {
    s0 = _mm256_dpbusd_avx_epi32(s0, w[j], quad(xq, j));
    s1 = _mm256_dpbusd_avx_epi32(s1, w[j + 1], quad(xq, j + 1));
  }
  return _mm256_add_epi32(s0, s1);
#else
  if constexpr (Nibbles) {
    return dot_small(w, xq);
  } else {
    const __m256i mask = _mm256_set1_epi8(15);
    __m256i lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      lo[j] = _mm256_and_si256(w[j], mask);
      hi[j] = _mm256_and_si256(_mm256_srli_epi16(w[j], 4), mask);
    }
    return _mm256_add_epi32(dot_small(lo, xq), _mm256_slli_epi32(dot_small(hi, xq), 4));
  }
#endif
}

// Rows r0 .. r0 + R against half h of column group g: the block's 8 weight registers are loaded
// (Q4_1: unpacked from nibbles) once and feed R rows.
template <int R, bool Nibbles>
inline void tile(const int8_t* qx, const float* xs, int64_t K, int64_t r0, int64_t g, int64_t h,
                 int64_t N, const uint8_t* wp, const float* sc, float* y) {
  const int64_t B = K / QK;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    __m256i w[8];
    const uint8_t* p = wp + (g * B + b) * (Nibbles ? 256 : 512) + h * 32;
    if constexpr (Nibbles) {
      const __m256i mask = _mm256_set1_epi8(15);
      for (int i = 0; i < 4; ++i) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * 64));
        w[i] = _mm256_and_si256(v, mask);
        w[i + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
    } else {
      for (int i = 0; i < 8; ++i)
        w[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i * 64));
    }
    const float* scb = sc + ((g * B + b) * 2) * LANES + h * HALF;
    const __m256 d = _mm256_loadu_ps(scb), m = _mm256_loadu_ps(scb + LANES);
    for (int r = 0; r < R; ++r) {
      const __m256 dot = _mm256_cvtepi32_ps(dot_block<Nibbles>(w, qx + (r0 + r) * K + b * QK));
      const float* x2 = xs + ((r0 + r) * B + b) * 2;
      acc[r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(d, _mm256_set1_ps(x2[0])), acc[r]);
      acc[r] = _mm256_fmadd_ps(m, _mm256_set1_ps(x2[1]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(y + (r0 + r) * N + g * LANES + h * HALF, acc[r]);
}

template <bool Nibbles>
void gemm(const int8_t* qx, const float* xs, int64_t M, int64_t K, int64_t N, const uint8_t* w,
          const float* sc, float* y) {
  // Rows a pass: the block's 8 weight registers feed 4 rows' accumulators (2 rows: 22.2 ms for
  // a batch-8 step's projections on one core, 4 rows: 19.3; at 32 rows 68.3 -> 57.3).
  at::parallel_for(0, N / LANES * 2, 4, [&](int64_t i0, int64_t i1) {
    for (int64_t p = 0; p < M; p += PANEL) {
      const int64_t pe = std::min(M, p + PANEL);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t g = i / 2, h = i % 2;
        int64_t r0 = p;
        for (; r0 + 4 <= pe; r0 += 4) tile<4, Nibbles>(qx, xs, K, r0, g, h, N, w, sc, y);
        switch (pe - r0) {
          case 3: tile<3, Nibbles>(qx, xs, K, r0, g, h, N, w, sc, y); break;
          case 2: tile<2, Nibbles>(qx, xs, K, r0, g, h, N, w, sc, y); break;
          case 1: tile<1, Nibbles>(qx, xs, K, r0, g, h, N, w, sc, y); break;
          default: break;
        }
      }
    }
  });
}
#else
constexpr bool kNative = false;
#endif

// The same sums one value at a time: for CPUs without AVX512-VNNI (tests compare it too).
void gemm_portable(const int8_t* qx, const float* xs, int64_t M, int64_t K, int64_t N,
                   const uint8_t* w, const float* sc, bool nibbles, float* y) {
  const int64_t B = K / QK;
  at::parallel_for(0, N / LANES, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t r = 0; r < M; ++r)
        for (int64_t c = 0; c < LANES; ++c) {
          float acc = 0.f;
          for (int64_t b = 0; b < B; ++b) {
            int32_t dot = 0;
            for (int64_t k = 0; k < QK; ++k) {
              const int64_t grp = k / 4, byte = (grp % (nibbles ? 4 : 8)) * 64 + c * 4 + k % 4;
              const uint8_t raw = w[(g * B + b) * (nibbles ? 256 : 512) + byte];
              const int32_t u = nibbles ? (grp < 4 ? raw & 15 : raw >> 4) : raw;
              dot += u * qx[r * K + b * QK + k];
            }
            const float* x2 = xs + (r * B + b) * 2;
            const float* scb = sc + ((g * B + b) * 2) * LANES;
            acc += static_cast<float>(dot) * (scb[c] * x2[0]);
            acc += scb[LANES + c] * x2[1];
          }
          y[r * N + g * LANES + c] = acc;
        }
  });
}
}  // namespace

bool q8_native() { return kNative; }

std::string q8_path() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  return "avx512-vnni";
#elif defined(__AVX2__) && defined(__AVXVNNI__)
  return "avx-vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "portable";
#endif
}

std::tuple<at::Tensor, at::Tensor> quantize_q8(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x must be a contiguous float32 matrix");
  const int64_t M = x.size(0), K = x.size(1), B = K / QK;
  TORCH_CHECK(K % QK == 0, "x's width must be whole 32-value blocks");
  at::Tensor qx = at::empty({M, K}, x.options().dtype(at::kChar));
  at::Tensor xs = at::empty({M, B, 2}, x.options());
  const float* xp = x.data_ptr<float>();
  int8_t* qp = qx.data_ptr<int8_t>();
  float* sp = xs.data_ptr<float>();
  at::parallel_for(0, M * B, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) quantize_block(xp + i * QK, qp + i * QK, sp + i * 2);
  });
  return {qx, xs};
}

at::Tensor q8_mm(const at::Tensor& qx, const at::Tensor& xs, const at::Tensor& w,
                    const at::Tensor& sc, bool nibbles, bool portable) {
  TORCH_CHECK(qx.dim() == 2 && qx.scalar_type() == at::kChar && qx.is_contiguous());
  const int64_t M = qx.size(0), K = qx.size(1), B = K / QK;
  TORCH_CHECK(xs.is_contiguous() && xs.size(0) == M && xs.size(1) == B && xs.size(2) == 2);
  TORCH_CHECK(w.scalar_type() == at::kByte && w.is_contiguous() && w.dim() == 3 &&
              w.size(1) == B && w.size(2) == (nibbles ? 256 : 512), "weights do not match x");
  const int64_t N = w.size(0) * LANES;
  TORCH_CHECK(sc.is_contiguous() && sc.numel() == (N / LANES) * B * 2 * LANES);
  at::Tensor y = at::empty({M, N}, xs.options());
  const int8_t* qp = qx.data_ptr<int8_t>();
  const float* xsp = xs.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  const float* scp = sc.data_ptr<float>();
  float* yp = y.data_ptr<float>();
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  if (portable) {
    gemm_portable(qp, xsp, M, K, N, wp, scp, nibbles, yp);
  } else if (nibbles) {
    gemm(qp, xsp, M, K, N, Nibbles{wp, B}, scp, yp);
  } else {
    gemm(qp, xsp, M, K, N, Bytes{wp, B}, scp, yp);
  }
#elif defined(__AVX2__)
  if (portable) {
    gemm_portable(qp, xsp, M, K, N, wp, scp, nibbles, yp);
  } else if (nibbles) {
    gemm<true>(qp, xsp, M, K, N, wp, scp, yp);
  } else {
    gemm<false>(qp, xsp, M, K, N, wp, scp, yp);
  }
#else
  (void)portable;
  gemm_portable(qp, xsp, M, K, N, wp, scp, nibbles, yp);
#endif
  return y;
}

}  // namespace trtllm_gateway
