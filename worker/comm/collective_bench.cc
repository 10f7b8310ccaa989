// Bus bandwidth of every collective of the Communicator interface, in the
// nccl-tests convention:
//   size    bytes of the operation: the buffer (all_reduce, broadcast), the
//           gathered output (all_gather), the scattered input
//           (reduce_scatter), what one rank sends in total (all_to_all);
//   time    mean wall time of one call over --iters calls after --warmup
//           calls, the maximum over ranks;
//   algbw   size / time;
//   busbw   algbw x 2(n-1)/n (all_reduce), x (n-1)/n (all_gather,
//           reduce_scatter, all_to_all), x 1 (broadcast).
// GB/s are 1e9 bytes per second. Each call waits for its completion (the
// interface is synchronous), so small sizes include one host round trip per
// call, unlike nccl-tests, which enqueues all iterations before waiting.
//
// Ranks are threads of this process (--ranks; NCCL: one GPU each) or one
// process per rank (--rank, --world_size, --store_dir: every process gets
// the same store directory).
//
//   collective_bench --backend=gloo --ranks=4 --max_bytes=64M
//   collective_bench --backend=nccl                       # every GPU, threads
//   collective_bench --backend=nccl --rank=$R --world_size=8 --store_dir=/tmp/rv

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/testing.h"

ABSL_FLAG(std::string, backend, "gloo", "gloo (host buffers, TCP) or nccl (one GPU per rank)");
ABSL_FLAG(int, ranks, 0, "ranks as threads of this process; 0 = 2 for gloo, every visible GPU for nccl");
ABSL_FLAG(int, rank, -1, "this process's rank (one process per rank; needs --world_size and --store_dir)");
ABSL_FLAG(int, world_size, 0, "number of processes (one process per rank)");
ABSL_FLAG(std::string, store_dir, "", "rendezvous directory shared by the processes");
ABSL_FLAG(int, device, -1, "CUDA device of this process (one process per rank); -1 = rank % visible GPUs");
ABSL_FLAG(std::string, hostname, "127.0.0.1", "gloo: address to bind");
ABSL_FLAG(std::string, min_bytes, "1K", "smallest size (suffixes K, M, G: powers of 1024)");
ABSL_FLAG(std::string, max_bytes, "1G", "largest size");
ABSL_FLAG(int, step_factor, 2, "size multiplier between rows");
ABSL_FLAG(int, warmup, 5, "untimed calls per size");
ABSL_FLAG(int, iters, 20, "timed calls per size");
ABSL_FLAG(std::string, ops, "all_reduce,all_gather,reduce_scatter,all_to_all,broadcast,barrier", "collectives to run");
ABSL_FLAG(std::string, dtype, "fp32", "fp32, bf16, fp64, int32 or int64");
ABSL_FLAG(int, timeout_s, 300, "communicator timeout");

