#include "bench/e2e/gpu_busy.h"

#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
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

struct Interval {
  uint64_t start, end;
  int name;  // index into names
  bool operator<(const Interval& o) const { return start < o.start; }
};

std::mutex intervals_mu;
std::vector<Interval>* intervals = nullptr;
std::vector<std::string> names;
std::map<std::string, int> name_ids;

int NameId(const std::string& name) {
  auto [it, fresh] = name_ids.try_emplace(name, static_cast<int>(names.size()));
  if (fresh) names.push_back(name);
  return it->second;
}

std::string KernelName(const char* mangled) {
  if (mangled == nullptr) return "kernel";
  int status = 0;
  char* plain = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && plain != nullptr ? plain : mangled;
  std::free(plain);
  // JSON-safe, and short enough to read.
  for (char& ch : name) {
    if (ch == '"' || ch == '\\') ch = '\'';
  }
  if (name.size() > 96) name.resize(96);
  return name;
}

// The kTop largest entries of `by_id` (device ns and counts per name id).
std::vector<GpuBusy::Share> Top(const std::map<int, std::pair<uint64_t, int64_t>>& by_id) {
  std::vector<GpuBusy::Share> out;
  for (const auto& [id, v] : by_id) {
    out.push_back({names[id], static_cast<double>(v.first) / 1e6, v.second});
  }
  std::sort(out.begin(), out.end(),
            [](const GpuBusy::Share& a, const GpuBusy::Share& b) { return a.ms > b.ms; });
  if (out.size() > GpuBusy::kTop) out.resize(GpuBusy::kTop);
  return out;
}

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
    std::string name;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        start = k->start, end = k->end;
        name = KernelName(k->name);
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        start = m->start, end = m->end;
        name = absl::StrCat("memcpy kind ", static_cast<int>(m->copyKind));
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        start = m->start, end = m->end;
        name = "memset";
        break;
      }
      default:
        continue;
    }
    if (intervals != nullptr && end > start) intervals->push_back({start, end, NameId(name)});
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
    intervals = new std::vector<Interval>;
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
  std::vector<Interval> iv;
  std::lock_guard<std::mutex> lock(intervals_mu);
  iv.swap(*intervals);
  delete intervals;
  intervals = nullptr;
  GpuBusy r;
  r.records = static_cast<int64_t>(iv.size());
  if (iv.empty()) return r;
  std::sort(iv.begin(), iv.end());
  std::map<int, std::pair<uint64_t, int64_t>> busy_by, before_by, after_by;
  uint64_t first = iv.front().start, last = 0, busy = 0;
  uint64_t cur_begin = iv.front().start, cur_end = iv.front().end;
  int cur_last = iv.front().name;  // the record that ends the current busy stretch
  for (const Interval& x : iv) {
    last = std::max(last, x.end);
    auto& n = busy_by[x.name];
    n.first += x.end - x.start;
    ++n.second;
    if (x.start > cur_end) {
      busy += cur_end - cur_begin;
      const uint64_t gap = x.start - cur_end;
      ++r.gaps;
      if (gap > 50000) r.gaps_over_50us_ms += static_cast<double>(gap) / 1e6;
      for (auto [by, id] : {std::pair{&before_by, x.name}, std::pair{&after_by, cur_last}}) {
        (*by)[id].first += gap;
        ++(*by)[id].second;
      }
      cur_begin = x.start, cur_end = x.end, cur_last = x.name;
    } else if (x.end > cur_end) {
      cur_end = x.end;
      cur_last = x.name;
    }
  }
  busy += cur_end - cur_begin;
  r.busy_by_name = Top(busy_by);
  r.idle_before = Top(before_by);
  r.idle_after = Top(after_by);
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
