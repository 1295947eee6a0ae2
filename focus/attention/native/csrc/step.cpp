// One layer's hard Focus decoding step as one native call (focus.attention.dispatch.kernel_runs.native_decoding_step calls it).
//
// The eager step is some 70 tensor ops of a few microseconds each on a CPU, for arithmetic that takes a few: it
// routes the new key and the query heads (rotary undone, cosine against the centroids, top-k), writes the key's
// groups and group bits into the index, builds the hard mask and calls the fused attention kernel over every key.
// Here the routing is a plain loop over a few thousand numbers, and the attention reads only the keys the mask keeps
// (found by one AND of group bits per key), in chunks spread over the cores.

#include "kernels.h"

#include "pattern.h"

#include "kept_rows.h"
#include "router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using focus_native::KEPT_BLOCK;

// Routes the new key and the query heads of every row (router.h), writes the key's groups and group bits into the
// index at position L - 1, and returns each query head's group bits (B * H). panel (K [+ H], D, G_pad): the key
// heads' then the query heads' centroids (router_panel); bias (K [+ H], G): the keys' balance bias, zeros for queries.
template <typename scalar_t, typename group_t>
void route(const at::Tensor& query, const at::Tensor& arrived, at::Tensor& key_groups, at::Tensor& key_bits,
           const at::Tensor& positions, const c10::optional<at::Tensor>& inv_freq, const at::Tensor& panel,
           const at::Tensor& bias, const c10::optional<at::Tensor>& base_mask, int64_t length, double temperature,
           int64_t top_k, int64_t route_queries, std::vector<int64_t>& query_bits_out) {
  const int64_t b_size = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = arrived.size(1), r = heads / k_heads, num_groups = bias.size(1), padded = panel.size(2);
  const bool by_query = route_queries != focus_native::ROUTE_BY_KEY;
  const int64_t share = route_queries == focus_native::ROUTE_BY_KV_HEAD ? r : 1, routed_queries = heads / share;
  auto groups_out = key_groups.accessor<group_t, 4>();
  auto bits_out = key_bits.accessor<int64_t, 3>();
  auto pos = positions.accessor<int64_t, 2>();
  const float* freq = inv_freq ? inv_freq->data_ptr<float>() : nullptr;
  const float* panel_data = panel.data_ptr<float>();
  const float* bias_data = bias.data_ptr<float>();
  const float temp = static_cast<float>(temperature);
  const focus_native::Router<scalar_t> keys{panel_data, bias_data, k_heads, d, num_groups, padded, 1, top_k, temp};
  // The queries' bias rows are zeros (adding them changes no logit): none is read.
  const focus_native::Router<scalar_t> queries{panel_data + k_heads * d * padded, nullptr, heads, d, num_groups,
                                               padded, share, top_k, temp};
  std::vector<float> cos_t(d / 2), sin_t(d / 2), x(d), logits(std::max(k_heads, heads) * num_groups), mean(num_groups);
  std::vector<int64_t> key_chosen(k_heads * top_k), query_chosen(routed_queries * top_k), query_bits(heads);
  auto bits_of = [top_k](const int64_t* chosen) { return focus_native::group_bits(chosen, top_k); };

  for (int64_t b = 0; b < b_size; ++b) {
    if (freq) {  // the angles to undo: position * inv_freq[m]
      const double p = static_cast<double>(pos[positions.size(0) > 1 ? b : 0][0]);
      for (int64_t m = 0; m < d / 2; ++m) {
        const float angle = static_cast<float>(p) * freq[m];
        cos_t[m] = std::cos(angle);
        sin_t[m] = std::sin(angle);
      }
    }
    const float* cos = freq ? cos_t.data() : nullptr;
    const float* sin = freq ? sin_t.data() : nullptr;
    keys.route(arrived.data_ptr<scalar_t>() + b * arrived.stride(0), arrived.stride(1), cos, sin, key_chosen.data(),
               top_k, x.data(), logits.data(), mean.data());
    const bool real = !base_mask || base_mask->accessor<bool, 4>()[b][0][0][length - 1];
    for (int64_t k = 0; k < k_heads; ++k) {
      const int64_t* chosen = key_chosen.data() + k * top_k;
      const int64_t bits = bits_of(chosen);
      for (int64_t s = 0; s < top_k; ++s)
        groups_out[b][k][length - 1][s] = real ? static_cast<group_t>(chosen[s]) : static_cast<group_t>(-1);
      bits_out[b][k][length - 1] = real ? bits : 0;
      if (!by_query)  // route_queries "key": a query takes its own key's groups
        for (int64_t i = 0; i < r; ++i) query_bits[k * r + i] = bits;
    }
    if (by_query) {
      queries.route(query.data_ptr<scalar_t>() + b * query.stride(0), query.stride(1), cos, sin, query_chosen.data(),
                    top_k, x.data(), logits.data(), mean.data());
      for (int64_t h = 0; h < heads; ++h) query_bits[h] = bits_of(query_chosen.data() + h / share * top_k);
    }
    for (int64_t h = 0; h < heads; ++h) query_bits_out[b * heads + h] = query_bits[h];
  }
}

