// One layer's hard Focus decoding step under the mask, as one native call (focus/attention/native_step.py).
//
// The eager step is some 70 tensor ops of a few microseconds each on a CPU, for arithmetic that takes a few: it
// routes the new key and the query heads (rotary undone, cosine against the centroids, top-k), writes the key's
// groups and group bits into the index, builds the hard mask and calls the attention kernel. Here the routing and
// the mask are plain loops over a few thousand numbers, and the attention is ATen's fused kernel, as in the eager step.

#include <torch/extension.h>

#include <cmath>
#include <limits>
#include <vector>

namespace {

// The top_k largest of row[0..n), best first; ties go to the lower index (as torch.topk's CPU kernel keeps them).
void top_groups(const float* row, int64_t n, int64_t top_k, int64_t* out) {
  for (int64_t s = 0; s < top_k; ++s) {
    int64_t best = -1;
    for (int64_t g = 0; g < n; ++g) {
      bool taken = false;
      for (int64_t t = 0; t < s; ++t) taken |= out[t] == g;
      if (!taken && (best < 0 || row[g] > row[best])) best = g;
    }
    out[s] = best;
  }
}

template <typename scalar_t, typename group_t>
void route_and_mask(const torch::Tensor& query, const torch::Tensor& arrived, torch::Tensor& key_groups,
                    torch::Tensor& key_bits, const torch::Tensor& positions, const c10::optional<torch::Tensor>& inv_freq,
                    const torch::Tensor& unit, const torch::Tensor& bias, const c10::optional<torch::Tensor>& base_mask,
                    const c10::optional<torch::Tensor>& dense, int64_t length, int64_t window, double temperature,
                    int64_t top_k, int64_t route_queries, torch::Tensor& mask) {
  const int64_t b_size = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = arrived.size(1), r = heads / k_heads, num_groups = unit.size(1);
  const bool by_query = route_queries != 0;  // 0: "key", 1: "query", 2: "kv_head"
  const int64_t routed = k_heads + (by_query ? heads : 0);
  auto q = query.accessor<scalar_t, 4>();
  auto a = arrived.accessor<scalar_t, 4>();
  auto groups_out = key_groups.accessor<group_t, 4>();
  auto bits_out = key_bits.accessor<int64_t, 3>();
  auto pos = positions.accessor<int64_t, 2>();
  const float* centroids = unit.data_ptr<float>();  // contiguous (K [+ H], G, D)
  auto bi = bias.accessor<float, 2>();
  const float* freq = inv_freq ? inv_freq->data_ptr<float>() : nullptr;
  std::vector<float> cos_t(d / 2), sin_t(d / 2), x(d), logits(routed * num_groups), shared(num_groups);
  std::vector<int64_t> chosen(top_k), query_bits(heads);
  const float blocked = -std::numeric_limits<float>::infinity();

  for (int64_t b = 0; b < b_size; ++b) {
    if (freq) {  // routing.undo_rotary: turn each pair (x_m, x_{m + D/2}) back by position * inv_freq[m]
      const double p = static_cast<double>(pos[positions.size(0) > 1 ? b : 0][0]);
      for (int64_t m = 0; m < d / 2; ++m) {
        const float angle = static_cast<float>(p) * freq[m];
        cos_t[m] = std::cos(angle);
        sin_t[m] = std::sin(angle);
      }
    }
    for (int64_t j = 0; j < routed; ++j) {  // routing logits: cosine to each centroid, over the temperature
      for (int64_t m = 0; m < d; ++m)
        x[m] = j < k_heads ? static_cast<float>(a[b][j][0][m]) : static_cast<float>(q[b][j - k_heads][0][m]);
      if (freq) {
        for (int64_t m = 0; m < d / 2; ++m) {
          const float first = x[m], second = x[m + d / 2];
          x[m] = first * cos_t[m] + second * sin_t[m];
          x[m + d / 2] = second * cos_t[m] - first * sin_t[m];
        }
      }
      float norm = 0;
#pragma omp simd reduction(+ : norm)
      for (int64_t m = 0; m < d; ++m) norm += x[m] * x[m];
      const float scale = 1.0f / std::max(std::sqrt(norm), 1e-12f);
      for (int64_t m = 0; m < d; ++m) x[m] *= scale;
      const float* centroid = centroids + j * num_groups * d;
      for (int64_t g = 0; g < num_groups; ++g, centroid += d) {
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t m = 0; m < d; ++m) dot += x[m] * centroid[m];
        logits[j * num_groups + g] = dot / static_cast<float>(temperature);
      }
    }
    if (route_queries == 2) {  // kv_head: the query heads of a key/value head share their mean logits
      for (int64_t k = 0; k < k_heads; ++k) {
        for (int64_t g = 0; g < num_groups; ++g) {
          float sum = 0;
          for (int64_t i = 0; i < r; ++i) sum += logits[(k_heads + k * r + i) * num_groups + g];
          shared[g] = sum / static_cast<float>(r);
        }
        for (int64_t i = 0; i < r; ++i)
          for (int64_t g = 0; g < num_groups; ++g) logits[(k_heads + k * r + i) * num_groups + g] = shared[g];
      }
    }
    const bool real = !base_mask || base_mask->accessor<bool, 4>()[b][0][0][length - 1];
    for (int64_t j = 0; j < routed; ++j) {  // top-k of the log-assignments (logits + balance bias, shifted per row)
      float* row = &logits[j * num_groups];
      for (int64_t g = 0; g < num_groups; ++g) row[g] += bi[j][g];
      top_groups(row, num_groups, top_k, chosen.data());
      int64_t bits = 0;
      for (int64_t s = 0; s < top_k; ++s) bits |= int64_t{1} << chosen[s];
      if (j < k_heads) {
        for (int64_t s = 0; s < top_k; ++s) groups_out[b][j][length - 1][s] = real ? static_cast<group_t>(chosen[s]) : -1;
        bits_out[b][j][length - 1] = real ? bits : 0;
        if (!by_query)
          for (int64_t i = 0; i < r; ++i) query_bits[j * r + i] = bits;
      } else {
        query_bits[j - k_heads] = bits;
      }
    }
    // The hard mask (B, K, R, L): a key is kept when it shares a group with the query head (sinks hold every bit),
    // is local, or its head is dense; and the model's own mask allows it.
    const bool* allowed_row = base_mask ? base_mask->data_ptr<bool>() + b * base_mask->stride(0) : nullptr;
    const bool* dense_heads = dense ? dense->data_ptr<bool>() : nullptr;
    for (int64_t k = 0; k < k_heads; ++k) {
      const int64_t* key_row = key_bits.data_ptr<int64_t>() + b * key_bits.stride(0) + k * key_bits.stride(1);
      for (int64_t i = 0; i < r; ++i) {
        scalar_t* out = mask.data_ptr<scalar_t>() + ((b * k_heads + k) * r + i) * length;
        const int64_t mine = query_bits[k * r + i];
        const bool all = dense_heads && dense_heads[k];
        const int64_t local = std::max<int64_t>(length - window, 0);
        const scalar_t zero(0), minus_inf(blocked);
        for (int64_t j = 0; j < local; ++j) out[j] = (all || (key_row[j] & mine) != 0) ? zero : minus_inf;
        for (int64_t j = local; j < length; ++j) out[j] = zero;
        if (allowed_row) {
          const int64_t step = base_mask->stride(3);
          for (int64_t j = 0; j < length; ++j) out[j] = allowed_row[j * step] ? out[j] : minus_inf;
        }
      }
    }
  }
}

}  // namespace

