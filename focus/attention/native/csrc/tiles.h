// The tiles the rectangles' kernels deal to the cores (rectangle.cpp, rectangle_amx.cpp): runs of consecutive query
// rows that read overlapping runs of keys.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace focus_native {

struct Tile {
  int64_t first_row, rows, key_first, key_count;
};

// Consecutive rows whose first keys are equal (a segment's rows) or step by one (a band's), at most `max_rows`: a
// tile reads the keys from its first row's first key, rounded down to a multiple of `align` (the kernel's layout of
// the keys starts a panel or block there; the keys before the row's are read, never weighed), to the furthest any of
// its rows reads.
inline std::vector<Tile> tiles_of(const int64_t* key_first, const int64_t* key_count, int64_t n, int64_t max_rows,
                                  int64_t align) {
  std::vector<Tile> tiles;
  for (int64_t i = 0; i < n;) {
    int64_t end = i + 1, stop = key_first[i] + key_count[i];
    while (end < n && end - i < max_rows && key_first[end] >= key_first[end - 1] &&
           key_first[end] - key_first[i] <= end - i) {
      stop = std::max(stop, key_first[end] + key_count[end]);
      ++end;
    }
    const int64_t start = key_first[i] / align * align;
    if (stop > key_first[i]) tiles.push_back({i, end - i, start, stop - start});
    i = end;
  }
  return tiles;
}

// Zeroes the rows of `out` (n rows of `row_size` numbers) that no tile covers (rows with no key in a tile of their
// own): a tile writes every row of its, so the rest alone need writing, where zeroing the whole output first took
// about as long as the merge.
inline void zero_rows_outside(const std::vector<Tile>& tiles, int64_t n, int64_t row_size, float* out) {
  int64_t next = 0;
  for (const Tile& tile : tiles) {
    std::fill(out + next * row_size, out + tile.first_row * row_size, 0.0f);
    next = tile.first_row + tile.rows;
  }
  std::fill(out + next * row_size, out + n * row_size, 0.0f);
}

}  // namespace focus_native