constexpr int64_t CHUNK = 512;  // keys per task: the cache is split so that both cores have work at any batch size

// One task's chunk of keys for the R query heads of a key/value head: first the keys any of them keeps (with a bit
// per head that keeps it), then those keys block by block: scores of every head, one rescale per head and block, the
// weights by a vectorised exp, the weighted values summed in registers when the head size is `D` (0: any, from `d`).
template <typename scalar_t, int64_t D>
void attend_chunk(const float* q, const int64_t* mine, int64_t r, int64_t d_runtime, const scalar_t* keys,
                  const scalar_t* values, int64_t key_step, int64_t value_step, const int64_t* bits,
                  const bool* allowed, int64_t mask_step, bool all, int64_t local, int64_t from, int64_t stop,
                  float* best, float* total, float* acc, int64_t* kept, int64_t* kept_by, float* scores) {
  const int64_t d = D > 0 ? D : d_runtime;
  int64_t any_bits = 0;  // a key sharing no group with any of the R heads is skipped at once
  for (int64_t i = 0; i < r; ++i) any_bits |= mine[i];
  int64_t n = 0;
  for (int64_t j = from; j < stop; ++j) {
    const bool near = all || j >= local;  // (within_window of the step's query: its last `window` keys)
    const int64_t key_groups = bits[j];
    if (!near && !focus_native::groups_meet(key_groups, any_bits)) continue;
    if (allowed && !allowed[j * mask_step]) continue;
    int64_t by = 0;
    for (int64_t i = 0; i < r; ++i) by |= static_cast<int64_t>(near || focus_native::groups_meet(key_groups, mine[i])) << i;
    kept[n] = j;
    kept_by[n++] = by;
  }
  focus_native::attend_rows<scalar_t, D, false>(q, r, d, keys, values, key_step, value_step, kept, kept_by, n, best,
                                               total, acc, scores);
}

// Hard attention of each query head over the keys its mask keeps, read in place: a key is kept when it shares a
// group with the head (group bits; sinks hold every bit), is local, or its key/value head is dense, and the model's
// own mask allows it. Only kept keys are read and multiplied, where the fused kernel would read every key and add a
// mask. The R query heads of a key/value head walk its keys together (a key kept by several is read once); the cache
// is cut into chunks of CHUNK keys, each with its own running maximum (online softmax, float32), merged at the end.
template <typename scalar_t>
void attend_kept(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                 const at::Tensor& key_bits, const std::vector<int64_t>& query_bits,
                 const c10::optional<at::Tensor>& base_mask, const c10::optional<at::Tensor>& dense,
                 int64_t window, double scale, at::Tensor& out) {
  const int64_t b_size = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = key.size(1), length = key.size(2), r = heads / k_heads;
  TORCH_CHECK(r <= 62, "masked_step: at most 62 query heads per key/value head");  // a bit per head in kept_by
  const int64_t local = std::max<int64_t>(length - window, 0), chunks = (length + CHUNK - 1) / CHUNK;
  const int64_t tasks = b_size * k_heads * chunks;
  std::vector<float> best(tasks * r, -std::numeric_limits<float>::infinity()), total(tasks * r), acc(tasks * r * d);
  const scalar_t* q_data = query.data_ptr<scalar_t>();
  const scalar_t* k_data = key.data_ptr<scalar_t>();
  const scalar_t* v_data = value.data_ptr<scalar_t>();
  const int64_t* bit_data = key_bits.data_ptr<int64_t>();
  const bool* mask_data = base_mask ? base_mask->data_ptr<bool>() : nullptr;
  const bool* dense_heads = dense ? dense->data_ptr<bool>() : nullptr;
  // Strides read once: Tensor::stride() is a checked call, too slow for the per-key loop.
  const int64_t key_step = key.stride(2), value_step = value.stride(2);
  const int64_t mask_step = base_mask ? base_mask->stride(3) : 0;
  const int64_t q_batch = query.stride(0), q_head = query.stride(1), k_batch = key.stride(0), k_head = key.stride(1);
  const int64_t v_batch = value.stride(0), v_head = value.stride(1), bit_batch = key_bits.stride(0);
  const int64_t bit_head = key_bits.stride(1), mask_batch = base_mask ? base_mask->stride(0) : 0;
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> q(r * d), scores(r * KEPT_BLOCK);
    std::vector<int64_t> mine(r), kept(CHUNK), kept_by(CHUNK);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / (k_heads * chunks), k = task / chunks % k_heads, c = task % chunks;
      for (int64_t i = 0; i < r; ++i) {
        const scalar_t* q_row = q_data + b * q_batch + (k * r + i) * q_head;
        for (int64_t m = 0; m < d; ++m) q[i * d + m] = static_cast<float>(q_row[m]) * static_cast<float>(scale);
        mine[i] = query_bits[b * heads + k * r + i];
      }
      auto chunk = [&](auto head_size) {
        attend_chunk<scalar_t, decltype(head_size)::value>(
            q.data(), mine.data(), r, d, k_data + b * k_batch + k * k_head, v_data + b * v_batch + k * v_head,
            key_step, value_step, bit_data + b * bit_batch + k * bit_head,
            mask_data ? mask_data + b * mask_batch : nullptr, mask_step, dense_heads && dense_heads[k], local,
            c * CHUNK, std::min(length, (c + 1) * CHUNK), &best[task * r], &total[task * r], &acc[task * r * d],
            kept.data(), kept_by.data(), scores.data());
      };
      if (d == 64) chunk(std::integral_constant<int64_t, 64>());
      else if (d == 128) chunk(std::integral_constant<int64_t, 128>());
      else chunk(std::integral_constant<int64_t, 0>());
    }
  });
  scalar_t* o_data = out.data_ptr<scalar_t>();
  std::vector<float> merged(d);
  for (int64_t b = 0; b < b_size; ++b)  // the chunks of each head, merged at their common maximum
    for (int64_t k = 0; k < k_heads; ++k)
      for (int64_t i = 0; i < r; ++i) {
        const int64_t first = (b * k_heads + k) * chunks;
        focus_native::merge_parts_of_head(&best[first * r + i], &total[first * r + i], &acc[(first * r + i) * d],
                                          chunks, r, d, merged.data(), o_data + (b * heads + k * r + i) * d);
      }
}

}  // namespace