torch::Tensor masked_step(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                          torch::Tensor key_groups, torch::Tensor key_bits, const torch::Tensor& positions,
                          const c10::optional<torch::Tensor>& inv_freq, const torch::Tensor& unit,
                          const torch::Tensor& bias, const c10::optional<torch::Tensor>& base_mask,
                          const c10::optional<torch::Tensor>& dense, double temperature, int64_t top_k,
                          int64_t window, bool route_on_value, int64_t route_queries, c10::optional<double> scaling) {
  const int64_t b = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = key.size(1), length = key.size(2);
  TORCH_CHECK(query.device().is_cpu() && query.size(2) == 1, "masked_step: one CPU query token per row");
  TORCH_CHECK(unit.scalar_type() == at::kFloat && unit.is_contiguous() && bias.scalar_type() == at::kFloat,
              "masked_step: a contiguous float32 router");
  TORCH_CHECK(key_bits.size(2) >= length && key_groups.size(2) >= length, "masked_step: index buffers too short");
  const auto& source = route_on_value ? value : key;
  const auto arrived = source.narrow(2, length - 1, 1);
  auto mask = torch::empty({b, k_heads, heads / k_heads, length}, query.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "masked_step", [&] {
    if (key_groups.scalar_type() == at::kChar) {
      route_and_mask<scalar_t, int8_t>(query, arrived, key_groups, key_bits, positions, inv_freq, unit, bias,
                                       base_mask, dense, length, window, temperature, top_k, route_queries, mask);
    } else {
      route_and_mask<scalar_t, int16_t>(query, arrived, key_groups, key_bits, positions, inv_freq, unit, bias,
                                        base_mask, dense, length, window, temperature, top_k, route_queries, mask);
    }
  });
  // The R query heads of a key/value head as R queries of it: keys and values are read once, not copied per head.
  auto out = at::scaled_dot_product_attention(query.view({b, k_heads, heads / k_heads, d}), key, value, mask, 0.0,
                                              false, scaling);
  return out.view({b, heads, 1, d});
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("masked_step", &masked_step); }
