// The CUDA path of engine/calibrate.h on a GPU (tag gpu): the worker's
// step timed with CUDA events, and the fitted cost predicts batches of
// mixed lengths it never saw.

#include <cstdio>

#include "engine/calibrate.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

// Full attention over histories up to 1,024 events, wide enough (model_dim
// 256, head dim 128: the bf16 kernels) that a step of 128 samples is
// compute-bound rather than bound by kernel launches.
constexpr char kSpec[] = R"pb(
  model {
    tables { name: "item" rows: 100000 dim: 256 }
    tables { name: "user" rows: 10000 dim: 256 }
    features { name: "user_id" kind: ID_LIST table: "user" }
    features { name: "item_id" kind: CANDIDATE table: "item" }
    features { name: "history_items" kind: SEQUENCE table: "item" max_length: 1024 }
    sequence {
      features: "history_items"
      num_layers: 2
      model_dim: 256
      num_heads: 2
      attention { kind: FULL rope: true }
    }
    cross { num_cross_layers: 1 pma_queries: 2 num_heads: 2 }
    dense { moe { num_experts: 2 top_k: 2 expert_hidden_dims: [ 1024, 256 ] } }
    heads { kind: CTR label: "label" hidden_dims: 256 }
  }
  data { dataset: "unused" local_batch_size: 128 }
  resources { workers: 1 gpus_per_worker: 1 }
  training { steps: 1 dense_learning_rate: 0.0005 sparse_learning_rate: 0.01 seed: 3 }
)pb";

TEST(CalibrateCudaTest, FitPredictsHeldOutBatchesOnTheGpu) {
  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kSpec, &spec));
  absl::StatusOr<JobModel> model = BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  CalibrationOptions o;
  o.device = Device::kCuda;
  o.lengths = CalibrationLengths(*model);
  ASSERT_EQ(o.lengths, (std::vector<int64_t>{1, 128, 256, 512, 1024}));
  o.batch_size = 128;
  o.warmup = 2;
  o.repeats = 5;
  o.fit_batches = 8;
  o.check_batches = 8;
  absl::StatusOr<Calibration> c = Calibrate(*model, o);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const data::BatchTime& b : c->one_length) {
    std::printf("length %lld: %.4f ms per batch\n", static_cast<long long>(b.lengths[0]),
                1e3 * b.seconds);
  }
  // Longer histories take longer, and full attention's quadratic term is
  // in the fit.
  for (size_t i = 1; i < c->one_length.size(); ++i) {
    EXPECT_GT(c->one_length[i].seconds, c->one_length[i - 1].seconds) << i;
  }
  EXPECT_GT(c->fit.quadratic, 0);
  const PredictionError seen = FitError(c->fit, c->mixed_fit);
  const PredictionError held_out = FitError(c->fit, c->held_out);
  std::printf("fit: per_sample %.6g s, linear %.6g s, quadratic %.6g s\n", c->fit.per_sample,
              c->fit.linear, c->fit.quadratic);
  std::printf("mixed batches seen: largest %.2f%%, mean %.2f%%; held out: largest %.2f%%, mean %.2f%%\n",
              100 * seen.largest, 100 * seen.mean, 100 * held_out.largest, 100 * held_out.mean);
  ASSERT_EQ(c->held_out.size(), 8u);
  // The held-out batches' caps span 128..1,024 tokens (their total time
  // several-fold); the issue's target for the mean is 10%, and no batch
  // may be off by more than 15%.
  EXPECT_LT(held_out.mean, 0.10);
  EXPECT_LT(held_out.largest, 0.15);
}

}  // namespace
}  // namespace recfleet::engine
