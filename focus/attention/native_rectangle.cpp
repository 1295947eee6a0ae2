// The query-routed hard Focus prefill's parts as native calls (focus/attention/native_parts.py): the rectangles
// (focus/attention/rectangle.py) and the band (decomposed._band_part).
//
// Every query row reads one contiguous run of keys: in a rectangle, the keys of its segment at least a window before
// it (keys and query rows packed in (segment, position) order); in the band, the keys of its key/value head within
// the window. The eager forms gather keys into padded batches per fused-kernel call (about 50 calls for the
// rectangles of one SmolLM2 layer at 2K tokens, at 2-3x the dense kernel's time per pair) or mask a block of keys
// wider than the window; here tiles of consecutive query rows read their keys in place, block by block, an online
// softmax in float32, spread over the cores.

#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "native_math.h"

namespace {

using focus_native::exp_nonpositive;

constexpr int64_t TILE_ROWS = 16;   // query rows per tile (of one segment, or of one band), times R query heads
constexpr int64_t KEY_BLOCK = 64;   // keys scored, weighed and summed together
constexpr int64_t TASKS_PER_THREAD = 8;  // tiles are dealt round-robin to this many tasks per thread: balanced work

struct Tile {
  int64_t first_row, rows, key_first, key_count;
};

// Consecutive rows whose first keys are equal (a segment's rows) or step by one (a band's), at most TILE_ROWS: a tile
// reads the keys from its first row's first key to the furthest any of its rows reads.
std::vector<Tile> tiles_of(const int64_t* key_first, const int64_t* key_count, int64_t n) {
  std::vector<Tile> tiles;
  for (int64_t i = 0; i < n;) {
    int64_t end = i + 1, stop = key_first[i] + key_count[i];
    while (end < n && end - i < TILE_ROWS && key_first[end] >= key_first[end - 1] &&
           key_first[end] - key_first[i] <= end - i) {
      stop = std::max(stop, key_first[end] + key_count[end]);
      ++end;
    }
    if (stop > key_first[i]) tiles.push_back({i, end - i, key_first[i], stop - key_first[i]});
    i = end;
  }
  return tiles;
}

constexpr int64_t LANES = 8;  // query vectors scored together (one AVX2 register of float32)
constexpr int64_t KEYS_AT_ONCE = 4;  // keys scored together: each query load feeds four multiply-adds
constexpr int64_t MAX_DIM = 256;  // the largest head size (a query's sum of values lives on the stack)

// One tile: its query vectors (row, head) against its keys, block by block. `D` is the head size when it is one the
// loops are unrolled for (0: any, read from `d`): a query's weighted sum of values then lives in registers.
template <typename scalar_t, int64_t D>
void attend_tile(const Tile& tile, const scalar_t* q_data, const scalar_t* k_data, const scalar_t* v_data,
                 const int64_t* query_index, const int64_t* key_index,
                 const int64_t* key_first, const int64_t* key_count, int64_t r, int64_t d_runtime, float scale,
                 float* out, float* lse,
                 std::vector<float>& qt, std::vector<float>& scores, std::vector<float>& acc,
                 std::vector<float>& kv_block, std::vector<float>& rows_state, std::vector<int64_t>& limits) {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const int64_t d = D > 0 ? D : d_runtime;
  const int64_t a_size = tile.rows * r;  // query vectors of the tile: a = row * r + head
  const int64_t a_pad = (a_size + LANES - 1) / LANES * LANES;
  // Queries transposed (D, A) and scaled: the scores of LANES queries against a key are one vector per dimension.
  std::fill(qt.begin(), qt.begin() + d * a_pad, 0.0f);
  for (int64_t a = 0; a < a_size; ++a) {
    const int64_t row = tile.first_row + a / r;
    const scalar_t* q_row = q_data + ((query_index ? query_index[row] : row) * r + a % r) * d;
    for (int64_t m = 0; m < d; ++m) qt[m * a_pad + a] = static_cast<float>(q_row[m]) * scale;
  }
  float* best = rows_state.data();  // per query vector: running maximum, sum of weights, the tile's keys it sees
  float* total = best + a_pad;
  int64_t* lower = limits.data();
  int64_t* upper = lower + a_pad;
  for (int64_t a = 0; a < a_size; ++a) {
    const int64_t row = tile.first_row + a / r;
    best[a] = none;
    total[a] = 0.0f;
    lower[a] = key_first[row] - tile.key_first;
    upper[a] = lower[a] + key_count[row];
  }
  std::fill(best + a_size, best + a_pad, 0.0f);  // padding lanes: any finite maximum (their weights go unread)
  std::fill(acc.begin(), acc.begin() + a_size * d, 0.0f);
  const float* zero_row = kv_block.data() + 2 * KEY_BLOCK * d;  // scores of the padding keys (never used)
  for (int64_t block = 0; block < tile.key_count; block += KEY_BLOCK) {
    const int64_t width = std::min(KEY_BLOCK, tile.key_count - block);
    const float* keys;  // the block's keys and values, (width, D) float32 each
    const float* values;
    if (std::is_same<scalar_t, float>::value && !key_index) {  // read in place
      keys = reinterpret_cast<const float*>(k_data) + (tile.key_first + block) * d;
      values = reinterpret_cast<const float*>(v_data) + (tile.key_first + block) * d;
    } else {  // gathered (and in float32) once, read by every query of the tile
      float* k_out = kv_block.data();
      float* v_out = k_out + KEY_BLOCK * d;
      for (int64_t j = 0; j < width; ++j) {
        const int64_t key = tile.key_first + block + j;
        const int64_t row = key_index ? key_index[key] : key;
        for (int64_t m = 0; m < d; ++m) {
          k_out[j * d + m] = static_cast<float>(k_data[row * d + m]);
          v_out[j * d + m] = static_cast<float>(v_data[row * d + m]);
        }
      }
      keys = k_out;
      values = v_out;
    }
    // Scores (width, A_pad), KEYS_AT_ONCE keys by LANES queries at a time, the sums in registers.
    for (int64_t j0 = 0; j0 < width; j0 += KEYS_AT_ONCE) {
      const float* key_rows[KEYS_AT_ONCE];
      for (int64_t t = 0; t < KEYS_AT_ONCE; ++t) key_rows[t] = j0 + t < width ? keys + (j0 + t) * d : zero_row;
      for (int64_t ab = 0; ab < a_pad; ab += LANES) {
        float sum[KEYS_AT_ONCE][LANES] = {};
        for (int64_t m = 0; m < d; ++m) {
          const float* q_m = &qt[m * a_pad + ab];
          for (int64_t t = 0; t < KEYS_AT_ONCE; ++t) {
            const float k_m = key_rows[t][m];
#pragma omp simd
            for (int64_t u = 0; u < LANES; ++u) sum[t][u] += q_m[u] * k_m;
          }
        }
        for (int64_t t = 0; t < KEYS_AT_ONCE && j0 + t < width; ++t)
          std::copy(sum[t], sum[t] + LANES, &scores[(j0 + t) * a_pad + ab]);
      }
    }
    for (int64_t a = 0; a < a_size; ++a) {  // a row sees its own run of the tile's keys; online softmax maximum
      const int64_t from = std::clamp<int64_t>(lower[a] - block, 0, width);
      const int64_t to = std::clamp<int64_t>(upper[a] - block, from, width);
      float top = best[a];
      for (int64_t j = 0; j < from; ++j) scores[j * a_pad + a] = none;
      for (int64_t j = from; j < to; ++j) top = std::max(top, scores[j * a_pad + a]);
      for (int64_t j = to; j < width; ++j) scores[j * a_pad + a] = none;
      if (top == none) continue;  // nothing seen by this query yet
      if (top > best[a]) {  // rescale what was summed to the new maximum
        const float shrink = best[a] == none ? 0.0f : exp_nonpositive(best[a] - top);
        total[a] *= shrink;
        float* acc_a = &acc[a * d];
#pragma omp simd
        for (int64_t m = 0; m < d; ++m) acc_a[m] *= shrink;
        best[a] = top;
      }
    }
    for (int64_t j = 0; j < width; ++j) {  // weights, in place of the scores
      float* s = &scores[j * a_pad];
#pragma omp simd
      for (int64_t a = 0; a < a_pad; ++a) {
        const float shifted = s[a] - best[a];
        const float weight = exp_nonpositive(shifted < 0.0f ? shifted : 0.0f);
        s[a] = s[a] == none ? 0.0f : weight;
      }
    }
    for (int64_t a = 0; a < a_size; ++a) {  // weighted values of each query, its sum in registers
      if (best[a] == none) continue;
      float sum[D > 0 ? D : MAX_DIM];
      float* acc_a = &acc[a * d];
      std::copy(acc_a, acc_a + d, sum);
      float weights = 0.0f;
      for (int64_t j = 0; j < width; ++j) {
        const float w = scores[j * a_pad + a];
        weights += w;
        const float* value_row = values + j * d;
#pragma omp simd
        for (int64_t m = 0; m < d; ++m) sum[m] += w * value_row[m];
      }
      std::copy(sum, sum + d, acc_a);
      total[a] += weights;
    }
  }
  for (int64_t a = 0; a < a_size; ++a) {
    float* o = out + (tile.first_row * r + a) * d;
    if (total[a] == 0.0f) {  // no key at all: no part (lse stays -inf, the output zero)
      std::fill(o, o + d, 0.0f);
      continue;
    }
    const float inverse = 1.0f / total[a];
    for (int64_t m = 0; m < d; ++m) o[m] = acc[a * d + m] * inverse;
    lse[tile.first_row * r + a] = best[a] + std::log(total[a]);
  }
}

}  // namespace

