#ifndef RECFLEET_KERNELS_ATTENTION_TILE_PLAN_H_
#define RECFLEET_KERNELS_ATTENTION_TILE_PLAN_H_

// The CUDA attention's tile schedule, planned on the host from the offsets
// and the mask: which (sequence, tile) items every kernel runs, with the
// inner rows each visits, non-empty tiles only, longest first. Pure host
// code (no CUDA calls), so it is built and tested on any machine; the
// launcher (attention_cuda.cc) uploads a plan once per distinct key and
// reuses it for every layer, forward and backward, that shares it.

#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/cuda_kernels.h"

namespace recfleet::attention::internal {

struct TilePlan {
  std::vector<cuda_impl::WorkItem> forward_tiles;   // kForwardTileRows queries each
  std::vector<cuda_impl::WorkItem> grouped_tiles;   // the Hopper forward's (forward tiles grouped)
  std::vector<cuda_impl::WorkItem> query_tiles;     // dQ
  std::vector<cuda_impl::WorkItem> key_tiles;       // dK/dV
  std::vector<cuda_impl::WorkItem> wide_key_tiles;  // the Hopper dK/dV pass's
  std::vector<cuda_impl::WorkItem> blocks;          // BlockAttention (empty if not applicable)
  bool block_kernel = false;
};

// The plan of `in`'s offsets under `o`'s mask (values are not read; only
// the heads count of q.values, for the bias layout). Offsets must be valid
// (ValidateAttention).
TilePlan MakeTilePlan(const AttentionInputs& in, const AttentionOptions& o);

// Orders items so the longest start first (the hardware hands CTAs out in
// grid order, so this is longest-processing-time-first over the SMs and the
// tail holds only short tiles). An item's work is its inner rows times its
// query tiles; items of equal work keep their order (stable).
void SortLongestFirst(std::vector<cuda_impl::WorkItem>& items);

// Work-weighted mean number of streamed query tiles per key tile of the
// Hopper dK/dV pass: sum(n^2) / sum(n) over its items, n the item's 64-row
// query tiles.
double MeanStreamedTiles(const std::vector<cuda_impl::WorkItem>& key_tiles);

// What a plan depends on: the mask (and the window of a sliding window) and
// both offset arrays. Equal keys give equal plans, whatever the values, the
// heads or the activation. Hashable (absl), so a cache looks it up without
// serializing the offsets; the hash is computed once, at construction.
class TilePlanKey {
 public:
  TilePlanKey(int device, const AttentionInputs& in, const AttentionOptions& o);

  bool operator==(const TilePlanKey& other) const {
    return hash_ == other.hash_ && device_ == other.device_ && mask_ == other.mask_ &&
           window_ == other.window_ && q_batch_ == other.q_batch_ &&
           offsets_ == other.offsets_;
  }
  template <typename H>
  friend H AbslHashValue(H h, const TilePlanKey& key) {
    return H::combine(std::move(h), key.hash_);
  }

  // q's offsets then k's, as int64.
  const std::vector<int64_t>& offsets() const { return offsets_; }
  int64_t batch_size() const { return q_batch_; }

 private:
  int device_;
  int mask_;
  int64_t window_;
  int64_t q_batch_;
  std::vector<int64_t> offsets_;
  size_t hash_;
};

}  // namespace recfleet::attention::internal

#endif  // RECFLEET_KERNELS_ATTENTION_TILE_PLAN_H_
