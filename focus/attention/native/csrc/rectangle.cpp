// The query-routed hard Focus prefill's parts as native calls (focus.attention.native.native_routed_prefill and its
// band, native/prefill.native_band_part): the rectangles (focus.attention.kernels.rectangle) and the band (band.band_part).
//
// Every query row reads one contiguous run of keys: in a rectangle, the keys of its segment at least a window before
// it (keys and query rows packed in (segment, position) order); in the band, the keys of its key/value head within
// the window. The eager forms gather keys into padded batches per fused-kernel call (tens of calls a layer, each
// slower per pair than the dense kernel) or mask a block of keys wider than the window; here tiles of consecutive query rows read their keys block by block, an online softmax in
// float32, spread over the cores. Every key is first copied once, transposed in panels of 16 (the layout a
// matrix-multiply kernel packs its right operand in), and each block's scores and weighted values are products of
// 6 x 16 micro-tiles held in registers.

#include "kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "online_softmax.h"
#include "tiles.h"

namespace {

using focus_native::exp_nonpositive;
using focus_native::raise_maximum;
using focus_native::Tile;

// Query rows per tile (of one segment, or of one band), times R query heads. Wider tiles read more keys past a row's
// own, narrower ones read the shared panels more often; 30 fills its micro-tiles of QUERIES_AT_ONCE rows exactly
// (docs/decomposition.md has the widths measured).
constexpr int64_t TILE_ROWS = 30;
constexpr int64_t KEY_BLOCK = 64;   // keys scored, weighed and summed together
constexpr int64_t TASKS_PER_THREAD = 8;  // tiles are dealt round-robin to this many tasks per thread: balanced work

// Query vectors of a micro-tile: 6 x 16 keeps 12 sums in AVX2 registers, enough to hide the multiply-adds' latency
// (4 x 16 did not: docs/decomposition.md).
constexpr int64_t QUERIES_AT_ONCE = 6;
constexpr int64_t WIDE = 16;  // keys scored, or head dimensions summed, by a micro-tile: two AVX2 registers of float32

// c (QUERIES_AT_ONCE rows c_step apart, WIDE columns) = (ADD: c +) the micro-tile's products over `depth` steps:
// sum over t of a[i * a_step + t] * b[t * b_step + u]. On AVX2 each step loads the two vectors of b once and
// broadcasts each row's number of a for two fused multiply-adds, the 2 x QUERIES_AT_ONCE sums in registers (left to
// the compiler, the loop read b again from memory for every row: a load per multiply-add, and the loads bound it).
template <bool ADD>
inline void micro_tile(const float* a, int64_t a_step, const float* b, int64_t b_step, int64_t depth, float* c,
                       int64_t c_step) {
#if defined(__AVX2__) && defined(__FMA__)
  __m256 low[QUERIES_AT_ONCE], high[QUERIES_AT_ONCE];
  for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) {
    low[i] = ADD ? _mm256_loadu_ps(c + i * c_step) : _mm256_setzero_ps();
    high[i] = ADD ? _mm256_loadu_ps(c + i * c_step + 8) : _mm256_setzero_ps();
  }
  for (int64_t t = 0; t < depth; ++t) {
    const __m256 b_low = _mm256_loadu_ps(b + t * b_step), b_high = _mm256_loadu_ps(b + t * b_step + 8);
    for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) {
      const __m256 a_it = _mm256_broadcast_ss(a + i * a_step + t);
      low[i] = _mm256_fmadd_ps(a_it, b_low, low[i]);
      high[i] = _mm256_fmadd_ps(a_it, b_high, high[i]);
    }
  }
  for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) {
    _mm256_storeu_ps(c + i * c_step, low[i]);
    _mm256_storeu_ps(c + i * c_step + 8, high[i]);
  }
#else
  float sums[QUERIES_AT_ONCE][WIDE];
  for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i)
    for (int64_t u = 0; u < WIDE; ++u) sums[i][u] = ADD ? c[i * c_step + u] : 0.0f;
  for (int64_t t = 0; t < depth; ++t) {
    const float* b_t = b + t * b_step;
    for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) {
      const float a_it = a[i * a_step + t];
#pragma omp simd
      for (int64_t u = 0; u < WIDE; ++u) sums[i][u] += a_it * b_t[u];
    }
  }
  for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) std::copy(sums[i], sums[i] + WIDE, c + i * c_step);
#endif
}

