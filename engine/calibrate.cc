#include "engine/calibrate.h"

#include <time.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
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
  if (o.lengths.empty() || o.batch_size < 1 || o.repeats < 1) {
    return absl::InvalidArgumentError(
        "calibrate: need at least one length, batch_size >= 1 and repeats >= 1");
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

// Median thread CPU seconds of ForwardBackward on `batch` over `repeats`
// runs, after one untimed warm-up.
absl::StatusOr<double> TimeBatch(GemLite<float>& gem, const Batch& batch, int repeats) {
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {
    const double start = ThreadSeconds();
    auto step = gem.ForwardBackward(batch);
    if (!step.ok()) return step.status();
    if (r > 0) seconds.push_back(ThreadSeconds() - start);
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  return seconds[seconds.size() / 2];
}

}  // namespace

absl::StatusOr<std::vector<data::CostMeasurement>> TimeForwardBackward(
    const JobModel& model, const CalibrationOptions& o) {
  RECFLEET_RETURN_IF_ERROR(CheckOptions(model, o));
  auto gem = GemLite<float>::Create(model.config, model.schema);
  if (!gem.ok()) return gem.status();
  std::vector<data::CostMeasurement> out;
  for (int64_t length : o.lengths) {
    const std::vector<int64_t> lengths(o.batch_size, length);
    auto seconds = TimeBatch(**gem, SyntheticBatch(model, lengths, o.seed + length), o.repeats);
    if (!seconds.ok()) return seconds.status();
    out.push_back({length, *seconds / o.batch_size});
  }
  return out;
}

absl::StatusOr<std::vector<BatchCheck>> CheckMixedBatches(const JobModel& model,
                                                          const data::CostModel& fit,
                                                          int64_t longest, int batches,
                                                          const CalibrationOptions& o) {
  RECFLEET_RETURN_IF_ERROR(CheckOptions(model, o));
  auto gem = GemLite<float>::Create(model.config, model.schema);
  if (!gem.ok()) return gem.status();
  std::mt19937_64 rng(o.seed ^ 0xC4EC);
  std::vector<BatchCheck> out;
  for (int b = 0; b < batches; ++b) {
    std::vector<int64_t> lengths(o.batch_size);
    BatchCheck check;
    for (int64_t& l : lengths) {
      l = 1 + static_cast<int64_t>(rng() % std::max<int64_t>(1, longest));
      check.predicted_seconds += fit.SampleCost(l);
    }
    auto seconds = TimeBatch(**gem, SyntheticBatch(model, lengths, rng()), o.repeats);
    if (!seconds.ok()) return seconds.status();
    check.measured_seconds = *seconds;
    out.push_back(check);
  }
  return out;
}

}  // namespace recfleet::engine
