// Host side of the CUDA attention: plans the tile work lists from the
// offsets, runs the pre/post passes and launches the kernels.
//
// Plans depend only on the offsets and the mask, so they are cached per
// device: the training step calls every attention layer, forward and
// backward, with the same batch offsets, and only the first call pays for
// planning and the upload. In training every step brings new offsets, so
// the upload is stream-ordered (pinned staging, cudaMemcpyAsync into
// stream-ordered memory, freed behind the events of its last users): the
// host never waits for the device. Temporaries come from the stream-ordered
// allocator and are freed on the stream.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/cuda_kernels.h"
#include "kernels/attention/tile_plan.h"

namespace recfleet::attention::internal {
namespace {

using cuda_impl::KernelParams;
using cuda_impl::TransformParams;
using cuda_impl::WorkItem;

constexpr int kTile = cuda_impl::kTileRows;

absl::Status CudaCheck(int err, absl::string_view what) {
  if (err == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA attention: ", what, " failed: ",
                                          cudaGetErrorString(static_cast<cudaError_t>(err))));
}


// Pinned host memory in which plans are staged for their asynchronous
// upload: a ring whose regions are reused once the copy out of them has
// completed (one event per copy, polled, never waited on). When a plan does
// not fit beside the copies still in flight the ring is replaced by a larger
// one (the only pinned allocation, rare: the size doubles), and the old one
// is freed once its copies are done. Not thread-safe (the cache's lock).
class StagingRing {
 public:
  // A region of `bytes` bytes to fill now and copy from on `stream`; Commit
  // after enqueuing the copy.
  absl::StatusOr<char*> Reserve(size_t bytes) {
    Reclaim();
    if (in_flight_.empty()) head_ = 0;
    std::optional<size_t> at = Fit(bytes);
    if (!at.has_value()) {
      char* grown = nullptr;
      const size_t cap = std::max({2 * cap_, 2 * bytes, kMinBytes});
      if (auto s = CudaCheck(cudaHostAlloc(reinterpret_cast<void**>(&grown), cap,
                                           cudaHostAllocPortable),
                             "cudaHostAlloc(plan staging)");
          !s.ok()) {
        return s;
      }
      if (buf_ != nullptr) retired_.push_back({buf_, std::move(in_flight_)});
      in_flight_.clear();
      buf_ = grown;
      cap_ = cap;
      head_ = 0;
      at = 0;
    }
    reserved_ = {*at, *at + bytes, nullptr};
    head_ = *at + bytes;
    return buf_ + *at;
  }

  // Records, on `stream`, when the copy out of the last reserved region is
  // done.
  absl::Status Commit(cudaStream_t stream) {
    cudaEvent_t done = nullptr;
    if (!spare_events_.empty()) {
      done = spare_events_.back();
      spare_events_.pop_back();
    } else if (auto s = CudaCheck(cudaEventCreateWithFlags(&done, cudaEventDisableTiming),
                                  "cudaEventCreate(plan staging)");
               !s.ok()) {
      return s;
    }
    reserved_.done = done;
    in_flight_.push_back(reserved_);
    return CudaCheck(cudaEventRecord(done, stream), "cudaEventRecord(plan staging)");
  }

 private:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  struct Copy {
    size_t begin, end;
    cudaEvent_t done;
  };

  // Where `bytes` fit beside the copies in flight: the live region runs from
  // the oldest copy's start to head_, wrapped when head_ is not past it.
  std::optional<size_t> Fit(size_t bytes) const {
    if (buf_ == nullptr) return std::nullopt;
    if (in_flight_.empty()) return bytes <= cap_ ? std::optional<size_t>(0) : std::nullopt;
    const size_t tail = in_flight_.front().begin;
    if (tail < head_) {  // not wrapped: [head_, cap_) or [0, tail)
      if (head_ + bytes <= cap_) return head_;
      if (bytes <= tail) return 0;
      return std::nullopt;
    }
    if (head_ + bytes <= tail) return head_;  // wrapped: [head_, tail)
    return std::nullopt;
  }

  // Drops the completed copies (oldest first) and frees retired rings whose
  // copies all completed.
  void Reclaim() {
    auto drop_done = [this](std::deque<Copy>& copies) {
      while (!copies.empty() && cudaEventQuery(copies.front().done) == cudaSuccess) {
        spare_events_.push_back(copies.front().done);
        copies.pop_front();
      }
    };
    drop_done(in_flight_);
    for (auto it = retired_.begin(); it != retired_.end();) {
      drop_done(it->second);
      if (it->second.empty()) {
        cudaFreeHost(it->first);
        it = retired_.erase(it);
      } else {
        ++it;
      }
    }
  }

