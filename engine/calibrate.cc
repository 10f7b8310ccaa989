#include "engine/calibrate.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda_device.h"
#include "engine/model.h"

namespace recfleet::engine {
namespace {

double ThreadSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

std::vector<int64_t> CalibrationLengths(const JobModel& model) {
  int64_t longest = 0;
  bool unlimited = model.sequence_max_length.empty();
  for (int m : model.sequence_max_length) {
    unlimited |= m == 0;
    longest = std::max<int64_t>(longest, m);
  }
  if (unlimited) longest = 512;
  std::vector<int64_t> lengths = {1, longest / 8, longest / 4, longest / 2, longest};
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

Batch SyntheticBatch(const JobModel& model, const std::vector<int64_t>& lengths, uint64_t seed) {
  const FeatureSchema& s = model.schema;
  const int size = static_cast<int>(lengths.size());
  std::mt19937_64 rng(seed);
  auto id = [&](int table) { return static_cast<int64_t>(rng() % s.tables[table].rows); };
  Batch b;
  b.size = size;
  b.id_lists.resize(s.id_lists.size());
  b.sequence.resize(s.sequence_fields.size());
  std::vector<int64_t> ids;
  for (int i = 0; i < size; ++i) {
    for (size_t f = 0; f < s.id_lists.size(); ++f) {
      const int64_t one = id(s.id_lists[f].table);
      b.id_lists[f].Append({&one, 1});
    }
    for (size_t f = 0; f < s.sequence_fields.size(); ++f) {
      ids.resize(lengths[i]);
      for (int64_t& x : ids) x = id(s.sequence_fields[f].table);
      b.sequence[f].Append(ids);
    }
    b.ctr_labels.push_back(static_cast<float>(i % 2));
    if (!model.cvr_label.empty()) b.cvr_labels.push_back(static_cast<float>((i / 2) % 2));
  }
  b.dense.assign(static_cast<size_t>(size) * s.num_dense, 0.0f);
  return b;
}

namespace {

absl::Status CheckOptions(const JobModel& model, const CalibrationOptions& o) {
  if (o.lengths.empty() || o.batch_size < 1 || o.repeats < 1 || o.warmup < 0 ||
      o.fit_batches < 0 || o.check_batches < 0) {
    return absl::InvalidArgumentError(
        "calibrate: need at least one length, batch_size >= 1, repeats >= 1 and warmup, "
        "fit_batches, check_batches >= 0");
  }
  for (int64_t length : o.lengths) {
    if (length < 0) return absl::InvalidArgumentError("calibrate: lengths must be >= 0");
  }
  if (model.schema.sequence_fields.empty()) {
    return absl::InvalidArgumentError(
        "calibrate: the model has no SEQUENCE feature, so its cost does not depend on length");
  }
  return absl::OkStatus();
}

// Seconds of one training step of `model` on `batch`, as the options'
// device measures them.
class StepTimer {
 public:
  explicit StepTimer(Device device) : device_(device), events_(2) {}

  absl::StatusOr<double> Time(GemLite<float>& model, const Batch& batch) {
    if (device_ == Device::kCpu) {
      const double start = ThreadSeconds();
      RECFLEET_RETURN_IF_ERROR(model.ForwardBackward(batch).status());
      return ThreadSeconds() - start;
    }
    RECFLEET_RETURN_IF_ERROR(events_.Mark(0));
    RECFLEET_RETURN_IF_ERROR(model.ForwardBackward(batch).status());
    RECFLEET_RETURN_IF_ERROR(model.ApplyUpdates());
    RECFLEET_RETURN_IF_ERROR(events_.Mark(1));
    return events_.Seconds(0, 1);
  }

 private:
  Device device_;
  CudaStreamTimer events_;  // Unused on the CPU (it creates events lazily).
};

}  // namespace

double PredictedSeconds(const data::CostModel& fit, const std::vector<int64_t>& lengths) {
  double seconds = 0;
  for (int64_t l : lengths) seconds += fit.SampleCost(l);
  return seconds;
}

PredictionError FitError(const data::CostModel& fit, const std::vector<data::BatchTime>& batches) {
  PredictionError e;
  if (batches.empty()) return e;
  for (const data::BatchTime& b : batches) {
    const double error = std::fabs(PredictedSeconds(fit, b.lengths) - b.seconds) / b.seconds;
    e.largest = std::max(e.largest, error);
    e.mean += error / static_cast<double>(batches.size());
  }
  return e;
}

absl::StatusOr<Calibration> Calibrate(const JobModel& model, const CalibrationOptions& o) {
  RECFLEET_RETURN_IF_ERROR(CheckOptions(model, o));
  ExecutionOptions execution;
  execution.device = o.device;
  execution.bf16 = o.device == Device::kCuda && o.bf16;
  auto gem = GemLite<float>::Create(model.config, model.schema, TableStorage::kInternal, execution);
  if (!gem.ok()) return gem.status();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(o.lengths.begin(), o.lengths.end()));
  // Every timed batch: the one-length ones, then the mixed ones.
  std::vector<data::BatchTime> timed;
  for (int64_t length : o.lengths) timed.push_back({std::vector<int64_t>(o.batch_size, length), 0});
  std::mt19937_64 rng(o.seed ^ 0xC4EC);
  const int64_t lowest_cap = std::max<int64_t>(1, longest / 8);
  for (int b = 0; b < o.fit_batches + o.check_batches; ++b) {
    const int64_t cap = lowest_cap + static_cast<int64_t>(rng() % (longest - lowest_cap + 1));
    std::vector<int64_t> lengths(o.batch_size);
    for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(rng() % cap);
    timed.push_back({std::move(lengths), 0});
  }
  std::vector<Batch> batches;
  for (size_t i = 0; i < timed.size(); ++i) {
    batches.push_back(SyntheticBatch(model, timed[i].lengths, o.seed + i));
  }
  StepTimer timer(o.device);
  std::vector<std::vector<double>> seconds(timed.size());
  for (int round = 0; round < o.warmup + o.repeats; ++round) {
    for (size_t i = 0; i < timed.size(); ++i) {
      absl::StatusOr<double> t = timer.Time(**gem, batches[i]);
      if (!t.ok()) return t.status();
      if (round >= o.warmup) seconds[i].push_back(*t);
    }
  }
  for (size_t i = 0; i < timed.size(); ++i) {
    std::vector<double>& s = seconds[i];
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    timed[i].seconds = s[s.size() / 2];
  }
  Calibration c;
  const size_t one = o.lengths.size(), fit_end = one + o.fit_batches;
  c.one_length.assign(timed.begin(), timed.begin() + one);
  c.mixed_fit.assign(timed.begin() + one, timed.begin() + fit_end);
  c.held_out.assign(timed.begin() + fit_end, timed.end());
  std::vector<data::BatchTime> seen = c.one_length;
  seen.insert(seen.end(), c.mixed_fit.begin(), c.mixed_fit.end());
  auto fit = data::FitCostModelToBatches(seen);
  if (!fit.ok()) return fit.status();
  c.fit = *fit;
  return c;
}

}  // namespace recfleet::engine
