// The vector layer every CPU kernel is written in: `vf`, W floats of the widest vector this build
// targets (AVX-512: W = 16, one zmm; AVX2 + FMA: W = 8, one ymm; otherwise GCC's generic 16-float
// vectors, which it lowers to SSE2 on a plain x86-64 and to NEON on arm64).
//
// The kernels compute in logical 16-float vectors held as H = 16 / W native ones, and every
// helper here that their results depend on (FMA, the horizontal sum, the 16-way transpose sum,
// exp) does the same float operations in the same order at either width. So an AVX2 build and an
// AVX-512 build compute the same bits, and the vector width is the only difference; the portable
// build rounds each multiply and add separately (no FMA there) and uses std::exp.
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>

namespace trtllm_gateway {

// Which path this build compiled (kernel_isa() reports it to Python, build.py names variants).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#define GW_AVX512 1
constexpr int W = 16;
using vf = __m512;
using vi = __m512i;
#elif defined(__AVX2__) && defined(__FMA__)
#define GW_AVX2 1
constexpr int W = 8;
using vf = __m256;
using vi = __m256i;
#else
#define GW_PORTABLE 1
constexpr int W = 16;
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
#endif
constexpr int H = 16 / W;  // native vectors per logical 16-float vector

#if defined(GW_AVX512)
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vset(float x) { return _mm512_set1_ps(x); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }    // a * b + c
inline vf vfnma(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a * b
inline vf vround(vf x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}
inline vf vcvt(vi v) { return _mm512_cvtepi32_ps(v); }
inline vi vcvt_int(vf v) { return _mm512_cvtps_epi32(v); }  // rounds to nearest even
inline vi vu8(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)p)); }
inline vi vs8(const int8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)); }
inline vi vand(vi a, int m) { return _mm512_and_si512(a, _mm512_set1_epi32(m)); }
inline vi vshr(vi a, int n) { return _mm512_srli_epi32(a, n); }
inline vf vpow2(vf n) {  // 2^n for whole n in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
inline float vmax_all(vf v) { return _mm512_reduce_max_ps(v); }
// Lanes n.. of v replaced by fill (n in 0..W).
inline vf vtail(vf v, int64_t n, vf fill) {
  return _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1), fill, v);
}
#elif defined(GW_AVX2)
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vset(float x) { return _mm256_set1_ps(x); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vfnma(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline vf vround(vf x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf vcvt(vi v) { return _mm256_cvtepi32_ps(v); }
inline vi vcvt_int(vf v) { return _mm256_cvtps_epi32(v); }
inline vi vu8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
inline vi vs8(const int8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
inline vi vand(vi a, int m) { return _mm256_and_si256(a, _mm256_set1_epi32(m)); }
inline vi vshr(vi a, int n) { return _mm256_srli_epi32(a, n); }
inline vf vpow2(vf n) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline float vmax_all(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return std::fmax(_mm_cvtss_f32(m), _mm_cvtss_f32(_mm_movehdup_ps(m)));
}
inline vf vtail(vf v, int64_t n, vf fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
  return _mm256_blendv_ps(fill, v, _mm256_castsi256_ps(keep));
}
#else
inline vf vload(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, vf v) { std::memcpy(p, &v, sizeof v); }
inline vf vset(float x) { return vf{} + x; }
inline vf vadd(vf a, vf b) { return a + b; }
inline vf vsub(vf a, vf b) { return a - b; }
inline vf vmul(vf a, vf b) { return a * b; }
inline vf vdiv(vf a, vf b) { return a / b; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
inline vf vfnma(vf a, vf b, vf c) { return c - a * b; }
inline vf vround(vf x) {
  for (int i = 0; i < W; ++i) x[i] = std::nearbyint(x[i]);
  return x;
}
inline vf vcvt(vi v) { return __builtin_convertvector(v, vf); }
inline vi vcvt_int(vf v) { return __builtin_convertvector(v, vi); }  // truncates: whole x only
inline vi vu8(const uint8_t* p) {
  vi v;
  for (int i = 0; i < W; ++i) v[i] = p[i];
  return v;
}
inline vi vs8(const int8_t* p) {
  vi v;
  for (int i = 0; i < W; ++i) v[i] = p[i];
  return v;
}
inline vi vand(vi a, int m) { return a & m; }
inline vi vshr(vi a, int n) { return a >> n; }
inline float vmax_all(vf v) {
  float m = v[0];
  for (int i = 1; i < W; ++i) m = std::fmax(m, v[i]);
  return m;
}
inline vf vtail(vf v, int64_t n, vf fill) {
  for (int64_t i = n; i < W; ++i) v[i] = fill[i];
  return v;
}
#endif

// v as it is, held in a register: GCC otherwise folds a load used by several FMAs into each of
// them (a reload per use) when registers are short. AVX2 only, where the tiles need all 16.
inline vf in_register(vf v) {
#if defined(GW_AVX2)
  asm("" : "+x"(v));
#endif
  return v;
}
inline vf vzero() { return vset(0.f); }

// The sum of a logical 16-float vector's lanes, as _mm512_reduce_add_ps adds them: lanes i and
// i + 8, then i and i + 4, then i and i + 2, then the last two.
inline float hsum16(const vf* v) {
#if defined(GW_PORTABLE)
  float s8[8], s4[4];
  for (int i = 0; i < 8; ++i) s8[i] = v[0][i] + v[0][i + 8];
  for (int i = 0; i < 4; ++i) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
#else
#if defined(GW_AVX512)
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v[0]),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v[0]), 1)));
#else
  const __m256 s8 = _mm256_add_ps(v[0], v[1]);
#endif
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
#endif
}