  char* buf_ = nullptr;
  size_t cap_ = 0;
  size_t head_ = 0;
  Copy reserved_{0, 0, nullptr};
  std::deque<Copy> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  std::vector<std::pair<char*, std::deque<Copy>>> retired_;
};

// A plan in device memory: one stream-ordered allocation holding every list.
// Lives in the cache until evicted and until its last user is done; every
// launcher call records, on its stream, when its kernels stop reading the
// plan (RecordUse), and the memory returns to the stream-ordered pool behind
// those events, so a later plan can never overwrite it while a kernel still
// reads it, and the host never waits.
struct DevicePlan {
  int device = 0;
  void* memory = nullptr;
  cudaEvent_t uploaded = nullptr;       // the upload's copy is done
  cudaStream_t release_stream = nullptr;  // the cache's, for the ordered free
  WorkItem* forward_tiles = nullptr;
  WorkItem* grouped_tiles = nullptr;
  WorkItem* query_tiles = nullptr;
  WorkItem* key_tiles = nullptr;
  WorkItem* wide_key_tiles = nullptr;
  WorkItem* blocks = nullptr;
  int64_t* q_offsets = nullptr;
  int64_t* k_offsets = nullptr;
  int num_forward_tiles = 0, num_grouped_tiles = 0, num_query_tiles = 0, num_key_tiles = 0,
      num_wide_key_tiles = 0, num_blocks = 0;
  bool block_kernel = false;
  double mean_streamed_key_tiles = 0.0;  // MeanStreamedTiles(wide key tiles)

  // Marks the work enqueued on `stream` so far as reading the plan.
  void RecordUse(cudaStream_t stream) const {
    std::lock_guard<std::mutex> lock(uses_mu_);
    for (auto& [s, event] : uses_) {
      if (s == stream) {
        cudaEventRecord(event, stream);
        return;
      }
    }
    cudaEvent_t event = nullptr;
    if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      // Without an event the free could overtake the work: wait for it now
      // (only where the driver cannot make an event).
      cudaStreamSynchronize(stream);
      return;
    }
    cudaEventRecord(event, stream);
    uses_.emplace_back(stream, event);
  }

  ~DevicePlan() {
    int current = 0;
    cudaGetDevice(&current);
    if (current != device) cudaSetDevice(device);
    if (uploaded != nullptr) {
      cudaStreamWaitEvent(release_stream, uploaded, 0);
      cudaEventDestroy(uploaded);
    }
    for (auto& [s, event] : uses_) {
      cudaStreamWaitEvent(release_stream, event, 0);
      cudaEventDestroy(event);  // released once it completes
    }
    if (memory != nullptr) cudaFreeAsync(memory, release_stream);
    if (current != device) cudaSetDevice(current);
  }

 private:
  mutable std::mutex uses_mu_;
  mutable std::vector<std::pair<cudaStream_t, cudaEvent_t>> uses_;
};

// The caller's hold on a plan: when the launcher returns (any path), the
// work it enqueued is recorded as a use of the plan.
class PlanLease {
 public:
  PlanLease(std::shared_ptr<const DevicePlan> plan, cudaStream_t stream)
      : plan_(std::move(plan)), stream_(stream) {}
  PlanLease(const PlanLease&) = delete;
  PlanLease& operator=(const PlanLease&) = delete;
  ~PlanLease() { plan_->RecordUse(stream_); }
  const DevicePlan& operator*() const { return *plan_; }
  const DevicePlan* operator->() const { return plan_.get(); }

 private:
  std::shared_ptr<const DevicePlan> plan_;
  cudaStream_t stream_;
};

