// Decode attention over the paged cache, read in place: q [B, Hq, D]; caches [slots, Hk, D] with
// slot = block * block_size + offset; tables [B, nb] int64 block ids; lens [B] int32 context
// lengths (the new token included). Per (row, KV head): scores, softmax, weighted sum of V, in
// float32, for the Hq / Hk query heads that share the KV head. D must be a multiple of 16.
//
// With AVX-512 (D of 64 or 128): scores 16 tokens at a time (16 partial dot products reduced
// into one register by a transpose tree instead of 16 horizontal sums), a vector exp, and cache
// rows prefetched a few tokens ahead; a decode step reads the whole cache from DRAM, and without
// the prefetch the kernel waited on it (39 -> 15 ms for 32 rows x ~160 tokens x 30 layers of
// SmolLM2, docs/benchmarks.md). Elsewhere a plain loop with the same arithmetic up to rounding.
#include "decode_attention.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "simd.h"

namespace trtllm_gateway {
namespace {

struct Problem {
  const float* q;   // the G query heads of this KV head, [G, D]
  const float* k;   // cache base + head offset; a token's row at k + offsets[t]
  const float* v;
  const int64_t* offsets;
  int64_t len, G;
  float scale;
  float* out;  // [G, D]
};

// Element offsets of a row's tokens in the cache (head 0), from its block table.
void token_offsets(const int64_t* table, int64_t len, int64_t block_size, int64_t row_elems,
                   std::vector<int64_t>& offsets) {
  offsets.resize(len);
  for (int64_t t = 0, blk = 0; t < len; ++blk)
    for (int64_t o = 0; o < block_size && t < len; ++o, ++t)
      offsets[t] = (table[blk] * block_size + o) * row_elems;
}

void portable(const Problem& p, int64_t D, std::vector<float>& scores) {
  const int64_t nv = D / 16;
  scores.assign(p.G * p.len, 0.f);
  std::vector<f32x16> acc(p.G * nv, f32x16{});
  for (int64_t t = 0; t < p.len; ++t)
    for (int64_t g = 0; g < p.G; ++g) {
      f32x16 dot{};
      for (int64_t j = 0; j < nv; ++j)
        dot += load16(p.q + g * D + j * 16) * load16(p.k + p.offsets[t] + j * 16);
      scores[g * p.len + t] = hsum(dot) * p.scale;
    }
  for (int64_t g = 0; g < p.G; ++g) {
    float* s = scores.data() + g * p.len;
    const float mx = *std::max_element(s, s + p.len);
    float sum = 0.f;
    for (int64_t t = 0; t < p.len; ++t) sum += (s[t] = std::exp(s[t] - mx));
    for (int64_t t = 0; t < p.len; ++t) s[t] /= sum;
  }
  for (int64_t t = 0; t < p.len; ++t)
    for (int64_t g = 0; g < p.G; ++g)
      for (int64_t j = 0; j < nv; ++j)
        acc[g * nv + j] += scores[g * p.len + t] * load16(p.v + p.offsets[t] + j * 16);
  for (int64_t g = 0; g < p.G; ++g)
    std::memcpy(p.out + g * D, acc.data() + g * nv, D * sizeof(float));
}

#if defined(__AVX512F__)
constexpr int64_t AHEAD = 8;  // tokens of prefetch distance (4 and 16 measured slower)

// Lane i of the result is the sum of v[i]'s 16 lanes.
inline __m512 sum16(const __m512* v) {
  __m512 w[8], x[4];
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int j = 0; j < 4; ++j) {
    const __m512d a = _mm512_castps_pd(w[2 * j]), b = _mm512_castps_pd(w[2 * j + 1]);
    x[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88),
                                  _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88),
                                  _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

inline void prefetch_row(const float* base, const int64_t* offsets, int64_t t, int64_t len,
                         int64_t D) {
  if (t >= len) return;
  const char* row = reinterpret_cast<const char*>(base + offsets[t]);
  for (int64_t j = 0; j < D * 4; j += 64) _mm_prefetch(row + j, _MM_HINT_T0);
}

template <int NV>
void vectorized(const Problem& p, std::vector<float>& scores) {
  constexpr int64_t D = NV * 16;
  const int64_t padded = (p.len + 15) / 16 * 16;
  scores.resize(p.G * padded);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < p.G; ++g) {  // scores, then softmax, one query head at a time
    __m512 q[NV];
    for (int j = 0; j < NV; ++j) q[j] = _mm512_loadu_ps(p.q + g * D + j * 16);
    float* s = scores.data() + g * padded;
    __m512 mx = ninf;
    for (int64_t t0 = 0; t0 < p.len; t0 += 16) {
      const int64_t n = std::min<int64_t>(16, p.len - t0);
      __m512 part[16];
      for (int64_t i = 0; i < 16; ++i) {
        part[i] = _mm512_setzero_ps();
        if (i >= n) continue;
        if (g == 0) prefetch_row(p.k, p.offsets, t0 + i + AHEAD, p.len, D);
        const float* k = p.k + p.offsets[t0 + i];
        for (int j = 0; j < NV; ++j)
          part[i] = _mm512_fmadd_ps(q[j], _mm512_loadu_ps(k + j * 16), part[i]);
      }
      __m512 v = _mm512_mul_ps(sum16(part), _mm512_set1_ps(p.scale));
      v = _mm512_mask_blend_ps(static_cast<__mmask16>((1u << n) - 1), ninf, v);
      mx = _mm512_max_ps(mx, v);
      _mm512_storeu_ps(s + t0, v);
    }
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t t0 = 0; t0 < padded; t0 += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + t0), m));  // padding: ~1e-38
      _mm512_storeu_ps(s + t0, e);
      sum = _mm512_add_ps(sum, e);
    }
    const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
    for (int64_t t0 = 0; t0 < padded; t0 += 16)
      _mm512_storeu_ps(s + t0, _mm512_div_ps(_mm512_loadu_ps(s + t0), total));
  }
  for (int64_t g0 = 0; g0 < p.G; g0 += 4) {  // V rows read once for up to 4 query heads
    const int64_t gn = std::min<int64_t>(4, p.G - g0);
    __m512 acc[4][NV];
    for (auto& a : acc)
      for (auto& r : a) r = _mm512_setzero_ps();
    for (int64_t t = 0; t < p.len; ++t) {
      if (g0 == 0) prefetch_row(p.v, p.offsets, t + AHEAD, p.len, D);
      const float* v = p.v + p.offsets[t];
      __m512 row[NV];
      for (int j = 0; j < NV; ++j) row[j] = _mm512_loadu_ps(v + j * 16);
      for (int g = 0; g < 4; ++g) {
        if (g >= gn) break;
        const __m512 w = _mm512_set1_ps(scores[(g0 + g) * padded + t]);
        for (int j = 0; j < NV; ++j) acc[g][j] = _mm512_fmadd_ps(w, row[j], acc[g][j]);
      }
    }
    for (int64_t g = 0; g < gn; ++g)
      for (int j = 0; j < NV; ++j) _mm512_storeu_ps(p.out + (g0 + g) * D + j * 16, acc[g][j]);
  }
}
#endif

void attend(const Problem& p, int64_t D, std::vector<float>& scores) {
#if defined(__AVX512F__)
  if (D == 64) return vectorized<4>(p, scores);
  if (D == 128) return vectorized<8>(p, scores);
#endif
  portable(p, D, scores);
}
}  // namespace

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
  // Consecutive KV heads of a row go to one thread, so its later heads find the row's blocks
  // in L2 (the cache interleaves heads).
  at::parallel_for(0, B * Hk, 1, [&](int64_t i0, int64_t i1) {
    std::vector<float> scores;
    std::vector<int64_t> offsets;
    int64_t row = -1;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = i / Hk, h = i % Hk, len = lp[b];
      TORCH_CHECK(len >= 1 && (len + block_size - 1) / block_size <= nb, "bad context length");
      if (row != b) token_offsets(tp + b * nb, len, block_size, Hk * D, offsets);
      row = b;
      const Problem p{qp + (b * Hq + h * G) * D, kp + h * D, vp + h * D, offsets.data(), len, G,
                      static_cast<float>(scale), op + (b * Hq + h * G) * D};
      attend(p, D, scores);
    }
  });
  return out;
}

}  // namespace trtllm_gateway
