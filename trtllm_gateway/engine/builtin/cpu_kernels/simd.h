// SIMD helpers shared by the CPU kernels: 16-float vectors in GCC's vector extension (one
// AVX-512 register, two AVX2 ones) and byte -> float widening with x86 intrinsics.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace trtllm_gateway {

typedef float f32x16 __attribute__((vector_size(64)));

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float hsum(f32x16 v) {
#if defined(__AVX512F__)
  return _mm512_reduce_add_ps((__m512)v);
#else
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += v[i];
  return s;
#endif
}

// 16 bytes -> 16 floats, zero- or sign-extended (GCC's generic vector conversion is scalar here).
template <bool Signed>
inline f32x16 widen(__m128i b) {
#if defined(__AVX512F__)
  const __m512i i = Signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b);
  return (f32x16)_mm512_cvtepi32_ps(i);
#elif defined(__AVX2__)
  const __m128i h = _mm_srli_si128(b, 8);
  const __m256 lo = _mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b));
  const __m256 hi = _mm256_cvtepi32_ps(Signed ? _mm256_cvtepi8_epi32(h) : _mm256_cvtepu8_epi32(h));
  f32x16 v;
  std::memcpy(&v, &lo, 32);
  std::memcpy(reinterpret_cast<char*>(&v) + 32, &hi, 32);
  return v;
#else
  alignas(16) uint8_t t[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(t), b);
  f32x16 v;
  for (int i = 0; i < 16; ++i) v[i] = Signed ? float(int8_t(t[i])) : float(t[i]);
  return v;
#endif
}

#if defined(__AVX512F__)
// exp(x): x = n ln2 + r with |r| <= ln2 / 2, Cephes' expf polynomial for e^r, then scaled by
// 2^n (within 2 ulp of expf; 0 below -87, 3.3e38 above 88.7).
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 e = _mm512_set1_ps(1.9875691500e-4f);
  for (const float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f,
                        5.0000001201e-1f})
    e = _mm512_fmadd_ps(e, r, _mm512_set1_ps(c));
  e = _mm512_fmadd_ps(e, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(e, n);
}
#endif

}  // namespace trtllm_gateway
