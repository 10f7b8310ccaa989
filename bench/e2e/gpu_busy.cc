#include "bench/e2e/gpu_busy.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#if __has_include(<cupti_activity.h>)
#include <cupti_activity.h>
#define RECFLEET_HAVE_CUPTI 1
#endif

namespace recfleet::bench {

#ifdef RECFLEET_HAVE_CUPTI
namespace {

// The CUPTI entry points, resolved from the shared library.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
};

absl::StatusOr<Cupti*> Load() {
  static Cupti* loaded = nullptr;
  if (loaded != nullptr) return loaded;
  void* lib = nullptr;
  for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
    lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) break;
  }
  if (lib == nullptr) {
    return absl::UnavailableError(absl::StrCat("CUPTI not found (dlopen libcupti.so.13: ", dlerror(),
                                               "); add its directory to LD_LIBRARY_PATH"));
  }
  auto* c = new Cupti;
  bool ok = true;
  auto get = [&](auto* fn, const char* sym) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, sym));
    ok = ok && *fn != nullptr;
  };
  get(&c->register_callbacks, "cuptiActivityRegisterCallbacks");
  get(&c->enable, "cuptiActivityEnable");
  get(&c->disable, "cuptiActivityDisable");
  get(&c->flush_all, "cuptiActivityFlushAll");
  get(&c->next_record, "cuptiActivityGetNextRecord");
  if (!ok) return absl::UnavailableError("libcupti lacks the activity API");
  loaded = c;
  return c;
}

constexpr size_t kBufferBytes = 8 << 20;
constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                         CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

std::mutex intervals_mu;
std::vector<std::pair<uint64_t, uint64_t>>* intervals = nullptr;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  static Cupti* c = *Load();
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(intervals_mu);
  while (c->next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    uint64_t start = 0, end = 0;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = k->start, end = k->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = m->start, end = m->end;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = m->start, end = m->end;
        break;
      }
      default:
        continue;
    }
    if (intervals != nullptr && end > start) intervals->emplace_back(start, end);
  }
  std::free(buffer);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuBusyMeter>> GpuBusyMeter::Start() {
  absl::StatusOr<Cupti*> c = Load();
  if (!c.ok()) return c.status();
  {
    std::lock_guard<std::mutex> lock(intervals_mu);
    if (intervals != nullptr) return absl::FailedPreconditionError("a GpuBusyMeter is running");
    intervals = new std::vector<std::pair<uint64_t, uint64_t>>;
  }
  if ((*c)->register_callbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS) {
    return absl::InternalError("cuptiActivityRegisterCallbacks failed");
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if ((*c)->enable(kind) != CUPTI_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuptiActivityEnable(", static_cast<int>(kind), ") failed"));
    }
  }
  return std::unique_ptr<GpuBusyMeter>(new GpuBusyMeter());
}

absl::StatusOr<GpuBusy> GpuBusyMeter::Stop() {
  Cupti* c = *Load();
  for (CUpti_ActivityKind kind : kKinds) c->disable(kind);
  c->flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  stopped_ = true;
  std::vector<std::pair<uint64_t, uint64_t>> iv;
  {
    std::lock_guard<std::mutex> lock(intervals_mu);
    iv.swap(*intervals);
    delete intervals;
    intervals = nullptr;
  }
  GpuBusy r;
  r.records = static_cast<int64_t>(iv.size());
  if (iv.empty()) return r;
  std::sort(iv.begin(), iv.end());
  uint64_t first = iv.front().first, last = 0, busy = 0;
  uint64_t cur_begin = iv.front().first, cur_end = iv.front().second;
  for (const auto& [b, e] : iv) {
    last = std::max(last, e);
    if (b > cur_end) {
      busy += cur_end - cur_begin;
      cur_begin = b, cur_end = e;
    } else {
      cur_end = std::max(cur_end, e);
    }
  }
  busy += cur_end - cur_begin;
  r.window_ms = static_cast<double>(last - first) / 1e6;
  r.busy_ms = static_cast<double>(busy) / 1e6;
  return r;
}

GpuBusyMeter::~GpuBusyMeter() {
  if (!stopped_) (void)Stop();
}

#else  // no CUPTI headers at build time

absl::StatusOr<std::unique_ptr<GpuBusyMeter>> GpuBusyMeter::Start() {
  return absl::UnavailableError("built without CUPTI headers");
}
absl::StatusOr<GpuBusy> GpuBusyMeter::Stop() { return GpuBusy{}; }
GpuBusyMeter::~GpuBusyMeter() = default;

#endif

}  // namespace recfleet::bench