namespace recfleet {
namespace comm {
namespace {

bool ParseBytes(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  int64_t mult = 1;
  std::string digits = s;
  switch (s.back()) {
    case 'K': mult = int64_t{1} << 10; digits.pop_back(); break;
    case 'M': mult = int64_t{1} << 20; digits.pop_back(); break;
    case 'G': mult = int64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(digits, &v) || v < 0) return false;
  *out = v * mult;
  return true;
}

bool ParseDType(const std::string& s, DType* out) {
  for (DType d : {DType::kFloat32, DType::kBFloat16, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    if (DTypeName(d) == s) {
      *out = d;
      return true;
    }
  }
  return false;
}

// Buffers of one rank: host memory or memory of its GPU.
class RankMemory {
 public:
  RankMemory(bool cuda, int device) : cuda_(cuda), device_(device) {}
  ~RankMemory() {
    for (void* p : owned_) cuda_ ? (void)cudaFree(p) : std::free(p);
  }
  // Filled with a non-zero byte pattern.
  void* Alloc(size_t bytes) {
    void* p = nullptr;
    bytes = std::max<size_t>(bytes, 64);
    if (cuda_) {
      if (cudaSetDevice(device_) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
      cudaMemset(p, 0x3c, bytes);
      cudaDeviceSynchronize();
    } else {
      p = std::malloc(bytes);
      if (p != nullptr) std::memset(p, 0x3c, bytes);
    }
    if (p != nullptr) owned_.push_back(p);
    return p;
  }
  // Max of `value` over the ranks of `comm`.
  double MaxOverRanks(Communicator& comm, double value) {
    if (scratch_ == nullptr) scratch_ = Alloc(sizeof(double));
    if (cuda_) {
      cudaMemcpy(scratch_, &value, sizeof(value), cudaMemcpyHostToDevice);
    } else {
      std::memcpy(scratch_, &value, sizeof(value));
    }
    absl::Status s = comm.AllReduce(MakeView(scratch_, DType::kFloat64, {1}, device()), ReduceOp::kMax);
    if (!s.ok()) return -1;
    if (cuda_) {
      cudaMemcpy(&value, scratch_, sizeof(value), cudaMemcpyDeviceToHost);
    } else {
      std::memcpy(&value, scratch_, sizeof(value));
    }
    return value;
  }
  Device device() const { return cuda_ ? Device::kCuda : Device::kCpu; }

 private:
  bool cuda_;
  int device_;
  void* scratch_ = nullptr;
  std::vector<void*> owned_;
};

struct Config {
  std::vector<std::string> ops;
  int64_t min_bytes = 0, max_bytes = 0;
  int step_factor = 2, warmup = 5, iters = 20;
  DType dtype = DType::kFloat32;
};

// Runs every op and size on one rank; rank 0 prints.
absl::Status BenchRank(Communicator& comm, RankMemory& memory, const Config& cfg) {
  const int n = comm.size();
  const int64_t es = static_cast<int64_t>(DTypeSize(cfg.dtype));
  const int64_t max_elems = cfg.max_bytes / es + n;
  char* in = static_cast<char*>(memory.Alloc(max_elems * es));
  char* out = static_cast<char*>(memory.Alloc(max_elems * es));
  if (in == nullptr || out == nullptr) return absl::ResourceExhaustedError("cannot allocate the benchmark buffers");
  const Device dev = memory.device();
  auto view = [&](char* p, int64_t count) { return MakeView(p, cfg.dtype, {count}, dev); };

  for (const std::string& op : cfg.ops) {
    if (comm.rank() == 0) {
      std::printf("# %s  backend %s  ranks %d  dtype %s\n", op.c_str(), std::string(comm.backend()).c_str(), n,
                  std::string(DTypeName(cfg.dtype)).c_str());
      std::printf("%14s %12s %12s %12s %12s\n", "size(B)", "count", "time(us)", "algbw(GB/s)", "busbw(GB/s)");
    }
    const bool barrier = op == "barrier";
    for (int64_t bytes = cfg.min_bytes; bytes <= cfg.max_bytes; bytes *= cfg.step_factor) {
      // count: elements per rank block (gather/scatter/all-to-all) or buffer.
      int64_t count = bytes / es;
      double factor = 1;
      std::vector<int64_t> splits;
      std::function<absl::Status()> call;
      if (op == "all_reduce") {
        factor = 2.0 * (n - 1) / n;
        call = [&] { return comm.AllReduce(view(in, count), ReduceOp::kSum); };
      } else if (op == "all_gather") {
        count = bytes / es / n;
        factor = static_cast<double>(n - 1) / n;
        call = [&] { return comm.AllGather(view(in, count), view(out, count * n)); };
      } else if (op == "reduce_scatter") {
        count = bytes / es / n;
        factor = static_cast<double>(n - 1) / n;
        call = [&] { return comm.ReduceScatter(view(in, count * n), view(out, count), ReduceOp::kSum); };
      } else if (op == "all_to_all") {
        count = bytes / es / n;
        factor = static_cast<double>(n - 1) / n;
        splits.assign(n, count);
        call = [&] { return comm.AllToAll(view(in, count * n), splits, view(out, count * n), splits); };
      } else if (op == "broadcast") {
        call = [&] { return comm.Broadcast(view(in, count), 0); };
      } else if (barrier) {
        call = [&] { return comm.Barrier(); };
      } else {
        return absl::InvalidArgumentError(absl::StrCat("unknown op '", op, "'"));
      }
      if (!barrier && count == 0) continue;
      for (int i = 0; i < cfg.warmup; ++i) {
        if (absl::Status s = call(); !s.ok()) return s;
      }
      if (absl::Status s = comm.Barrier(); !s.ok()) return s;
      const absl::Time start = absl::Now();
      for (int i = 0; i < cfg.iters; ++i) {
        if (absl::Status s = call(); !s.ok()) return s;
      }
      const double secs = memory.MaxOverRanks(comm, absl::ToDoubleSeconds(absl::Now() - start) / cfg.iters);
      if (secs < 0) return absl::InternalError("timing reduction failed");
      if (comm.rank() == 0) {
        if (barrier) {
          std::printf("%14s %12s %12.2f %12s %12s\n", "-", "-", secs * 1e6, "-", "-");
        } else {
          const int64_t size = op == "all_reduce" || op == "broadcast" ? count * es : count * n * es;
          const double algbw = size / secs / 1e9;
          std::printf("%14lld %12lld %12.2f %12.3f %12.3f\n", static_cast<long long>(size),
                      static_cast<long long>(count), secs * 1e6, algbw, algbw * factor);
        }
        std::fflush(stdout);
      }
      if (barrier) break;
    }
  }
  return absl::OkStatus();
}

int Main() {
  Config cfg;
  const std::string backend = absl::GetFlag(FLAGS_backend);
  const bool nccl = backend == "nccl";
  if (!nccl && backend != "gloo") {
    std::fprintf(stderr, "--backend must be gloo or nccl, got '%s'\n", backend.c_str());
    return 2;
  }
  if (!ParseBytes(absl::GetFlag(FLAGS_min_bytes), &cfg.min_bytes) ||
      !ParseBytes(absl::GetFlag(FLAGS_max_bytes), &cfg.max_bytes) || cfg.min_bytes < 1 ||
      cfg.max_bytes < cfg.min_bytes) {
    std::fprintf(stderr, "--min_bytes/--max_bytes: expected sizes like 1K, 64M, 1G with min <= max\n");
    return 2;
  }
  if (!ParseDType(absl::GetFlag(FLAGS_dtype), &cfg.dtype)) {
    std::fprintf(stderr, "--dtype must be fp32, bf16, fp64, int32 or int64\n");
    return 2;
  }
  cfg.step_factor = std::max(2, absl::GetFlag(FLAGS_step_factor));
  cfg.warmup = absl::GetFlag(FLAGS_warmup);
  cfg.iters = std::max(1, absl::GetFlag(FLAGS_iters));
  cfg.ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',', absl::SkipEmpty());
  CommOptions options;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  int gpus = 0;
  if (nccl && cudaGetDeviceCount(&gpus) != cudaSuccess) gpus = 0;
  if (nccl && gpus == 0) {
    std::fprintf(stderr, "--backend=nccl: no CUDA device visible\n");
    return 1;
  }

  // One rank in this process, or several as threads.
  const int proc_rank = absl::GetFlag(FLAGS_rank);
  std::unique_ptr<KvStore> store;
  int world = 0, first_rank = 0, local_ranks = 0;
  if (proc_rank >= 0) {
    world = absl::GetFlag(FLAGS_world_size);
    auto file_store = FileKvStore::Open(absl::GetFlag(FLAGS_store_dir));
    if (world < 1 || proc_rank >= world || !file_store.ok()) {
      std::fprintf(stderr, "--rank needs --world_size > rank and a usable --store_dir\n");
      return 2;
    }
    store = *std::move(file_store);
    first_rank = proc_rank;
    local_ranks = 1;
  } else {
    world = absl::GetFlag(FLAGS_ranks) > 0 ? absl::GetFlag(FLAGS_ranks) : (nccl ? gpus : 2);
    if (nccl && world > gpus) {
      std::fprintf(stderr, "--ranks=%d but only %d GPUs are visible\n", world, gpus);
      return 2;
    }
    store = std::make_unique<InProcessKvStore>();
    local_ranks = world;
  }

  std::vector<absl::Status> status(local_ranks);
  RunOnThreads(local_ranks, [&](int i) {
    const int rank = first_rank + i;
    int device = 0;
    if (nccl) device = proc_rank >= 0 && absl::GetFlag(FLAGS_device) >= 0 ? absl::GetFlag(FLAGS_device) : rank % gpus;
    absl::StatusOr<std::unique_ptr<Communicator>> comm;
    if (nccl) {
      comm = ConnectNccl(*store, rank, world, device, options);
    } else {
      auto transport = GlooTransport::Create(absl::GetFlag(FLAGS_hostname));
      comm = transport.ok() ? ConnectGloo(*store, rank, world, *transport, options)
                            : absl::StatusOr<std::unique_ptr<Communicator>>(transport.status());
    }
    if (!comm.ok()) {
      status[i] = comm.status();
      return;
    }
    RankMemory memory(nccl, device);
    status[i] = BenchRank(**comm, memory, cfg);
  });
  for (const absl::Status& s : status) {
    if (!s.ok()) {
      std::fprintf(stderr, "collective_bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace comm
}  // namespace recfleet

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return recfleet::comm::Main();
}
