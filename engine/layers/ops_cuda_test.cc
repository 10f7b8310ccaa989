// The CUDA glue ops against a float64 host reference on fresh random data.
// ScatterAddRows: both of its kernels (the shared-memory one for outputs of
// at most 12,288 elements fed at least 4 rows per output row, the per-row
// one otherwise), ragged widths, skewed slots that send most rows to one
// output row (as the 16-row action table gets), an output that already
// holds values, and output rows no slot names staying bit for bit.

#include <cmath>
#include <cstdint>
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

}  // namespace
}  // namespace recfleet::engine::ops
