// A prompt's routing as one native call (focus.attention.routing.route_natively): the top-k groups of every token's
// vector in every head, as the eager routing finds them (rotary undone, cosine to each centroid over the temperature,
// plus the balance bias, top-k; log-softmax keeps the order, so it is left out).
//
// The eager form is some ten tensor ops over (B, H, L, D) float32 copies (undo the rotary embedding, normalise, a
// product with the centroids, log-softmax, a top-k that is slow for 16 groups): about 10 ms of a 2K-token SmolLM2
// layer's query and key routing on 2 cores, where the prefill's attention itself takes 40. Here each vector is read
// once, turned, normalised and scored in registers.

#include "native_aten.h"

#include "native_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace {

constexpr int64_t GROUP_BLOCK = 16;  // groups scored together: two AVX2 registers of float32 sums

// Everything a token's routing reads; `route` writes its top-k groups in every routed head.
template <typename scalar_t>
struct Router {
  const scalar_t* data;
  int64_t s_b, s_h, s_l, heads, length, d, groups, share;
  int64_t padded;  // groups rounded up to GROUP_BLOCK
  // centroids_t: (H, D, padded), each head's unit centroids transposed, zero past the last group.
  const float *centroids_t, *bias, *cos, *sin;
  int64_t angle_batches;
  float temperature;
  int64_t top_k;

  // Locals and raw pointers throughout: stores through a float pointer could alias this struct's float member, and
  // the compiler then reloads it (and every member) in the inner loops.
  void route(int64_t token, float* x, float* logits, float* mean, int64_t* top, int64_t* chosen) const {
    const int64_t d = this->d, groups = this->groups, heads = this->heads, share = this->share;
    const int64_t b = token / length, l = token % length, routed = heads / share;
    const float* cos_row = cos ? cos + ((angle_batches > 1 ? b : 0) * length + l) * (d / 2) : nullptr;
    const float* sin_row = sin ? sin + ((angle_batches > 1 ? b : 0) * length + l) * (d / 2) : nullptr;
    const float inverse_temperature = 1.0f / temperature;
    for (int64_t h = 0; h < heads; ++h) {
      const scalar_t* v = data + b * s_b + h * s_h + l * s_l;
      for (int64_t m = 0; m < d; ++m) x[m] = static_cast<float>(v[m]);
      if (cos_row) {  // routing.undo_rotary: each pair (x_m, x_{m + D/2}) turned back by its angle
        const int64_t half = d / 2;
#pragma omp simd
        for (int64_t m = 0; m < half; ++m) {
          const float first = x[m], second = x[m + half];
          x[m] = first * cos_row[m] + second * sin_row[m];
          x[m + half] = second * cos_row[m] - first * sin_row[m];
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
      const float* panel = centroids_t + h * d * padded;
      for (int64_t g0 = 0; g0 < groups; g0 += GROUP_BLOCK, panel += GROUP_BLOCK) {
        // Four sets of sums over every fourth dimension: four chains of multiply-adds in flight, not one.
        float sums[4][GROUP_BLOCK] = {};
        int64_t m = 0;
        for (; m + 4 <= d; m += 4) {
          for (int64_t c = 0; c < 4; ++c) {
            const float x_m = x[m + c];
            const float* column = panel + (m + c) * padded;
#pragma omp simd
            for (int64_t u = 0; u < GROUP_BLOCK; ++u) sums[c][u] += x_m * column[u];
          }
        }
        for (; m < d; ++m) {
#pragma omp simd
          for (int64_t u = 0; u < GROUP_BLOCK; ++u) sums[0][u] += x[m] * panel[m * padded + u];
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
      focus_native::top_groups(mean, groups, top_k, top);
      std::copy(top, top + top_k, chosen + ((b * routed + j) * length + l) * top_k);
    }
  }
};

}  // namespace

// vectors (B, H, L, D) float32, bfloat16 or float16, unit along D; cos, sin (B or 1, L, D / 2) float32 (both or
// neither: the rotary angles to undo); unit (H, G, D) float32 contiguous, unit centroids of each head; bias (H / share,
// G) float32 or none; share: heads whose logits are averaged into one routing (the query heads of a key/value head
// under route_queries="kv_head"; 1: none). Returns (B, H / share, L, top_k) int64, best first, ties to the lower id.
at::Tensor route_tokens(const at::Tensor& vectors, const c10::optional<at::Tensor>& cos,
                        const c10::optional<at::Tensor>& sin, const at::Tensor& unit,
                        const c10::optional<at::Tensor>& bias, double temperature, int64_t top_k, int64_t share) {
  TORCH_CHECK(vectors.dim() == 4 && vectors.stride(3) == 1, "route_tokens: vectors (B, H, L, D), unit stride along D");
  const int64_t b_size = vectors.size(0), heads = vectors.size(1), length = vectors.size(2), d = vectors.size(3);
  TORCH_CHECK(unit.scalar_type() == at::kFloat && unit.is_contiguous() && unit.dim() == 3 && unit.size(0) == heads &&
                  unit.size(2) == d,
              "route_tokens: float32 contiguous unit centroids (H, G, D)");
  const int64_t groups = unit.size(1);
  TORCH_CHECK(share >= 1 && heads % share == 0 && top_k >= 1 && top_k <= groups && top_k <= focus_native::MAX_TOP_K,
              "route_tokens: share divides H, top-k from 1 to the groups, at most ", focus_native::MAX_TOP_K);
  TORCH_CHECK(!cos == !sin && (!cos || (cos->scalar_type() == at::kFloat && sin->scalar_type() == at::kFloat &&
                                        cos->is_contiguous() && sin->is_contiguous() && cos->dim() == 3 &&
                                        cos->size(1) == length && cos->size(2) * 2 == d &&
                                        cos->sizes() == sin->sizes())),
              "route_tokens: float32 contiguous cos and sin (B or 1, L, D / 2)");
  TORCH_CHECK(!bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                        bias->numel() == heads / share * groups),
              "route_tokens: float32 contiguous bias (H / share, G)");
  const int64_t routed = heads / share;
  auto out = at::empty({b_size, routed, length, top_k}, vectors.options().dtype(at::kLong));
  int64_t* chosen = out.data_ptr<int64_t>();
  const int64_t padded = (groups + GROUP_BLOCK - 1) / GROUP_BLOCK * GROUP_BLOCK;
  at::Tensor unit_t = at::zeros({heads, d, padded}, unit.options());  // (H, D, G_pad)
  unit_t.narrow(2, 0, groups).copy_(unit.transpose(1, 2));
  const float* centroids = unit_t.data_ptr<float>();
  const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
  const float* cos_data = cos ? cos->data_ptr<float>() : nullptr;
  const float* sin_data = sin ? sin->data_ptr<float>() : nullptr;
  const int64_t angle_batches = cos ? cos->size(0) : 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, vectors.scalar_type(), "route_tokens", [&] {
    const Router<scalar_t> router{vectors.data_ptr<scalar_t>(), vectors.stride(0), vectors.stride(1),
                                  vectors.stride(2), heads, length, d, groups, share, padded, centroids, bias_data,
                                  cos_data, sin_data, angle_batches, static_cast<float>(temperature), top_k};
    at::parallel_for(0, b_size * length, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> x(d), logits(heads * groups), mean(groups);
      std::vector<int64_t> top(top_k);
      for (int64_t token = begin; token < end; ++token)
        router.route(token, x.data(), logits.data(), mean.data(), top.data(), chosen);
    });
  });
  return out;
}
