#ifndef RECFLEET_ENGINE_CALIBRATE_H_
#define RECFLEET_ENGINE_CALIBRATE_H_

// Calibrating Base Batch Shuffling's cost model in time: the job's real
// GEM-lite (built from its JobSpec by engine/job_model.h) runs forward and
// backward on synthetic batches (every sample of one length, for several
// lengths, and batches of mixed lengths); data::FitCostModelToBatches fits
// per-sample, linear and quadratic (attention) weights to the batch times,
// and batches of mixed lengths the fit never saw check its predictions.
// CPU engine (the reference kernels); a GPU job needs the same timing on
// its device. Not thread-safe (one model per call).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data/cost_model.h"
#include "engine/job_model.h"

namespace recfleet::engine {

struct CalibrationOptions {
  // Sequence lengths of the one-length batches; see CalibrationLengths.
  std::vector<int64_t> lengths = {1, 16, 64, 128, 256, 512};
  int batch_size = 16;  // Samples per timed batch.
  // Timed rounds after one untimed warm-up round; a round times every
  // batch once, so a slow moment of a shared machine touches all batches
  // alike instead of one length. The median per batch counts.
  int repeats = 9;
  // Batches of mixed lengths (uniform in 1..longest length) the fit sees,
  // and more held out to check it.
  int fit_batches = 8;
  int check_batches = 8;
  uint64_t seed = 1;  // Ids, labels and lengths of the synthetic batches.
};

struct Calibration {
  std::vector<data::BatchTime> one_length;  // One per options.lengths entry.
  std::vector<data::BatchTime> mixed_fit;   // Mixed lengths, seen by the fit.
  std::vector<data::BatchTime> held_out;    // Mixed lengths, not seen by it.
  data::CostModel fit;
};

// Times every batch (thread CPU seconds of ForwardBackward, so other
// processes on the machine do not add to it) and fits the cost model to
// the one-length and mixed_fit batches. InvalidArgument for an empty
// length list, batch_size or repeats < 1, fit_batches or check_batches
// < 0, or a model without a sequence feature.
absl::StatusOr<Calibration> Calibrate(const JobModel& model, const CalibrationOptions& options);

// Lengths worth timing for `model`: 1 up to its longest sequence
// (max_length, which truncates longer histories; 512 when unlimited), at
// 1/8, 1/4, 1/2 and all of it.
std::vector<int64_t> CalibrationLengths(const JobModel& model);

// A batch with one sample per entry of `lengths`, whose sequence fields
// hold that many events: ids uniform over each table, dense inputs 0,
// labels alternating 0/1.
Batch SyntheticBatch(const JobModel& model, const std::vector<int64_t>& lengths, uint64_t seed);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_CALIBRATE_H_
