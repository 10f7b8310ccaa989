#include "services/common/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "common/process_memory.h"

namespace recfleet {

double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec * 1e-6;
}

namespace {

// Start time from /proc: boot time (btime in /proc/stat) plus the process's
// start in clock ticks after boot (field 22 of /proc/self/stat).
double StartTimeSeconds() {
  double btime = 0;
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (std::sscanf(line, "btime %lf", &btime) == 1) break;
    }
    std::fclose(f);
  }
  unsigned long long start_ticks = 0;
  if (FILE* f = std::fopen("/proc/self/stat", "r")) {
    char buf[1024];
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    buf[n] = 0;
    std::fclose(f);
    // Fields after the command name, which is in parentheses and may hold spaces.
    const char* p = std::strrchr(buf, ')');
    if (p != nullptr) {
      // Field 3 (state) is first after ')'; starttime is field 22.
      std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                         "%*d %llu",
                  &start_ticks);
    }
  }
  return btime + static_cast<double>(start_ticks) / sysconf(_SC_CLK_TCK);
}

}  // namespace

void AddProcessMetrics(metrics::MetricRegistry* registry) {
  auto* cpu = &registry->AddCounter("process_cpu_seconds_total",
                                    "Total user and system CPU time spent in seconds.")
                   .Get();
  auto* rss = &registry->AddGauge("process_resident_memory_bytes", "Resident memory size in bytes.")
                   .Get();
  registry
      ->AddGauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
      .Get()
      .Set(StartTimeSeconds());
  auto mu = std::make_shared<absl::Mutex>();
  registry->AddCollector([cpu, rss, mu] {
    absl::MutexLock lock(mu.get());
    // The counter catches up to the cumulative CPU time (never goes down).
    cpu->Increment(ProcessCpuSeconds() - cpu->Value());
    absl::StatusOr<int64_t> resident = ResidentBytes();
    rss->Set(resident.ok() ? static_cast<double>(*resident) : 0);
  });
}

}  // namespace recfleet