// exp(x): x = n ln2 + r with |r| <= ln2 / 2, Cephes' expf polynomial for e^r, times 2^n (within
// 2 ulp of expf; x is clamped to [-87, 88.376], so 0 below and 2.4e38 above).
inline vf vexp(vf x) {
  x = vmin(vmax(x, vset(-87.f)), vset(88.3762626647949f));
#if defined(GW_PORTABLE)
  for (int i = 0; i < W; ++i) x[i] = std::exp(x[i]);
  return x;
#else
  const vf n = vround(vmul(x, vset(1.44269504088896341f)));
  vf r = vfnma(n, vset(0.693359375f), x);
  r = vfnma(n, vset(-2.12194440e-4f), r);
  vf e = vset(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                        5.0000001201e-1f})
    e = vfma(e, r, vset(c));
  e = vfma(e, vmul(r, r), vadd(r, vset(1.f)));
  return vmul(e, vpow2(n));
#endif
}

// 16 logical vectors v[i] (H native vectors each, v[i * H + h]) -> out (H native vectors) whose
// logical lane i is the sum of v[i]'s 16 lanes, by the adds of a 4-level transpose tree (instead
// of 16 horizontal sums). AVX2 mirrors AVX-512's unpacks and 128-bit lane shuffles half by half.
inline void transpose_sum16(const vf* v, vf* out) {
#if defined(GW_PORTABLE)
  for (int i = 0; i < 16; ++i) out[0][i] = hsum16(v + i);
#else
  vf w[8 * H], x[4 * H];
  for (int i = 0; i < 8; ++i)
    for (int h = 0; h < H; ++h) {
      const vf a = v[2 * i * H + h], b = v[(2 * i + 1) * H + h];
#if defined(GW_AVX512)
      w[i * H + h] = vadd(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
#else
      w[i * H + h] = vadd(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
#endif
    }
  for (int j = 0; j < 4; ++j)
    for (int h = 0; h < H; ++h) {
      const vf a = w[2 * j * H + h], b = w[(2 * j + 1) * H + h];
#if defined(GW_AVX512)
      const __m512d ad = _mm512_castps_pd(a), bd = _mm512_castps_pd(b);
      x[j * H + h] = vadd(_mm512_castpd_ps(_mm512_unpacklo_pd(ad, bd)),
                          _mm512_castpd_ps(_mm512_unpackhi_pd(ad, bd)));
#else
      const __m256d ad = _mm256_castps_pd(a), bd = _mm256_castps_pd(b);
      x[j * H + h] = vadd(_mm256_castpd_ps(_mm256_unpacklo_pd(ad, bd)),
                          _mm256_castpd_ps(_mm256_unpackhi_pd(ad, bd)));
#endif
    }
  // Two levels of 128-bit lane pairs: AVX-512 shuffles lanes (0, 2) against (1, 3) of two
  // registers; AVX2 holds those four lanes as two ymm halves and permutes them the same way.
  vf z[2 * H];
#if defined(GW_AVX512)
  for (int k = 0; k < 2; ++k)
    z[k] = vadd(_mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0x88),
                _mm512_shuffle_f32x4(x[2 * k], x[2 * k + 1], 0xDD));
  out[0] = vadd(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xDD));
#else
  auto pairs = [](vf lo, vf hi) {  // [lo.l0 + lo.l1, hi.l0 + hi.l1] of the lanes (0,2) (1,3)
    return vadd(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
  };
  for (int k = 0; k < 2; ++k) {
    z[2 * k] = pairs(x[4 * k], x[4 * k + 1]);
    z[2 * k + 1] = pairs(x[4 * k + 2], x[4 * k + 3]);
  }
  out[0] = pairs(z[0], z[1]);
  out[1] = pairs(z[2], z[3]);
#endif
#endif
}

}  // namespace trtllm_gateway
