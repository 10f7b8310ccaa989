// CUDA embedding kernels against the CPU reference on fresh random data.

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/formats.h"
#include "kernels/base/test_random.h"
#include "kernels/embedding/embedding.h"

namespace recfleet {
namespace {

// Random host tensor of `dtype` (fp32 or bf16) stored as raw bytes.
std::vector<uint8_t> RandomTensor(DType dtype, int64_t n, double lo, double hi) {
  std::vector<double> v = RandomDoubles(n, lo, hi);
  std::vector<uint8_t> out(n * DTypeSize(dtype));
  TensorView t = MakeView(out.data(), dtype, {n});
  for (int64_t i = 0; i < n; ++i) StoreFromDouble(t, i, v[i]);
  return out;
}

// max |a - b| / (scale + |b|); scale 1 compares absolutely for |b| << 1.
double MaxDiff(const TensorView& a, const TensorView& b, double scale) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double ref = LoadAsDouble(b, i);
    const double d = std::fabs(LoadAsDouble(a, i) - ref) / (scale + std::fabs(ref));
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

// Jagged ids with empty bags, single-id bags and heavy duplication.
struct Batch {
  std::vector<int64_t> ids, offsets;
};

// With `hot`, half of the ids are one id.
Batch RandomBatch(int64_t bags, int64_t rows, int max_len, bool hot) {
  std::uniform_int_distribution<int64_t> id(0, rows - 1);
  std::uniform_int_distribution<int> len(0, max_len);
  std::bernoulli_distribution coin(0.5);
  const int64_t hot_id = id(TestRng());
  Batch b;
  b.offsets.push_back(0);
  for (int64_t i = 0; i < bags; ++i) {
    const int n = i == 0 ? 0 : (i == 1 ? 1 : len(TestRng()));
    for (int k = 0; k < n; ++k) b.ids.push_back(hot && coin(TestRng()) ? hot_id : id(TestRng()));
    b.offsets.push_back(static_cast<int64_t>(b.ids.size()));
  }
  return b;
}

// Host ids/offsets as int32 or int64 bytes.
std::vector<uint8_t> AsIndex(const std::vector<int64_t>& v, DType dtype) {
  std::vector<uint8_t> out(v.size() * DTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kInt32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      std::memcpy(out.data() + 8 * i, &v[i], 8);
    }
  }
  return out;
}

struct Config {
  DType table_dtype;
  DType io_dtype;  // out / grad_out
  DType index_dtype;
  int64_t rows, dim, bags;
  bool pooled;
  Pooling pooling;
  bool hot = false;
};

void CheckAgainstCpu(const Config& c) {
  SCOPED_TRACE(::testing::Message() << DTypeName(c.table_dtype) << " table, "
                                    << DTypeName(c.io_dtype) << " io, dim " << c.dim
                                    << (c.pooled ? " pooled" : " sequence")
                                    << (c.pooling == Pooling::kMean ? " mean" : " sum")
                                    << (c.hot ? " hot id" : ""));
  Batch b = RandomBatch(c.bags, c.rows, 40, c.hot);
  if (!c.pooled) b.offsets.clear();
  const int64_t lookups = c.pooled ? c.bags : static_cast<int64_t>(b.ids.size());
  const int64_t n_ids = b.ids.size();
  std::vector<uint8_t> table = RandomTensor(c.table_dtype, c.rows * c.dim, -1, 1);
  std::vector<uint8_t> ids = AsIndex(b.ids, c.index_dtype);
  std::vector<uint8_t> offsets = AsIndex(b.offsets, c.index_dtype);
  std::vector<uint8_t> out_cpu(lookups * c.dim * DTypeSize(c.io_dtype));
  std::vector<uint8_t> grad = RandomTensor(c.io_dtype, lookups * c.dim, -1, 1);
  std::vector<float> momentum(c.rows);
  for (float& m : momentum) m = static_cast<float>(RandomDoubles(1, 0.1, 1.0)[0]);

  DeviceBuffer d_table(table), d_ids(ids), d_offsets(offsets), d_grad(grad), d_mom(momentum);
  DeviceBuffer d_out(out_cpu.size());
  CudaOrDie(cudaMemset(d_out.get(), 0xFF, d_out.bytes()), "poison");  // NaN everywhere

  auto run_forward = [&](Device dev, void* t, void* i, void* o, void* out) {
    TensorView tv = MakeView(t, c.table_dtype, {c.rows, c.dim}, dev);
    TensorView iv = MakeView(i, c.index_dtype, {n_ids}, dev);
    TensorView ov = MakeView(out, c.io_dtype, {lookups, c.dim}, dev);
    if (!c.pooled) return EmbeddingSequenceForward(tv, iv, ov);
    JaggedView j{iv, MakeView(o, c.index_dtype, {c.bags + 1}, dev)};
    return EmbeddingBagForward(tv, j, c.pooling, ov);
  };
  ASSERT_TRUE(run_forward(Device::kCpu, table.data(), ids.data(), offsets.data(), out_cpu.data()).ok());
  absl::Status s = run_forward(Device::kCuda, d_table.get(), d_ids.get(), d_offsets.get(), d_out.get());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> out_gpu = d_out.ToHost<uint8_t>();
  // Relative: a bf16 sum of 40 rows has an ulp of up to 1/8.
  const double tol = c.io_dtype == DType::kBFloat16 ? 1.0 / 64 : 1e-5;
  EXPECT_LE(MaxDiff(MakeView(out_gpu.data(), c.io_dtype, {lookups * c.dim}),
                    MakeView(out_cpu.data(), c.io_dtype, {lookups * c.dim}), 1.0),
            tol);

  const RowwiseAdagradConfig cfg{0.05f, 1e-6f};
  auto run_backward = [&](Device dev, void* g, void* i, void* o, void* t, void* m) {
    TensorView gv = MakeView(g, c.io_dtype, {lookups, c.dim}, dev);
    TensorView iv = MakeView(i, c.index_dtype, {n_ids}, dev);
    TensorView tv = MakeView(t, c.table_dtype, {c.rows, c.dim}, dev);
    TensorView mv = MakeView(m, DType::kFloat32, {c.rows}, dev);
    if (!c.pooled) return EmbeddingSequenceBackwardAdagrad(gv, iv, cfg, tv, mv);
    JaggedView j{iv, MakeView(o, c.index_dtype, {c.bags + 1}, dev)};
    return EmbeddingBagBackwardAdagrad(gv, j, c.pooling, cfg, tv, mv);
  };
  std::vector<uint8_t> table_cpu = table;
  std::vector<float> mom_cpu = momentum;
  ASSERT_TRUE(run_backward(Device::kCpu, grad.data(), ids.data(), offsets.data(), table_cpu.data(),
                           mom_cpu.data())
                  .ok());
  s = run_backward(Device::kCuda, d_grad.get(), d_ids.get(), d_offsets.get(), d_table.get(),
                   d_mom.get());
  ASSERT_TRUE(s.ok()) << s;
  std::vector<uint8_t> table_gpu = d_table.ToHost<uint8_t>();
  std::vector<float> mom_gpu = d_mom.ToHost<float>();
  // Momentum sums many fp32 squares: relative tolerance.
  double worst_m = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    worst_m = std::max(worst_m, std::fabs(double{mom_gpu[r]} - mom_cpu[r]) / mom_cpu[r]);
  }
  EXPECT_LE(worst_m, 1e-4);
  // A step moves a row by at most lr * sqrt(dim)-ish; bf16 tables round.
  const double ttol = c.table_dtype == DType::kBFloat16 ? 1.0 / 64 : 1e-5;
  const int64_t n = c.rows * c.dim;
  EXPECT_LE(MaxDiff(MakeView(table_gpu.data(), c.table_dtype, {n}),
                    MakeView(table_cpu.data(), c.table_dtype, {n}), 1.0),
            ttol);
  // The update really happened (and rows never looked up stayed put).
  EXPECT_GT(MaxDiff(MakeView(table_gpu.data(), c.table_dtype, {n}),
                    MakeView(table.data(), c.table_dtype, {n}), 1.0),
            0.0);
}