// One tile: its query vectors (row, head) against its keys, block by block. `D` is the head size when it is one the
// loops are unrolled for (a multiple of WIDE; 0: any, read from `d`). The keys come transposed
// in panels of WIDE keys, (panels, D, WIDE); the values as (keys, D) rows; both float32, in the key order `key_first`
// counts in.
template <typename scalar_t, int64_t D>
void attend_tile(const Tile& tile, const scalar_t* q_data, const float* panels, const float* values,
                 const int64_t* query_index, const int64_t* query_skip, const int64_t* key_bits,
                 const int64_t* key_first, const int64_t* key_count, int64_t r,
                 int64_t d_runtime, float scale, float* out, float* lse, std::vector<float>& qs,
                 std::vector<float>& scores, std::vector<float>& acc, std::vector<float>& rows_state,
                 std::vector<int64_t>& limits) {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const int64_t d = D > 0 ? D : d_runtime;
  const int64_t a_size = tile.rows * r;  // query vectors of the tile: a = row * r + head
  const int64_t a_pad = (a_size + QUERIES_AT_ONCE - 1) / QUERIES_AT_ONCE * QUERIES_AT_ONCE;
  // Queries (A_pad, D), scaled; padding vectors zero (their weights are zeroed below).
  std::fill(qs.begin(), qs.begin() + a_pad * d, 0.0f);
  for (int64_t a = 0; a < a_size; ++a) {
    const int64_t row = tile.first_row + a / r;
    const scalar_t* q_row = q_data + ((query_index ? query_index[row] : row) * r + a % r) * d;
    for (int64_t m = 0; m < d; ++m) qs[a * d + m] = static_cast<float>(q_row[m]) * scale;
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
  std::fill(acc.begin(), acc.begin() + a_pad * d, 0.0f);
  for (int64_t block = 0; block < tile.key_count; block += KEY_BLOCK) {
    const int64_t width = std::min(KEY_BLOCK, tile.key_count - block);
    const int64_t width_pad = (width + WIDE - 1) / WIDE * WIDE;  // columns past `width` are read, never weighed
    const float* block_keys = panels + (tile.key_first + block) * d;  // its first panel (tiles start at one)
    const float* block_values = values + (tile.key_first + block) * d;
    // The block's columns a micro-tile's query vectors see, [first, last), in whole micro-tiles: the columns outside
    // are neither scored nor weighed (the corners of a band's tile, the ends of a segment's shorter rows).
    auto columns = [&](int64_t a0) {
      int64_t first = width, last = 0;
      for (int64_t a = a0; a < std::min(a0 + QUERIES_AT_ONCE, a_size); ++a) {
        first = std::min(first, std::clamp<int64_t>(lower[a] - block, 0, width));
        last = std::max(last, std::clamp<int64_t>(upper[a] - block, 0, width));
      }
      first = first / WIDE * WIDE;
      return std::pair<int64_t, int64_t>{first, std::max(first, (last + WIDE - 1) / WIDE * WIDE)};
    };
    // Scores (A_pad, KEY_BLOCK): micro-tiles of QUERIES_AT_ONCE query vectors by WIDE keys.
    for (int64_t a0 = 0; a0 < a_pad; a0 += QUERIES_AT_ONCE) {
      const auto [first, last] = columns(a0);
      for (int64_t j0 = first; j0 < last; j0 += WIDE)
        micro_tile<false>(&qs[a0 * d], d, block_keys + j0 * d, WIDE, d, &scores[a0 * KEY_BLOCK + j0], KEY_BLOCK);
    }
    // Each query vector sees its own run of the tile's keys: the online softmax's maximum, then the weights in place.
    for (int64_t a = 0; a < a_pad; ++a) {
      float* s = &scores[a * KEY_BLOCK];
      const int64_t from = a < a_size ? std::clamp<int64_t>(lower[a] - block, 0, width) : 0;
      const int64_t to = a < a_size ? std::clamp<int64_t>(upper[a] - block, from, width) : 0;
      const int64_t skip = query_skip && a < a_size ? query_skip[tile.first_row + a / r] : 0;
      if (skip) {  // the keys holding a group of the row's below its segment's: counted in that group's segment
        const int64_t* bits = key_bits + tile.key_first + block;
#pragma omp simd
        for (int64_t j = from; j < to; ++j) s[j] = (bits[j] & skip) != 0 ? none : s[j];  // a select, no branch
      }
      float top = a < a_size ? best[a] : none;
#pragma omp simd reduction(max : top)
      for (int64_t j = from; j < to; ++j) top = s[j] > top ? s[j] : top;
      if (top == none) {  // nothing seen by this query yet (or a padding vector): no weight
        std::fill(s, s + width_pad, 0.0f);
        continue;
      }
      if (top > best[a]) raise_maximum(top, best[a], total[a], &acc[a * d], d);
      float weights = 0.0f;
#pragma omp simd reduction(+ : weights)
      for (int64_t j = 0; j < width_pad; ++j) {
        const float shifted = s[j] - top;
        const float weight = exp_nonpositive(shifted < 0.0f ? shifted : 0.0f);
        s[j] = j >= from && j < to && s[j] > none ? weight : 0.0f;  // (skipped keys' scores are -inf)
        weights += s[j];
      }
      total[a] += weights;
    }
    // Weighted values: acc (A_pad, D) += weights (A_pad, width) x values (width, D), micro-tiles of QUERIES_AT_ONCE
    // query vectors by WIDE head dimensions (any head size: one dimension at a time), over their columns only.
    for (int64_t a0 = 0; a0 < a_pad; a0 += QUERIES_AT_ONCE) {
      const auto [first, end] = columns(a0);
      const int64_t last = std::min(end, width);  // (the weights of the other columns are zero)
      if (first >= last) continue;
      if (D > 0) {
        for (int64_t m0 = 0; m0 < d; m0 += WIDE)
          micro_tile<true>(&scores[a0 * KEY_BLOCK + first], KEY_BLOCK, block_values + first * d + m0, d, last - first,
                           &acc[a0 * d + m0], d);
      } else {
        for (int64_t i = 0; i < QUERIES_AT_ONCE; ++i) {
          float* acc_a = &acc[(a0 + i) * d];
          const float* w = &scores[(a0 + i) * KEY_BLOCK];
          for (int64_t j = first; j < last; ++j)
            for (int64_t m = 0; m < d; ++m) acc_a[m] += w[j] * block_values[j * d + m];
        }
      }
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
// keys of neighbours are equal or step by one: a segment's rows, or a band's). query_skip (N,) and key_bits (Nk,),
// optional: a row skips the keys whose bits meet its own (focus.attention.kernels.rectangle, `once`). Returns the output
// (N, R, D) and log-sum-exp (N, R) in float32; a row with no key gets lse -inf (and zeros).
std::tuple<at::Tensor, at::Tensor> rectangles(const at::Tensor& query, const at::Tensor& key,
                                                    const at::Tensor& value, const at::Tensor& key_first,
                                                    const at::Tensor& key_count, double scale,
                                                    const c10::optional<at::Tensor>& query_rows,
                                                    const c10::optional<at::Tensor>& key_rows,
                                                    const c10::optional<at::Tensor>& query_skip,
                                                    const c10::optional<at::Tensor>& key_bits, bool matrix_units) {
  TORCH_CHECK(query.device().is_cpu() && query.dim() == 3 && query.is_contiguous() && key.is_contiguous() &&
                  value.is_contiguous() && key.scalar_type() == query.scalar_type() &&
                  value.scalar_type() == query.scalar_type(),
              "rectangles: contiguous CPU query (N, R, D), key and value (Nk, D) of one dtype");
  TORCH_CHECK(query.size(2) <= focus_native::MAX_DIM, "rectangles: heads of at most ", focus_native::MAX_DIM,
              " dimensions");
  TORCH_CHECK(key_first.scalar_type() == at::kLong && key_count.scalar_type() == at::kLong &&
                  key_first.is_contiguous() && key_count.is_contiguous() &&
                  key_first.numel() == (query_rows ? query_rows->numel() : query.size(0)) &&
                  key_count.numel() == key_first.numel(),
              "rectangles: int64 key_first and key_count, one per query row");
  for (const auto& rows : {query_rows, key_rows, query_skip, key_bits})
    TORCH_CHECK(!rows || (rows->scalar_type() == at::kLong && rows->is_contiguous()), "rectangles: int64 row indexes");
  TORCH_CHECK(!query_skip == !key_bits, "rectangles: query_skip and key_bits together");
  const int64_t n = query_rows ? query_rows->numel() : query.size(0), r = query.size(1), d = query.size(2);
  const int64_t* q_index = query_rows ? query_rows->data_ptr<int64_t>() : nullptr;
  const int64_t* k_index = key_rows ? key_rows->data_ptr<int64_t>() : nullptr;
  const int64_t* skip = query_skip ? query_skip->data_ptr<int64_t>() : nullptr;
  const int64_t* bits = key_bits ? key_bits->data_ptr<int64_t>() : nullptr;
  const int64_t* first = key_first.data_ptr<int64_t>();
  const int64_t* count = key_count.data_ptr<int64_t>();
  const int64_t keys = k_index ? key_rows->numel() : key.size(0);
  if (focus_native::rectangles_on_matrix_units(query, matrix_units))  // bfloat16 on AMX: rectangle_amx.cpp
    return focus_native::rectangles_amx(query, key, value, first, count, n, scale, q_index, k_index, keys, skip, bits);
  auto out = at::empty({n, r, d}, query.options().dtype(at::kFloat));
  auto lse = at::full({n, r}, -std::numeric_limits<float>::infinity(), query.options().dtype(at::kFloat));
  const std::vector<Tile> tiles = focus_native::tiles_of(first, count, n, TILE_ROWS, WIDE);
  // Rows of no tile (no key) keep lse -inf; their output is never read, but is zeroed to be defined.
  focus_native::zero_rows_outside(tiles, n, r * d, out.data_ptr<float>());
  const int64_t tasks = std::min<int64_t>(tiles.size(), at::get_num_threads() * TASKS_PER_THREAD);
  // Every key once in float32 for all the tiles that read it (a segment's key is read by most of its tiles): the keys
  // transposed in panels of WIDE, (panels, D, WIDE) with key j in panel j / WIDE, column j % WIDE (zero past the last
  // key), so that a micro-tile reads its keys' dimension t as one contiguous vector; the values as (keys, D) rows,
  // read in place when they already are.
  const int64_t panel_count = (keys + WIDE - 1) / WIDE;
  auto panels = at::empty({panel_count, d, WIDE}, query.options().dtype(at::kFloat));
  const bool values_in_place = query.scalar_type() == at::kFloat && !k_index;
  auto values = values_in_place ? value : at::empty({keys, d}, query.options().dtype(at::kFloat));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "rectangles", [&] {
    const scalar_t* q_data = query.data_ptr<scalar_t>();
    const scalar_t* k_data = key.data_ptr<scalar_t>();
    const scalar_t* v_data = value.data_ptr<scalar_t>();
    float* panels_data = panels.data_ptr<float>();
    float* values_data = values.data_ptr<float>();
    at::parallel_for(0, panel_count, 64, [&](int64_t begin, int64_t end) {
      for (int64_t panel = begin; panel < end; ++panel) {
        const int64_t from = panel * WIDE, to = std::min(from + WIDE, keys);
        float* target = panels_data + panel * d * WIDE;
        if (to - from < WIDE)  // the last panel's columns past the last key: read by a block's last micro-tile
          for (int64_t m = 0; m < d; ++m) std::fill(target + m * WIDE + (to - from), target + (m + 1) * WIDE, 0.0f);
        for (int64_t j = from; j < to; ++j) {
          const int64_t row = k_index ? k_index[j] : j;
          for (int64_t m = 0; m < d; ++m) target[m * WIDE + j - from] = static_cast<float>(k_data[row * d + m]);
          if (!values_in_place)
            for (int64_t m = 0; m < d; ++m) values_data[j * d + m] = static_cast<float>(v_data[row * d + m]);
        }
      }
    });
    float* out_data = out.data_ptr<float>();
    float* lse_data = lse.data_ptr<float>();
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
      const int64_t a_pad = (TILE_ROWS * r + QUERIES_AT_ONCE - 1) / QUERIES_AT_ONCE * QUERIES_AT_ONCE;
      std::vector<float> qs(a_pad * d), scores(a_pad * KEY_BLOCK), acc(a_pad * d);
      std::vector<float> rows_state(2 * a_pad);
      std::vector<int64_t> limits(2 * a_pad);
      for (int64_t task = begin; task < end; ++task) {
        for (size_t t = task; t < tiles.size(); t += tasks) {
          auto tile = [&](auto head_size) {
            attend_tile<scalar_t, decltype(head_size)::value>(tiles[t], q_data, panels_data, values_data,
                                                               q_index, skip, bits, first, count, r, d,
                                                               static_cast<float>(scale), out_data, lse_data, qs,
                                                               scores, acc, rows_state, limits);
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
