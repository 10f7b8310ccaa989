// The CUDA glue ops against a float64 host reference on fresh random data.
// The elementwise ops: every kind, lengths around the 4-element packs, and
// operands off the 16-byte alignment (the one-by-one kernel), with the
// elements around the operands left bit for bit.
// ScatterAddRows: both of its kernels (the shared-memory one for outputs of
// at most 12,288 elements fed at least 4 rows per output row, the per-row
// one otherwise), ragged widths, skewed slots that send most rows to one
// output row (as the 16-row action table gets), an output that already
// holds values, and output rows no slot names staying bit for bit.

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "engine/layers/ops.h"
#include "gtest/gtest.h"
#include "kernels/base/device_buffer.h"
#include "kernels/base/test_random.h"

namespace recfleet::engine::ops {
namespace {

void CheckScatterAddRows(int64_t n, int64_t out_rows, int64_t dim, bool skewed) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " out_rows=" << out_rows << " dim=" << dim
                                    << " skewed=" << skewed);
  const std::vector<double> rv = RandomDoubles(n * dim), ov = RandomDoubles(out_rows * dim);
  std::vector<float> rows(rv.begin(), rv.end()), out(ov.begin(), ov.end());
  // The last output row is named by no slot (when there are two or more).
  const int64_t used = out_rows > 1 ? out_rows - 1 : out_rows;
  std::uniform_int_distribution<int64_t> any(0, used - 1);
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) {
    slots[i] = skewed && TestRng()() % 4 != 0 ? used / 2 : any(TestRng());
  }
  DeviceBuffer drows(rows), dslots(slots), dout(out);
  const absl::Status s = ScatterAddRows(drows.View(DType::kFloat32, {n, dim}),
                                        dslots.View(DType::kInt64, {n}),
                                        dout.View(DType::kFloat32, {out_rows, dim}));
  ASSERT_TRUE(s.ok()) << s;
  const std::vector<float> got = dout.ToHost<float>();

  std::vector<double> want(out.begin(), out.end()), mag(out_rows * dim);
  for (int64_t e = 0; e < out_rows * dim; ++e) mag[e] = std::fabs(want[e]);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = 0; c < dim; ++c) {
      want[slots[i] * dim + c] += rows[i * dim + c];
      mag[slots[i] * dim + c] += std::fabs(rows[i * dim + c]);
    }
  }
  for (int64_t e = 0; e < out_rows * dim; ++e) {
    if (e / dim >= used) {
      ASSERT_EQ(got[e], out[e]) << "untouched element " << e;
    } else {
      // fp32 sums in some order: within a few ulps of the magnitude summed.
      ASSERT_NEAR(got[e], want[e], 1e-6 * mag[e] + 1e-7) << "element " << e;
    }
  }
}

TEST(OpsCudaTest, ScatterAddRowsMatchesFloat64Reference) {
  // Shared-memory kernel: few output rows, many input rows.
  CheckScatterAddRows(78001, 16, 256, true);   // the action table's shape
  CheckScatterAddRows(78001, 16, 256, false);
  CheckScatterAddRows(5000, 48, 256, true);    // 12,288 elements: the limit
  CheckScatterAddRows(333, 7, 33, false);      // ragged width
  CheckScatterAddRows(4097, 1, 1, false);      // one element
  CheckScatterAddRows(64, 16, 3, false);       // exactly 4 rows per output row
  // Per-row kernel: too many output elements, or too few input rows.
  CheckScatterAddRows(5000, 49, 256, true);
  CheckScatterAddRows(50000, 1000, 64, false);
  CheckScatterAddRows(63, 16, 3, false);
  CheckScatterAddRows(1, 1, 1, false);
  CheckScatterAddRows(3001, 2000, 300, false);
  CheckScatterAddRows(20000, 10000, 17, true);
}

TEST(OpsCudaTest, ScatterAddRowsOfNoRowsLeavesOutAlone) {
  const std::vector<double> ov = RandomDoubles(4 * 8);
  std::vector<float> out(ov.begin(), ov.end());
  DeviceBuffer drows(1), dslots(1), dout(out);
  ASSERT_TRUE(ScatterAddRows(drows.View(DType::kFloat32, {0, 8}), dslots.View(DType::kInt64, {0}),
                             dout.View(DType::kFloat32, {4, 8}))
                  .ok());
  EXPECT_EQ(dout.ToHost<float>(), out);
}

