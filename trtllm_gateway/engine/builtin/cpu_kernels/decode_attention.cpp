// Decode attention over the paged cache, read in place: q [B, Hq, D]; caches [slots, Hk, D] with
// slot = block * block_size + offset; tables [B, nb] int64 block ids; lens [B] int32 context
// lengths (the new token included). Per (row, KV head): scores, softmax, weighted sum of V, in
// float32, for the Hq / Hk query heads that share the KV head. D must be a multiple of 16.
//
// With AVX-512 or AVX2 (D of 64 or 128): scores 16 tokens at a time (16 partial dot products
// reduced into one logical vector by a transpose tree instead of 16 horizontal sums), a vector
// exp, and cache rows prefetched a few tokens ahead; a decode step reads the whole cache from
// DRAM, and without the prefetch the kernel waited on it (39 -> 15 ms for 32 rows x ~160 tokens x
// 30 layers of SmolLM2, docs/benchmarks.md). Both widths compute the same bits (simd.h). Other
// head sizes and the portable build: a plain loop with the same arithmetic up to rounding.
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
  std::vector<vf> acc(p.G * nv * H, vzero());
  for (int64_t t = 0; t < p.len; ++t)
    for (int64_t g = 0; g < p.G; ++g) {
      vf dot[H];
      for (auto& v : dot) v = vzero();
      for (int64_t j = 0; j < nv; ++j)
        for (int h = 0; h < H; ++h)
          dot[h] = vfma(vload(p.q + g * D + j * 16 + h * W),
                        vload(p.k + p.offsets[t] + j * 16 + h * W), dot[h]);
      scores[g * p.len + t] = hsum16(dot) * p.scale;
    }
  for (int64_t g = 0; g < p.G; ++g) {
    float* s = scores.data() + g * p.len;
    const float mx = *std::max_element(s, s + p.len);
    float sum = 0.f;
    for (int64_t t = 0; t < p.len; ++t) sum += (s[t] = std::exp(s[t] - mx));
    for (int64_t t = 0; t < p.len; ++t) s[t] /= sum;
  }
  for (int64_t t = 0; t < p.len; ++t)
    for (int64_t g = 0; g < p.G; ++g) {
      const vf w = vset(scores[g * p.len + t]);
      for (int64_t j = 0; j < nv * H; ++j)
        acc[g * nv * H + j] = vfma(w, vload(p.v + p.offsets[t] + j * W), acc[g * nv * H + j]);
    }
  for (int64_t g = 0; g < p.G; ++g)
    for (int64_t j = 0; j < nv * H; ++j) vstore(p.out + g * D + j * W, acc[g * nv * H + j]);
}

#if !defined(GW_PORTABLE)
constexpr int64_t AHEAD = 8;  // tokens of prefetch distance (4 and 16 measured slower)

inline void prefetch_row(const float* base, const int64_t* offsets, int64_t t, int64_t len,
                         int64_t D) {
  if (t >= len) return;
  const char* row = reinterpret_cast<const char*>(base + offsets[t]);
  for (int64_t j = 0; j < D * 4; j += 64) _mm_prefetch(row + j, _MM_HINT_T0);
}

