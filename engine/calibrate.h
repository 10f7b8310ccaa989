#ifndef RECFLEET_ENGINE_CALIBRATE_H_
#define RECFLEET_ENGINE_CALIBRATE_H_

// Calibrating Base Batch Shuffling's cost model in time: the job's real
// GEM-lite (built from its JobSpec by engine/job_model.h) runs forward and
// backward on synthetic batches (every sample of one length, for several
// lengths, and batches of mixed lengths); data::FitCostModelToBatches fits
// per-sample, linear and quadratic (attention) weights to the batch times,
// and batches of mixed lengths the fit never saw check its predictions.
// On the CPU engine (the reference kernels, for CPU jobs) or the CUDA engine
// (GPU jobs: the step a GPU worker runs, timed on the device). Not
// thread-safe (one model per call).

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "data/cost_model.h"
#include "engine/job_model.h"
#include "engine/step_rates.h"
#include "kernels/tensor.h"

namespace recfleet::engine {

struct CalibrationOptions {
  // Sequence lengths of the one-length batches; see CalibrationLengths.
  std::vector<int64_t> lengths = {1, 16, 64, 128, 256, 512};
  int batch_size = 16;  // Samples per timed batch.
  // Timed rounds after one untimed warm-up round; a round times every
  // batch once, so a slow moment of a shared machine touches all batches
  // alike instead of one length. The median per batch counts.
  int repeats = 9;
  // Untimed rounds before them: the first steps of a CUDA model pick
  // cuBLASLt algorithms and grow the memory pool.
  int warmup = 1;
  // Batches of mixed lengths the fit sees, and more held out to check it.
  // Each batch draws its own cap uniform in [longest / 8, longest] and its
  // lengths uniform in 1..cap, so the batches' total lengths differ (equal
  // totals would check nothing but the per-batch mean).
  int fit_batches = 8;
  int check_batches = 8;
  uint64_t seed = 1;  // Ids, labels and lengths of the synthetic batches.
  // kCpu: ForwardBackward on the reference kernels, timed in thread CPU
  // seconds (other processes on the machine do not add to it).
  // kCuda: the step a GPU worker runs (worker/single_rank_model.h:
  // ForwardBackward then ApplyUpdates, the losses read back in between),
  // timed with CUDA events on the engine's stream; the process's current
  // CUDA device (engine/cuda_device.h).
  Device device = Device::kCpu;
  bool bf16 = true;  // kCuda: bf16 GEMMs and attention, as workers run by default.
};

struct Calibration {
  std::vector<data::BatchTime> one_length;  // One per options.lengths entry.
  std::vector<data::BatchTime> mixed_fit;   // Mixed lengths, seen by the fit.
  std::vector<data::BatchTime> held_out;    // Mixed lengths, not seen by it.
  data::CostModel fit;
};

// What `fit` predicts for a batch of samples with these lengths: the sum
// of their costs (seconds), as BBS prices a base batch.
double PredictedSeconds(const data::CostModel& fit, const std::vector<int64_t>& lengths);

// The largest error |predicted - measured| / measured of `fit` over
// `batches`, and the mean of those errors; {0, 0} for no batches.
struct PredictionError {
  double largest = 0;
  double mean = 0;
};
PredictionError FitError(const data::CostModel& fit, const std::vector<data::BatchTime>& batches);

// Times every batch (see CalibrationOptions::device) and fits the cost
// model to the one-length and mixed_fit batches. InvalidArgument for an
// empty length list, batch_size or repeats < 1, warmup, fit_batches or
// check_batches < 0, or a model without a sequence feature; the CUDA
// engine's errors (no device, out of memory) as they come.
absl::StatusOr<Calibration> Calibrate(const JobModel& model, const CalibrationOptions& options);

// Lengths worth timing for `model`: 1 up to its longest sequence
// (max_length, which truncates longer histories; 512 when unlimited), at
// 1/8, 1/4, 1/2 and all of it.
std::vector<int64_t> CalibrationLengths(const JobModel& model);

// A batch with one sample per entry of `lengths`, whose sequence fields
// hold that many events: ids uniform over each table, dense inputs 0,
// labels alternating 0/1.
Batch SyntheticBatch(const JobModel& model, const std::vector<int64_t>& lengths, uint64_t seed);

// The engine's rate table (engine/step_rates.h) for the device: a fixed
// family of probe models (RateProbeModels) trained a few steps each on
// synthetic batches (lengths uniform in [longest / 4, longest], at two
// longest lengths per model): the median step time (the step a worker runs,
// forward+backward+update; kCuda: CUDA events, kCpu: thread CPU time) and
// the peak memory (kCuda: the device pool's peak bytes in use; kCpu: the
// process's peak resident bytes above those before the probe's model was
// built, common/process_memory.h). Fits the table to them.
struct RateProbeOptions {
  Device device = Device::kCuda;
  bool bf16 = true;  // kCuda only.
  int warmup = 2;
  int repeats = 3;
  uint64_t seed = 1;
};
struct RateProbeResult {
  std::vector<std::string> names;  // One per probe step: "probe3 L=512".
  std::vector<ProbeStep> steps;
  StepRates rates;  // Description fields left for the caller.
};
// kCuda probes are sized like the engine benchmark's configurations
// (d 256-1024, batches 32-1024, histories up to 2,048); kCpu ones are
// small enough for a CPU core (d 16-64, histories up to 96).
struct RateProbe {
  JobModel model;
  int batch_size = 0;
  std::vector<int64_t> longest;  // Batches drawn at each of these.
};
std::vector<RateProbe> RateProbeModels(Device device);
absl::StatusOr<RateProbeResult> MeasureStepRates(const RateProbeOptions& options);

// One step of `model` on a synthetic batch with these lengths, timed and
// counted as MeasureStepRates does its probes: what a prediction from the
// table is checked against.
absl::StatusOr<ProbeStep> MeasureStep(const JobModel& model, const std::vector<int64_t>& lengths,
                                      const RateProbeOptions& options);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_CALIBRATE_H_
