#ifndef RECFLEET_KERNELS_ATTENTION_TILE_MASK_H_
#define RECFLEET_KERNELS_ATTENTION_TILE_MASK_H_

// The mask of one sequence as key ranges per query row, and the class of a
// rectangular tile of its score matrix: every pair visible (a kernel's
// no-mask path), some (the per-element path) or none (skippable). Callable
// from host and device code, so that a CPU test (tile_mask_test, against
// the per-pair mask) checks the decisions the kernels take: the Hopper
// forward and backward (cuda_common.cuh, cuda_wgmma.cu, cuda_wgmma_bwd.cu)
// classify their tiles with it (bench/RESULTS.md, attention, sliding window
// tile classes).

#include "kernels/attention/cuda_kernels.h"

#if defined(__CUDACC__)
#define RECFLEET_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define RECFLEET_HOST_DEVICE inline
#endif

namespace recfleet::attention::cuda_impl {

// The keys [lo, hi) that query i (0 <= i < lq) of a sequence with lq
// queries and lk keys sees under `mask` (kMask*; `window` for kMaskWindow),
// the same ranges as internal::VisibleKeys; an empty range has hi == lo.
// For every mask lo and hi never decrease with i, the rows with an empty
// range come first, and the range of row i + 1 starts at or before the end
// of row i's (when that is not empty): ClassifyTile relies on all three.
RECFLEET_HOST_DEVICE void MaskKeyRange(int mask, int window, int lq, int lk, int i, int& lo,
                                       int& hi) {
  const int pq = i + lk - lq;
  lo = 0;
  hi = lk;
  if (mask == kMaskCausal || mask == kMaskWindow) hi = pq + 1 < lk ? pq + 1 : lk;
  if (mask == kMaskWindow) lo = pq - window + 1 > 0 ? pq - window + 1 : 0;
  if (mask == kMaskBlock) {
    const int blk = pq >= 0 ? pq / 64 : -((-pq + 63) / 64);
    lo = blk * 64 > 0 ? blk * 64 : 0;
    hi = blk * 64 + 64 < lk ? blk * 64 + 64 : lk;
  }
  if (hi < lo) hi = lo;
}

enum TileClass : int {
  kTileOutside = 0,  // no pair of the tile inside the sequence is visible
  kTilePartial = 1,  // some are: mask per element
  kTileFull = 2,     // the tile lies inside the sequence and every pair is visible
};

// The class of queries [i0, i0 + rows) x keys [j0, j0 + cols) (i0, j0 >= 0;
// rows and keys past the sequence end count as not visible). Four range
// look-ups: the ranges are monotone and chained (MaskKeyRange), so the keys
// the rows see together are [lo(first row), hi(last row inside)).
RECFLEET_HOST_DEVICE TileClass ClassifyTile(int mask, int window, int lq, int lk, int i0, int rows,
                                            int j0, int cols) {
  const int i_last = (i0 + rows < lq ? i0 + rows : lq) - 1;
  if (rows <= 0 || cols <= 0 || i_last < i0) return kTileOutside;
  int lo_first, hi_first, lo_last, hi_last;
  MaskKeyRange(mask, window, lq, lk, i0, lo_first, hi_first);
  MaskKeyRange(mask, window, lq, lk, i_last, lo_last, hi_last);
  if (hi_last <= j0 || lo_first >= j0 + cols) return kTileOutside;
  if (i0 + rows <= lq && j0 + cols <= lk && lo_last <= j0 && hi_first >= j0 + cols) {
    return kTileFull;
  }
  return kTilePartial;
}

}  // namespace recfleet::attention::cuda_impl

#endif  // RECFLEET_KERNELS_ATTENTION_TILE_MASK_H_
