#ifndef RECFLEET_BENCH_E2E_GPU_BUSY_H_
#define RECFLEET_BENCH_E2E_GPU_BUSY_H_

// How much of a stretch of GPU time the device actually computed: CUPTI's
// activity records of every kernel, memcpy and memset, merged into busy
// intervals. Over steps that run back to back, window = first record's
// start to last record's end, and idle = window - busy is the time the GPU
// waited for the host (launch gaps, host work, synchronizations).
//
// CUPTI is loaded at run time (dlopen of libcupti.so.13, or libcupti.so),
// so the benchmark builds and runs without it; Start() then says why it is
// unavailable. One meter at a time per process.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recfleet::bench {

struct GpuBusy {
  double window_ms = 0;   // first start .. last end of the records
  double busy_ms = 0;     // union of the records' intervals
  int64_t records = 0;    // kernels + copies + sets seen
  double idle_fraction() const { return window_ms > 0 ? 1.0 - busy_ms / window_ms : 0.0; }

  // Where the time goes, by record name (a kernel's demangled name cut to
  // 96 characters, "memcpy <kind>", "memset"), at most kTop each, largest
  // first: device time per name, and each idle gap charged to the record
  // the GPU waited for (the first one after the gap: what the host had not
  // yet launched) and to the record before it (what the host did after).
  struct Share {
    std::string name;
    double ms = 0;
    int64_t count = 0;
  };
  static constexpr size_t kTop = 12;
  std::vector<Share> busy_by_name, idle_before, idle_after;
  int64_t gaps = 0;            // idle gaps in the window
  double gaps_over_50us_ms = 0;  // their total length where longer than 50 us
};

class GpuBusyMeter {
 public:
  // Starts recording (activity kinds enabled from now on).
  static absl::StatusOr<std::unique_ptr<GpuBusyMeter>> Start();
  ~GpuBusyMeter();
  GpuBusyMeter(const GpuBusyMeter&) = delete;
  GpuBusyMeter& operator=(const GpuBusyMeter&) = delete;

  // Stops recording and merges what was recorded since Start(). Call after
  // the device finished the work (cudaDeviceSynchronize).
  absl::StatusOr<GpuBusy> Stop();

 private:
  GpuBusyMeter() = default;
  bool stopped_ = false;
};

}  // namespace recfleet::bench

#endif  // RECFLEET_BENCH_E2E_GPU_BUSY_H_
