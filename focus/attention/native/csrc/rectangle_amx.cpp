// The rectangles (rectangle.cpp) in bfloat16 on a CPU with matrix units for it (Intel AMX: what ATen's batch-reduce
// GEMM packs for, `at::native::cpublas::could_pack`). The same tiles of rows, the same pairs and the same online
// softmax in float32, but a tile's scores and weighted values, up to CHUNK keys at a time, are each one call of that
// GEMM (oneDNN's brgemm ukernel, the one PyTorch's own flash attention calls on such CPUs) on bfloat16 operands, where
// rectangle.cpp converts the keys to float32 and multiplies them with AVX2. On an AMX Xeon the unmodified model's
// bfloat16 attention runs on the matrix units, and the vector path lost to it several times over per pair
// (docs/decomposition.md has the numbers).
//
// As in PyTorch's flash attention, the softmax weights are rounded to bfloat16 for their product with the values
// (the scores, their maximum, the sums of weights and the outputs stay float32); a row's sum of weights is the sum of
// its rounded weights, so that its output is a mean of values with weights that sum to one.

#include "kernels.h"

#include <ATen/native/CPUBlas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include "online_softmax.h"
#include "tiles.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace {

using at::BFloat16;
using focus_native::exp_nonpositive;
#if defined(__AVX512F__)
using focus_native::exp_nonpositive_16;
#endif
using focus_native::raise_maximum;
using focus_native::Tile;
namespace cpublas = at::native::cpublas;

// Keys a tile scores and weighs together (at most): the N of its scores' product and the K of its weighted values'.
// A tile's run of keys is one product up to this width, rounded up to a multiple of WIDTH_STEP (the GEMM compiles a
// kernel per shape: a few widths, a few kernels). Fewer, wider products: each call has its cost (the dispatch, the
// matrix unit's tile loads); at 64 keys a call the rectangles of an 8K prompt took 131 ms, at up to 512, 108.
constexpr int64_t CHUNK = 512;
constexpr int64_t WIDTH_STEP = 64;
// Query vectors per tile (rows times R query heads): the M of both products. 64, 128 and 256 took the rectangles of
// an 8K prompt in the same time; a band's tile reads its rows' windows plus its own length of keys, and took 17, 21
// and 25 ms in that run (64 and 128 within the noise of each other in a later one, in turns).
constexpr int64_t TILE_VECTORS = 64;
// The M of the products in steps of this (the matrix unit's tiles are 16 rows): the GEMM compiles a kernel for each
// shape on its first call, and at one per row count the first prefill spent more time compiling than multiplying.
constexpr int64_t M_STEP = 32;
constexpr int64_t TASKS_PER_THREAD = 8;  // as rectangle.cpp: tiles dealt round-robin, balanced work

// Every key and value once, in the layouts the GEMM reads its right operand in (VNNI: pairs along K interleaved):
// the keys as the (D, keys) right operand of the scores, (D / 2, stride, 2), so that any run of keys is a block of it
// with the same row stride; the values as the (keys, D) right operand of the weighted values, (stride / 2, D, 2), so
// that any run from an even key is one. Zeros past the last key: a product's width rounded up reads them (never
// weighs them).
void pack(const BFloat16* k_data, const BFloat16* v_data, const int64_t* k_index, int64_t keys, int64_t stride,
          int64_t d, BFloat16* key_pairs, BFloat16* value_pairs) {
  at::parallel_for(0, stride / 2, 64, [&](int64_t begin, int64_t end) {
    for (int64_t pair = begin; pair < end; ++pair) {
      for (int64_t j = 2 * pair; j < 2 * pair + 2; ++j) {
        const bool real = j < keys;
        const int64_t row = real ? (k_index ? k_index[j] : j) : 0;
        const BFloat16* k_row = k_data + row * d;
        const BFloat16* v_row = v_data + row * d;
        for (int64_t m = 0; m < d; ++m) {
          key_pairs[(m / 2 * stride + j) * 2 + m % 2] = real ? k_row[m] : BFloat16(0.0f);
          value_pairs[(pair * d + m) * 2 + j % 2] = real ? v_row[m] : BFloat16(0.0f);
        }
      }
    }
  });
}