// Four device operands of n floats each, `offset` floats into their
// allocations (one float of slack after them too): a, b, c and out.
struct Operands {
  int64_t n, offset;
  std::vector<float> host[4];
  std::unique_ptr<DeviceBuffer> dev[4];

  Operands(int64_t size, int64_t off) : n(size), offset(off) {
    for (int k = 0; k < 4; ++k) {
      const std::vector<double> v = RandomDoubles(n + offset + 1);
      host[k].assign(v.begin(), v.end());
      dev[k] = std::make_unique<DeviceBuffer>(host[k]);
    }
  }
  TensorView View(int k) const {
    return MakeView(static_cast<float*>(dev[k]->get()) + offset, DType::kFloat32, {n},
                    Device::kCuda);
  }
  double At(int k, int64_t i) const { return host[k][offset + i]; }
};

void CheckElementwise(int64_t n, int64_t offset) {
  SCOPED_TRACE(::testing::Message() << "n=" << n << " offset=" << offset);
  const double w = RandomDoubles(1, 0.5, 2.0)[0];
  const float wf = static_cast<float>(w);
  struct Case {
    const char* name;
    std::function<absl::Status(const Operands&)> run;
    std::function<double(const Operands&, int64_t)> want;
    int out;  // which operand holds the result
  };
  const Case cases[] = {
      {"Add", [](const Operands& o) { return Add(o.View(0), o.View(1), o.View(3)); },
       [](const Operands& o, int64_t i) { return o.At(0, i) + o.At(1, i); }, 3},
      {"Mul", [](const Operands& o) { return Mul(o.View(0), o.View(1), o.View(3)); },
       [](const Operands& o, int64_t i) { return o.At(0, i) * o.At(1, i); }, 3},
      {"AddMul", [](const Operands& o) { return AddMul(o.View(0), o.View(1), o.View(3)); },
       [](const Operands& o, int64_t i) { return o.At(3, i) + o.At(0, i) * o.At(1, i); }, 3},
      {"MulAdd",
       [](const Operands& o) { return MulAdd(o.View(0), o.View(1), o.View(2), o.View(3)); },
       [](const Operands& o, int64_t i) { return o.At(0, i) * o.At(1, i) + o.At(2, i); }, 3},
      {"Scale", [&](const Operands& o) { return Scale(o.View(0), w); },
       [&](const Operands& o, int64_t i) { return o.At(0, i) * wf; }, 0},
      {"AddScaled", [&](const Operands& o) { return AddScaled(o.View(0), w, o.View(3)); },
       [&](const Operands& o, int64_t i) { return o.At(3, i) + wf * o.At(0, i); }, 3},
      {"FillMeanWeights", [](const Operands& o) { return FillMeanWeights(o.View(3)); },
       [](const Operands& o, int64_t) { return 1.0 / static_cast<double>(o.n); }, 3},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const Operands o(n, offset);
    const absl::Status s = k.run(o);
    ASSERT_TRUE(s.ok()) << s;
    for (int op = 0; op < 4; ++op) {
      const std::vector<float> got = o.dev[op]->ToHost<float>();
      for (int64_t j = 0; j < n + offset + 1; ++j) {
        const int64_t i = j - offset;
        if (op != k.out || i < 0 || i >= n) {
          ASSERT_EQ(got[j], o.host[op][j]) << "operand " << op << " element " << j;
        } else {
          // One or two fp32 roundings of terms of magnitude <= 2 (w < 2).
          ASSERT_NEAR(got[j], k.want(o, i), 1e-6) << "element " << i;
        }
      }
    }
  }
}

TEST(OpsCudaTest, ElementwiseOpsMatchFloat64Reference) {
  for (int64_t n : {1, 3, 4, 5, 8, 1023, 4099, (1 << 20) + 3}) {
    CheckElementwise(n, 0);  // 16-byte aligned: packs of 4, then the rest
    CheckElementwise(n, 1);  // unaligned: one by one
  }
}

}  // namespace
}  // namespace recfleet::engine::ops
