#include "worker/comm/conformance.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "gtest/gtest.h"
#include "worker/comm/host_reduce.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

// A typed host buffer addressed through doubles, mirrored by a buffer in
// the backend's memory.
class Buffer {
 public:
  Buffer(TestMemory& memory, int rank, DType dtype, int64_t n)
      : memory_(memory), rank_(rank), dtype_(dtype), n_(n), host_(std::max<size_t>(1, n * DTypeSize(dtype))) {
    device_ = memory_.Alloc(rank_, host_.size());
  }
  ~Buffer() { memory_.Free(rank_, device_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void Set(int64_t i, double v) {
    char* p = host_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
      case DType::kFloat64: std::memcpy(p, &v, 8); break;
      case DType::kBFloat16: { uint16_t x = FloatToBf16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
      case DType::kInt32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
      case DType::kInt64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
      default: break;
    }
  }

  double Get(int64_t i) const {
    const char* p = host_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
      case DType::kFloat64: { double x; std::memcpy(&x, p, 8); return x; }
      case DType::kBFloat16: { uint16_t x; std::memcpy(&x, p, 2); return Bf16ToFloat(x); }
      case DType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
      case DType::kInt64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
      default: return 0;
    }
  }

  void Upload() { memory_.Upload(rank_, device_, host_.data(), host_.size()); }
  void Download() { memory_.Download(rank_, host_.data(), device_, host_.size()); }
  TensorView view() const { return MakeView(device_, dtype_, {n_}, memory_.device()); }

 private:
  TestMemory& memory_;
  int rank_;
  DType dtype_;
  int64_t n_;
  std::vector<char> host_;
  void* device_;
};

double Value(int rank, int64_t i) { return static_cast<double>((rank * 7 + i * 3) % 11 - 5); }

double Tolerance(DType dtype, double want) { return dtype == DType::kBFloat16 ? 0.02 * std::abs(want) : 1e-6; }

const int64_t kCounts[] = {0, 1, 7, 1000, 4097};

double Fold(ReduceOp op, double acc, double v) {
  return op == ReduceOp::kMin ? std::min(acc, v) : op == ReduceOp::kMax ? std::max(acc, v) : acc + v;
}

// Elements rank `src` sends to rank `dst`: uneven, zero for some pairs.
int64_t SplitCount(int src, int dst, int64_t scale) { return ((src * 3 + dst * 5) % 4) * scale + (src + dst) % 2; }
double A2aValue(int src, int dst, int64_t j) { return static_cast<double>((src * 5 + dst * 3 + j) % 97); }

}  // namespace

void* HostTestMemory::Alloc(int, size_t bytes) { return std::malloc(bytes); }
void HostTestMemory::Free(int, void* p) { std::free(p); }
void HostTestMemory::Upload(int, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void HostTestMemory::Download(int, void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CheckAllReduce(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};
  if (IsFloatingDType(dtype)) ops.push_back(ReduceOp::kAvg);
  for (int64_t n : kCounts) {
    for (ReduceOp op : ops) {
      RunOnThreads(size, [&](int r) {
        Buffer b(memory, r, dtype, n);
        for (int64_t i = 0; i < n; ++i) b.Set(i, Value(r, i));
        b.Upload();
        absl::Status s = comms[r]->AllReduce(b.view(), op);
        ASSERT_TRUE(s.ok()) << s;
        b.Download();
        for (int64_t i = 0; i < n; ++i) {
          double want = Value(0, i);
          for (int q = 1; q < size; ++q) want = Fold(op, want, Value(q, i));
          if (op == ReduceOp::kAvg) want /= size;
          ASSERT_NEAR(b.Get(i), want, Tolerance(dtype, want))
              << "rank " << r << " i " << i << " op " << ReduceOpName(op) << " n " << n;
        }
      });
    }
  }
}

void CheckAllGather(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  for (int64_t n : kCounts) {
    RunOnThreads(size, [&](int r) {
      Buffer in(memory, r, dtype, n), out(memory, r, dtype, n * size);
      for (int64_t i = 0; i < n; ++i) in.Set(i, Value(r, i));
      in.Upload();
      absl::Status s = comms[r]->AllGather(in.view(), out.view());
      ASSERT_TRUE(s.ok()) << s;
      out.Download();
      for (int q = 0; q < size; ++q) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.Get(q * n + i), Value(q, i)) << "rank " << r;
      }
    });
  }
}

void CheckReduceScatter(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax};
  if (IsFloatingDType(dtype)) ops.push_back(ReduceOp::kAvg);
  for (int64_t n : kCounts) {
    for (ReduceOp op : ops) {
      RunOnThreads(size, [&](int r) {
        Buffer in(memory, r, dtype, n * size), out(memory, r, dtype, n);
        for (int64_t i = 0; i < n * size; ++i) in.Set(i, Value(r, i));
        in.Upload();
        absl::Status s = comms[r]->ReduceScatter(in.view(), out.view(), op);
        ASSERT_TRUE(s.ok()) << s;
        out.Download();
        for (int64_t i = 0; i < n; ++i) {
          double want = Value(0, r * n + i);
          for (int q = 1; q < size; ++q) want = Fold(op, want, Value(q, r * n + i));
          if (op == ReduceOp::kAvg) want /= size;
          ASSERT_NEAR(out.Get(i), want, Tolerance(dtype, want))
              << "rank " << r << " i " << i << " op " << ReduceOpName(op);
        }
      });
    }
  }
}

