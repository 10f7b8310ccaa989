#ifndef RECFLEET_WORKER_CHECKPOINT_H_
#define RECFLEET_WORKER_CHECKPOINT_H_

// Sharded training checkpoints, written so that a crash at any moment leaves
// either a complete checkpoint or one that readers ignore.
//
// Layout under a checkpoint directory:
//   step-000000000120/
//     shard-00000-of-00002   one per rank: named byte records + CRC-32C
//     shard-00001-of-00002
//     MANIFEST               written last: step, world size, every shard's
//                            size and CRC-32C
//
// Protocol of one checkpoint: every rank calls WriteShard (temporary file,
// fsync, rename), the ranks meet at a barrier, then rank 0 calls Commit,
// which verifies every shard and publishes MANIFEST (temporary file, fsync,
// rename). A step directory without MANIFEST, or whose shards do not match
// it, is incomplete: LatestComplete skips it and a resume never reads it.
//
// The functions are stateless and may be called from several processes at
// once on distinct (step, rank) pairs.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recfleet::worker {

// One rank's state: named binary records (parameters, optimizer state, data
// position). Names are unique; the map keeps them sorted, so a shard's bytes
// depend only on its contents.
using CheckpointShard = std::map<std::string, std::string>;

// "<dir>/step-<step, 12 digits>".
std::string CheckpointStepDir(const std::string& dir, int64_t step);

// Writes rank `rank`'s shard of checkpoint `step` (creating directories).
// Overwrites a shard left by an earlier attempt at the same step.
absl::Status WriteCheckpointShard(const std::string& dir, int64_t step, int rank, int world_size,
                                  const CheckpointShard& shard);

// Verifies that all `world_size` shards of `step` are present and intact and
// publishes the manifest. FailedPrecondition naming the missing or damaged
// shard otherwise.
absl::Status CommitCheckpoint(const std::string& dir, int64_t step, int world_size);

// The newest step under `dir` with a manifest for `world_size` ranks whose
// shards all match it; nullopt when there is none (or `dir` does not exist).
absl::StatusOr<std::optional<int64_t>> LatestCompleteCheckpoint(const std::string& dir, int world_size);

// Reads rank `rank`'s shard of the complete checkpoint `step`, verified
// against the manifest. NotFound when the checkpoint is not complete;
// DataLoss when the shard is damaged (the message names file and offset).
absl::StatusOr<CheckpointShard> ReadCheckpointShard(const std::string& dir, int64_t step, int rank,
                                                    int world_size);

// Deletes complete checkpoints older than the newest `keep` (>= 1),
// incomplete step directories older than the newest complete one, and the
// partial ("*.tmp") files that writers killed mid-write left in the kept
// complete ones.
absl::Status PruneCheckpoints(const std::string& dir, int world_size, int keep);

// Deletes every partial ("*.tmp") file under `dir`'s step directories: what
// ranks killed while writing left behind. Only safe while no rank writes,
// i.e. when a job (re)starts, before its first checkpoint.
absl::Status RemovePartialCheckpointFiles(const std::string& dir);

// Records of float ranges, the form every model's shard takes (a range
// record "<first> <end>" names the elements or rows a value record holds):
// FloatRecord encodes n floats; RangeRecord parses a range record (nullopt
// when absent or malformed); CopyRecordOverlap copies the elements of
// `record` (holding `src`, `width` floats per element) that fall in `dst`
// into out (element dst.first at out[0]) and returns how many it copied, or
// -1 when the record is shorter than its range says. Restores add up the
// copied counts to check that the records cover what they restore.
std::string FloatRecord(const float* data, int64_t n);
std::optional<std::pair<int64_t, int64_t>> RangeRecord(const CheckpointShard& shard, const std::string& key);
int64_t CopyRecordOverlap(const std::string& record, std::pair<int64_t, int64_t> src, int64_t width,
                          std::pair<int64_t, int64_t> dst, float* out);

// Dense parameters in checkpoints: slices [range) of the flat dense vector
// (every parameter in DenseParameterNames order), as records
// "<prefix>.range", "<prefix>.value", "<prefix>.adam_m" and
// "<prefix>.adam_v", prefix "dense" for a shard's slot 0 and "dense.<slot>"
// for slot >= 1 (a rank may hold several slices: its part of every FSDP
// unit, each on either side of the experts, and its experts). Every
// element is recorded by one shard only.
void SaveDenseSlice(CheckpointShard* shard, int slot, std::pair<int64_t, int64_t> range, const float* value,
                    const float* adam_m, const float* adam_v);
// The slots of the dense slices `shard` holds, ascending.
std::vector<int> DenseSlots(const CheckpointShard& shard);
// Copies the elements of [range) that any slice of `shards` holds into
// value / adam_m / adam_v (element range.first at [0]); returns how many
// it copied (range.second - range.first when the checkpoint covers the
// range), or DataLoss naming the shard when a record does not match its
// range.
absl::StatusOr<int64_t> RestoreDenseSlice(const std::vector<CheckpointShard>& shards,
                                          std::pair<int64_t, int64_t> range, float* value, float* adam_m,
                                          float* adam_v);

// Embedding tables in checkpoints: a block of table `table` (`dim`
// columns), rows [rows) x columns [cols), as records "table.<t>.rows",
// "table.<t>.cols" (only for a column slice), "table.<t>.value" (the block,
// row-major) and "table.<t>.adagrad" (the rows' accumulators; only when
// `momentum` is given: of a column-wise table's slices only one records
// them, as every slice holds the same).
void SaveTableBlock(CheckpointShard* shard, int table, int64_t dim, std::pair<int64_t, int64_t> rows,
                    std::pair<int64_t, int64_t> cols, const float* values, const float* momentum);
// Fills block [rows) x [cols) of table `table` (`values`, row-major, and
// the rows' accumulators `momentum`) from whatever blocks of it `shards`
// hold, under any other layout. DataLoss naming the shard when a record
// does not match its ranges, or naming the table when the records do not
// cover every element and every row's accumulator of the block.
absl::Status RestoreTableBlock(const std::vector<CheckpointShard>& shards, int table, int64_t dim,
                               std::pair<int64_t, int64_t> rows, std::pair<int64_t, int64_t> cols, float* values,
                               float* momentum);

}  // namespace recfleet::worker

#endif  // RECFLEET_WORKER_CHECKPOINT_H_