// query (M, R, D): query vectors (R query heads sharing a row's keys); key, value (Mk, D); query_rows (N,) and key_rows
// (Nk,): the rows of query and key that are the i-th query row and key (none: the i-th row itself). key_first (N,):
// each query row's first key; key_count (N,): how many keys from it the row sees (rows in an order where the first
// keys of neighbours are equal or step by one: a segment's rows, or a band's). Returns the output
// (N, R, D) and log-sum-exp (N, R) in float32; a row with no key gets lse -inf (and zeros).
std::tuple<torch::Tensor, torch::Tensor> rectangles(const torch::Tensor& query, const torch::Tensor& key,
                                                    const torch::Tensor& value, const torch::Tensor& key_first,
                                                    const torch::Tensor& key_count, double scale,
                                                    const c10::optional<torch::Tensor>& query_rows,
                                                    const c10::optional<torch::Tensor>& key_rows) {
  TORCH_CHECK(query.device().is_cpu() && query.dim() == 3 && query.is_contiguous() && key.is_contiguous() &&
                  value.is_contiguous() && key.scalar_type() == query.scalar_type() &&
                  value.scalar_type() == query.scalar_type(),
              "rectangles: contiguous CPU query (N, R, D), key and value (Nk, D) of one dtype");
  TORCH_CHECK(query.size(2) <= MAX_DIM, "rectangles: heads of at most ", MAX_DIM, " dimensions");
  TORCH_CHECK(key_first.scalar_type() == at::kLong && key_count.scalar_type() == at::kLong &&
                  key_first.is_contiguous() && key_count.is_contiguous() && key_first.numel() == (query_rows ? query_rows->numel() : query.size(0)) &&
                  key_count.numel() == key_first.numel(),
              "rectangles: int64 key_first and key_count, one per query row");
  for (const auto& rows : {query_rows, key_rows})
    TORCH_CHECK(!rows || (rows->scalar_type() == at::kLong && rows->is_contiguous()), "rectangles: int64 row indexes");
  const int64_t n = query_rows ? query_rows->numel() : query.size(0), r = query.size(1), d = query.size(2);
  const int64_t* q_index = query_rows ? query_rows->data_ptr<int64_t>() : nullptr;
  const int64_t* k_index = key_rows ? key_rows->data_ptr<int64_t>() : nullptr;
  auto out = torch::empty({n, r, d}, query.options().dtype(at::kFloat));
  auto lse = torch::full({n, r}, -std::numeric_limits<float>::infinity(), query.options().dtype(at::kFloat));
  const int64_t* first = key_first.data_ptr<int64_t>();
  const int64_t* count = key_count.data_ptr<int64_t>();
  const std::vector<Tile> tiles = tiles_of(first, count, n);
  // Rows of no tile (no key) keep lse -inf; their output is never read, but is zeroed to be defined.
  out.zero_();
  const int64_t tasks = std::min<int64_t>(tiles.size(), at::get_num_threads() * TASKS_PER_THREAD);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rectangles", [&] {
    const scalar_t* q_data = query.data_ptr<scalar_t>();
    const scalar_t* k_data = key.data_ptr<scalar_t>();
    const scalar_t* v_data = value.data_ptr<scalar_t>();
    float* out_data = out.data_ptr<float>();
    float* lse_data = lse.data_ptr<float>();
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      const int64_t a_pad = (TILE_ROWS * r + LANES - 1) / LANES * LANES;
      std::vector<float> qt(d * a_pad), scores(KEY_BLOCK * a_pad), acc(TILE_ROWS * r * d);
      std::vector<float> kv_block((2 * KEY_BLOCK + 1) * d, 0.0f);  // a block in float32, then a row of zeros
      std::vector<float> rows_state(2 * a_pad);
      std::vector<int64_t> limits(2 * a_pad);
      for (int64_t task = begin; task < end; ++task) {
        for (size_t t = task; t < tiles.size(); t += tasks) {
          auto tile = [&](auto head_size) {
            attend_tile<scalar_t, decltype(head_size)::value>(tiles[t], q_data, k_data, v_data, q_index, k_index,
                                                               first, count, r, d,
                                                               static_cast<float>(scale), out_data, lse_data, qt,
                                                               scores, acc, kv_block, rows_state, limits);
          };
          if (d == 64) tile(std::integral_constant<int64_t, 64>());
          else if (d == 128) tile(std::integral_constant<int64_t, 128>());
          else tile(std::integral_constant<int64_t, 0>());
        }
      }
    });
  });
  return {out, lse};
}
