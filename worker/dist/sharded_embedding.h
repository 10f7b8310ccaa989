#ifndef RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_H_
#define RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_H_

// Embedding tables sharded over a model-parallel group ("table group"),
// table-wise (a whole table on one rank), row-wise (contiguous row blocks on
// a list of ranks) or column-wise (contiguous column slices on a list of
// ranks), as a plan places them, optionally replicated across a replica
// group that trains the same shards on other data (2D sparse parallelism,
// replicated tables).
//
// One step, for a batch of id lists per table on every rank:
//  Forward   ids go to the ranks owning their rows (all-to-all of bag
//            lengths, then of ids); owners pool their rows per bag (partial
//            sums for row-wise tables); pooled vectors come back (all-to-all
//            of embeddings) and are summed per bag (and divided by the bag
//            length for mean pooling).
//  Backward  the pooled gradients go back to the owners (all-to-all); the
//            owners of one shard in every replica exchange their bags and
//            gradients (broadcasts over the replica group) and apply one
//            rowwise-Adagrad step with the gradient summed over every bag of
//            every rank, exactly as one rank holding the whole table and the
//            whole global batch would (kernels/embedding). Rowwise Adagrad
//            scales a row by the mean square of its whole gradient, so the
//            holders of a column-wise table's slices first exchange each
//            touched row's sum of squares over their slices (all-to-all).
//
// The result is the single-rank result up to floating-point summation order.
// Replicas apply identical updates in identical order, so their shards stay
// bit-identical.
//
// Model-independent: each table gets one jagged list of bags per step, with
// its own number of bags (pooled features: one bag per sample; per-token
// sequence lookups: one id per bag; a table serving several features: their
// bags concatenated), and returns one [bags, dim] fp32 output per table.
//
// Devices: tables, outputs and gradients live on the communicators' device
// (host with Gloo, the current CUDA device with NCCL); id lists are host
// memory, as they come from the data loader. The same code path on both
// devices (kernels/embedding/bucket.h runs on either):
//  - a step's ids and bag offsets go to the device in one copy; there they
//    are bucketed by owner (per owner and bag, the count of its ids; a
//    scan; a stable scatter of the ids as the owner's local rows: row
//    blocks split them, every column slice holder gets them all), sent
//    (all-to-alls of the per-(owner, table) id counts, of the bag lengths
//    and of the ids), regrouped per table by device copies and turned into
//    jagged offsets by a device scan. The bag counts (an all-gather, before
//    the copy) and the id counts (one copy of 2 x group x tables integers,
//    after their all-to-all) are all that comes back to the host: they
//    size the all-to-alls and the regrouping. Pooled rows need no index on
//    the way back: each owner returns one row per bag it received, in the
//    order it received them;
//  - pooled partial rows, the pooled outputs and their gradients never
//    leave the device: packed, summed (row blocks), placed (column slices)
//    and scaled (mean pooling, by the offsets already there) by device
//    copies and the engine's ops, around device all-to-alls; the backward
//    reuses the served bags Forward left on the device;
//  - with a replica group, every table's served bags and gradients go to
//    the host for the replicas' exchange of bags (GatherReplicas) and come
//    back; with column-wise tables of several slices, those tables' bags
//    and gradients go to the host for the slices' per-row sums, which
//    change only the accumulators (AlignColumnSliceAccumulators, a copy of
//    each sliced table's accumulators to the host and back).
// Without replicas or slices a step (Forward and BackwardAndUpdate) copies
// twice to the device (this rank's bag counts, its batch) and twice back
// (every rank's bag counts, the id counts), whatever the number of tables.
// Buffers are allocated per call. Not thread-safe.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/embedding/embedding.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"

