#ifndef RECFLEET_KERNELS_QUANT_TILED_TESTING_H_
#define RECFLEET_KERNELS_QUANT_TILED_TESTING_H_

// Matrices laid one after another in a flat buffer, as an FSDP unit holds
// weights, and the TiledPieces of a holder's range of that buffer: the
// tiled-piece tests' layout (quantize.h TiledPiece).

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/quant/quantize.h"

namespace recfleet {

struct TiledMatrices {
  explicit TiledMatrices(std::vector<std::pair<int64_t, int64_t>> rows_cols) : shapes(std::move(rows_cols)) {
    for (const auto& [r, c] : shapes) {
      offsets.push_back(numel), first_tiles.push_back(tiles);
      numel += r * c, tiles += TileCount(r, c);
    }
  }
  // The pieces of the holder of flat range [b, e), one per matrix it meets,
  // each with its flat offset.
  std::vector<std::pair<int64_t, TiledPiece>> PiecesOf(int64_t b, int64_t e) const {
    std::vector<std::pair<int64_t, TiledPiece>> out;
    for (size_t m = 0; m < shapes.size(); ++m) {
      const int64_t mb = offsets[m], me = mb + shapes[m].first * shapes[m].second;
      const int64_t lo = std::max(b, mb), hi = std::min(e, me);
      if (lo < hi) out.push_back({lo, TiledPiece{hi - lo, lo - mb, shapes[m].second, first_tiles[m]}});
    }
    return out;
  }

  std::vector<std::pair<int64_t, int64_t>> shapes;  // (rows, cols)
  std::vector<int64_t> offsets, first_tiles;
  int64_t numel = 0, tiles = 0;
};

}  // namespace recfleet

#endif  // RECFLEET_KERNELS_QUANT_TILED_TESTING_H_
