// Host side of the CUDA attention: plans the tile work lists from the
// offsets, runs the pre/post passes and launches the kernels.
//
// Plans depend only on the offsets and the mask, so they are cached per
// device: the training step calls every attention layer, forward and
// backward, with the same batch offsets, and only the first call pays for
// planning and the upload (a synchronous copy). Temporaries come from the
// stream-ordered allocator and are freed on the stream.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/attention_internal.h"
#include "kernels/attention/cuda_kernels.h"

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

// Orders items so the longest start first (the hardware hands CTAs out in
// grid order, so this is longest-processing-time-first over the SMs and the
// tail holds only short tiles). An item's work is its inner rows times its
// query tiles.
void SortLongestFirst(std::vector<WorkItem>& items) {
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& a, const WorkItem& b) {
    return static_cast<int64_t>(a.inner_end - a.inner_begin) * a.q_tiles >
           static_cast<int64_t>(b.inner_end - b.inner_begin) * b.q_tiles;
  });
}

struct HostPlan {
  std::vector<WorkItem> forward_tiles;  // forward (kForwardTileRows queries each)
  std::vector<WorkItem> grouped_tiles;  // the Hopper forward's (forward tiles grouped)
  std::vector<WorkItem> query_tiles;    // dQ
  std::vector<WorkItem> key_tiles;    // dK/dV
  std::vector<WorkItem> wide_key_tiles;  // the Hopper dK/dV pass's
  std::vector<WorkItem> blocks;       // BlockAttention (empty if not applicable)
  bool block_kernel = false;
};

// Appends the query tiles of `rows` rows of one sequence (described by
// `base`) with the keys they see. Key ranges are monotone in the query, so a
// tile's first and last rows bound the keys of the whole tile.
void AddQueryTiles(const WorkItem& base, const AttentionOptions& o, int64_t rows,
                   std::vector<WorkItem>& out) {
  const int64_t lq = base.q_len, lk = base.k_len;
  for (int64_t m0 = 0; m0 < lq; m0 += rows) {
    WorkItem it = base;
    it.tile_row = static_cast<int>(m0);
    const KeyRange first = VisibleKeys(o, lq, lk, m0);
    const KeyRange last = VisibleKeys(o, lq, lk, std::min(lq, m0 + rows) - 1);
    it.inner_begin = static_cast<int>(first.begin);
    it.inner_end = static_cast<int>(std::max(first.begin, last.end));
    out.push_back(it);
  }
}

// Appends the key tiles of `rows` rows of one sequence (described by `base`)
// with the queries that see them.
void AddKeyTiles(const WorkItem& base, const AttentionOptions& o, int64_t rows,
                 std::vector<WorkItem>& out) {
  const int64_t lq = base.q_len, lk = base.k_len;
  for (int64_t n0 = 0; n0 < lk; n0 += rows) {
    WorkItem it = base;
    it.tile_row = static_cast<int>(n0);
    const int64_t n_last = std::min(lk, n0 + rows) - 1;
    // First query whose range ends after n0, last whose range starts at or
    // before n_last (both monotone): binary searches over [0, lq).
    int64_t lo = 0, hi = lq;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (VisibleKeys(o, lq, lk, mid).end > n0) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const int64_t first = lo;
    lo = 0;
    hi = lq;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (VisibleKeys(o, lq, lk, mid).begin <= n_last) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    const int64_t end = lo;
    it.inner_begin = static_cast<int>(first);
    it.inner_end = static_cast<int>(std::max(first, end));
    out.push_back(it);
  }
}

// Appends tiles[first..] (one sequence's forward tiles, in row order) to
// `out`, merging runs of consecutive tiles with the same short inner range
// (short-K/V cross-attention and PMA, no mask) into items of up to
// kWgmmaMaxGroup query tiles that load their K/V once.
void GroupQueryTiles(const std::vector<WorkItem>& tiles, size_t first,
                     std::vector<WorkItem>& out) {
  for (size_t i = first; i < tiles.size(); ++i) {
    const WorkItem& t = tiles[i];
    WorkItem* last = out.empty() ? nullptr : &out.back();
    if (i > first && last->inner_begin == t.inner_begin && last->inner_end == t.inner_end &&
        t.inner_end - t.inner_begin <= cuda_impl::kWgmmaResidentKeys &&
        last->q_tiles < cuda_impl::kWgmmaMaxGroup) {
      ++last->q_tiles;
    } else {
      out.push_back(t);
    }
  }
}