// Least-recently-used cache of device plans keyed by (device, mask, window,
// offsets). A new plan is uploaded on the caller's stream (stream-ordered
// allocation, copy from pinned staging, no host synchronization); a caller
// on another stream waits for the upload on its own stream. Thread-safe.
class PlanCache {
 public:
  absl::StatusOr<std::unique_ptr<PlanLease>> Get(const AttentionInputs& in,
                                                 const AttentionOptions& o, cudaStream_t stream) {
    int device = 0;
    if (auto s = CudaCheck(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
    TilePlanKey key(device, in, o);
    std::lock_guard<std::mutex> lock(mu_);
    auto found = index_.find(key);
    if (found != index_.end()) {
      lru_.splice(lru_.begin(), lru_, found->second);
      const std::shared_ptr<DevicePlan>& plan = found->second->second;
      // Free where the upload ran on this stream; ordered where it did not.
      if (auto s = CudaCheck(cudaStreamWaitEvent(stream, plan->uploaded, 0),
                             "cudaStreamWaitEvent(plan)");
          !s.ok()) {
        return s;
      }
      return std::make_unique<PlanLease>(plan, stream);
    }
    auto plan = Upload(MakeTilePlan(in, o), key, device, stream);
    if (!plan.ok()) return plan.status();
    lru_.emplace_front(std::move(key), *plan);
    index_.insert_or_assign(lru_.front().first, lru_.begin());
    if (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();  // in-flight users hold their own reference
    }
    return std::make_unique<PlanLease>(*plan, stream);
  }

 private:
  static constexpr size_t kCapacity = 32;
  static constexpr size_t kAlign = 256;
  using Entry = std::pair<TilePlanKey, std::shared_ptr<DevicePlan>>;

  // Per device: the staging ring and the stream on which plans are freed.
  struct PerDevice {
    StagingRing staging;
    cudaStream_t release_stream = nullptr;
  };

  absl::StatusOr<PerDevice*> ForDevice(int device) {
    PerDevice& d = devices_[device];
    if (d.release_stream == nullptr) {
      if (auto s = CudaCheck(cudaStreamCreateWithFlags(&d.release_stream, cudaStreamNonBlocking),
                             "cudaStreamCreate(plan release)");
          !s.ok()) {
        return s;
      }
      KeepPoolMemory(device);
    }
    return &d;
  }

  absl::StatusOr<std::shared_ptr<DevicePlan>> Upload(const TilePlan& host, const TilePlanKey& key,
                                                     int device, cudaStream_t stream) {
    const absl::Span<const int64_t> offsets(key.offsets());
    const absl::Span<const int64_t> q_off = offsets.subspan(0, key.batch_size() + 1);
    const absl::Span<const int64_t> k_off = offsets.subspan(key.batch_size() + 1);
    auto per_device = ForDevice(device);
    if (!per_device.ok()) return per_device.status();
    auto plan = std::make_shared<DevicePlan>();
    plan->device = device;
    plan->release_stream = (*per_device)->release_stream;
    plan->num_forward_tiles = static_cast<int>(host.forward_tiles.size());
    plan->num_grouped_tiles = static_cast<int>(host.grouped_tiles.size());
    plan->num_query_tiles = static_cast<int>(host.query_tiles.size());
    plan->num_key_tiles = static_cast<int>(host.key_tiles.size());
    plan->num_wide_key_tiles = static_cast<int>(host.wide_key_tiles.size());
    plan->num_blocks = static_cast<int>(host.blocks.size());
    plan->block_kernel = host.block_kernel;
    plan->mean_streamed_key_tiles = MeanStreamedTiles(host.wide_key_tiles);
    // One allocation: each list at a kAlign-aligned offset.
    struct Part {
      const void* data;
      size_t bytes;
      void** dev;
      size_t at;
    };
    auto part = [](const auto& v, auto** dev) {
      return Part{v.data(), v.size() * sizeof(v[0]), reinterpret_cast<void**>(dev), 0};
    };
    Part parts[] = {part(host.forward_tiles, &plan->forward_tiles),
                    part(host.grouped_tiles, &plan->grouped_tiles),
                    part(host.query_tiles, &plan->query_tiles),
                    part(host.key_tiles, &plan->key_tiles),
                    part(host.wide_key_tiles, &plan->wide_key_tiles),
                    part(host.blocks, &plan->blocks),
                    part(q_off, &plan->q_offsets),
                    part(k_off, &plan->k_offsets)};
    size_t total = 0;
    for (Part& pt : parts) {
      pt.at = total;
      total += (pt.bytes + kAlign - 1) / kAlign * kAlign;
    }
    auto staged = (*per_device)->staging.Reserve(total);
    if (!staged.ok()) return staged.status();
    for (const Part& pt : parts) {
      if (pt.bytes > 0) std::memcpy(*staged + pt.at, pt.data, pt.bytes);
    }
    if (auto s = CudaCheck(cudaEventCreateWithFlags(&plan->uploaded, cudaEventDisableTiming),
                           "cudaEventCreate(plan)");
        !s.ok()) {
      return s;
    }
    if (auto s = CudaCheck(cudaMallocAsync(&plan->memory, total, stream), "cudaMallocAsync(plan)");
        !s.ok()) {
      return s;
    }
    if (auto s = CudaCheck(cudaMemcpyAsync(plan->memory, *staged, total, cudaMemcpyHostToDevice,
                                           stream),
                           "cudaMemcpyAsync(plan)");
        !s.ok()) {
      return s;
    }
    if (auto s = (*per_device)->staging.Commit(stream); !s.ok()) return s;
    if (auto s = CudaCheck(cudaEventRecord(plan->uploaded, stream), "cudaEventRecord(plan)");
        !s.ok()) {
      return s;
    }
    for (const Part& pt : parts) {
      *pt.dev = pt.bytes > 0 ? static_cast<char*>(plan->memory) + pt.at : nullptr;
    }
    return plan;
  }

  // Keeps freed temporaries in the stream-ordered pool instead of returning
  // them to the driver at every synchronization.
  static void KeepPoolMemory(int device) {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) == cudaSuccess) {
      uint64_t threshold = UINT64_MAX;
      cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold);
    }
  }

  std::mutex mu_;
  std::list<Entry> lru_;
  absl::flat_hash_map<TilePlanKey, std::list<Entry>::iterator> index_;
  std::unordered_map<int, PerDevice> devices_;
};

PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();
  return *cache;
}

