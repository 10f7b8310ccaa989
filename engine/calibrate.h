#ifndef RECFLEET_ENGINE_CALIBRATE_H_
#define RECFLEET_ENGINE_CALIBRATE_H_

// Calibrating Base Batch Shuffling's cost model in time: the job's real
// GEM-lite (built from its JobSpec by engine/job_model.h) runs forward and
// backward on synthetic batches whose samples all have one sequence
// length, for several lengths; data::FitCostModel then fits per-sample,
// linear and quadratic (attention) weights to the seconds per sample. CPU
// engine (the reference kernels); a GPU job needs the same timing on its
// device. Not thread-safe (one model per call).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data/cost_model.h"
#include "engine/job_model.h"

namespace recfleet::engine {

struct CalibrationOptions {
  // Sequence lengths to time; see CalibrationLengths.
  std::vector<int64_t> lengths = {1, 16, 64, 128, 256, 512};
  int batch_size = 16;  // Samples per timed batch.
  int repeats = 3;      // Timed batches per length (after one untimed warm-up); the median counts.
  uint64_t seed = 1;    // Ids and labels of the synthetic batches.
};

// Seconds per sample of ForwardBackward for each length (thread CPU time,
// so other processes on the machine do not inflate it). InvalidArgument
// for an empty length list, batch_size or repeats < 1, or a model without
// a sequence feature.
absl::StatusOr<std::vector<data::CostMeasurement>> TimeForwardBackward(
    const JobModel& model, const CalibrationOptions& options);

// Lengths worth timing for `model`: 1 up to its longest sequence
// (max_length, which truncates longer histories; 512 when unlimited), at
// 1/8, 1/4, 1/2 and all of it.
std::vector<int64_t> CalibrationLengths(const JobModel& model);

// A batch with one sample per entry of `lengths`, whose sequence fields
// hold that many events: ids uniform over each table, dense inputs 0,
// labels alternating 0/1.
Batch SyntheticBatch(const JobModel& model, const std::vector<int64_t>& lengths, uint64_t seed);

// Checking a fit where it is used: batches of mixed lengths (uniform in
// 1..longest), each timed like TimeForwardBackward and compared with the
// sum of its samples' predicted costs.
struct BatchCheck {
  double measured_seconds = 0;
  double predicted_seconds = 0;
};
absl::StatusOr<std::vector<BatchCheck>> CheckMixedBatches(const JobModel& model,
                                                          const data::CostModel& fit,
                                                          int64_t longest, int batches,
                                                          const CalibrationOptions& options);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_CALIBRATE_H_
