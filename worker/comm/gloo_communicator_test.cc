// Every collective of the Gloo backend against a direct computation of its
// definition, for every dtype, world sizes 1 to 4 and odd element counts
// (including 0 and uneven all-to-all splits with zero-sized pairs).

#include <atomic>
#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/comm/host_reduce.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

// A typed host buffer addressed through doubles, so one test body covers
// every dtype. Test values are small integers, exact in every dtype and in
// any summation order.
class Buffer {
 public:
  Buffer(DType dtype, int64_t n) : dtype_(dtype), n_(n), bytes_(std::max<size_t>(1, n * DTypeSize(dtype))) {}

  void Set(int64_t i, double v) {
    char* p = bytes_.data() + i * DTypeSize(dtype_);
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
    const char* p = bytes_.data() + i * DTypeSize(dtype_);
    switch (dtype_) {
      case DType::kFloat32: { float x; std::memcpy(&x, p, 4); return x; }
      case DType::kFloat64: { double x; std::memcpy(&x, p, 8); return x; }
      case DType::kBFloat16: { uint16_t x; std::memcpy(&x, p, 2); return Bf16ToFloat(x); }
      case DType::kInt32: { int32_t x; std::memcpy(&x, p, 4); return x; }
      case DType::kInt64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
      default: return 0;
    }
  }

  TensorView view() { return MakeView(bytes_.data(), dtype_, {n_}); }

 private:
  DType dtype_;
  int64_t n_;
  std::vector<char> bytes_;
};

double Value(int rank, int64_t i) { return static_cast<double>((rank * 7 + i * 3) % 11 - 5); }

class GlooCollectivesTest : public ::testing::TestWithParam<std::tuple<int, DType>> {
 protected:
  void SetUp() override {
    size_ = std::get<0>(GetParam());
    dtype_ = std::get<1>(GetParam());
    CommOptions options;
    options.timeout = absl::Seconds(20);
    auto comms = ConnectGlooGroup(store_, size_, options);
    ASSERT_TRUE(comms.ok()) << comms.status();
    comms_ = *std::move(comms);
  }

  bool floating() const { return IsFloatingDType(dtype_); }

  int size_ = 0;
  DType dtype_ = DType::kFloat32;
  InProcessKvStore store_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

const int64_t kCounts[] = {0, 1, 7, 1000, 4097};

TEST_P(GlooCollectivesTest, AllReduceMatchesReference) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};
  if (floating()) ops.push_back(ReduceOp::kAvg);
  for (int64_t n : kCounts) {
    for (ReduceOp op : ops) {
      RunOnThreads(size_, [&](int r) {
        Buffer b(dtype_, n);
        for (int64_t i = 0; i < n; ++i) b.Set(i, Value(r, i));
        ASSERT_TRUE(comms_[r]->AllReduce(b.view(), op).ok());
        for (int64_t i = 0; i < n; ++i) {
          double want = Value(0, i);
          for (int q = 1; q < size_; ++q) {
            const double v = Value(q, i);
            want = op == ReduceOp::kMin ? std::min(want, v) : op == ReduceOp::kMax ? std::max(want, v) : want + v;
          }
          if (op == ReduceOp::kAvg) want /= size_;
          const double tol = dtype_ == DType::kBFloat16 ? 0.02 * std::abs(want) : 1e-6;
          ASSERT_NEAR(b.Get(i), want, tol) << "rank " << r << " i " << i << " op " << ReduceOpName(op) << " n " << n;
        }
      });
    }
  }
}

TEST_P(GlooCollectivesTest, AllGatherMatchesReference) {
  for (int64_t n : kCounts) {
    RunOnThreads(size_, [&](int r) {
      Buffer in(dtype_, n), out(dtype_, n * size_);
      for (int64_t i = 0; i < n; ++i) in.Set(i, Value(r, i));
      ASSERT_TRUE(comms_[r]->AllGather(in.view(), out.view()).ok());
      for (int q = 0; q < size_; ++q) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out.Get(q * n + i), Value(q, i)) << "rank " << r;
      }
    });
  }
}

TEST_P(GlooCollectivesTest, ReduceScatterMatchesReference) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMax};
  if (floating()) ops.push_back(ReduceOp::kAvg);
  for (int64_t n : kCounts) {
    for (ReduceOp op : ops) {
      RunOnThreads(size_, [&](int r) {
        Buffer in(dtype_, n * size_), out(dtype_, n);
        for (int64_t i = 0; i < n * size_; ++i) in.Set(i, Value(r, i));
        ASSERT_TRUE(comms_[r]->ReduceScatter(in.view(), out.view(), op).ok());
        for (int64_t i = 0; i < n; ++i) {
          double want = Value(0, r * n + i);
          for (int q = 1; q < size_; ++q) {
            want = op == ReduceOp::kMax ? std::max(want, Value(q, r * n + i)) : want + Value(q, r * n + i);
          }
          if (op == ReduceOp::kAvg) want /= size_;
          const double tol = dtype_ == DType::kBFloat16 ? 0.02 * std::abs(want) : 1e-6;
          ASSERT_NEAR(out.Get(i), want, tol) << "rank " << r << " i " << i << " op " << ReduceOpName(op);
        }
      });
    }
  }
}

