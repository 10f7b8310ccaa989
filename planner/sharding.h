#ifndef RECFLEET_PLANNER_SHARDING_H_
#define RECFLEET_PLANNER_SHARDING_H_

// Embedding-table sharding inside one model-parallel group: enumerate each
// table's sharding options, pick one per table, and place the shards on the
// group's ranks balanced on lookup cost, all-to-all bytes and memory, under
// a hard per-rank memory limit.
//
// Options, from fewest to most messages:
//   TW    table-wise: the whole table on one rank;
//   CW    column-wise: k column slices on k ranks (same output bytes as TW);
//   TWRW  row-wise inside one NVLink domain: partial sums reduced on NVLink;
//   RW    row-wise over the whole group: partial sums cross the group.
// A table takes the first option whose largest shard stays within one
// rank's fair share (total cost / group size, total memory / group size):
// a bigger shard would by itself make its rank the straggler. The rule uses
// only the model and the group size, never link bandwidths, so a faster
// network can never change a sharding for the worse.
//
// Every group of a 2D layout holds the same tables on the same layout, so
// the result describes group positions 0..group_size-1. Pure function;
// deterministic; thread-safe.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planner/model.h"
#include "planner/topology.h"

namespace recfleet::planner {

enum class ShardingType { kTableWise, kColumnWise, kTableWiseRowWise, kRowWise };
const char* ShardingTypeName(ShardingType type);  // "TW", "CW", "TWRW", "RW".

struct ShardingInput {
  const Model* model = nullptr;
  const Topology* topology = nullptr;
  const PrecisionRecipe* precision = nullptr;
  const Efficiencies* efficiency = nullptr;
  const PlannerOptions* options = nullptr;
  GroupShape group;      // The model-parallel group.
  int local_batch = 0;
  // Each rank stores 1/storage_divisor of what the group layout assigns it
  // (V3 splits every shard over that many groups inside an NVLink domain).
  int storage_divisor = 1;
  double rank_memory_limit_bytes = 0;  // Hard limit for stored shard bytes.
};

// One table's layout. Shards of a table are equal; `ranks` lists the group
// positions that hold them (empty for RW: every position holds one).
struct TableSharding {
  int table = 0;  // Index into Model::tables.
  std::string name;
  ShardingType type = ShardingType::kTableWise;
  int num_shards = 1;
  std::vector<int> ranks;
  int64_t rows_per_shard = 0;
  int cols_per_shard = 0;
  double shard_bytes = 0;          // Stored per rank (after storage_divisor).
  double shard_compute_s = 0;      // Forward + backward lookup time.
  double shard_out_bytes = 0;      // Embeddings sent per step (forward).
  double shard_id_bytes = 0;       // Ids received per step.
  double shard_touched_bytes = 0;  // Rows touched per step (V3 gather, copy sync).
  std::string reason;
};

struct ShardingResult {
  std::vector<TableSharding> tables;  // In model order.
  // Per group position.
  std::vector<double> rank_bytes;
  std::vector<double> rank_compute_s;
  std::vector<double> rank_out_bytes;
  std::vector<double> rank_id_bytes;
  std::vector<double> rank_touched_bytes;
  double largest_shard_bytes = 0;
  // Max over ranks / mean over ranks of the lookup cost (1 = balanced).
  double compute_imbalance = 1;
};

// Bytes of the lookup outputs `samples` samples return from `cols` columns
// of table t: one vector per sample for a pooled table (a row shard's
// partial sum), one per id for a sequence table, of which a row shard
// serves row_fraction.
double LookupOutputBytes(const Table& t, double samples, int cols, double row_fraction,
                         const PrecisionRecipe& p);

// Fails (ResourceExhausted) naming the table, its smallest possible shard,
// the limit and the overage when some shard fits on no rank.
absl::StatusOr<ShardingResult> ShardTables(const ShardingInput& input);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_SHARDING_H_