void CheckAllToAllUneven(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  for (int64_t scale : {0, 1, 13}) {
    RunOnThreads(size, [&](int r) {
      std::vector<int64_t> send_counts(size), recv_counts(size);
      int64_t send_total = 0, recv_total = 0;
      for (int p = 0; p < size; ++p) {
        send_counts[p] = SplitCount(r, p, scale);
        recv_counts[p] = SplitCount(p, r, scale);
        send_total += send_counts[p];
        recv_total += recv_counts[p];
      }
      Buffer in(memory, r, dtype, send_total), out(memory, r, dtype, recv_total);
      int64_t k = 0;
      for (int p = 0; p < size; ++p) {
        for (int64_t j = 0; j < send_counts[p]; ++j) in.Set(k++, A2aValue(r, p, j));
      }
      in.Upload();
      absl::Status s = comms[r]->AllToAll(in.view(), send_counts, out.view(), recv_counts);
      ASSERT_TRUE(s.ok()) << s;
      out.Download();
      k = 0;
      for (int p = 0; p < size; ++p) {
        for (int64_t j = 0; j < recv_counts[p]; ++j) {
          ASSERT_EQ(out.Get(k++), A2aValue(p, r, j)) << "rank " << r << " from " << p << " j " << j;
        }
      }
    });
  }
}

void CheckBroadcast(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  for (int root = 0; root < size; ++root) {
    for (int64_t n : {int64_t{1}, int64_t{4097}}) {
      RunOnThreads(size, [&](int r) {
        Buffer b(memory, r, dtype, n);
        for (int64_t i = 0; i < n; ++i) b.Set(i, Value(r, i));
        b.Upload();
        absl::Status s = comms[r]->Broadcast(b.view(), root);
        ASSERT_TRUE(s.ok()) << s;
        b.Download();
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.Get(i), Value(root, i)) << "rank " << r;
      });
    }
  }
}

void CheckBarrier(const std::vector<Communicator*>& comms) {
  const int size = static_cast<int>(comms.size());
  std::atomic<int> arrived{0};
  RunOnThreads(size, [&](int r) {
    // The last rank arrives late; nobody may leave before it arrived.
    if (r == size - 1) absl::SleepFor(absl::Milliseconds(50));
    arrived.fetch_add(1);
    absl::Status s = comms[r]->Barrier();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(arrived.load(), size) << "rank " << r << " left the barrier early";
  });
}

void CheckStartedCollectives(const std::vector<Communicator*>& comms, DType dtype, TestMemory& memory) {
  const int size = static_cast<int>(comms.size());
  for (int64_t n : kCounts) {
    RunOnThreads(size, [&](int r) {
      Buffer gather_in(memory, r, dtype, n), gathered(memory, r, dtype, n * size);
      Buffer scatter_in(memory, r, dtype, n * size), scattered(memory, r, dtype, n);
      Buffer reduced(memory, r, dtype, n), blocking(memory, r, dtype, n);
      for (int64_t i = 0; i < n; ++i) {
        gather_in.Set(i, Value(r, i));
        reduced.Set(i, Value(r, i + 1));
        blocking.Set(i, Value(r, i + 2));
      }
      for (int64_t i = 0; i < n * size; ++i) scatter_in.Set(i, Value(r, i));
      for (Buffer* b : {&gather_in, &scatter_in, &reduced, &blocking}) b->Upload();
      auto gather = comms[r]->StartAllGather(gather_in.view(), gathered.view());
      ASSERT_TRUE(gather.ok()) << gather.status();
      auto scatter = comms[r]->StartReduceScatter(scatter_in.view(), scattered.view(), ReduceOp::kSum);
      ASSERT_TRUE(scatter.ok()) << scatter.status();
      auto reduce = comms[r]->StartAllReduce(reduced.view(), ReduceOp::kMax);
      ASSERT_TRUE(reduce.ok()) << reduce.status();
      // A blocking call issued behind them runs after them.
      absl::Status s = comms[r]->AllReduce(blocking.view(), ReduceOp::kSum);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_TRUE((*gather)->Ready().ok());
      for (auto* pending : {&*gather, &*scatter, &*reduce}) {
        s = (*pending)->Wait();
        ASSERT_TRUE(s.ok()) << s;
      }
      for (Buffer* b : {&gathered, &scattered, &reduced, &blocking}) b->Download();
      for (int q = 0; q < size; ++q) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gathered.Get(q * n + i), Value(q, i)) << "rank " << r;
      }
      for (int64_t i = 0; i < n; ++i) {
        double sum = 0, max = Value(0, i + 1), total = 0;
        for (int q = 0; q < size; ++q) {
          sum += Value(q, r * n + i);
          max = std::max(max, Value(q, i + 1));
          total += Value(q, i + 2);
        }
        ASSERT_NEAR(scattered.Get(i), sum, Tolerance(dtype, sum)) << "rank " << r << " i " << i;
        ASSERT_EQ(reduced.Get(i), max) << "rank " << r << " i " << i;
        ASSERT_NEAR(blocking.Get(i), total, Tolerance(dtype, total)) << "rank " << r << " i " << i;
      }
    });
  }
}

}  // namespace comm
}  // namespace recfleet
