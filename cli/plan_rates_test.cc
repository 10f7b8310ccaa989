// The committed H200 rate table against the engine benchmark's measured
// steps (bench/RESULTS.md, "Predicted vs measured step time and peak memory
// on the GPU", 2026-12-02): `recfleet plan --rates` must keep predicting
// configs A (batch 64) and B (batch 1024) on one H200 within 20% of what
// was measured there. A change to the counts, the adapter or the planner's
// step composition that breaks the prediction fails here, on the CPU.

#include <cmath>
#include <cstdio>
#include <string>

#include "cli/jobs/spec_file.h"
#include "engine/step_rates.h"
#include "gtest/gtest.h"
#include "planner/planner.h"
#include "services/coordinator/plan_adapter.h"

namespace recfleet {
namespace {

planner::Topology OneH200() {
  planner::Topology t = coordinator::DefaultHardware();
  t.num_nodes = 1;
  t.gpus_per_node = 1;
  t.nodes_per_zone = 1;
  t.nodes_per_nvlink_domain = 1;
  return t;
}

struct Measured {
  const char* spec;
  int batch;
  double step_s;
  double peak_bytes;
};

TEST(PlanRatesTest, CommittedH200TablePredictsTheMeasuredConfigsWithinTwentyPercent) {
  absl::StatusOr<engine::StepRates> rates = engine::ReadStepRates("bench/rates/h200-bf16.yaml");
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_EQ(rates->device, "cuda");
  EXPECT_EQ(rates->precision, "bf16");
  // engine_bench medians and pool peaks of that run.
  const Measured runs[] = {{"bench/e2e/config_a.yaml", 64, 48.758e-3, 16407832888.0},
                           {"bench/e2e/config_b.yaml", 1024, 11.841e-3, 8994089835.0}};
  for (const Measured& m : runs) {
    absl::StatusOr<v1::JobSpec> spec = cli::LoadJobSpec(m.spec);
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->mutable_data()->set_local_batch_size(m.batch);
    const planner::Topology topology = coordinator::WithMeasuredPeak(OneH200(), *rates);
    absl::StatusOr<planner::PlanRequest> request =
        coordinator::PlanRequestFromSpec(*spec, &*rates, topology);
    ASSERT_TRUE(request.ok()) << request.status();
    absl::StatusOr<planner::Plan> plan = planner::MakePlan(topology, *request);
    ASSERT_TRUE(plan.ok()) << plan.status();
    std::printf("%s batch %d: step predicted %.2f ms, measured %.2f ms; peak predicted %.2f GiB, "
                "measured %.2f GiB\n",
                m.spec, m.batch, plan->step.total_s * 1e3, m.step_s * 1e3,
                plan->peak.Total() / (1 << 30), m.peak_bytes / (1 << 30));
    EXPECT_LT(std::fabs(plan->step.total_s / m.step_s - 1), 0.20)
        << m.spec << ": predicted " << plan->step.total_s * 1e3 << " ms";
    EXPECT_LT(std::fabs(plan->peak.Total() / m.peak_bytes - 1), 0.20)
        << m.spec << ": predicted " << plan->peak.Total() / (1 << 30) << " GiB";
  }
}

TEST(PlanRatesTest, CommittedCpuTableLoads) {
  absl::StatusOr<engine::StepRates> rates = engine::ReadStepRates("bench/rates/cpu-fp32.yaml");
  ASSERT_TRUE(rates.ok()) << rates.status();
  EXPECT_EQ(rates->device, "cpu");
  EXPECT_GT(rates->probes, 6);
}

}  // namespace
}  // namespace recfleet