// Elements rank `src` sends to rank `dst`: uneven, zero for some pairs.
int64_t SplitCount(int src, int dst, int64_t scale) { return ((src * 3 + dst * 5) % 4) * scale + (src + dst) % 2; }
double A2aValue(int src, int dst, int64_t j) { return static_cast<double>((src * 5 + dst * 3 + j) % 97); }

TEST_P(GlooCollectivesTest, AllToAllUnevenSplitsMatchReference) {
  for (int64_t scale : {0, 1, 13}) {
    RunOnThreads(size_, [&](int r) {
      std::vector<int64_t> send_counts(size_), recv_counts(size_);
      int64_t send_total = 0, recv_total = 0;
      for (int p = 0; p < size_; ++p) {
        send_counts[p] = SplitCount(r, p, scale);
        recv_counts[p] = SplitCount(p, r, scale);
        send_total += send_counts[p];
        recv_total += recv_counts[p];
      }
      Buffer in(dtype_, send_total), out(dtype_, recv_total);
      int64_t k = 0;
      for (int p = 0; p < size_; ++p) {
        for (int64_t j = 0; j < send_counts[p]; ++j) in.Set(k++, A2aValue(r, p, j));
      }
      ASSERT_TRUE(comms_[r]->AllToAll(in.view(), send_counts, out.view(), recv_counts).ok());
      k = 0;
      for (int p = 0; p < size_; ++p) {
        for (int64_t j = 0; j < recv_counts[p]; ++j) {
          ASSERT_EQ(out.Get(k++), A2aValue(p, r, j)) << "rank " << r << " from " << p << " j " << j;
        }
      }
    });
  }
}

TEST_P(GlooCollectivesTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size_; ++root) {
    for (int64_t n : {int64_t{1}, int64_t{4097}}) {
      RunOnThreads(size_, [&](int r) {
        Buffer b(dtype_, n);
        for (int64_t i = 0; i < n; ++i) b.Set(i, Value(r, i));
        ASSERT_TRUE(comms_[r]->Broadcast(b.view(), root).ok());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(b.Get(i), Value(root, i)) << "rank " << r;
      });
    }
  }
}

TEST_P(GlooCollectivesTest, BarrierWaitsForEveryRank) {
  std::atomic<int> arrived{0};
  RunOnThreads(size_, [&](int r) {
    // The last rank arrives late; nobody may leave before it arrived.
    if (r == size_ - 1) absl::SleepFor(absl::Milliseconds(50));
    arrived.fetch_add(1);
    ASSERT_TRUE(comms_[r]->Barrier().ok());
    EXPECT_EQ(arrived.load(), size_) << "rank " << r << " left the barrier early";
  });
}

INSTANTIATE_TEST_SUITE_P(
    SizesAndDTypes, GlooCollectivesTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kInt32,
                                         DType::kInt64)),
    [](const ::testing::TestParamInfo<std::tuple<int, DType>>& info) {
      return absl::StrCat("world", std::get<0>(info.param), "_", DTypeName(std::get<1>(info.param)));
    });

TEST(GlooValidationTest, RejectsMismatchedArguments) {
  InProcessKvStore store;
  auto comms = ConnectGlooGroup(store, 1, CommOptions());
  ASSERT_TRUE(comms.ok()) << comms.status();
  Communicator& c = *(*comms)[0];
  std::vector<float> f(8);
  std::vector<int32_t> i(8);
  TensorView fv = MakeView(f.data(), DType::kFloat32, {8});
  TensorView iv = MakeView(i.data(), DType::kInt32, {8});
  EXPECT_EQ(c.AllGather(fv, iv).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllGather(fv, MakeView(f.data(), DType::kFloat32, {4})).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(iv, ReduceOp::kAvg).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.Broadcast(fv, 1).code(), absl::StatusCode::kInvalidArgument);
  const int64_t too_many[] = {9};
  EXPECT_EQ(c.AllToAll(fv, too_many, MakeView(i.data(), DType::kFloat32, {8}), too_many).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(MakeView(f.data(), DType::kFloat32, {8}, Device::kCuda), ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.AllReduce(MakeView(f.data(), DType::kFloat8E4M3, {8}), ReduceOp::kSum).code(),
            absl::StatusCode::kInvalidArgument);
  // Bad arguments are the caller's error, not the group's: it stays usable.
  EXPECT_TRUE(c.health().ok());
  EXPECT_TRUE(c.AllReduce(fv, ReduceOp::kSum).ok());
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
