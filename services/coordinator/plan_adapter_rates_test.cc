// The planner's prediction from a measured rate table against a measured
// step (time and peak memory), on the CPU engine: rates fitted to the CPU probe family, the CPU
// demo's model (tools/demo.sh: d 16, one FULL attention layer, histories
// lognormal around 20, batch 128) planned through PlanRequestFromSpec, and
// the same model's step timed. The demo model is not one of the probes.

#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/calibrate.h"
#include "engine/job_model.h"
#include "engine/step_cost.h"
#include "engine/step_rates.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "services/coordinator/plan_adapter.h"

namespace recfleet::coordinator {
namespace {

constexpr char kCpuDemo[] = R"pb(
  display_name: "cpu-demo"
  model {
    tables { name: "item" rows: 500 dim: 16 }
    tables { name: "user" rows: 500 dim: 16 }
    tables { name: "item_category" rows: 9 dim: 16 }
    features { name: "user_id" kind: ID_LIST table: "user" }
    features { name: "item_id" kind: CANDIDATE table: "item" }
    features { name: "item_category" kind: CANDIDATE table: "item_category" }
    features { name: "history_items" kind: SEQUENCE table: "item" max_length: 64 }
    features { name: "dense_0" kind: NUMERIC width: 1 }
    features { name: "dense_1" kind: NUMERIC width: 1 }
    features { name: "dense_2" kind: NUMERIC width: 1 }
    features { name: "dense_3" kind: NUMERIC width: 1 }
    sequence {
      features: "history_items"
      num_layers: 1
      model_dim: 16
      num_heads: 2
      attention { kind: FULL rope: true }
    }
    cross { num_cross_layers: 1 pma_queries: 2 num_heads: 2 }
    dense { dcn { num_layers: 1 } }
    dense { moe { num_experts: 2 top_k: 2 expert_hidden_dims: 64 expert_hidden_dims: 32 } }
    heads { kind: CTR label: "label" hidden_dims: 16 }
  }
  data {
    dataset: "synthetic://demo?samples=200000&users=500&items=500&clusters=8&dense=4&lengths=lognormal:mean=20,sigma=0.8,min=1,max=64&seed=1"
    local_batch_size: 128
  }
  resources { workers: 1 }
  training { steps: 10 seed: 1 }
)pb";

planner::Topology OneCpuRank() {
  planner::Topology t = DefaultHardware();
  t.num_nodes = 1;
  t.gpus_per_node = 1;
  t.nodes_per_zone = 1;
  t.nodes_per_nvlink_domain = 1;
  return t;
}

engine::RateProbeOptions CpuProbes() {
  engine::RateProbeOptions o;
  o.device = Device::kCpu;
  o.warmup = 1;
  o.repeats = 5;
  return o;
}

// The CPU table, measured once for the tests below.
const absl::StatusOr<engine::RateProbeResult>& MeasuredCpuRates() {
  static const absl::StatusOr<engine::RateProbeResult>* measured =
      new absl::StatusOr<engine::RateProbeResult>(engine::MeasureStepRates(CpuProbes()));
  return *measured;
}

TEST(PlanAdapterRatesTest, CpuDemoStepPredictedWithinTwentyPercentOfMeasured) {
  const engine::RateProbeOptions o = CpuProbes();
  const absl::StatusOr<engine::RateProbeResult>& measured = MeasuredCpuRates();
  ASSERT_TRUE(measured.ok()) << measured.status();
  const engine::StepRates& rates = measured->rates;
  EXPECT_LT(rates.time_fit_error, 0.25) << engine::StepRatesToYaml(rates);

  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kCpuDemo, &spec));
  const planner::Topology topology = WithMeasuredPeak(OneCpuRank(), rates);
  absl::StatusOr<planner::PlanRequest> request = PlanRequestFromSpec(spec, &rates, topology);
  ASSERT_TRUE(request.ok()) << request.status();
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(topology, *request);
  ASSERT_TRUE(plan.ok()) << plan.status();

  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int64_t> lengths = SpecSequenceLengths(spec, *model);
  lengths.resize(spec.data().local_batch_size());
  absl::StatusOr<engine::ProbeStep> step = engine::MeasureStep(*model, lengths, o);
  ASSERT_TRUE(step.ok()) << step.status();

  // The plan's FLOPs are the engine's for this batch's length mix.
  EXPECT_NEAR(plan->step.model_flops / step->counts.StepFlops(), 1, 0.15);
  const double error = plan->step.total_s / step->seconds - 1;
  std::printf("CPU demo model, batch 128: predicted %.2f ms, measured %.2f ms (error %+.1f%%)\n",
              plan->step.total_s * 1e3, step->seconds * 1e3, 100 * error);
  EXPECT_LT(std::fabs(error), 0.20) << "predicted " << plan->step.total_s * 1e3 << " ms, measured "
                                    << step->seconds * 1e3 << " ms\n"
                                    << engine::StepRatesToYaml(rates);
}

// The memory half on the CPU: the table's fitted memory terms (the probes'
// peak resident growth) price the demo's model, which is no probe, and the
// prediction of what a step adds to the process's resident memory is
// checked against a real training run of that model, at the demo's batch
// and at four times it (activations then outweigh the fixed overhead).
TEST(PlanAdapterRatesTest, CpuDemoPeakMemoryPredictedWithinTwentyPercentOfMeasured) {
  const engine::RateProbeOptions o = CpuProbes();
  const absl::StatusOr<engine::RateProbeResult>& measured = MeasuredCpuRates();
  ASSERT_TRUE(measured.ok()) << measured.status();
  const engine::StepRates& rates = measured->rates;
  ASSERT_GT(rates.fixed_bytes + rates.bytes_per_token_element + rates.bytes_per_dense_element, 0)
      << engine::StepRatesToYaml(rates);

  v1::JobSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kCpuDemo, &spec));
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  for (int batch : {128, 512}) {
    spec.mutable_data()->set_local_batch_size(batch);
    // Resident bytes before the job: 0, so the prediction is the job's own.
    absl::StatusOr<double> predicted = CpuRankPeakBytes(spec, rates, 0);
    ASSERT_TRUE(predicted.ok()) << predicted.status();
    std::vector<int64_t> lengths = SpecSequenceLengths(spec, *model);
    lengths.resize(batch);
    absl::StatusOr<engine::ProbeStep> step = engine::MeasureStep(*model, lengths, o);
    ASSERT_TRUE(step.ok()) << step.status();
    const double error = *predicted / step->peak_bytes - 1;
    std::printf("CPU demo model, batch %d: predicted %.2f MiB, measured %.2f MiB resident growth (error %+.1f%%)\n",
                batch, *predicted / (1 << 20), step->peak_bytes / (1 << 20), 100 * error);
    EXPECT_LT(std::fabs(error), 0.20) << "batch " << batch << "\n" << engine::StepRatesToYaml(rates);
  }
}

}  // namespace
}  // namespace recfleet::coordinator