// The softmax weights exp(score * scale - top) of `count` scores (a multiple of 16; -inf: no weight) rounded to
// bfloat16 (to nearest even), written to `weight`; returns the sum of the rounded weights.
inline float bfloat16_weights(const float* score, int64_t count, float scale, float top, BFloat16* weight) {
  constexpr float none = -std::numeric_limits<float>::infinity();
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  // 16 lanes at a time, the rounding one instruction (every CPU with AMX has AVX-512 BF16; the compiler does not
  // vectorize the conversion below)
  const __m512 scale_v = _mm512_set1_ps(scale), top_v = _mm512_set1_ps(top), none_v = _mm512_set1_ps(none);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; j += 16) {
    const __m512 raw = _mm512_loadu_ps(score + j);
    const __m512 shifted = _mm512_min_ps(_mm512_fmsub_ps(raw, scale_v, top_v), _mm512_setzero_ps());
    const __m512 w = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(raw, none_v, _CMP_GT_OQ), exp_nonpositive_16(shifted));
    const __m256i rounded = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(w));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(weight + j), rounded);
    sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16)));
  }
  return _mm512_reduce_add_ps(sum);
#else
  uint16_t* bits_out = reinterpret_cast<uint16_t*>(weight);
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < count; ++j) {
    const float shifted = score[j] * scale - top;
    const float w = score[j] > none ? exp_nonpositive(shifted < 0.0f ? shifted : 0.0f) : 0.0f;
    uint32_t bits = __builtin_bit_cast(uint32_t, w);  // rounded to nearest even in integers: it vectorizes
    bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
    total += __builtin_bit_cast(float, bits);
    bits_out[j] = static_cast<uint16_t>(bits >> 16);
  }
  return total;
#endif
}

// A thread's buffers for its tiles.
struct Scratch {
  explicit Scratch(int64_t vectors, int64_t d)
      : queries(vectors * d), weights(vectors * CHUNK), scores(vectors * CHUNK), acc(vectors * d), best(vectors),
        total(vectors), lower(vectors), upper(vectors) {}
  std::vector<BFloat16> queries, weights;
  std::vector<float> scores, acc, best, total;
  std::vector<int64_t> lower, upper;
};

// One tile: its query vectors (row, head), A = rows x R of them, against its keys, CHUNK at a time.
void attend_tile(const Tile& tile, const BFloat16* q_data, const BFloat16* key_pairs, const BFloat16* value_pairs,
                 int64_t stride, const int64_t* query_index, const int64_t* query_skip, const int64_t* key_bits,
                 const int64_t* key_first, const int64_t* key_count, int64_t r, int64_t d, float scale, float* out,
                 float* lse, Scratch& s) {
  constexpr float none = -std::numeric_limits<float>::infinity();
  const int64_t a_size = tile.rows * r;
  for (int64_t a = 0; a < a_size; ++a) {  // the queries as they are: the scale goes onto the float32 scores
    const int64_t row = tile.first_row + a / r;
    const BFloat16* q_row = q_data + ((query_index ? query_index[row] : row) * r + a % r) * d;
    std::copy(q_row, q_row + d, s.queries.data() + a * d);
    s.best[a] = none;
    s.total[a] = 0.0f;
    s.lower[a] = key_first[row] - tile.key_first;
    s.upper[a] = s.lower[a] + key_count[row];
  }
  // The products take M_STEP rows at a time (zero queries and weights past the tile's): a few shapes, a few kernels.
  const int64_t m_rows = (a_size + M_STEP - 1) / M_STEP * M_STEP;
  std::fill(s.queries.begin() + a_size * d, s.queries.begin() + m_rows * d, BFloat16(0.0f));
  std::fill(s.weights.begin() + a_size * CHUNK, s.weights.begin() + m_rows * CHUNK, BFloat16(0.0f));
  std::fill(s.acc.begin(), s.acc.begin() + m_rows * d, 0.0f);
  for (int64_t chunk = 0; chunk < tile.key_count; chunk += CHUNK) {
    const int64_t first_key = tile.key_first + chunk;  // even: the tile starts at an even key
    const int64_t width = std::min(CHUNK, tile.key_count - chunk);
    const int64_t padded = (width + WIDTH_STEP - 1) / WIDTH_STEP * WIDTH_STEP;
    cpublas::brgemm(m_rows, padded, d, d, stride, CHUNK, false, s.queries.data(), key_pairs + first_key * 2,
                    s.scores.data(), true);
    for (int64_t a = 0; a < a_size; ++a) {
      float* score = &s.scores[a * CHUNK];
      const int64_t from = std::clamp<int64_t>(s.lower[a] - chunk, 0, width);
      const int64_t to = std::clamp<int64_t>(s.upper[a] - chunk, from, width);
      std::fill(score, score + from, none);  // the keys outside the row's run: -inf, as the skipped ones
      std::fill(score + to, score + padded, none);
      const int64_t skip = query_skip ? query_skip[tile.first_row + a / r] : 0;
      if (skip) {  // the keys holding a group of the row's below its segment's: counted in that group's segment
        const int64_t* bits = key_bits + first_key;
#pragma omp simd
        for (int64_t j = from; j < to; ++j) score[j] = (bits[j] & skip) != 0 ? none : score[j];  // a select
      }
      float chunk_top = none;  // of the unscaled scores (the scale is positive)
#pragma omp simd reduction(max : chunk_top)
      for (int64_t j = from; j < to; ++j) chunk_top = score[j] > chunk_top ? score[j] : chunk_top;
      const float top = std::max(s.best[a], chunk_top * scale);
      BFloat16* weight = &s.weights[a * CHUNK];
      if (top == none) {  // nothing seen by this query yet: no weight
        std::fill(weight, weight + padded, BFloat16(0.0f));
        continue;
      }
      if (top > s.best[a]) raise_maximum(top, s.best[a], s.total[a], &s.acc[a * d], d);
      s.total[a] += bfloat16_weights(score, padded, scale, top, weight);
    }
    cpublas::brgemm(m_rows, d, padded, CHUNK, d, d, true, s.weights.data(), value_pairs + first_key * d, s.acc.data(),
                    true);
  }
  for (int64_t a = 0; a < a_size; ++a) {
    float* o = out + (tile.first_row * r + a) * d;
    if (s.total[a] == 0.0f) {  // no key at all: no part (lse stays -inf, the output zero)
      std::fill(o, o + d, 0.0f);
      continue;
    }
    const float inverse = 1.0f / s.total[a];
    for (int64_t m = 0; m < d; ++m) o[m] = s.acc[a * d + m] * inverse;
    lse[tile.first_row * r + a] = s.best[a] + std::log(s.total[a]);
  }
}

}  // namespace

