// Focus's routing in C++, written once for the decoding step (step.cpp) and the prompt (route.cpp): a token's top-k
// groups in every routed head, as the eager routing finds them (focus.attention.routers.routing: rotary undone, cosine to each
// centroid over the temperature, the mean over the heads that share a routing, plus the balance bias, top-k;
// log-softmax keeps the order, so it is left out).
#pragma once

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace focus_native {

constexpr int64_t MAX_TOP_K = 64;  // (callers check it)
constexpr int64_t GROUP_BLOCK = 16;  // groups scored together: two AVX2 registers of float32 sums

// The top_k largest of row[0..n), best first, into out; ties go to the lower index (as torch.topk's CPU kernel keeps
// them). One pass, each value inserted below the kept ones it does not exceed: after the first few, a value is mostly
// compared with the k-th alone (a predictable branch, where a pass per rank compared each value with the best
// unpredictably).
inline void top_groups(const float* row, int64_t n, int64_t top_k, int64_t* out) {
  float kept[MAX_TOP_K];
  int64_t filled = 0;
  for (int64_t g = 0; g < n; ++g) {
    const float value = row[g];
    if (filled == top_k && !(value > kept[top_k - 1])) continue;
    int64_t at = filled < top_k ? filled++ : top_k - 1;
    for (; at > 0 && value > kept[at - 1]; --at) {  // strictly greater: an equal, earlier value stays ahead
      kept[at] = kept[at - 1];
      out[at] = out[at - 1];
    }
    kept[at] = value;
    out[at] = g;
  }
}

// unit (H, G, D) float32 contiguous, each head's unit centroids -> (H, D, G_pad) float32: transposed, padded with zeros
// to whole GROUP_BLOCKs, the layout the router scores in. Made once per set of centroids (the step's caller keeps it).
inline at::Tensor router_panel(const at::Tensor& unit) {
  TORCH_CHECK(unit.scalar_type() == at::kFloat && unit.dim() == 3, "router_panel: float32 unit centroids (H, G, D)");
  const int64_t groups = unit.size(1);
  const int64_t padded = (groups + GROUP_BLOCK - 1) / GROUP_BLOCK * GROUP_BLOCK;
  at::Tensor panel = at::zeros({unit.size(0), unit.size(2), padded}, unit.options());
  panel.narrow(2, 0, groups).copy_(unit.transpose(1, 2));
  return panel;
}

// One routing of a token: its vectors in `heads` heads, routed as heads / share (the query heads of a key/value head
// under route_queries="kv_head" share the mean of their logits; share 1: each head its own).
template <typename scalar_t>
struct Router {
  const float* panel;  // (heads, D, padded): router_panel of the heads' centroids
  const float* bias;   // (heads / share, G) float32 contiguous, or null: no balance bias
  int64_t heads, d, groups, padded, share, top_k;
  float temperature;

  // vectors: head h's vector at vectors + h * head_step; cos, sin: the D / 2 angles to undo, or null. Writes routed
  // head j's top-k groups, best first, at chosen + j * chosen_step. x (D), logits (heads * G), mean (G): scratch.
  // Locals and raw pointers throughout: stores through a float pointer could alias this struct's float member, and
  // the compiler then reloads it (and every member) in the inner loops.
  void route(const scalar_t* vectors, int64_t head_step, const float* cos, const float* sin, int64_t* chosen,
             int64_t chosen_step, float* x, float* logits, float* mean) const {
    const int64_t d = this->d, groups = this->groups, heads = this->heads, share = this->share;
    const int64_t padded = this->padded, routed = heads / share;
    const float inverse_temperature = 1.0f / temperature;
    for (int64_t h = 0; h < heads; ++h) {
      const scalar_t* v = vectors + h * head_step;
      for (int64_t m = 0; m < d; ++m) x[m] = static_cast<float>(v[m]);
      if (cos) {  // routing.undo_rotary: each pair (x_m, x_{m + D/2}) turned back by its angle
        const int64_t half = d / 2;
#pragma omp simd
        for (int64_t m = 0; m < half; ++m) {
          const float first = x[m], second = x[m + half];
          x[m] = first * cos[m] + second * sin[m];
          x[m + half] = second * cos[m] - first * sin[m];
        }
      }
      float norm = 0;
#pragma omp simd reduction(+ : norm)
      for (int64_t m = 0; m < d; ++m) norm += x[m] * x[m];
      const float scale = inverse_temperature / std::max(std::sqrt(norm), 1e-12f);
      // The products with every centroid at once, a dimension at a time, GROUP_BLOCK groups a pass: the centroids
      // come transposed and padded, (D, G_pad), so the sums are vectors held in registers (one reduction per centroid
      // cost more than its products; sums in memory, a store-to-load wait per dimension).
      float* row = logits + h * groups;
      const float* block = panel + h * d * padded;
      for (int64_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK, block += GROUP_BLOCK) {
        // Four sets of sums over every fourth dimension: four chains of multiply-adds in flight, not one.
        float sums[4][GROUP_BLOCK] = {};
        int64_t m = 0;
        for (; m + 4 <= d; m += 4) {
          for (int64_t c = 0; c < 4; ++c) {
            const float x_m = x[m + c];
            const float* column = block + (m + c) * padded;
#pragma omp simd
            for (int64_t u = 0; u < GROUP_BLOCK; ++u) sums[c][u] += x_m * column[u];
          }
        }
        for (; m < d; ++m) {
#pragma omp simd
          for (int64_t u = 0; u < GROUP_BLOCK; ++u) sums[0][u] += x[m] * block[m * padded + u];
        }
        for (int64_t u = 0; u < std::min(GROUP_BLOCK, groups - g0); ++u)
          row[g0 + u] = ((sums[0][u] + sums[1][u]) + (sums[2][u] + sums[3][u])) * scale;
      }
    }
    for (int64_t j = 0; j < routed; ++j) {
      for (int64_t g = 0; g < groups; ++g) {  // the mean of the shared heads' logits (one head: itself), plus the bias
        float sum = 0;
        for (int64_t i = 0; i < share; ++i) sum += logits[(j * share + i) * groups + g];
        mean[g] = (share > 1 ? sum / static_cast<float>(share) : sum) + (bias ? bias[j * groups + g] : 0.0f);
      }
      top_groups(mean, groups, top_k, chosen + j * chosen_step);
    }
  }
};

}  // namespace focus_native