at::Tensor masked_step(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       at::Tensor key_groups, at::Tensor key_bits, const at::Tensor& positions,
                       const c10::optional<at::Tensor>& inv_freq, const at::Tensor& panel, const at::Tensor& bias,
                       const c10::optional<at::Tensor>& base_mask, const c10::optional<at::Tensor>& dense,
                       double temperature, int64_t top_k, int64_t window, bool route_on_value, int64_t route_queries,
                       c10::optional<double> scaling) {
  const int64_t b = query.size(0), heads = query.size(1), d = query.size(3);
  const int64_t k_heads = key.size(1), length = key.size(2);
  TORCH_CHECK(query.device().is_cpu() && query.size(2) == 1, "masked_step: one CPU query token per row");
  TORCH_CHECK(route_queries == focus_native::ROUTE_BY_KEY || route_queries == focus_native::ROUTE_BY_QUERY ||
                  route_queries == focus_native::ROUTE_BY_KV_HEAD,
              "masked_step: route_queries is one of ROUTE_QUERIES' codes");
  const int64_t routed = k_heads + (route_queries == focus_native::ROUTE_BY_KEY ? 0 : heads);
  TORCH_CHECK(bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.dim() == 2 && bias.size(0) == routed,
              "masked_step: a contiguous float32 bias (K [+ H], G)");
  const int64_t num_groups = bias.size(1);
  TORCH_CHECK(num_groups <= focus_native::GROUP_BITS, "masked_step: at most ", focus_native::GROUP_BITS, " groups");
  TORCH_CHECK(top_k >= 1 && top_k <= num_groups && top_k <= focus_native::MAX_TOP_K, "masked_step: top-k from 1 to "
              "the groups, at most ", focus_native::MAX_TOP_K);
  TORCH_CHECK(panel.scalar_type() == at::kFloat && panel.is_contiguous() && panel.dim() == 3 &&
                  panel.size(0) == routed && panel.size(1) == d && panel.size(2) >= num_groups &&
                  panel.size(2) % focus_native::GROUP_BLOCK == 0,
              "masked_step: the router's panel (K [+ H], D, G_pad) of router_panel");
  TORCH_CHECK(key_bits.size(2) >= length && key_groups.size(2) >= length, "masked_step: index buffers too short");
  const auto& source = route_on_value ? value : key;
  const auto arrived = source.narrow(2, length - 1, 1);
  TORCH_CHECK(query.stride(3) == 1 && key.stride(3) == 1 && value.stride(3) == 1 && key_bits.stride(2) == 1,
              "masked_step: rows must be contiguous along the head dimension");
  std::vector<int64_t> query_bits(b * heads);
  auto out = at::empty({b, heads, 1, d}, query.options());
  const double scale = scaling ? *scaling : 1.0 / std::sqrt(static_cast<double>(d));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "masked_step", [&] {
    if (key_groups.scalar_type() == at::kChar) {
      route<scalar_t, int8_t>(query, arrived, key_groups, key_bits, positions, inv_freq, panel, bias, base_mask, length,
                              temperature, top_k, route_queries, query_bits);
    } else {
      route<scalar_t, int16_t>(query, arrived, key_groups, key_bits, positions, inv_freq, panel, bias, base_mask,
                               length, temperature, top_k, route_queries, query_bits);
    }
    attend_kept<scalar_t>(query, key, value, key_bits, query_bits, base_mask, dense, window, scale, out);
  });
  return out;
}
