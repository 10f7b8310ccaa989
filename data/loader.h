#ifndef RECFLEET_DATA_LOADER_H_
#define RECFLEET_DATA_LOADER_H_

// The epoch loader: turns dataset files into per-step, per-rank batches.
//
// Epoch order: this instance's blocks (every num_instances-th block of the
// files, so instances split the data without overlap) are permuted by
// (seed, epoch) and cut into shuffle groups of `shuffle_blocks` blocks; the
// rows of each group are permuted by (seed, epoch, group). Step s takes the
// window of positions [s * W, (s + 1) * W), W = ranks x K x base_batch,
// prices each sample with the cost model (on the length of
// `length_feature`) and deals the window to the ranks with the policy.
//
// Step(epoch, step) is a pure function of the options and its arguments:
// any step can be computed at any time, so a restarted loader resumes at
// the first undelivered step and neither drops nor repeats a sample. Every
// sample of the instance is delivered exactly once per epoch (the short
// last step included unless drop_remainder). Memory: the block cache
// (about two shuffle groups of decoded blocks) and one group's row
// permutation; block data is read with positioned reads, verified by CRC,
// and copied once, from the read buffer into the rank batches.
//
// Not thread-safe: callers serialize Plan() and Step() calls; GatherRank
// on a plan is thread-safe.

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "data/bbs.h"
#include "data/cost_model.h"
#include "data/dataset_file.h"

namespace recfleet::data {

struct LoaderOptions {
  std::vector<std::string> files;
  DealOptions deal;
  Policy policy = Policy::kRecfleet;
  CostModel cost;
  // Jagged feature whose length prices a sample; "" = the file's
  // "length_feature" metadata, else "history_items".
  std::string length_feature;
  uint64_t seed = 1;
  int shuffle_blocks = 16;
  // This instance serves ranks [first_rank, first_rank + deal.ranks) of the
  // job from every num_instances-th block, starting at block `instance`.
  int instance = 0;
  int num_instances = 1;
  int first_rank = 0;
  bool drop_remainder = false;
};

struct RankBatch {
  int64_t epoch = 0;
  int64_t step = 0;
  int rank = 0;  // Job-wide rank (first_rank + local rank).
  Batch samples;
  // Row offsets of the base batches in `samples` (base batches + 1 entries).
  std::vector<uint32_t> base_batch_offsets;
  double cost = 0;
};

// One step dealt but not yet gathered: which rows each rank gets, with the
// blocks holding them pinned. Immutable; GatherRank may run on many
// threads at once (one per rank).
struct StepPlan {
  struct Sample {
    const BlockView* block;
    uint32_t row;
  };
  int64_t epoch = 0;
  int64_t step = 0;
  int first_rank = 0;
  std::shared_ptr<const Schema> schema;
  int length_col = -1;
  std::vector<Sample> samples;  // The window, in epoch order.
  Deal deal;                    // Indices into `samples`.
  double gap = 0;
  double naive_gap = 0;
  std::vector<std::shared_ptr<const BlockView>> pinned;
};

// Copies local rank `rank`'s samples out of the plan's blocks. Thread-safe.
RankBatch GatherRank(const StepPlan& plan, int rank);

struct StepBatches {
  int64_t epoch = 0;
  int64_t step = 0;
  std::vector<RankBatch> ranks;
  double gap = 0;        // Straggler gap of the policy's dealing.
  double naive_gap = 0;  // Gap of consecutive dealing of the same window.
};

class Loader {
 public:
  static absl::StatusOr<std::unique_ptr<Loader>> Open(const LoaderOptions& options);

  const std::shared_ptr<const Schema>& schema() const { return schema_; }
  const LoaderOptions& options() const { return options_; }
  // The schema column whose length prices a sample.
  int length_column() const { return length_col_; }
  // Samples this instance delivers per epoch, and the steps that takes.
  int64_t samples_per_epoch() const { return num_samples_; }
  int64_t steps_per_epoch() const;

  // Deals (epoch, step): cheap next to gathering, which callers may then
  // spread over threads with GatherRank.
  absl::StatusOr<std::shared_ptr<const StepPlan>> Plan(int64_t epoch, int64_t step);
  // The batches of every rank of this instance for (epoch, step): Plan,
  // then GatherRank for each rank.
  absl::StatusOr<StepBatches> Step(int64_t epoch, int64_t step);

 private:
  struct BlockId {
    uint32_t file;
    uint32_t block;
    uint32_t rows;
  };
  struct RowRef {
    uint32_t block;  // Index into blocks_.
    uint32_t row;
  };

  explicit Loader(LoaderOptions options) : options_(std::move(options)) {}
  void PrepareEpoch(int64_t epoch);
  const std::vector<RowRef>& GroupOrder(size_t group);
  absl::StatusOr<std::shared_ptr<const BlockView>> GetBlock(uint32_t block);

  LoaderOptions options_;
  std::vector<std::unique_ptr<DatasetFile>> files_;
  std::shared_ptr<const Schema> schema_;
  int length_col_ = -1;
  std::vector<BlockId> blocks_;  // This instance's blocks, in file order.
  int64_t num_samples_ = 0;

  // Per-epoch order: blocks_ indices permuted, and group start positions.
  int64_t epoch_ = -1;
  std::vector<uint32_t> block_perm_;
  std::vector<int64_t> group_start_;  // groups + 1 entries.
  // Row orders of recently used groups (most recent first).
  std::list<std::pair<size_t, std::vector<RowRef>>> group_orders_;
  // Verified blocks, least recently used last. Plans share them; an
  // evicted block's buffer is reused once no plan holds it.
  std::list<std::pair<uint32_t, std::shared_ptr<BlockView>>> cache_;
  size_t cache_capacity_ = 0;
};

// The length (of the loader's length feature) of every sample of the
// window of (epoch, step), in the order the loader deals them: what the
// policies price.
std::vector<int64_t> WindowLengths(const StepPlan& plan);

// WindowLengths of every full step of epochs 0..epochs-1, from the
// loader's own plans: `balance-report` on a dataset compares the policies on
// exactly the windows this loader will deal (a user's rows stay together
// within groups of blocks, so windows are not independent draws).
absl::StatusOr<std::vector<std::vector<int64_t>>> EpochWindows(Loader& loader, int epochs);

// Expands "a.rfd,b.rfd", directories (every *.rfd inside, sorted) and
// plain paths into the file list.
absl::StatusOr<std::vector<std::string>> ExpandDatasetPaths(const std::string& spec);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_LOADER_H_