HostPlan MakePlan(const AttentionInputs& in, const AttentionOptions& o) {
  HostPlan plan;
  plan.block_kernel = o.mask == Mask::kBlock;
  int64_t bias_base = 0;
  const int64_t heads = in.q.values.dim(1);
  for (int64_t b = 0; b < in.q.batch_size(); ++b) {
    const int64_t lq = in.q.length(b), lk = in.k.length(b);
    if (lq != lk) plan.block_kernel = false;
    WorkItem base{};
    base.q_tiles = 1;
    base.q_start = in.q.offset(b);
    base.k_start = in.k.offset(b);
    base.bias_base = bias_base;
    base.q_len = static_cast<int>(lq);
    base.k_len = static_cast<int>(lk);
    bias_base += lq * lk * heads;
    AddQueryTiles(base, o, kTile, plan.query_tiles);
    const size_t first_tile = plan.forward_tiles.size();
    AddQueryTiles(base, o, cuda_impl::kForwardTileRows, plan.forward_tiles);
    GroupQueryTiles(plan.forward_tiles, first_tile, plan.grouped_tiles);
    for (int64_t m0 = 0; m0 < lq && lq == lk; m0 += kTile) {
      WorkItem blk = base;
      blk.tile_row = static_cast<int>(m0);
      blk.inner_begin = blk.tile_row;
      blk.inner_end = static_cast<int>(std::min(lk, m0 + kTile));
      plan.blocks.push_back(blk);
    }
    AddKeyTiles(base, o, kTile, plan.key_tiles);
    AddKeyTiles(base, o, cuda_impl::kWideKeyTileRows, plan.wide_key_tiles);
  }
  SortLongestFirst(plan.forward_tiles);
  SortLongestFirst(plan.grouped_tiles);
  SortLongestFirst(plan.query_tiles);
  SortLongestFirst(plan.key_tiles);
  SortLongestFirst(plan.wide_key_tiles);
  if (!plan.block_kernel) plan.blocks.clear();
  return plan;
}

// A plan in device memory. Lives in the cache until evicted.
struct DevicePlan {
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

  ~DevicePlan() {
    for (void* p : {static_cast<void*>(forward_tiles), static_cast<void*>(grouped_tiles),
                    static_cast<void*>(query_tiles),
                    static_cast<void*>(key_tiles), static_cast<void*>(wide_key_tiles),
                    static_cast<void*>(blocks),
                    static_cast<void*>(q_offsets), static_cast<void*>(k_offsets)}) {
      if (p != nullptr) cudaFree(p);
    }
  }
};

