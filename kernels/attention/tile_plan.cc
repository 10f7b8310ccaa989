#include "kernels/attention/tile_plan.h"

#include <algorithm>
#include <cstring>

#include "absl/hash/hash.h"
#include "absl/types/span.h"
#include "kernels/attention/attention_internal.h"

namespace recfleet::attention::internal {
namespace {

using cuda_impl::WorkItem;

constexpr int kTile = cuda_impl::kTileRows;

int64_t Work(const WorkItem& it) {
  return static_cast<int64_t>(it.inner_end - it.inner_begin) * it.q_tiles;
}

int64_t Tiles(int64_t rows, int64_t tile) { return (rows + tile - 1) / tile; }

}  // namespace

void SortLongestFirst(std::vector<WorkItem>& items) {
  if (items.size() < 2) return;
  int64_t max_work = 0, min_work = 0;
  for (const WorkItem& it : items) {
    max_work = std::max(max_work, Work(it));
    min_work = std::min(min_work, Work(it));
  }
  // Where works span no more than a few times the item count (short
  // histories), a counting sort: one pass instead of a merge sort's
  // log(n) passes over 48-byte items. Both are stable.
  if (min_work < 0 || max_work > 4 * static_cast<int64_t>(items.size()) + 1024) {
    std::stable_sort(items.begin(), items.end(),
                     [](const WorkItem& a, const WorkItem& b) { return Work(a) > Work(b); });
    return;
  }
  // start[max_work - w]: where the items of work w begin (longest first).
  std::vector<size_t> start(max_work + 2, 0);
  for (const WorkItem& it : items) ++start[max_work - Work(it) + 1];
  for (size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
  std::vector<WorkItem> sorted(items.size());
  for (const WorkItem& it : items) sorted[start[max_work - Work(it)]++] = it;
  items.swap(sorted);
}

namespace {

// Appends the query tiles of `rows` rows of one sequence (described by
// `base`) with the keys they see. Key ranges are monotone in the query, so a
// tile's first and last rows bound the keys of the whole tile.
void AddQueryTiles(const WorkItem& base, const AttentionOptions& o, int64_t rows,
                   std::vector<WorkItem>& out) {
  const int64_t lq = base.q_len, lk = base.k_len;
  for (int64_t m0 = 0; m0 < lq; m0 += rows) {
    WorkItem it = base;
    it.tile_row = static_cast<int>(m0);
    const KeyRange first = VisibleKeys(o, lq, lk, m0);
    const KeyRange last = VisibleKeys(o, lq, lk, std::min(lq, m0 + rows) - 1);
    it.inner_begin = static_cast<int>(first.begin);
    it.inner_end = static_cast<int>(std::max(first.begin, last.end));
    out.push_back(it);
  }
}

// Appends the key tiles of `rows` rows of one sequence (described by `base`)
// with the queries that see them.
void AddKeyTiles(const WorkItem& base, const AttentionOptions& o, int64_t rows,
                 std::vector<WorkItem>& out) {
  const int64_t lq = base.q_len, lk = base.k_len;
  for (int64_t n0 = 0; n0 < lk; n0 += rows) {
    WorkItem it = base;
    it.tile_row = static_cast<int>(n0);
    const int64_t n_last = std::min(lk, n0 + rows) - 1;
    // First query whose range ends after n0, last whose range starts at or
    // before n_last (both monotone): binary searches over [0, lq).
    int64_t lo = 0, hi = lq;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (VisibleKeys(o, lq, lk, mid).end > n0) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int64_t first = lo;
    lo = 0;
    hi = lq;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (VisibleKeys(o, lq, lk, mid).begin <= n_last) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t end = lo;
    it.inner_begin = static_cast<int>(first);
    it.inner_end = static_cast<int>(std::max(first, end));
    out.push_back(it);
  }
}

// Appends tiles[first..] (one sequence's forward tiles, in row order) to
// `out`, merging runs of consecutive tiles with the same short inner range
// (short-K/V cross-attention and PMA, no mask) into items of up to
// kWgmmaMaxGroup query tiles that load their K/V once.
void GroupQueryTiles(const std::vector<WorkItem>& tiles, size_t first,
                     std::vector<WorkItem>& out) {
  for (size_t i = first; i < tiles.size(); ++i) {
    const WorkItem& t = tiles[i];
    WorkItem* last = out.empty() ? nullptr : &out.back();
    if (i > first && last->inner_begin == t.inner_begin && last->inner_end == t.inner_end &&
        t.inner_end - t.inner_begin <= cuda_impl::kWgmmaResidentKeys &&
        last->q_tiles < cuda_impl::kWgmmaMaxGroup) {
      ++last->q_tiles;
    } else {
      out.push_back(t);
    }
  }
}

}  // namespace

TilePlan MakeTilePlan(const AttentionInputs& in, const AttentionOptions& o) {
  TilePlan plan;
  plan.block_kernel = o.mask == Mask::kBlock;
  // Every list's length first: one allocation each.
  int64_t q_tiles = 0, forward_tiles = 0, key_tiles = 0, wide_key_tiles = 0;
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    const int64_t lq = in.q.length(b), lk = in.k.length(b);
    q_tiles += Tiles(lq, kTile);
    forward_tiles += Tiles(lq, cuda_impl::kForwardTileRows);
    key_tiles += Tiles(lk, kTile);
    wide_key_tiles += Tiles(lk, cuda_impl::kWideKeyTileRows);
  }
  plan.query_tiles.reserve(q_tiles);
  plan.forward_tiles.reserve(forward_tiles);
  plan.grouped_tiles.reserve(forward_tiles);
  plan.key_tiles.reserve(key_tiles);
  plan.wide_key_tiles.reserve(wide_key_tiles);
  if (plan.block_kernel) plan.blocks.reserve(q_tiles);
  int64_t bias_base = 0;
  const int64_t heads = in.q.values.dim(1);
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    const int64_t lq = in.q.length(b), lk = in.k.length(b);
    if (lq != lk) plan.block_kernel = false;
    WorkItem base{};
    base.q_tiles = 1;
    base.q_start = in.q.offset(b);
    base.k_start = in.k.offset(b);
    base.bias_base = bias_base;
    base.q_len = static_cast<int>(lq);
    base.k_len = static_cast<int>(lk);
    bias_base += lq * lk * heads;
    AddQueryTiles(base, o, kTile, plan.query_tiles);
    const size_t first_tile = plan.forward_tiles.size();
    AddQueryTiles(base, o, cuda_impl::kForwardTileRows, plan.forward_tiles);
    GroupQueryTiles(plan.forward_tiles, first_tile, plan.grouped_tiles);
    for (int64_t m0 = 0; m0 < lq && lq == lk; m0 += kTile) {
      WorkItem blk = base;
      blk.tile_row = static_cast<int>(m0);
      blk.inner_begin = blk.tile_row;
      blk.inner_end = static_cast<int>(std::min(lk, m0 + kTile));
      plan.blocks.push_back(blk);
    }
    AddKeyTiles(base, o, kTile, plan.key_tiles);
    AddKeyTiles(base, o, cuda_impl::kWideKeyTileRows, plan.wide_key_tiles);
  }
  SortLongestFirst(plan.forward_tiles);
  SortLongestFirst(plan.grouped_tiles);
  SortLongestFirst(plan.query_tiles);
  SortLongestFirst(plan.key_tiles);
  SortLongestFirst(plan.wide_key_tiles);
  if (!plan.block_kernel) plan.blocks.clear();
  return plan;
}

