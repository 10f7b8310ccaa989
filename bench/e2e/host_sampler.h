#ifndef RECFLEET_BENCH_E2E_HOST_SAMPLER_H_
#define RECFLEET_BENCH_E2E_HOST_SAMPLER_H_

// A wall-clock sampling profiler of one host thread, for machines without
// perf or Nsight Systems: a helper thread signals the sampled thread every
// `interval_us`, and the signal handler records the interrupted call stack
// (return addresses) and a caller-set tag (what the step is doing). Blocking
// waits (event and stream synchronizations, joins) are sampled like work, so
// the samples say where the thread's wall time goes. Write() saves the raw
// addresses with the process's memory map; tools symbolize them offline
// against the unstripped binary (bench/e2e/host_profile.py).
//
// One sampler per process at a time; not a general-purpose profiler.
// backtrace() in a signal handler is not async-signal-safe: a sample that
// lands while the sampled thread holds the dynamic loader's lock (dlopen,
// a first CUDA module load, exception unwinding) can deadlock. Sample only
// warmed-up steady-state steps, as engine_bench does after its timed steps.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace recfleet::bench {

class HostSampler {
 public:
  // Starts sampling the calling thread.
  static absl::StatusOr<std::unique_ptr<HostSampler>> Start(int interval_us);
  ~HostSampler();
  HostSampler(const HostSampler&) = delete;
  HostSampler& operator=(const HostSampler&) = delete;

  // Stops sampling (idempotent). Returns the number of samples kept.
  int64_t Stop();
  // "maps" section (/proc/self/maps), then one line per sample:
  // "TAG US ADDR ADDR ..." with US the wall time (microseconds) the sample
  // stands for: since the previous sample, more than one interval when the
  // thread waited for a core and the signals merged. Frames innermost
  // first, addresses in hex.
  absl::Status Write(const std::string& path) const;

  // What the sampled thread is doing now (a string literal or another
  // string that outlives the sampler); recorded with every sample.
  static void SetTag(const char* tag);

 private:
  HostSampler() = default;
  struct Thread;
  std::unique_ptr<Thread> thread_;
  bool stopped_ = false;
};

}  // namespace recfleet::bench

#endif  // RECFLEET_BENCH_E2E_HOST_SAMPLER_H_
