// A prompt's routing as one native call (focus.attention.routers.routing.route_prompt_natively): the top-k groups of every
// token's vector in every head, by the router the decoding step uses too (router.h). Each vector is read once,
// turned, normalised and scored in registers, where the eager form is some ten tensor ops over (B, H, L, D) float32
// copies (undo the rotary embedding, normalise, a product with the centroids, log-softmax, a top-k that is slow for
// 16 groups).

#include "kernels.h"

#include "router.h"

#include <cstdint>
#include <vector>

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
  const at::Tensor panel = focus_native::router_panel(unit);  // (H, D, G_pad)
  const float* bias_data = bias ? bias->data_ptr<float>() : nullptr;
  const float* cos_data = cos ? cos->data_ptr<float>() : nullptr;
  const float* sin_data = sin ? sin->data_ptr<float>() : nullptr;
  const int64_t angle_batches = cos ? cos->size(0) : 1, half = d / 2;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, vectors.scalar_type(), "route_tokens", [&] {
    const focus_native::Router<scalar_t> router{panel.data_ptr<float>(), bias_data, heads, d, groups, panel.size(2),
                                                share, top_k, static_cast<float>(temperature)};
    const scalar_t* data = vectors.data_ptr<scalar_t>();
    const int64_t s_b = vectors.stride(0), s_h = vectors.stride(1), s_l = vectors.stride(2);
    at::parallel_for(0, b_size * length, 64, [&](int64_t begin, int64_t end) {
      std::vector<float> x(d), logits(heads * groups), mean(groups);
      for (int64_t token = begin; token < end; ++token) {
        const int64_t b = token / length, l = token % length;
        const int64_t angles = ((angle_batches > 1 ? b : 0) * length + l) * half;
        router.route(data + b * s_b + l * s_l, s_h, cos_data ? cos_data + angles : nullptr,
                     sin_data ? sin_data + angles : nullptr, chosen + (b * routed * length + l) * top_k,
                     length * top_k, x.data(), logits.data(), mean.data());
      }
    });
  });
  return out;
}

// unit (H, G, D) float32 -> (H, D, G_pad): what the decoding step's router reads (its caller keeps one per layer).
at::Tensor router_panel(const at::Tensor& unit) { return focus_native::router_panel(unit); }