template <typename T>
absl::Status Upload(const std::vector<T>& host, T** dev) {
  if (host.empty()) return absl::OkStatus();
  if (auto s = CudaCheck(cudaMalloc(reinterpret_cast<void**>(dev), host.size() * sizeof(T)),
                         "cudaMalloc(plan)");
      !s.ok()) {
    return s;
  }
  return CudaCheck(cudaMemcpy(*dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
                   "cudaMemcpy(plan)");
}

std::vector<int64_t> Offsets(const JaggedView& j) {
  std::vector<int64_t> v(j.batch_size() + 1);
  for (int64_t b = 0; b <= j.batch_size(); ++b) v[b] = j.offset(b);
  return v;
}

// Least-recently-used cache of device plans keyed by (device, mask, window,
// offsets). Thread-safe.
class PlanCache {
 public:
  absl::StatusOr<std::shared_ptr<const DevicePlan>> Get(const AttentionInputs& in,
                                                       const AttentionOptions& o) {
    int device = 0;
    if (auto s = CudaCheck(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
    const std::vector<int64_t> q_off = Offsets(in.q), k_off = Offsets(in.k);
    std::string key = absl::StrCat(device, "/", static_cast<int>(o.mask), "/",
                                   o.mask == Mask::kSlidingWindow ? o.window : 0, "/");
    key.append(reinterpret_cast<const char*>(q_off.data()), q_off.size() * sizeof(int64_t));
    key.append("/");
    key.append(reinterpret_cast<const char*>(k_off.data()), k_off.size() * sizeof(int64_t));
    std::lock_guard<std::mutex> lock(mu_);
    auto found = index_.find(key);
    if (found != index_.end()) {
      lru_.splice(lru_.begin(), lru_, found->second);
      return found->second->second;
    }
    const HostPlan host = MakePlan(in, o);
    auto plan = std::make_shared<DevicePlan>();
    plan->num_forward_tiles = static_cast<int>(host.forward_tiles.size());
    plan->num_grouped_tiles = static_cast<int>(host.grouped_tiles.size());
    plan->num_query_tiles = static_cast<int>(host.query_tiles.size());
    plan->num_key_tiles = static_cast<int>(host.key_tiles.size());
    plan->num_wide_key_tiles = static_cast<int>(host.wide_key_tiles.size());
    plan->num_blocks = static_cast<int>(host.blocks.size());
    plan->block_kernel = host.block_kernel;
    for (auto s : {Upload(host.forward_tiles, &plan->forward_tiles),
                   Upload(host.grouped_tiles, &plan->grouped_tiles),
                   Upload(host.query_tiles, &plan->query_tiles),
                   Upload(host.key_tiles, &plan->key_tiles),
                   Upload(host.wide_key_tiles, &plan->wide_key_tiles),
                   Upload(host.blocks, &plan->blocks),
                   Upload(q_off, &plan->q_offsets), Upload(k_off, &plan->k_offsets)}) {
      if (!s.ok()) return s;
    }
    if (index_.empty()) KeepPoolMemory(device);
    lru_.emplace_front(key, plan);
    index_[key] = lru_.begin();
    if (lru_.size() > kCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();  // in-flight users hold their own reference
    }
    return std::shared_ptr<const DevicePlan>(plan);
  }

 private:
  static constexpr size_t kCapacity = 32;
  using Entry = std::pair<std::string, std::shared_ptr<DevicePlan>>;

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
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
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

absl::StatusOr<PreparedQk> PrepareQk(const AttentionInputs& in, const AttentionOptions& o,
                                     const DevicePlan& plan, Workspace& ws, cudaStream_t stream) {
  PreparedQk prep{in.q.values.data, in.k.values.data, false, false};
  prep.fused_rope = o.rope && plan.block_kernel;
  const bool pass_rope = o.rope && !plan.block_kernel;
  if (!o.qk_norm && !pass_rope) return prep;
  prep.transformed = true;
  for (bool is_query : {true, false}) {
    const TensorView& x = is_query ? in.q.values : in.k.values;
    auto y = ws.Alloc(x.nbytes());
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
// reduce-add into an fp32 buffer (the default at d = 128, as measured on
// H200, bench/RESULTS.md), or by a separate query-stationary pass
// (RECFLEET_ATTENTION_WGMMA_DQ=pass; always at d = 64 and without TMA).
bool WgmmaFusedDq(const KernelParams& p) {
  if (!cuda_impl::WgmmaFusedDqSupports(p)) return false;
  const char* mode = std::getenv("RECFLEET_ATTENTION_WGMMA_DQ");
  return mode == nullptr || std::string(mode) != "pass";
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
  const bool fused = WgmmaFusedDq(p);
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
  auto plan = Plans().Get(in, o);
  if (!plan.ok()) return plan.status();
  Workspace ws(stream);
  auto prep = PrepareQk(in, o, **plan, ws, stream);
  if (!prep.ok()) return prep.status();
  KernelParams p = BaseParams(in, o, *prep);
  p.o = out.data;
  p.lse = lse.as<float>();
  if ((*plan)->block_kernel) {
    p.items = (*plan)->blocks;
    p.num_items = (*plan)->num_blocks;
    return CudaCheck(cuda_impl::LaunchBlockForward(p, stream), "block attention forward");
  }
  p.items = (*plan)->forward_tiles;
  p.num_items = (*plan)->num_forward_tiles;
  if (UseWgmmaForward(p)) {
    auto sms = SmCount();
    if (!sms.ok()) return sms.status();
    if (EnvFlag("RECFLEET_ATTENTION_WGMMA_GROUP")) {
      p.items = (*plan)->grouped_tiles;
      p.num_items = (*plan)->num_grouped_tiles;
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
  auto plan_or = Plans().Get(in, o);
  if (!plan_or.ok()) return plan_or.status();
  const DevicePlan& plan = **plan_or;
  Workspace ws(stream);
  auto prep = PrepareQk(in, o, plan, ws, stream);
  if (!prep.ok()) return prep.status();
  KernelParams p = BaseParams(in, o, *prep);
  p.out = out.data;
  p.dout = d_out.data;
  p.lse = lse.as<float>();
  p.dv = grads.dv.data;
  p.dbias = grads.dbias.data;
  p.dq = grads.dq.data;
  p.dk = grads.dk.data;
  if (prep->transformed) {  // gradients of the transformed q/k first
    auto dq = ws.Alloc(grads.dq.nbytes());
    auto dk = ws.Alloc(grads.dk.nbytes());
    if (!dq.ok()) return dq.status();
    if (!dk.ok()) return dk.status();
    p.dq = *dq;
    p.dk = *dk;
  }
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
    if (o.activation == Activation::kSoftmax) {
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
    const absl::Status s = UseWgmmaBackward(p) ? WgmmaBackward(in, plan, grads, ws, p, stream)
                                               : MmaBackward(plan, grads, ws, p, stream);
    if (!s.ok()) return s;
  }
  if (prep->transformed) {
    const bool pass_rope = o.rope && !plan.block_kernel;
    for (bool is_query : {true, false}) {
      TransformParams t = MakeTransform(in, o, plan, is_query, pass_rope);
      t.dy = is_query ? p.dq : p.dk;
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