namespace recfleet {
namespace dist {

struct EmbeddingTableConfig {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  Pooling pooling = Pooling::kSum;
};

enum class TableSharding : uint8_t {
  kTableWise,   // The whole table on group rank `owner`.
  kRowWise,     // Rows in contiguous blocks of ceil(rows / n) on the n `ranks`.
  kColumnWise,  // Columns in n equal slices (dim / n each) on the n `ranks`.
};

struct TablePlacement {
  TableSharding sharding = TableSharding::kTableWise;
  int owner = 0;  // kTableWise only.
  // kRowWise / kColumnWise: the group ranks holding block (slice) 0, 1, ...
  // in order, each at most once; empty means every group rank, 0..G-1.
  std::vector<int> ranks = {};
};

// One table as a plan places it inside its model-parallel group (mirrors
// recfleet.v1.TableShardingPlan): sharding "TW", "CW", "TWRW" or "RW",
// `ranks` the group positions holding the shards in shard order (empty for
// "RW": every position).
struct PlannedTable {
  std::string table;
  std::string sharding;
  int num_shards = 1;
  std::vector<int> ranks;
};

// The placements of `tables` exactly as `planned` (one entry per table, in
// the same order and with the same names) chose them, in a group of
// `group_size`: TW on its rank, CW slices and TWRW / RW row blocks on the
// listed ranks in order. InvalidArgument naming the table when an entry
// does not fit (unknown sharding, shard count and ranks disagreeing, a rank
// outside the group, another table's name).
absl::StatusOr<std::vector<TablePlacement>> PlacementsFromPlan(const std::vector<EmbeddingTableConfig>& tables,
                                                               const std::vector<PlannedTable>& planned,
                                                               int group_size);

// A placement balanced by bytes when no plan gives one: a table larger than
// an even share of all tables (total / group_size) is split row-wise; the
// others go whole, largest first, to the rank holding the fewest bytes
// (ties: the lowest rank). Deterministic, so every rank computes the same.
std::vector<TablePlacement> BalancedTablePlacements(const std::vector<EmbeddingTableConfig>& tables, int group_size);

// Where every row of every table lives in a group of `group_size` ranks.
// Immutable; thread-safe.
class EmbeddingShardingPlan {
 public:
  static absl::StatusOr<EmbeddingShardingPlan> Create(std::vector<EmbeddingTableConfig> tables,
                                                      std::vector<TablePlacement> placements, int group_size);

  int num_tables() const { return static_cast<int>(tables_.size()); }
  int group_size() const { return group_size_; }
  const EmbeddingTableConfig& table(int t) const { return tables_[t]; }
  const TablePlacement& placement(int t) const { return placements_[t]; }

  // Rows [first, second) of table t held by group rank r (empty if none).
  std::pair<int64_t, int64_t> RowRange(int t, int r) const;
  // Columns [first, second) of those rows that rank r holds: all of them
  // unless the table is column-wise (empty if it holds none).
  std::pair<int64_t, int64_t> ColumnRange(int t, int r) const;
  int64_t Columns(int t, int r) const {
    const auto c = ColumnRange(t, r);
    return c.second - c.first;
  }
  // Shards of table t, and the index of group rank r among their holders
  // (-1 if it holds none).
  int NumShards(int t) const;
  int ShardIndex(int t, int r) const;
  // Tables with at least one element on group rank r, ascending.
  const std::vector<int>& TablesOn(int r) const { return tables_on_[r]; }

 private:
  EmbeddingShardingPlan() = default;

  std::vector<EmbeddingTableConfig> tables_;
  std::vector<TablePlacement> placements_;
  int group_size_ = 1;
  std::vector<std::vector<int>> tables_on_;
};

class ShardedEmbeddingCollection {
 public:
  // `table_group` shards the tables (its size must equal the plan's);
  // `replica_group` (nullptr: none) holds the same shards elsewhere;
  // `shard_group` (nullptr or one rank: none; V3) holds the same shards in
  // other table groups and splits their rows: each member stores one part
  // (contiguous rows, ceil(rows / size) each), and Forward all-gathers the
  // whole block over it, kept until BackwardAndUpdate has applied the
  // update (every member applies the same one: the shard group must lie
  // inside the replica group). Not owned; all must outlive the collection.
  static absl::StatusOr<std::unique_ptr<ShardedEmbeddingCollection>> Create(EmbeddingShardingPlan plan,
                                                                            comm::Communicator* table_group,
                                                                            comm::Communicator* replica_group,
                                                                            RowwiseAdagradConfig optimizer,
                                                                            comm::Communicator* shard_group = nullptr);

  const EmbeddingShardingPlan& plan() const { return plan_; }

  // This rank's part of table t: [StoredRows(t)] x [ColumnRange(t, rank)]
  // fp32, and the Adagrad accumulators of those rows [rows] fp32 (every
  // slice holder of a column-wise table keeps the same), on the
  // communicators' device. Zero rows if it holds none.
  TensorView shard(int t);
  TensorView momentum(int t);
  // The rows of table t this rank stores: RowRange(t, rank), or its part of
  // them under V3.
  std::pair<int64_t, int64_t> StoredRows(int t) const;
  int group_rank() const { return table_group_->rank(); }

  // Sets every local row element to value(table, global_row, column) and
  // zeroes the accumulators. Deterministic initialization that every layout
  // (and a single-rank reference) can reproduce.
  absl::Status Initialize(const std::function<float(int table, int64_t row, int64_t col)>& value);

