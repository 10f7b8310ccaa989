#include "kernels/attention/tile_mask.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recfleet::attention::cuda_impl {
namespace {

// The mask of one (query, key) pair as attention.h states it, with
// pq = i + lk - lq the query's position among the keys.
bool Visible(int mask, int window, int lq, int lk, int i, int j) {
  if (i < 0 || i >= lq || j < 0 || j >= lk) return false;
  const int64_t pq = static_cast<int64_t>(i) + lk - lq;
  switch (mask) {
    case kMaskCausal:
      return j <= pq;
    case kMaskWindow:
      return j <= pq && pq - window < j;
    case kMaskBlock: {
      auto floor64 = [](int64_t x) { return x >= 0 ? x / 64 : -((-x + 63) / 64); };
      return floor64(pq) == floor64(j);
    }
    default:
      return true;
  }
}

// Every pair of the tile, counted.
TileClass BruteForce(int mask, int window, int lq, int lk, int i0, int rows, int j0, int cols) {
  int visible = 0;
  for (int i = i0; i < i0 + rows; ++i) {
    for (int j = j0; j < j0 + cols; ++j) visible += Visible(mask, window, lq, lk, i, j);
  }
  if (visible == 0) return kTileOutside;
  return visible == rows * cols ? kTileFull : kTilePartial;
}

struct Shape {
  int lq, lk;
};

// Lengths around the tile sizes (0, 1, 63..65, 127..129, ...), sequences
// shorter than the window and longer, self and cross (lq != lk both ways).
std::vector<Shape> Shapes() {
  const std::vector<int> lens = {0, 1, 2, 63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 383, 520};
  std::vector<Shape> out;
  for (int l : lens) out.push_back({l, l});
  for (int lq : {1, 64, 129, 300}) {
    for (int lk : {0, 1, 65, 128, 257}) {
      if (lq != lk) out.push_back({lq, lk});
    }
  }
  return out;
}

// The classes that the kernels' tile grids meet: tiles of 64 and 128 rows
// from row 0 of each side, and from the planner's unaligned inner-range
// starts (any offset), against a per-pair count.
TEST(TileMaskTest, ClassifyTileMatchesEveryPair) {
  int checked = 0, full = 0, outside = 0;
  for (int mask : {kMaskNone, kMaskCausal, kMaskWindow, kMaskBlock}) {
    for (int window : {1, 2, 63, 64, 100, 128, 150, 256, 300}) {
      if (mask != kMaskWindow && window != 1) continue;
      for (const Shape& s : Shapes()) {
        for (int rows : {64, 128}) {
          for (int cols : {64, 128}) {
            for (int offset : {0, 1, 37, 63}) {
              for (int i0 = 0; i0 < s.lq + rows; i0 += rows) {
                for (int j0 = offset; j0 < s.lk + cols; j0 += cols) {
                  const TileClass want =
                      BruteForce(mask, window, s.lq, s.lk, i0, rows, j0, cols);
                  ASSERT_EQ(ClassifyTile(mask, window, s.lq, s.lk, i0, rows, j0, cols), want)
                      << absl::StrCat("mask ", mask, " window ", window, " lq ", s.lq, " lk ",
                                      s.lk, " rows [", i0, ", +", rows, ") keys [", j0, ", +",
                                      cols, ")");
                  ++checked;
                  full += want == kTileFull;
                  outside += want == kTileOutside;
                }
              }
            }
          }
        }
      }
    }
  }
  // The grid met all three classes many times over.
  EXPECT_GT(full, 1000);
  EXPECT_GT(outside, 1000);
  EXPECT_GT(checked - full - outside, 1000);
}

// The key range of every row equals the visible keys counted pair by pair.
TEST(TileMaskTest, MaskKeyRangeMatchesEveryPair) {
  for (int mask : {kMaskNone, kMaskCausal, kMaskWindow, kMaskBlock}) {
    for (int window : {1, 5, 64, 256}) {
      for (const Shape& s : Shapes()) {
        for (int i = 0; i < s.lq; ++i) {
          int lo, hi;
          MaskKeyRange(mask, window, s.lq, s.lk, i, lo, hi);
          ASSERT_LE(lo, hi);
          for (int j = -1; j <= s.lk; ++j) {
            ASSERT_EQ(j >= lo && j < hi, Visible(mask, window, s.lq, s.lk, i, j))
                << "mask " << mask << " window " << window << " lq " << s.lq << " lk " << s.lk
                << " query " << i << " key " << j;
          }
        }
      }
    }
  }
}

// Sliding window W = 256 in the benchmark's tiling: a 128-query tile's
// warpgroup (64 rows) meets one full 128-key tile and two partial ones in
// the forward; the backward's 64-row warpgroups see six 64-row streamed
// tiles, one of them outside (the tile the kernels skip).
TEST(TileMaskTest, WindowTilesOfALongSequence) {
  const int l = 4096, w = 256, q0 = 1024;
  int lo, hi, unused;
  MaskKeyRange(kMaskWindow, w, l, l, q0, lo, unused);
  MaskKeyRange(kMaskWindow, w, l, l, q0 + 127, unused, hi);
  for (int c = 0; c < 2; ++c) {
    int counts[3] = {0, 0, 0};
    for (int j0 = lo; j0 < hi; j0 += 128) {
      ++counts[ClassifyTile(kMaskWindow, w, l, l, q0 + 64 * c, 64, j0, 128)];
    }
    EXPECT_EQ(counts[kTileOutside], 0);
    EXPECT_EQ(counts[kTilePartial], 2);
    EXPECT_EQ(counts[kTileFull], 1);
    int streamed[3] = {0, 0, 0};
    for (int j0 = lo; j0 < hi; j0 += 64) {
      ++streamed[ClassifyTile(kMaskWindow, w, l, l, q0 + 64 * c, 64, j0, 64)];
    }
    EXPECT_EQ(streamed[kTileOutside], 1) << "warpgroup " << c;
    EXPECT_EQ(streamed[kTilePartial], 2) << "warpgroup " << c;
    EXPECT_EQ(streamed[kTileFull], 3) << "warpgroup " << c;
  }
}

}  // namespace
}  // namespace recfleet::attention::cuda_impl