TEST(EmbeddingCudaTest, MatchesCpuReference) {
  for (DType table : {DType::kFloat32, DType::kBFloat16}) {
    for (DType io : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t dim : {128, 37, 300}) {  // vector path, scalar path, several chunks
        CheckAgainstCpu({table, io, DType::kInt64, 500, dim, 300, true, Pooling::kSum});
      }
    }
  }
  CheckAgainstCpu({DType::kFloat32, DType::kFloat32, DType::kInt32, 50, 64, 400, true,
                   Pooling::kMean});
  CheckAgainstCpu({DType::kBFloat16, DType::kFloat32, DType::kInt32, 3000, 256, 200, true,
                   Pooling::kMean});
  CheckAgainstCpu({DType::kFloat32, DType::kFloat32, DType::kInt64, 100, 128, 50, false,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt32, 100, 96, 50, false,
                   Pooling::kSum});
  // bf16 tables whose groups take two sorted positions each: mostly distinct
  // ids (a ragged last warp), one chunk per lane (dim 64) and a partial
  // second chunk (dim 136).
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt64, 100000, 64, 257, true,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kBFloat16, DType::kFloat32, DType::kInt64, 100000, 136, 131, true,
                   Pooling::kMean});
  // Ids of 10 bits (1000 rows) are sorted by id >> 2: buckets of four ids
  // whose occurrences interleave, ~16 occurrences per id; in registers (dim
  // 128) and through the two-pass path (dim 600 fp32).
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt64, 1000, 128, 800, true,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kFloat32, DType::kFloat32, DType::kInt32, 1000, 600, 400, true,
                   Pooling::kMean});
}