// NV logical 16-float vectors a head (D = 16 NV), each H native vectors.
template <int NV>
void vectorized(const Problem& p, std::vector<float>& scores) {
  constexpr int64_t D = NV * 16;
  // Query heads that share a pass over V: their accumulators must fit the registers.
  constexpr int64_t GROUP = W == 16 ? 4 : (NV <= 4 ? 2 : 1);
  const int64_t padded = (p.len + 15) / 16 * 16;
  scores.resize(p.G * padded);
  const vf ninf = vset(-std::numeric_limits<float>::infinity());
  for (int64_t g = 0; g < p.G; ++g) {  // scores, then softmax, one query head at a time
    vf q[NV * H];
    for (int j = 0; j < NV * H; ++j) q[j] = vload(p.q + g * D + j * W);
    float* s = scores.data() + g * padded;
    vf mx = ninf;
    for (int64_t t0 = 0; t0 < p.len; t0 += 16) {
      const int64_t n = std::min<int64_t>(16, p.len - t0);
      vf part[16 * H];
      for (int64_t i = 0; i < 16; ++i) {
        for (int h = 0; h < H; ++h) part[i * H + h] = vzero();
        if (i >= n) continue;
        if (g == 0) prefetch_row(p.k, p.offsets, t0 + i + AHEAD, p.len, D);
        const float* k = p.k + p.offsets[t0 + i];
        for (int j = 0; j < NV; ++j)
          for (int h = 0; h < H; ++h)
            part[i * H + h] = vfma(q[j * H + h], vload(k + j * 16 + h * W), part[i * H + h]);
      }
      vf v[H];
      transpose_sum16(part, v);  // logical lane i: token t0 + i's score
      for (int h = 0; h < H; ++h) {
        const vf scaled = vtail(vmul(v[h], vset(p.scale)), std::clamp<int64_t>(n - h * W, 0, W),
                                ninf);
        mx = vmax(mx, scaled);
        vstore(s + t0 + h * W, scaled);
      }
    }
    const vf m = vset(vmax_all(mx));
    vf sum[H];
    for (auto& v : sum) v = vzero();
    for (int64_t t0 = 0; t0 < padded; t0 += 16)
      for (int h = 0; h < H; ++h) {
        const vf e = vexp(vsub(vload(s + t0 + h * W), m));  // padding: ~1e-38
        vstore(s + t0 + h * W, e);
        sum[h] = vadd(sum[h], e);
      }
    const vf total = vset(hsum16(sum));
    for (int64_t t = 0; t < padded; t += W) vstore(s + t, vdiv(vload(s + t), total));
  }
  for (int64_t g0 = 0; g0 < p.G; g0 += GROUP) {  // V rows read once for up to GROUP query heads
    const int64_t gn = std::min<int64_t>(GROUP, p.G - g0);
    vf acc[GROUP][NV * H];
    for (auto& a : acc)
      for (auto& r : a) r = vzero();
    for (int64_t t = 0; t < p.len; ++t) {
      if (g0 == 0) prefetch_row(p.v, p.offsets, t + AHEAD, p.len, D);
      const float* v = p.v + p.offsets[t];
      for (int g = 0; g < GROUP; ++g) {
        if (g >= gn) break;
        const vf w = vset(scores[(g0 + g) * padded + t]);
        for (int j = 0; j < NV * H; ++j) acc[g][j] = vfma(w, vload(v + j * W), acc[g][j]);
      }
    }
    for (int64_t g = 0; g < gn; ++g)
      for (int j = 0; j < NV * H; ++j) vstore(p.out + (g0 + g) * D + j * W, acc[g][j]);
  }
}
#endif

void attend(const Problem& p, int64_t D, std::vector<float>& scores) {
#if !defined(GW_PORTABLE)
  if (D == 64) return vectorized<4>(p, scores);
  if (D == 128) return vectorized<8>(p, scores);
#endif
  portable(p, D, scores);
}
}  // namespace

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                               const at::Tensor& v_cache, const at::Tensor& tables,
                               const at::Tensor& lens, int64_t block_size, double scale) {
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.is_contiguous());
  TORCH_CHECK(k_cache.scalar_type() == at::kFloat && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.sizes() == v_cache.sizes());
  TORCH_CHECK(tables.scalar_type() == at::kLong && tables.is_contiguous());
  TORCH_CHECK(lens.scalar_type() == at::kInt && lens.numel() == q.size(0));
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2), Hk = k_cache.size(1);
  const int64_t nb = tables.size(1), G = Hq / Hk;
  TORCH_CHECK(D % 16 == 0 && Hq % Hk == 0 && k_cache.size(2) == D);
  at::Tensor out = at::empty_like(q);
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
