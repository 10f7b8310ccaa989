#include "services/coordinator/progress_aggregator.h"

#include <algorithm>

namespace recfleet::coordinator {

void ProgressAggregator::Reset(int world_size, int64_t resume_step) {
  std::vector<RankStats> fresh(world_size);
  for (RankStats& r : fresh) r.step = resume_step;
  ranks_ = std::move(fresh);
}

int ProgressAggregator::Record(
    int rank, const google::protobuf::RepeatedPtrField<::recfleet::v1::StepStats>& steps) {
  RankStats& r = ranks_[rank];
  int recorded = 0;
  for (const auto& s : steps) {
    if (s.step() <= r.step && r.reported) continue;  // A retried report.
    r.step = s.step();
    r.samples += s.samples();
    r.loss = s.loss();
    r.peak_memory_bytes = std::max(r.peak_memory_bytes, s.peak_memory_bytes());
    if (!r.reported) r.warmup_in_recent = true;
    r.reported = true;
    r.recent.push_back(s);
    if (r.warmup_in_recent && r.recent.size() > 1) {
      r.recent.pop_front();
      r.warmup_in_recent = false;
    }
    if (r.recent.size() > kRecentSteps) r.recent.pop_front();
    ++recorded;
  }
  return recorded;
}

void ProgressAggregator::Compute(::recfleet::v1::JobProgress& progress) const {
  ::recfleet::v1::JobProgress* p = &progress;
  int64_t min_step = -1, samples = 0;
  double loss_sum = 0, window_samples = 0, max_seconds = 0;
  double step_sum = 0, wait_sum = 0, compute_sum = 0, comm_sum = 0, max_mean = 0;
  int reported = 0, timed = 0, slowest = 0;
  int64_t peak_memory = 0;
  // While some ranks are past their warm-up step, a rank whose window holds
  // only its warm-up stays out of the timing: mixed in, it would read as a
  // straggler until its second step arrives.
  const bool some_warm = std::any_of(ranks_.begin(), ranks_.end(), [](const RankStats& r) {
    return !r.recent.empty() && !r.warmup_in_recent;
  });
  for (size_t rank = 0; rank < ranks_.size(); ++rank) {
    const RankStats& r = ranks_[rank];
    min_step = min_step < 0 ? r.step : std::min(min_step, r.step);
    peak_memory = std::max(peak_memory, r.peak_memory_bytes);
    samples += r.samples;
    if (!r.reported) continue;
    ++reported;
    loss_sum += r.loss;
    if (r.recent.empty() || (some_warm && r.warmup_in_recent)) continue;
    double seconds = 0, wait = 0, compute = 0, comm = 0, n = r.recent.size();
    for (const auto& s : r.recent) {
      seconds += s.step_seconds();
      wait += s.data_wait_seconds();
      compute += s.compute_seconds();
      comm += s.comm_seconds();
      window_samples += s.samples();
    }
    max_seconds = std::max(max_seconds, seconds);
    const double mean = seconds / n;
    if (mean > max_mean) {
      max_mean = mean;
      slowest = static_cast<int>(rank);
    }
    step_sum += mean;
    wait_sum += wait / n;
    compute_sum += compute / n;
    comm_sum += comm / n;
    ++timed;
  }
  if (samples > 0 || reported > 0) {
    p->set_step(std::max<int64_t>(min_step, 0));
    p->set_samples(std::max(p->samples(), samples));
  }
  if (reported > 0) p->set_loss(loss_sum / reported);
  if (peak_memory > 0) p->set_peak_memory_bytes(std::max(p->peak_memory_bytes(), peak_memory));
  if (timed > 0) {
    // Synchronous training: the job moves at the pace of its slowest rank.
    p->set_samples_per_second(max_seconds > 0 ? window_samples / max_seconds : 0);
    const double mean = step_sum / timed;
    p->set_slowest_rank(slowest);
    p->set_straggler_gap(mean > 0 ? max_mean / mean - 1 : 0);
    p->set_step_seconds(mean);
    p->set_data_wait_seconds(wait_sum / timed);
    p->set_compute_seconds(compute_sum / timed);
    p->set_comm_seconds(comm_sum / timed);
  }
}

}  // namespace recfleet::coordinator
