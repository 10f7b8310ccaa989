#ifndef RECFLEET_BENCH_E2E_BATCH_FILE_H_
#define RECFLEET_BENCH_E2E_BATCH_FILE_H_

// A file of engine batches (engine/batch.h), so the engine benchmark and
// the PyTorch model (bench/e2e/gemlite_torch.py, which reads it with numpy)
// train on exactly the same samples.
//
// Format, little-endian, no padding; every count is an int64:
//
//   magic      8 bytes "RFBATCH1"
//   count      number of batches
//   then per batch:
//     size               samples B
//     num_id_lists       then per id list:   num_offsets, num_ids,
//                                            offsets int64[num_offsets],
//                                            ids int64[num_ids]
//     num_sequence       then per sequence field, the same as an id list
//     num_dense          then dense float32[num_dense]  (B x num_dense_features)
//     num_ctr_labels     then float32[num_ctr_labels]   (0 or B)
//     num_cvr_labels     then float32[num_cvr_labels]   (0 or B)
//
// An id list's offsets have B + 1 entries from 0 to num_ids (sample b owns
// ids[offsets[b], offsets[b+1])). Files are written and read whole; no
// schema is stored (model.json beside the file holds it).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/batch.h"

namespace recfleet::bench {

// Writes `batches` to `path` (replaced). InvalidArgument for a batch whose
// lists break the offset rules above (the reader would reject the file);
// Internal when the file cannot be written.
absl::Status WriteBatchFile(const std::string& path, const std::vector<engine::Batch>& batches);

// Reads a file written by WriteBatchFile. NotFound when it cannot be
// opened; DataLoss naming the batch and the byte offset for a bad magic, a
// truncated file, a negative or oversized count, offsets that are not
// monotone from 0 to the id count, or labels/dense not matching the size.
absl::StatusOr<std::vector<engine::Batch>> ReadBatchFile(const std::string& path);

}  // namespace recfleet::bench

#endif  // RECFLEET_BENCH_E2E_BATCH_FILE_H_