// Stream-ordered temporaries, freed on the stream when the call returns.
class Workspace {
 public:
  explicit Workspace(cudaStream_t stream) : stream_(stream) {}
  ~Workspace() {
    for (void* p : buffers_) cudaFreeAsync(p, stream_);
  }
  absl::StatusOr<void*> Alloc(size_t bytes) {
    void* p = nullptr;
    if (bytes == 0) return p;
    if (auto s = CudaCheck(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync"); !s.ok()) {
      return s;
    }
    buffers_.push_back(p);
    return p;
  }

 private:
  cudaStream_t stream_;
  std::vector<void*> buffers_;
};

// What the kernels see of q and k: the raw tensors, or their QK-norm/RoPE
// transform computed by a pre-pass. The block kernel fuses RoPE itself.
struct PreparedQk {
  const void* q = nullptr;
  const void* k = nullptr;
  bool transformed = false;
  bool fused_rope = false;
};

TransformParams MakeTransform(const AttentionInputs& in, const AttentionOptions& o,
                              const DevicePlan& plan, bool is_query, bool rope) {
  TransformParams t;
  const TensorView& x = is_query ? in.q.values : in.k.values;
  t.x = x.data;
  t.own_offsets = is_query ? plan.q_offsets : plan.k_offsets;
  t.peer_offsets = is_query ? plan.k_offsets : plan.q_offsets;
  t.rows = x.dim(0);
  t.batch = static_cast<int>(in.q.batch_size());
  t.heads = static_cast<int>(x.dim(1));
  t.head_dim = static_cast<int>(x.dim(2));
  t.is_query = is_query;
  t.qk_norm = o.qk_norm;
  t.rope = rope;
  t.log2_theta = static_cast<float>(std::log2(o.rope_theta));
  return t;
}

// `in_place` (a backward whose caller gave up q and k, AttentionInputs::
// qk_writable) writes a transform that the backward can undo without the
// input (RoPE alone) over q and k: each warp reads its (row, head) before
// writing it, so the pass may alias. QK-norm's backward reads the raw input
// and always gets temporaries.
absl::StatusOr<PreparedQk> PrepareQk(const AttentionInputs& in, const AttentionOptions& o,
                                     const DevicePlan& plan, Workspace& ws, cudaStream_t stream,
                                     bool in_place = false) {
  PreparedQk prep{in.q.values.data, in.k.values.data, false, false};
  prep.fused_rope = o.rope && plan.block_kernel;
  const bool pass_rope = o.rope && !plan.block_kernel;
  if (!o.qk_norm && !pass_rope) return prep;
  prep.transformed = true;
  in_place = in_place && !o.qk_norm;
  for (bool is_query : {true, false}) {
    const TensorView& x = is_query ? in.q.values : in.k.values;
    absl::StatusOr<void*> y = x.data;
    if (!in_place) y = ws.Alloc(x.nbytes());
    if (!y.ok()) return y.status();
    TransformParams t = MakeTransform(in, o, plan, is_query, pass_rope);
    t.y = *y;
    if (auto s = CudaCheck(cuda_impl::LaunchQkTransform(t, stream), "QK transform"); !s.ok()) {
      return s;
    }
    (is_query ? prep.q : prep.k) = *y;
  }
  return prep;
}

KernelParams BaseParams(const AttentionInputs& in, const AttentionOptions& o,
                        const PreparedQk& prep) {
  KernelParams p;
  p.q = prep.q;
  p.k = prep.k;
  p.v = in.v.data;
  p.bias = in.bias.data;
  p.heads = static_cast<int>(in.q.values.dim(1));
  p.head_dim = static_cast<int>(in.q.values.dim(2));
  p.activation = o.activation == Activation::kSoftmax ? cuda_impl::kActSoftmax
                 : o.activation == Activation::kGelu  ? cuda_impl::kActGelu
                                                      : cuda_impl::kActSilu;
  p.mask = static_cast<int>(o.mask);
  p.window = static_cast<int>(std::min<int64_t>(o.window, INT32_MAX));
  p.scale = static_cast<float>(ResolvedScale(o, p.head_dim));
  p.rope = prep.fused_rope;
  p.log2_theta = static_cast<float>(std::log2(o.rope_theta));
  return p;
}

// The backward's dQ: a separate query-stationary pass (no atomics,
// deterministic; the default) or fp32 atomics from the dK/dV pass
// (RECFLEET_ATTENTION_DQ=atomic), kept selectable so the choice can be
// re-measured on new shapes and GPUs (bench/attention).
bool AtomicDq() {
  const char* mode = std::getenv("RECFLEET_ATTENTION_DQ");
  return mode != nullptr && std::string(mode) == "atomic";
}

// Which forward kernel runs where the Hopper (wgmma) one supports the shapes
// (head dim 64 or 128, no fused RoPE): by default the Hopper kernel for every
// activation, as measured on H200 (bench/attention). RECFLEET_ATTENTION_FWD
// =mma forces the mma.sync kernel, so the choice can be re-measured.
bool UseWgmmaForward(const KernelParams& p) {
  if (!cuda_impl::WgmmaForwardSupports(p)) return false;
  const char* mode = std::getenv("RECFLEET_ATTENTION_FWD");
  return mode == nullptr || std::string(mode) != "mma";
}

// Which backward runs where the Hopper (wgmma) one supports the shapes: by
// default the Hopper passes, unless RECFLEET_ATTENTION_BWD=mma or the atomic
// dQ (an mma.sync dK/dV pass feature) is asked for, so the choice can be
// re-measured.
bool UseWgmmaBackward(const KernelParams& p) {
  if (!cuda_impl::WgmmaBackwardSupports(p) || AtomicDq()) return false;
  const char* mode = std::getenv("RECFLEET_ATTENTION_BWD");
  return mode == nullptr || std::string(mode) != "mma";
}

// The current device's SM count (the persistent kernels' grid).
absl::StatusOr<int> SmCount() {
  int device = 0, sms = 0;
  if (auto s = CudaCheck(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  if (auto s = CudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                         "cudaDeviceGetAttribute");
      !s.ok()) {
    return s;
  }
  return sms;
}

// Switches of the Hopper forward (KernelParams::wgmma_turns, wgmma_tma,
// wgmma_overlap, wgmma_chain, and whether it runs the grouped tiles), on unless the
// environment variable is "0", kept selectable so the choices can be
// re-measured (bench/attention).
bool EnvFlag(const char* name) {
  const char* mode = std::getenv(name);
  return mode == nullptr || std::string(mode) != "0";
}

// A zeroed fp32 buffer of dQ's shape, into which a dK/dV pass adds dQ.
absl::StatusOr<float*> ZeroedDqAccum(const AttentionGrads& grads, Workspace& ws,
                                     cudaStream_t stream) {
  const size_t bytes = grads.dq.numel() * sizeof(float);
  auto acc = ws.Alloc(bytes);
  if (!acc.ok()) return acc.status();
  if (auto s = CudaCheck(cudaMemsetAsync(*acc, 0, bytes, stream), "cudaMemsetAsync(dq)");
      !s.ok()) {
    return s;
  }
  return static_cast<float*>(*acc);
}

// How the Hopper backward forms dQ: inside the dK/dV pass by TMA
// reduce-add into an fp32 buffer, or by a separate query-stationary pass.
// The fused dQ saves the pass's recomputation of S and dP but pays per
// query row for zeroing and converting the fp32 buffer and per step for the
// consumers' dS exchange; measured on H200 (bench/RESULTS.md) it wins where
// a key tile streams many query tiles (jagged self: hundreds; GDPA cross,
// K/V = 256, Q 256..2048: ~22 on average) and loses where it streams few
// (sliding window W = 256: 6). The rule: fused from
// kFusedDqMinStreamedTiles on (work-weighted mean, MeanStreamedTiles).
// RECFLEET_ATTENTION_WGMMA_DQ=pass or =fused forces either (for
// re-measuring); without TMA always the pass.
constexpr double kFusedDqMinStreamedTiles = 12.0;

bool WgmmaFusedDq(const KernelParams& p, const DevicePlan& plan) {
  if (!cuda_impl::WgmmaFusedDqSupports(p)) return false;
  const char* mode = std::getenv("RECFLEET_ATTENTION_WGMMA_DQ");
  if (mode != nullptr && std::string(mode) == "pass") return false;
  if (mode != nullptr && std::string(mode) == "fused") return true;
  return plan.mean_streamed_key_tiles >= kFusedDqMinStreamedTiles;
}

// The jagged backward's Hopper passes: dK/dV with dQ fused, or dQ then dK/dV.
absl::Status WgmmaBackward(const AttentionInputs& in, const DevicePlan& plan,
                           const AttentionGrads& grads, Workspace& ws, KernelParams p,
                           cudaStream_t stream) {
  auto sms = SmCount();
  if (!sms.ok()) return sms.status();
  p.q_rows = in.q.values.dim(0);
  p.kv_rows = in.k.values.dim(0);
  p.wgmma_tma = EnvFlag("RECFLEET_ATTENTION_WGMMA_TMA");
  p.wgmma_stat_prefetch = EnvFlag("RECFLEET_ATTENTION_WGMMA_STAT_PREFETCH");
  const bool fused = WgmmaFusedDq(p, plan);
  if (fused) {
    auto acc = ZeroedDqAccum(grads, ws, stream);
    if (!acc.ok()) return acc.status();
    p.dq_accum = *acc;
  } else {
    p.items = plan.forward_tiles;
    p.num_items = plan.num_forward_tiles;
    if (auto s = CudaCheck(cuda_impl::LaunchJaggedBackwardDqWgmma(p, *sms, stream),
                           "attention dQ (wgmma)");
        !s.ok()) {
      return s;
    }
  }
  p.items = plan.wide_key_tiles;
  p.num_items = plan.num_wide_key_tiles;
  if (auto s = CudaCheck(cuda_impl::LaunchJaggedBackwardDkDvWgmma(p, *sms, stream),
                         "attention dK/dV (wgmma)");
      !s.ok()) {
    return s;
  }
  if (!fused) return absl::OkStatus();
  return CudaCheck(cuda_impl::LaunchFloatToBf16(p.dq_accum, p.dq, grads.dq.numel(), stream),
                   "dQ to bf16");
}

// The jagged backward's mma.sync passes: dQ (or its fp32 atomics from the
// dK/dV pass), then dK/dV.
absl::Status MmaBackward(const DevicePlan& plan, const AttentionGrads& grads, Workspace& ws,
                         KernelParams p, cudaStream_t stream) {
  const bool atomic_dq = AtomicDq();
  if (atomic_dq) {
    auto acc = ZeroedDqAccum(grads, ws, stream);
    if (!acc.ok()) return acc.status();
    p.dq_accum = *acc;
  } else {
    p.items = plan.query_tiles;
    p.num_items = plan.num_query_tiles;
    if (auto s = CudaCheck(cuda_impl::LaunchJaggedBackwardDq(p, stream), "attention dQ");
        !s.ok()) {
      return s;
    }
  }
  p.items = plan.key_tiles;
  p.num_items = plan.num_key_tiles;
  if (auto s = CudaCheck(cuda_impl::LaunchJaggedBackwardDkDv(p, stream), "attention dK/dV");
      !s.ok()) {
    return s;
  }
  if (!atomic_dq) return absl::OkStatus();
  return CudaCheck(cuda_impl::LaunchFloatToBf16(p.dq_accum, p.dq, grads.dq.numel(), stream),
                   "dQ to bf16");
}

// A stream-ordered temporary of `bytes` for each pointer.
struct Part {
  void** dst;
  int64_t bytes;
};
absl::Status AllocParts(Workspace& ws, std::initializer_list<Part> parts) {
  for (const Part& part : parts) {
    auto buf = ws.Alloc(static_cast<size_t>(part.bytes));
    if (!buf.ok()) return buf.status();
    *part.dst = *buf;
  }
  return absl::OkStatus();
}
void** Ptr(float** x) { return reinterpret_cast<void**>(x); }
void** Ptr(uint32_t** x) { return reinterpret_cast<void**>(x); }

// The FP8 forward (AttentionOptions::forward_precision): the quantize
// pre-pass into stream-ordered temporaries, then the Hopper FP8 kernel over
// the grouped forward tiles (RECFLEET_ATTENTION_WGMMA_GROUP and _TURNS as for
// the bf16 kernel). Unmasked it takes 192-key tiles, under a mask 128
// (measured on H200, bench/RESULTS.md: the 192-key kernel 3-4% faster
// unmasked, no gain causal, where a wider tile holds more masked keys);
// RECFLEET_ATTENTION_FP8_KEYS=128 or 192 overrides, for re-measuring.
absl::Status Fp8Forward(const AttentionInputs& in, const DevicePlan& plan, Workspace& ws,
                        KernelParams p, cudaStream_t stream) {
  if (!cuda_impl::Fp8ForwardSupports(p)) {
    return absl::InvalidArgumentError(
        "the FP8 attention forward supports softmax at head_dim 128 without bias or fused RoPE");
  }
  auto sms = SmCount();
  if (!sms.ok()) return sms.status();
  const int64_t tq = in.q.values.dim(0);
  // At least one key row, so that the tensor maps exist when no sequence
  // has keys (no tile then reads them).
  const int64_t tk = std::max<int64_t>(in.k.values.dim(0), 1);
  const int64_t cols = static_cast<int64_t>(p.heads) * p.head_dim;
  cuda_impl::Fp8Operands ops;
  ops.vt_cols = cuda_impl::Fp8VtCols(tk);
  if (auto s = AllocParts(ws, {{&ops.q8, tq * cols},
                               {&ops.k8, tk * cols},
                               {&ops.vt8, cols * ops.vt_cols},
                               {Ptr(&ops.q_scale), tq * p.heads * 4},
                               {Ptr(&ops.k_scale), cols * 4},
                               {Ptr(&ops.v_scale), cols * 4},
                               {Ptr(&ops.amax), 2 * cols * 4}});
      !s.ok()) {
    return s;
  }
  if (auto s = CudaCheck(cudaMemsetAsync(ops.amax, 0, 2 * cols * 4, stream),
                         "cudaMemsetAsync(fp8 amax)");
      !s.ok()) {
    return s;
  }
  if (auto s = CudaCheck(cuda_impl::LaunchFp8Quantize(p.q, p.k, p.v, tq, in.k.values.dim(0),
                                                      p.heads, p.head_dim, ops, stream),
                         "FP8 attention quantize");
      !s.ok()) {
    return s;
  }
  p.q = ops.q8;
  p.k = ops.k8;
  p.v = ops.vt8;
  p.q_scale = ops.q_scale;
  p.v_scale = ops.v_scale;
  p.vt_cols = ops.vt_cols;
  p.q_rows = tq;
  p.kv_rows = tk;
  p.items = plan.forward_tiles;
  p.num_items = plan.num_forward_tiles;
  if (EnvFlag("RECFLEET_ATTENTION_WGMMA_GROUP")) {
    p.items = plan.grouped_tiles;
    p.num_items = plan.num_grouped_tiles;
  }
  p.wgmma_turns = EnvFlag("RECFLEET_ATTENTION_WGMMA_TURNS");
  const char* keys = std::getenv("RECFLEET_ATTENTION_FP8_KEYS");
  p.fp8_wide_keys = keys != nullptr && std::string(keys) == "128"   ? false
                    : keys != nullptr && std::string(keys) == "192" ? true
                                                                     : p.mask == cuda_impl::kMaskNone;
  return CudaCheck(cuda_impl::LaunchJaggedForwardFp8(p, *sms, stream),
                   "jagged attention forward (FP8)");
}

// The FP8 backward (AttentionOptions::backward_precision): the quantize
// pre-pass into stream-ordered temporaries (q, k, v, dout and the
// transposed copies of q, dout and k: ~7 bytes per element of q, k and v
// together, freed when the call returns; rowsum(dO * O) comes from it too),
// then the dQ pass over the
// forward's query tiles and the dK/dV pass over the 128-key tiles.
absl::Status Fp8Backward(const AttentionInputs& in, const DevicePlan& plan, Workspace& ws,
                         KernelParams p, cudaStream_t stream) {
  if (!cuda_impl::Fp8ForwardSupports(p)) {
    return absl::InvalidArgumentError(
        "the FP8 attention backward supports softmax at head_dim 128 without bias or fused RoPE");
  }
  auto sms = SmCount();
  if (!sms.ok()) return sms.status();
  // At least one row each, so that the tensor maps exist for empty sides
  // (no tile then reads them).
  const int64_t tq_real = in.q.values.dim(0), tk_real = in.k.values.dim(0);
  const int64_t tq = std::max<int64_t>(tq_real, 1), tk = std::max<int64_t>(tk_real, 1);
  const int64_t cols = static_cast<int64_t>(p.heads) * p.head_dim;
  cuda_impl::Fp8BackwardOperands ops;
  ops.q_cols = cuda_impl::Fp8VtCols(tq);
  ops.kv_cols = cuda_impl::Fp8VtCols(tk);
  const int64_t row_floats = tq * p.heads * 4, col_floats = cols * 4;
  if (auto s = AllocParts(ws, {{&ops.q8, tq * cols},
                               {&ops.do8, tq * cols},
                               {&ops.k8, tk * cols},
                               {&ops.v8, tk * cols},
                               {&ops.qt8, cols * ops.q_cols},
                               {&ops.dot8, cols * ops.q_cols},
                               {&ops.kt8, cols * ops.kv_cols},
                               {Ptr(&ops.q_scale), row_floats},
                               {Ptr(&ops.do_scale), row_floats},
                               {Ptr(&ops.dsum), row_floats},
                               {Ptr(&ops.k_scale), col_floats},
                               {Ptr(&ops.v_scale), col_floats},
                               {Ptr(&ops.qt_scale), col_floats},
                               {Ptr(&ops.dot_scale), col_floats},
                               {Ptr(&ops.amax), 4 * col_floats}});
      !s.ok()) {
    return s;
  }
  if (auto s = CudaCheck(cudaMemsetAsync(ops.amax, 0, 4 * cols * 4, stream),
                         "cudaMemsetAsync(fp8 amax)");
      !s.ok()) {
    return s;
  }
  if (auto s = CudaCheck(cuda_impl::LaunchFp8BackwardQuantize(p.q, p.k, p.v, p.dout, p.out, tq_real,
                                                              tk_real, p.heads, p.head_dim, ops,
                                                              stream),
                         "FP8 attention backward quantize");
      !s.ok()) {
    return s;
  }
  p.q_rows = tq;
  p.kv_rows = tk;
  p.items = plan.forward_tiles;
  p.num_items = plan.num_forward_tiles;
  // The dQ pass streams 128-row K/V tiles (measured on H200: the whole
  // backward call 5.7% faster unmasked, 4.2% causal than with 64, whose
  // fewer registers the dK/dV pass needs); RECFLEET_ATTENTION_FP8_DQ_KEYS=64
  // takes 64, for re-measuring.
  const char* dq_keys = std::getenv("RECFLEET_ATTENTION_FP8_DQ_KEYS");
  p.fp8_wide_keys = dq_keys == nullptr || std::string(dq_keys) != "64";
  if (auto s = CudaCheck(cuda_impl::LaunchJaggedBackwardFp8(p, ops, /*dkdv=*/false, *sms, stream),
                         "attention dQ (FP8)");
      !s.ok()) {
    return s;
  }
  p.items = plan.wide_key_tiles;
  p.num_items = plan.num_wide_key_tiles;
  return CudaCheck(cuda_impl::LaunchJaggedBackwardFp8(p, ops, /*dkdv=*/true, *sms, stream),
                   "attention dK/dV (FP8)");
}

absl::Status CheckSizes(const AttentionInputs& in) {
  // Kernels index rows within a sequence with int32.
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    if (in.q.length(b) > INT32_MAX / 2 || in.k.length(b) > INT32_MAX / 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", b, " is longer than the CUDA attention supports (2^30)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ForwardCuda(const AttentionInputs& in, const AttentionOptions& o, TensorView out,
                         TensorView lse) {
  if (auto s = CheckSizes(in); !s.ok()) return s;
  auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  auto lease = Plans().Get(in, o, stream);
  if (!lease.ok()) return lease.status();
  const DevicePlan& plan = ***lease;
  Workspace ws(stream);
  auto prep = PrepareQk(in, o, plan, ws, stream);
  if (!prep.ok()) return prep.status();
  KernelParams p = BaseParams(in, o, *prep);
  p.o = out.data;
  p.lse = lse.as<float>();
  if (plan.block_kernel) {
    p.items = plan.blocks;
    p.num_items = plan.num_blocks;
    return CudaCheck(cuda_impl::LaunchBlockForward(p, stream), "block attention forward");
  }
  if (o.forward_precision == ForwardPrecision::kFp8E4M3) {
    return Fp8Forward(in, plan, ws, p, stream);
  }
  p.items = plan.forward_tiles;
  p.num_items = plan.num_forward_tiles;
  if (UseWgmmaForward(p)) {
    auto sms = SmCount();
    if (!sms.ok()) return sms.status();
    if (EnvFlag("RECFLEET_ATTENTION_WGMMA_GROUP")) {
      p.items = plan.grouped_tiles;
      p.num_items = plan.num_grouped_tiles;
    }
    p.wgmma_turns = EnvFlag("RECFLEET_ATTENTION_WGMMA_TURNS");
    p.wgmma_tma = EnvFlag("RECFLEET_ATTENTION_WGMMA_TMA");
    p.wgmma_overlap = EnvFlag("RECFLEET_ATTENTION_WGMMA_OVERLAP");
    p.wgmma_chain = EnvFlag("RECFLEET_ATTENTION_WGMMA_CHAIN");
    p.q_rows = in.q.values.dim(0);
    p.kv_rows = in.k.values.dim(0);
    return CudaCheck(cuda_impl::LaunchJaggedForwardWgmma(p, *sms, stream),
                     "jagged attention forward (wgmma)");
  }
  return CudaCheck(cuda_impl::LaunchJaggedForward(p, stream), "jagged attention forward");
}

absl::Status BackwardCuda(const AttentionInputs& in, const AttentionOptions& o,
                          const TensorView& out, const TensorView& lse, const TensorView& d_out,
                          const AttentionGrads& grads) {
  if (auto s = CheckSizes(in); !s.ok()) return s;
  auto stream = static_cast<cudaStream_t>(o.cuda_stream);
  auto lease = Plans().Get(in, o, stream);
  if (!lease.ok()) return lease.status();
  const DevicePlan& plan = ***lease;
  Workspace ws(stream);
  auto prep = PrepareQk(in, o, plan, ws, stream, in.qk_writable);
  if (!prep.ok()) return prep.status();
  KernelParams p = BaseParams(in, o, *prep);
  p.out = out.data;
  p.dout = d_out.data;
  p.lse = lse.as<float>();
  p.dv = grads.dv.data;
  p.dbias = grads.dbias.data;
  // With a transform, the kernels write the gradients of the transformed
  // q/k into dq/dk and its backward pass turns them into those of q/k in
  // place (each warp reads its (row, head) before writing it): no
  // temporaries of their size.
  p.dq = grads.dq.data;
  p.dk = grads.dk.data;
  if (grads.dbias.data != nullptr) {  // masked pairs are never visited
    if (auto s = CudaCheck(cudaMemsetAsync(grads.dbias.data, 0, grads.dbias.nbytes(), stream),
                           "cudaMemsetAsync(dbias)");
        !s.ok()) {
      return s;
    }
  }
  if (plan.block_kernel) {
    p.items = plan.blocks;
    p.num_items = plan.num_blocks;
    if (auto s = CudaCheck(cuda_impl::LaunchBlockBackward(p, stream), "block attention backward");
        !s.ok()) {
      return s;
    }
  } else {
    const bool fp8 = o.backward_precision == BackwardPrecision::kFp8E4M3;
    if (o.activation == Activation::kSoftmax && !fp8) {  // FP8: its own (Fp8Backward)
      auto dsum = ws.Alloc(lse.nbytes());
      if (!dsum.ok()) return dsum.status();
      p.dsum = static_cast<const float*>(*dsum);
      if (auto s = CudaCheck(cuda_impl::LaunchRowDot(d_out.data, out.data,
                                                     static_cast<float*>(*dsum), out.dim(0),
                                                     p.heads, p.head_dim, stream),
                             "rowsum(dO * O)");
          !s.ok()) {
        return s;
      }
    }
    const absl::Status s =
        fp8 ? Fp8Backward(in, plan, ws, p, stream)
        : UseWgmmaBackward(p) ? WgmmaBackward(in, plan, grads, ws, p, stream)
                              : MmaBackward(plan, grads, ws, p, stream);
    if (!s.ok()) return s;
  }
  if (prep->transformed) {
    const bool pass_rope = o.rope && !plan.block_kernel;
    for (bool is_query : {true, false}) {
      TransformParams t = MakeTransform(in, o, plan, is_query, pass_rope);
      t.dy = is_query ? grads.dq.data : grads.dk.data;
      t.y = is_query ? grads.dq.data : grads.dk.data;
      if (auto s = CudaCheck(cuda_impl::LaunchQkTransformBackward(t, stream),
                             "QK transform backward");
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace recfleet::attention::internal
