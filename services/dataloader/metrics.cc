#include "services/dataloader/metrics.h"

#include "absl/strings/str_cat.h"

namespace recfleet::dataloader {

void LoaderMetrics::Rate::Add(int64_t now_s, double v) {
  int i = static_cast<int>(now_s % kBuckets);
  if (second[i] != now_s) {
    second[i] = now_s;
    sum[i] = 0;
  }
  sum[i] += v;
}

double LoaderMetrics::Rate::PerSecond(int64_t now_s) const {
  double total = 0;
  for (int i = 0; i < kBuckets; ++i) {
    // Complete seconds only: the current one is still filling.
    if (second[i] < now_s && second[i] >= now_s - (kBuckets - 1)) total += sum[i];
  }
  return total / (kBuckets - 1);
}

LoaderMetrics::LoaderMetrics()
    : samples_(registry_.AddCounter("recfleet_dataloader_samples_total",
                                    "Samples sent to workers.", {"recfleet_job", "rank"})),
      bytes_(registry_.AddCounter("recfleet_dataloader_bytes_total",
                                  "Bytes of sample data sent to workers.", {"recfleet_job", "rank"})),
      samples_per_second_(registry_
                              .AddGauge("recfleet_dataloader_samples_per_second",
                                        "Samples sent per second over the last 10 s.")
                              .Get()),
      bytes_per_second_(registry_
                            .AddGauge("recfleet_dataloader_bytes_per_second",
                                      "Bytes sent per second over the last 10 s.")
                            .Get()),
      steps_(registry_.AddCounter("recfleet_dataloader_steps_total", "Steps dealt.").Get()),
      gap_(registry_.AddGauge(
          "recfleet_dataloader_straggler_gap",
          "Last step's max rank cost / mean - 1, before (naive) and after (policy) dealing.",
          {"recfleet_job", "dealing"})),
      // Gaps run from ~0.001 (policy dealing) to ~1 (naive dealing of skewed lengths).
      gap_histogram_(registry_.AddHistogram("recfleet_dataloader_step_straggler_gap_ratio",
                                            "Per-step max rank cost / mean - 1, by dealing.",
                                            {"recfleet_job", "dealing"},
                                            metrics::ExponentialBuckets(0.001, 2, 12))),
      queue_depth_(registry_.AddGauge("recfleet_dataloader_queue_depth",
                                      "Prefetched batches waiting to be sent, per rank.",
                                      {"recfleet_job", "rank"})),
      open_jobs_(registry_.AddGauge("recfleet_dataloader_open_jobs", "Jobs whose data this loader has open.").Get()),
      start_(std::chrono::steady_clock::now()) {
  registry_.AddCollector([this] {
    int64_t now = Now();
    absl::MutexLock l(&mu_);
    samples_per_second_.Set(sample_rate_.PerSecond(now));
    bytes_per_second_.Set(byte_rate_.PerSecond(now));
  });
}

int64_t LoaderMetrics::Now() const {
  // Offset by one so that no real second collides with the zero-initialized buckets.
  return 1 + std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                               start_)
                 .count();
}

void LoaderMetrics::RecordStep(const std::string& job, double policy_gap, double naive_gap) {
  steps_.Increment();
  gap_.WithLabels({job, "naive"}).Set(naive_gap);
  gap_.WithLabels({job, "policy"}).Set(policy_gap);
  gap_histogram_.WithLabels({job, "naive"}).Observe(naive_gap);
  gap_histogram_.WithLabels({job, "policy"}).Observe(policy_gap);
}

void LoaderMetrics::RecordSent(const std::string& job, int rank, int64_t samples, int64_t bytes) {
  std::string r = absl::StrCat(rank);
  samples_.WithLabels({job, r}).Increment(static_cast<double>(samples));
  bytes_.WithLabels({job, r}).Increment(static_cast<double>(bytes));
  int64_t now = Now();
  absl::MutexLock l(&mu_);
  job_ranks_[job].insert(r);
  sample_rate_.Add(now, static_cast<double>(samples));
  byte_rate_.Add(now, static_cast<double>(bytes));
}

void LoaderMetrics::SetQueueDepth(const std::string& job, int rank, int depth) {
  {
    absl::MutexLock l(&mu_);
    job_ranks_[job].insert(absl::StrCat(rank));
  }
  queue_depth_.WithLabels({job, absl::StrCat(rank)}).Set(depth);
}

void LoaderMetrics::EndJob(const std::string& job) {
  std::set<std::string> ranks;
  {
    absl::MutexLock l(&mu_);
    auto it = job_ranks_.find(job);
    if (it != job_ranks_.end()) {
      ranks = std::move(it->second);
      job_ranks_.erase(it);
    }
  }
  for (const std::string& r : ranks) {
    samples_.Remove({job, r});
    bytes_.Remove({job, r});
    queue_depth_.Remove({job, r});
  }
  for (const char* dealing : {"naive", "policy"}) {
    gap_.Remove({job, dealing});
    gap_histogram_.Remove({job, dealing});
  }
}

void LoaderMetrics::EndStream(const std::string& job, int rank) {
  queue_depth_.Remove({job, absl::StrCat(rank)});
}

void LoaderMetrics::SetOpenJobs(int jobs) { open_jobs_.Set(jobs); }

}  // namespace recfleet::dataloader
