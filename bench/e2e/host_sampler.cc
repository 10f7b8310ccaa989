#include "bench/e2e/host_sampler.h"

#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace recfleet::bench {
namespace {

constexpr int kMaxSamples = 50000;
constexpr int kDepth = 40;

struct Sample {
  const char* tag;
  int64_t weight_ns;  // wall time since the previous sample (or the start)
  int depth;
  void* frames[kDepth];
};

// The signal handler's state: one sampler per process.
Sample* g_samples = nullptr;
std::atomic<int> g_count{0};
std::atomic<const char*> g_tag{"-"};
pthread_t g_target;
std::atomic<bool> g_active{false};
// When the previous sample was taken; only the sampled thread touches it
// once sampling runs.
int64_t g_last_ns = 0;

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // async-signal-safe
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

void OnSignal(int, siginfo_t*, void*) {
  if (!g_active.load(std::memory_order_acquire) || !pthread_equal(pthread_self(), g_target)) return;
  const int saved_errno = errno;
  // Signals sent while the thread waited for a core merge into one
  // (a pending signal is not queued twice), so a sample stands for the
  // wall time since the previous one, not for one interval.
  const int64_t now = MonotonicNs();
  const int64_t weight = now - g_last_ns;
  g_last_ns = now;
  const int n = g_count.fetch_add(1, std::memory_order_relaxed);
  if (n < kMaxSamples) {
    Sample& s = g_samples[n];
    s.tag = g_tag.load(std::memory_order_relaxed);
    s.weight_ns = weight;
    s.depth = backtrace(s.frames, kDepth);
  }
  errno = saved_errno;
}

}  // namespace

struct HostSampler::Thread {
  std::atomic<bool> stop{false};
  std::thread thread;
};

void HostSampler::SetTag(const char* tag) { g_tag.store(tag, std::memory_order_relaxed); }

absl::StatusOr<std::unique_ptr<HostSampler>> HostSampler::Start(int interval_us) {
  if (g_active.load()) return absl::FailedPreconditionError("a host sampler is already running");
  if (interval_us < 10) return absl::InvalidArgumentError("interval_us must be >= 10");
  // backtrace() loads its unwinder on first use: not inside the handler.
  void* warm[4];
  backtrace(warm, 4);
  if (g_samples == nullptr) g_samples = new Sample[kMaxSamples];
  g_count.store(0);
  g_target = pthread_self();
  g_last_ns = MonotonicNs();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = OnSignal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, nullptr) != 0) {
    return absl::InternalError(absl::StrCat("sigaction: ", std::strerror(errno)));
  }
  std::unique_ptr<HostSampler> sampler(new HostSampler());
  sampler->thread_ = std::make_unique<Thread>();
  g_active.store(true, std::memory_order_release);
  Thread* t = sampler->thread_.get();
  const pthread_t target = g_target;
  t->thread = std::thread([t, target, interval_us] {
    // Only the sampled thread takes the signal.
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGPROF);
    pthread_sigmask(SIG_BLOCK, &block, nullptr);
    timespec next;
    clock_gettime(CLOCK_MONOTONIC, &next);
    while (!t->stop.load(std::memory_order_relaxed)) {
      next.tv_nsec += static_cast<long>(interval_us) * 1000;
      while (next.tv_nsec >= 1000000000L) {
        next.tv_nsec -= 1000000000L;
        ++next.tv_sec;
      }
      clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr);
      pthread_kill(target, SIGPROF);
    }
  });
  return sampler;
}

int64_t HostSampler::Stop() {
  if (!stopped_) {
    stopped_ = true;
    thread_->stop.store(true);
    thread_->thread.join();
    g_active.store(false, std::memory_order_release);
  }
  return std::min(g_count.load(), kMaxSamples);
}

HostSampler::~HostSampler() { Stop(); }

absl::Status HostSampler::Write(const std::string& path) const {
  std::ofstream out(path);
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  out << "maps\n";
  {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) out << line << "\n";
  }
  out << "samples\n";
  const int n = std::min(g_count.load(), kMaxSamples);
  char hex[32];
  for (int i = 0; i < n; ++i) {
    const Sample& s = g_samples[i];
    out << (s.tag != nullptr ? s.tag : "-") << ' ' << (s.weight_ns + 500) / 1000;
    // Frames 0-1 are the handler and the signal trampoline.
    for (int f = 2; f < s.depth; ++f) {
      std::snprintf(hex, sizeof(hex), " %lx", reinterpret_cast<unsigned long>(s.frames[f]));
      out << hex;
    }
    out << "\n";
  }
  if (!out) return absl::InternalError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace recfleet::bench