  // ids[t]: table t's bags on this rank (values int64 in [0, rows), offsets
  // int32/int64; any number of bags, including none). out[t]: [bags of
  // ids[t], dim] fp32, overwritten with each bag's sum (or mean) of rows; an
  // empty bag gives zeros. Every rank of the table group calls Forward
  // together.
  absl::Status Forward(absl::Span<const JaggedView> ids, absl::Span<const TensorView> out);

  // grads[t]: [bags, dim] fp32, the gradient of the loss w.r.t. out[t] of the
  // last Forward. Applies one optimizer step to every row that any rank of
  // the table and replica groups looked up.
  absl::Status BackwardAndUpdate(absl::Span<const TensorView> grads);

 private:
  // What Forward leaves for BackwardAndUpdate.
  struct Pending {
    bool valid = false;
    // bags[p * num_tables + t]: bags table-group rank p looked up in table t.
    std::vector<int64_t> bags;
    // Per table this rank holds (index into TablesOn(rank)): the bags it
    // served, ordered by (source rank, bag), as a jagged batch of local row
    // ids on the device (int64), and its bag and id counts.
    std::vector<DeviceBuffer> offsets;
    std::vector<DeviceBuffer> ids;
    std::vector<int64_t> served_bags;
    std::vector<int64_t> served_ids;
    // This rank's own batch as copied to the device: per table, its offsets
    // (from own_offsets_at[t], own_bags[t] + 1 of them, for mean pooling)
    // then its ids.
    DeviceBuffer input;
    std::vector<int64_t> own_offsets_at;
    std::vector<int64_t> own_bags;
  };

  // The served bags of Pending copied to the host, for the exchanges that
  // still run there (empty for tables they do not read).
  struct ServedOnHost {
    std::vector<std::vector<int64_t>> offsets;
    std::vector<std::vector<int64_t>> ids;
  };

  ShardedEmbeddingCollection(EmbeddingShardingPlan plan, comm::Communicator* table_group,
                             comm::Communicator* replica_group, RowwiseAdagradConfig optimizer,
                             comm::Communicator* shard_group);

  int ShardDegree() const { return shard_group_ == nullptr ? 1 : shard_group_->size(); }
  // V3: rows of each part of table t's block (the last ones padded).
  int64_t PartRows(int t) const;
  // The whole block [RowRange(t, rank)] x columns the kernels work on
  // (the gathered one under V3).
  TensorView Block(int t);
  TensorView BlockMomentum(int t);
  // V3: all-gathers every local table's block from the shard group's parts;
  // ReleaseBlocks keeps this rank's part only. No-ops otherwise.
  absl::Status GatherBlocks();
  absl::Status ReleaseBlocks();

  absl::Status CheckIds(absl::Span<const JaggedView> ids) const;
  // Checks one [bags, dim] fp32 host buffer per table.
  absl::Status CheckPerTable(absl::Span<const TensorView> views, absl::string_view what) const;
  int64_t Bags(int rank, int t) const { return pending_.bags[rank * plan_.num_tables() + t]; }
  // The served bags of local table k (index into TablesOn(rank)).
  JaggedView ServedBags(int k) const;
  // Table t is column-wise in more than one slice; some table is.
  bool Sliced(int t) const;
  bool AnySliced() const;
  // out = in with each of this rank's bags of table t (the last Forward's)
  // divided by its length (empty bags unchanged): mean pooling, on the
  // device. `out` may be `in`.
  absl::Status ScaleByBagLengths(int t, const TensorView& in, const TensorView& out);
  // Replaces the served bags and `grads` of every local table by their
  // union over the replica group, in replica-rank order.
  absl::Status GatherReplicas(ServedOnHost& served, std::vector<std::vector<float>>& grads);
  // For every local column-wise table of more than one slice (`served` and
  // `grads` hold at least those tables'): adds to the
  // accumulator of each row that `grads` touch the difference between the
  // mean square of the row's whole gradient (every slice's, exchanged with
  // the other holders) and of this slice's, so the kernel's rowwise-Adagrad
  // step, which adds the slice's own mean square, lands on the whole row's.
  absl::Status AlignColumnSliceAccumulators(const ServedOnHost& served, const std::vector<std::vector<float>>& grads);

  EmbeddingShardingPlan plan_;
  comm::Communicator* table_group_;
  comm::Communicator* replica_group_;
  comm::Communicator* shard_group_;
  RowwiseAdagradConfig optimizer_;
  Device device_;
  std::vector<DeviceBuffer> shards_;
  std::vector<DeviceBuffer> momenta_;
  bool gathered_ = false;  // V3: shards_ / momenta_ hold whole blocks.
  Pending pending_;
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_SHARDED_EMBEDDING_H_
