// Attention over a list of kept keys read in place, shared by the decoding steps (step.cpp: the keys a group mask
// keeps; indexer_step.cpp: the keys an indexer selects): the R query heads of a key/value head weigh the list
// together, block by block, with an online softmax in float32; a list cut into parts over the cores is merged at
// the parts' common maximum (`merge_parts_of_head`).
#pragma once

#include "online_softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace focus_native {

constexpr int64_t KEPT_BLOCK = 64;  // kept keys scored, weighed and summed together
constexpr int64_t AHEAD = 8;  // kept rows are fetched this many rows ahead: scattered rows defeat the hardware's
                              // prefetcher, which follows runs

// Ask for a row of `d` elements to be brought to the cache, one request per cache line.
template <typename scalar_t>
inline void prefetch_row(const scalar_t* row, int64_t d) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t offset = 0; offset < d * static_cast<int64_t>(sizeof(scalar_t)); offset += 64)
    __builtin_prefetch(bytes + offset);
}

// The keys kept[0..n) for the R query heads q (R, d), scaled, a head i weighing key t where bit i of kept_by[t] is
// set: block by block, scores of every head, one rescale per head and block, the weights by a vectorised exp, the
// weighted values summed in registers when the head size is `D` (0: any, from `d`). best, total (R) and acc (R, d)
// carry each head's running maximum, sum of weights and weighted values (start at -inf, 0, 0); scores: R *
// KEPT_BLOCK floats of scratch. PREFETCH: ask for the rows ahead (a selection's scattered rows: ~10% at 8K; the group
// step's denser runs were 3-6% slower with it, one build against the other, so it does not).
template <typename scalar_t, int64_t D, bool PREFETCH>
void attend_rows(const float* q, int64_t r, int64_t d_runtime, const scalar_t* keys, const scalar_t* values,
                 int64_t key_step, int64_t value_step, const int64_t* kept, const int64_t* kept_by, int64_t n,
                 float* best, float* total, float* acc, float* scores) {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const int64_t d = D > 0 ? D : d_runtime;
  for (int64_t block = 0; block < n; block += KEPT_BLOCK) {
    const int64_t width = std::min(KEPT_BLOCK, n - block);
    for (int64_t t = 0; t < width; ++t) {  // scores (R, width): a key row is read once for the R heads
      const scalar_t* key_row = keys + kept[block + t] * key_step;
      if (PREFETCH) {
        if (block + t + AHEAD < n) prefetch_row(keys + kept[block + t + AHEAD] * key_step, d_runtime);
        prefetch_row(values + kept[block + t] * value_step, d_runtime);  // in cache when the block's values are summed
      }
      for (int64_t i = 0; i < r; ++i) {
        float score = none;
        if (kept_by[block + t] >> i & 1) {
          const float* q_i = q + i * d;
          score = 0;
#pragma omp simd reduction(+ : score)
          for (int64_t m = 0; m < d; ++m) score += q_i[m] * static_cast<float>(key_row[m]);
        }
        scores[i * KEPT_BLOCK + t] = score;
      }
    }
    for (int64_t i = 0; i < r; ++i) {
      float* s = scores + i * KEPT_BLOCK;
      float top = best[i];
      for (int64_t t = 0; t < width; ++t) top = std::max(top, s[t]);
      if (top == none) continue;  // this head keeps none of the block's keys, nor kept any before
      float* acc_i = acc + i * d;
      if (top > best[i]) raise_maximum(top, best[i], total[i], acc_i, d);
      float weights = 0.0f;
#pragma omp simd reduction(+ : weights)
      for (int64_t t = 0; t < width; ++t) {
        const float shifted = s[t] - top;
        const float weight = exp_nonpositive(shifted < 0.0f ? shifted : 0.0f);
        s[t] = s[t] == none ? 0.0f : weight;
        weights += s[t];
      }
      total[i] += weights;
      float sum[D > 0 ? D : 1];
      float* into = D > 0 ? sum : acc_i;  // any head size: summed in place
      if (D > 0) std::copy(acc_i, acc_i + d, sum);
      for (int64_t t = 0; t < width; ++t) {
        if (!(kept_by[block + t] >> i & 1)) continue;
        const float w = s[t];
        const scalar_t* value_row = values + kept[block + t] * value_step;
#pragma omp simd
        for (int64_t m = 0; m < d; ++m) into[m] += w * static_cast<float>(value_row[m]);
      }
      if (D > 0) std::copy(sum, sum + d, acc_i);
    }
  }
}

// One head's output from its `parts` partial softmaxes (part c: best[c * stride], total[c * stride], acc[c * stride *
// d ..+d]), merged at their common maximum into out (d); a head that kept no key gets zeros.
template <typename scalar_t>
void merge_parts_of_head(const float* best, const float* total, const float* acc, int64_t parts, int64_t stride,
                         int64_t d, float* merged, scalar_t* out) {
  float top = -std::numeric_limits<float>::infinity(), sum = 0;
  for (int64_t c = 0; c < parts; ++c) top = std::max(top, best[c * stride]);
  std::fill(merged, merged + d, 0.0f);
  for (int64_t c = 0; c < parts; ++c) {
    const float part = best[c * stride];
    if (part == -std::numeric_limits<float>::infinity()) continue;  // nothing kept in this part
    const float shrink = std::exp(part - top);
    sum += total[c * stride] * shrink;
    const float* acc_c = acc + c * stride * d;
    for (int64_t m = 0; m < d; ++m) merged[m] += acc_c[m] * shrink;
  }
  for (int64_t m = 0; m < d; ++m) out[m] = static_cast<scalar_t>(sum > 0 ? merged[m] / sum : 0.0f);
}

}  // namespace focus_native