// Edge shapes of the Adagrad backward: a batch of a few ids, a partial
// second chunk per lane (dim 136 bf16), one lane per row (dim 8), 2^16-row
// tables (no skipped bits), and a hot id (half of all ids: one sorted run
// spanning thousands of positions) with bf16 and fp32 rows (dims 128, 300).
TEST(EmbeddingCudaTest, EdgeShapesAndHotIdsMatchCpuReference) {
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt64, 20, 128, 3, true,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt64, 100000, 136, 300, true,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt32, 5000, 8, 900, true,
                   Pooling::kMean});
  CheckAgainstCpu({DType::kFloat32, DType::kBFloat16, DType::kInt64, 1 << 16, 64, 600, true,
                   Pooling::kSum});
  CheckAgainstCpu({DType::kBFloat16, DType::kBFloat16, DType::kInt64, 100000, 128, 400, true,
                   Pooling::kMean, /*hot=*/true});
  CheckAgainstCpu({DType::kFloat32, DType::kFloat32, DType::kInt64, 1000, 128, 300, true,
                   Pooling::kSum, /*hot=*/true});
  CheckAgainstCpu({DType::kFloat32, DType::kFloat32, DType::kInt64, 1000, 300, 300, true,
                   Pooling::kSum, /*hot=*/true});
}

// A table past 2^31 elements: rows near the end must be addressed with
// 64-bit offsets. Only the rows looked up get random values; the rest hold
// a constant pattern that a wrongly wrapped offset would read instead.
TEST(EmbeddingCudaTest, TablesBeyond2To31ElementsUse64BitOffsets) {
  const int64_t dim = 128, rows = (int64_t{1} << 31) / dim + 4096;  // ~8.6 GB fp32
  DeviceBuffer table(static_cast<size_t>(rows * dim) * sizeof(float));
  CudaOrDie(cudaMemset(table.get(), 0x3F, table.bytes()), "fill");
  std::vector<int64_t> ids = {rows - 1, rows - 2, rows - 4000, rows - 1, 5};
  std::vector<float> host_rows(ids.size() * dim);
  for (size_t k = 0; k < ids.size(); ++k) {
    std::vector<double> r = RandomDoubles(dim);
    for (int64_t d = 0; d < dim; ++d) host_rows[k * dim + d] = static_cast<float>(r[d]);
    if (k == 3) std::memcpy(&host_rows[k * dim], &host_rows[0], dim * sizeof(float));
    CudaOrDie(cudaMemcpy(static_cast<float*>(table.get()) + ids[k] * dim, &host_rows[k * dim],
                         dim * sizeof(float), cudaMemcpyHostToDevice),
              "row");
  }
  std::vector<int64_t> offsets = {0, 2, 5};
  DeviceBuffer d_ids(ids), d_off(offsets), out(2 * dim * sizeof(float));
  JaggedView j{d_ids.View(DType::kInt64, {5}), d_off.View(DType::kInt64, {3})};
  ASSERT_TRUE(EmbeddingBagForward(table.View(DType::kFloat32, {rows, dim}), j, Pooling::kSum,
                                  out.View(DType::kFloat32, {2, dim}))
                  .ok());
  std::vector<float> got = out.ToHost<float>();
  for (int64_t d = 0; d < dim; ++d) {
    EXPECT_NEAR(got[d], host_rows[d] + host_rows[dim + d], 1e-5);
    EXPECT_NEAR(got[dim + d], host_rows[2 * dim + d] + host_rows[d] + host_rows[4 * dim + d], 1e-5);
  }
  // Backward on the same rows: row rows-1 appears twice, so its update uses
  // the summed gradient; the update lands on the right (high) row.
  std::vector<float> grad(2 * dim, 0.5f), mom(rows, 0.0f);
  DeviceBuffer d_grad(grad), d_mom(mom);
  ASSERT_TRUE(EmbeddingBagBackwardAdagrad(d_grad.View(DType::kFloat32, {2, dim}), j, Pooling::kSum,
                                          {0.1f, 1e-8f}, table.View(DType::kFloat32, {rows, dim}),
                                          d_mom.View(DType::kFloat32, {rows}))
                  .ok());
  std::vector<float> m = d_mom.ToHost<float>();
  EXPECT_NEAR(m[rows - 1], 1.0f, 1e-6);  // in both bags: g = 0.5 + 0.5 per column
  EXPECT_NEAR(m[rows - 2], 0.25f, 1e-6);
  EXPECT_NEAR(m[rows - 4000], 0.25f, 1e-6);
  EXPECT_NEAR(m[5], 0.25f, 1e-6);
  EXPECT_EQ(m[rows - 3], 0.0f);
}

}  // namespace
}  // namespace recfleet
