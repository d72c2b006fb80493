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

}  // namespace trtllm_gateway