namespace focus_native {

bool matrix_units() { return cpublas::could_pack(at::kBFloat16); }

bool rectangles_on_matrix_units(const at::Tensor& query, bool asked) {
  return asked && query.scalar_type() == at::kBFloat16 && query.size(2) % 2 == 0 && matrix_units();
}

std::tuple<at::Tensor, at::Tensor> rectangles_amx(const at::Tensor& query, const at::Tensor& key,
                                                  const at::Tensor& value, const int64_t* first, const int64_t* count,
                                                  int64_t n, double scale, const int64_t* q_index,
                                                  const int64_t* k_index, int64_t keys, const int64_t* skip,
                                                  const int64_t* bits) {
  const int64_t r = query.size(1), d = query.size(2);
  auto out = at::empty({n, r, d}, query.options().dtype(at::kFloat));
  auto lse = at::full({n, r}, -std::numeric_limits<float>::infinity(), query.options().dtype(at::kFloat));
  const std::vector<Tile> tiles = tiles_of(first, count, n, std::max<int64_t>(1, TILE_VECTORS / r), 2);
  zero_rows_outside(tiles, n, r * d, out.data_ptr<float>());  // rows with no key: never read, but defined
  // Room for the widest product from the last tile's first key: its width rounded up, past the last key.
  const int64_t stride = (keys + WIDTH_STEP + 1) / 2 * 2;
  auto key_pairs = at::empty({stride * d}, query.options());
  auto value_pairs = at::empty({stride * d}, query.options());
  pack(key.data_ptr<BFloat16>(), value.data_ptr<BFloat16>(), k_index, keys, stride, d, key_pairs.data_ptr<BFloat16>(),
       value_pairs.data_ptr<BFloat16>());
  const int64_t tasks = std::min<int64_t>(tiles.size(), at::get_num_threads() * TASKS_PER_THREAD);
  const BFloat16* q_data = query.data_ptr<BFloat16>();
  float* out_data = out.data_ptr<float>();
  float* lse_data = lse.data_ptr<float>();
  at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch((std::max<int64_t>(1, TILE_VECTORS / r) * r + M_STEP - 1) / M_STEP * M_STEP, d);
    for (int64_t task = begin; task < end; ++task)
      for (size_t t = task; t < tiles.size(); t += tasks)
        attend_tile(tiles[t], q_data, key_pairs.data_ptr<BFloat16>(), value_pairs.data_ptr<BFloat16>(), stride,
                    q_index, skip, bits, first, count, r, d, static_cast<float>(scale), out_data, lse_data, scratch);
    cpublas::brgemm_release(true);  // the matrix units' configuration this thread set
  });
  return {out, lse};
}

}  // namespace focus_native
