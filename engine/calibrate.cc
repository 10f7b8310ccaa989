#include "engine/calibrate.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/process_memory.h"
#include "common/status_macros.h"
#include "engine/cuda_device.h"
#include "engine/model.h"
#include "engine/step_cost.h"
#include "engine/tensor.h"

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
// kCpu times forward+backward only unless `with_update` (BBS prices the
// per-sample work; the rate table the whole step).
class StepTimer {
 public:
  explicit StepTimer(Device device, bool with_update = false)
      : device_(device), with_update_(with_update), events_(2) {}

  absl::StatusOr<double> Time(GemLite<float>& model, const Batch& batch) {
    if (device_ == Device::kCpu) {
      const double start = ThreadSeconds();
      RECFLEET_RETURN_IF_ERROR(model.ForwardBackward(batch).status());
      if (with_update_) RECFLEET_RETURN_IF_ERROR(model.ApplyUpdates());
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
  bool with_update_;
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

namespace {

struct ProbeShape {
  int64_t dim, heads;
  int layers;
  attention::Mask mask;
  attention::Activation activation;
  bool qk_norm;
  int id_lists, num_dense, pma, dcn_layers, experts;
  int64_t expert_hidden, expert_out, tower_hidden;
  int batch;
  std::vector<int64_t> longest;
};

JobModel ProbeModel(const ProbeShape& p) {
  JobModel m;
  // Small tables: their storage is priced exactly (StaticBytes); the probes
  // time the network, not table initialization.
  m.schema.tables = {{"item", 4096}, {"action", 16}, {"other", 4096}};
  for (int f = 0; f < p.id_lists; ++f) {
    m.schema.id_lists.push_back({absl::StrCat("f", f), f == 0 ? 0 : 2, Pooling::kSum});
  }
  m.schema.sequence_fields = {{"history_items", 0}, {"history_actions", 1}};
  m.schema.num_dense = p.num_dense;
  GemLiteConfig& c = m.config;
  c.dim = p.dim;
  c.heads = p.heads;
  c.seq_layers = p.layers;
  c.seq_mask = p.mask;
  c.seq_activation = p.activation;
  c.rope = true;
  c.qk_norm = p.qk_norm;
  c.cross_attention = true;
  c.pma_queries = p.pma;
  c.dcn_layers = p.dcn_layers;
  c.num_experts = p.experts;
  c.expert_hidden = p.expert_hidden;
  c.expert_out = p.expert_out;
  c.tower_hidden = p.tower_hidden;
  m.ctr_label = "click";
  m.cvr_label = "conversion";
  return m;
}

}  // namespace

std::vector<RateProbe> RateProbeModels(Device device) {
  using attention::Activation;
  using attention::Mask;
  std::vector<ProbeShape> shapes;
  if (device == Device::kCuda) {
    // Head dims of 64 or 128 (the bf16 attention kernels' sizes).
    shapes = {
        {1024, 8, 4, Mask::kNone, Activation::kSoftmax, false, 4, 16, 2, 1, 4, 1024, 256, 256, 32, {1024, 256}},
        {1024, 8, 2, Mask::kNone, Activation::kSoftmax, false, 2, 16, 2, 1, 2, 2048, 512, 256, 64, {2048, 512}},
        {768, 6, 2, Mask::kNone, Activation::kSoftmax, false, 3, 16, 2, 1, 3, 1536, 384, 256, 48, {1536, 384}},
        {512, 4, 2, Mask::kNone, Activation::kSoftmax, false, 3, 16, 2, 2, 4, 2048, 512, 256, 128, {512, 128}},
        {512, 4, 3, Mask::kBlock, Activation::kSilu, true, 3, 32, 2, 1, 4, 1024, 256, 256, 256, {512, 128}},
        {256, 2, 2, Mask::kBlock, Activation::kSilu, true, 8, 64, 4, 2, 4, 4096, 1024, 512, 512, {256, 64}},
        {256, 2, 1, Mask::kBlock, Activation::kSilu, true, 5, 64, 4, 1, 2, 8192, 1024, 512, 1024, {128, 32}},
        {256, 4, 4, Mask::kNone, Activation::kSoftmax, false, 2, 16, 2, 1, 2, 512, 128, 128, 256, {256, 64}},
    };
  } else {
    shapes = {
        {16, 2, 1, Mask::kNone, Activation::kSoftmax, false, 2, 4, 2, 1, 2, 64, 32, 16, 64, {64, 16}},
        {32, 2, 2, Mask::kNone, Activation::kSoftmax, false, 3, 4, 2, 1, 2, 64, 32, 16, 32, {96, 24}},
        {32, 4, 1, Mask::kBlock, Activation::kSilu, true, 4, 8, 2, 2, 3, 128, 64, 32, 64, {64, 16}},
        {64, 4, 2, Mask::kNone, Activation::kSoftmax, false, 2, 4, 2, 1, 2, 128, 64, 16, 32, {48, 12}},
        {16, 2, 2, Mask::kNone, Activation::kSoftmax, false, 5, 8, 1, 1, 4, 256, 32, 16, 128, {32, 8}},
        {48, 4, 1, Mask::kNone, Activation::kSoftmax, false, 2, 4, 2, 1, 2, 96, 48, 16, 96, {64, 16}},
    };
  }
  std::vector<RateProbe> probes;
  for (const ProbeShape& s : shapes) probes.push_back({ProbeModel(s), s.batch, s.longest});
  return probes;
}

namespace {

ExecutionOptions ProbeExecution(const RateProbeOptions& o) {
  ExecutionOptions execution;
  execution.device = o.device;
  execution.bf16 = o.device == Device::kCuda && o.bf16;
  return execution;
}

// The process's resident bytes before a probe model exists: what its
// training adds is measured from here (freed heap returned to the kernel
// first, so an earlier probe's leftovers do not count).
absl::StatusOr<int64_t> ResidentBeforeModel(const RateProbeOptions& o) {
  if (o.device == Device::kCuda) return 0;
  RECFLEET_RETURN_IF_ERROR(ResetPeakResident());
  return ResidentBytes();
}

// The median of o.repeats steps after o.warmup, and the peak memory over the
// timed steps: kCuda the pool's peak bytes in use, kCpu the process's peak
// resident bytes above `resident_before_model`.
absl::StatusOr<ProbeStep> TimeSteps(GemLite<float>& gem, const JobModel& model,
                                    const std::vector<int64_t>& lengths, uint64_t seed,
                                    int64_t resident_before_model, const RateProbeOptions& o) {
  if (o.repeats < 1 || o.warmup < 0) {
    return absl::InvalidArgumentError("step rates: repeats >= 1 and warmup >= 0");
  }
  StepTimer timer(o.device, /*with_update=*/true);
  const Batch batch = SyntheticBatch(model, lengths, seed);
  for (int i = 0; i < o.warmup; ++i) {
    if (absl::StatusOr<double> t = timer.Time(gem, batch); !t.ok()) return t.status();
  }
  RECFLEET_RETURN_IF_ERROR(o.device == Device::kCuda ? ResetCudaMemoryPeak() : ResetPeakResident());
  std::vector<double> seconds;
  for (int i = 0; i < o.repeats; ++i) {
    absl::StatusOr<double> t = timer.Time(gem, batch);
    if (!t.ok()) return t.status();
    seconds.push_back(*t);
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  ProbeStep step{CountStep(model, lengths), seconds[seconds.size() / 2], 0};
  if (o.device == Device::kCuda) {
    absl::StatusOr<DeviceMemoryStats> mem = CudaMemoryStats();
    if (!mem.ok()) return mem.status();
    step.peak_bytes = static_cast<double>(mem->peak);
  } else {
    absl::StatusOr<int64_t> peak = PeakResidentBytes();
    if (!peak.ok()) return peak.status();
    step.peak_bytes = static_cast<double>(*peak - resident_before_model);
  }
  return step;
}

}  // namespace

absl::StatusOr<ProbeStep> MeasureStep(const JobModel& model, const std::vector<int64_t>& lengths,
                                      const RateProbeOptions& o) {
  absl::StatusOr<int64_t> before = ResidentBeforeModel(o);
  if (!before.ok()) return before.status();
  auto gem = GemLite<float>::Create(model.config, model.schema, TableStorage::kInternal,
                                    ProbeExecution(o));
  if (!gem.ok()) return gem.status();
  return TimeSteps(**gem, model, lengths, o.seed, *before, o);
}

absl::StatusOr<RateProbeResult> MeasureStepRates(const RateProbeOptions& o) {
  RateProbeResult result;
  std::mt19937_64 rng(o.seed ^ 0x9A7E);
  int index = 0;
  for (const RateProbe& probe : RateProbeModels(o.device)) {
    absl::StatusOr<int64_t> before = ResidentBeforeModel(o);
    if (!before.ok()) return before.status();
    auto gem = GemLite<float>::Create(probe.model.config, probe.model.schema,
                                      TableStorage::kInternal, ProbeExecution(o));
    if (!gem.ok()) return gem.status();
    for (int64_t longest : probe.longest) {
      std::vector<int64_t> lengths(probe.batch_size);
      const int64_t lowest = std::max<int64_t>(1, longest / 4);
      for (int64_t& l : lengths) l = lowest + static_cast<int64_t>(rng() % (longest - lowest + 1));
      absl::StatusOr<ProbeStep> step = TimeSteps(**gem, probe.model, lengths, o.seed + index, *before, o);
      if (!step.ok()) return step.status();
      result.names.push_back(absl::StrCat("probe", index / 2, " d=", probe.model.config.dim,
                                          " B=", probe.batch_size, " L<=", longest));
      result.steps.push_back(*std::move(step));
      ++index;
    }
  }
  StepRates described;
  described.device = o.device == Device::kCuda ? "cuda" : "cpu";
  described.precision = ProbeExecution(o).bf16 ? "bf16" : "fp32";
  auto rates = FitStepRates(result.steps, described);
  if (!rates.ok()) return rates.status();
  result.rates = *rates;
  return result;
}

}  // namespace recfleet::engine
