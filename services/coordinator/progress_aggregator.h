#ifndef RECFLEET_SERVICES_COORDINATOR_PROGRESS_AGGREGATOR_H_
#define RECFLEET_SERVICES_COORDINATOR_PROGRESS_AGGREGATOR_H_

// Folds the per-rank step reports of one job attempt into the job-level
// JobProgress: the step every rank has reached, samples, mean loss,
// throughput at the pace of the slowest rank, and the straggler gap with the
// data-wait / compute / comm breakdown of a mean step. Statistics use the
// newest kRecentSteps steps of each rank; an attempt's first step (warm-up:
// allocations, the first kernels' loading, the data pipeline filling) leaves
// them as soon as the rank has reported a second one, and a rank that has
// reported only its warm-up is left out of them while another rank is past
// its own.
//
// Not thread-safe: the coordinator keeps one per active job under its mutex.

#include <cstdint>
#include <deque>
#include <vector>

#include "google/protobuf/repeated_ptr_field.h"
#include "recfleet/v1/job.pb.h"
#include "recfleet/v1/worker_service.pb.h"

namespace recfleet::coordinator {

class ProgressAggregator {
 public:
  // Steps per rank kept for throughput and straggler statistics.
  static constexpr size_t kRecentSteps = 16;

  // Starts an attempt of `world_size` ranks that resume at `resume_step`;
  // forgets every earlier report.
  void Reset(int world_size, int64_t resume_step);

  int world_size() const { return static_cast<int>(ranks_.size()); }

  // The latest step `rank` reported (the resume step before its first
  // report); `rank` must be in [0, world_size()).
  int64_t rank_step(int rank) const { return ranks_[rank].step; }

  // Records the steps one rank reports; `rank` must be in [0, world_size()).
  // Steps at or before the rank's latest reported step are a retried report
  // and are skipped. Returns how many steps were recorded.
  int Record(int rank,
             const google::protobuf::RepeatedPtrField<::recfleet::v1::StepStats>& steps);

  // Writes the aggregate into `progress`. Eval fields and update_time are
  // left alone; `samples` never decreases, so samples counted before a
  // restart stay counted. Fields no rank has reported yet are left as they
  // are.
  void Compute(::recfleet::v1::JobProgress& progress) const;

 private:
  struct RankStats {
    int64_t step = 0;
    int64_t samples = 0;
    double loss = 0;
    int64_t peak_memory_bytes = 0;  // Largest StepStats.peak_memory_bytes.
    bool reported = false;
    // The attempt's first step is still in `recent` (see the class comment).
    bool warmup_in_recent = false;
    std::deque<::recfleet::v1::StepStats> recent;  // Newest last.
  };
  std::vector<RankStats> ranks_;
};

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_PROGRESS_AGGREGATOR_H_