double MeanStreamedTiles(const std::vector<WorkItem>& key_tiles) {
  double tiles = 0, weighted = 0;
  for (const WorkItem& it : key_tiles) {
    const double n = (it.inner_end - it.inner_begin + kTile - 1) / kTile;
    tiles += n;
    weighted += n * n;
  }
  return tiles > 0 ? weighted / tiles : 0.0;
}
TilePlanKey::TilePlanKey(int device, const AttentionInputs& in, const AttentionOptions& o)
    : device_(device),
      mask_(static_cast<int>(o.mask)),
      window_(o.mask == Mask::kSlidingWindow ? o.window : 0),
      q_batch_(in.q.batch_size()) {
  const int64_t nq = in.q.batch_size() + 1, nk = in.k.batch_size() + 1;
  offsets_.resize(nq + nk);
  auto fill = [](const JaggedView& j, int64_t n, int64_t* out) {
    if (j.offsets.dtype == DType::kInt64) {
      std::memcpy(out, j.offsets.data, n * sizeof(int64_t));
    } else {
      for (int64_t b = 0; b < n; ++b) out[b] = j.offset(b);
    }
  };
  fill(in.q, nq, offsets_.data());
  fill(in.k, nk, offsets_.data() + nq);
  hash_ = absl::HashOf(device_, mask_, window_, q_batch_, absl::MakeConstSpan(offsets_));
}

}  // namespace recfleet::attention::internal
