#include "engine/step_rates.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

StepCounts Counts(double linear, double attention, double token_elements, double dense_elements,
                  int64_t params, int64_t table_rows) {
  StepCounts c;
  c.parts.push_back({"a", params, linear, attention});
  c.token_elements = token_elements;
  c.dense_elements = dense_elements;
  c.table_rows = table_rows;
  c.dim = 8;
  return c;
}

StepRates Known() {
  StepRates r;
  r.device = "cuda";
  r.precision = "bf16";
  r.gemm_flops_per_s = 400e12;
  r.attention_flops_per_s = 250e12;
  r.seconds_per_token_element = 2e-12;
  r.seconds_per_dense_element = 5e-12;
  r.seconds_per_param = 1e-11;
  r.seconds_per_step = 1.5e-3;
  r.bytes_per_token_element = 30;
  r.bytes_per_dense_element = 12;
  r.fixed_bytes = 3e8;
  return r;
}

TEST(StepRatesTest, PredictionAddsEveryTerm) {
  const StepCounts c = Counts(1e12, 2e11, 1e9, 1e8, 1000000, 500);
  const StepPrediction p = PredictStep(c, Known());
  EXPECT_DOUBLE_EQ(p.gemm_s, 3e12 / 400e12);
  EXPECT_DOUBLE_EQ(p.attention_s, 3.5 * 2e11 / 250e12);
  EXPECT_DOUBLE_EQ(p.elementwise_s, 1e9 * 2e-12 + 1e8 * 5e-12);
  EXPECT_DOUBLE_EQ(p.optimizer_s, 1e6 * 1e-11);
  EXPECT_DOUBLE_EQ(p.seconds, p.gemm_s + p.attention_s + p.elementwise_s + p.optimizer_s + 1.5e-3);
  EXPECT_DOUBLE_EQ(p.static_bytes, 16e6 + 4.0 * 500 * 9);
  EXPECT_DOUBLE_EQ(p.peak_bytes, p.static_bytes + 30e9 + 12e8 + 3e8);
}

// Probes generated from known coefficients: the fit must give them back
// (within the iteration's tolerance) and predict an unseen model.
TEST(StepRatesTest, FitRecoversTheRatesThatMadeTheProbes) {
  const StepRates truth = Known();
  std::vector<ProbeStep> probes;
  for (int i = 0; i < 12; ++i) {
    const double s = 1 + i % 4, t = 1 + i / 4;
    StepCounts c = Counts(1e11 * s * t, 4e10 * t * t / s, 3e8 * t, 2e7 * s * s, 100000 * (1 + i % 3),
                          1000);
    probes.push_back({c, PredictStep(c, truth).seconds, PredictStep(c, truth).peak_bytes});
  }
  StepRates described;
  described.device = "cuda";
  described.machine = "test";
  auto fit = FitStepRates(probes, described);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->machine, "test");
  EXPECT_EQ(fit->probes, 12);
  EXPECT_LT(fit->time_fit_error, 1e-3);
  EXPECT_LT(fit->memory_fit_error, 1e-3);
  EXPECT_NEAR(fit->gemm_flops_per_s / truth.gemm_flops_per_s, 1, 0.01);
  EXPECT_NEAR(fit->attention_flops_per_s / truth.attention_flops_per_s, 1, 0.01);
  const StepCounts unseen = Counts(7e11, 9e10, 5e8, 4e7, 300000, 1000);
  EXPECT_NEAR(PredictStep(unseen, *fit).seconds / PredictStep(unseen, truth).seconds, 1, 0.01);
  EXPECT_NEAR(PredictStep(unseen, *fit).peak_bytes / PredictStep(unseen, truth).peak_bytes, 1, 0.01);
}

TEST(StepRatesTest, FitNeedsEnoughProbes) {
  std::vector<ProbeStep> probes(3, ProbeStep{Counts(1, 1, 1, 1, 1, 1), 1.0, 0});
  EXPECT_FALSE(FitStepRates(probes, {}).ok());
}

TEST(StepRatesTest, YamlRoundTripKeepsEveryField) {
  StepRates r = Known();
  r.machine = "NVIDIA H200, driver 1";
  r.date = "2026-12-02T03:00:00Z";
  r.command = "recfleet data calibrate --rates x.yaml --device cuda";
  r.probes = 16;
  r.time_fit_error = 0.04;
  auto back = StepRatesFromYaml(StepRatesToYaml(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->machine, r.machine);
  EXPECT_EQ(back->command, r.command);
  EXPECT_EQ(back->probes, 16);
  EXPECT_NEAR(back->gemm_flops_per_s / r.gemm_flops_per_s, 1, 1e-5);
  EXPECT_NEAR(back->seconds_per_step / r.seconds_per_step, 1, 1e-5);
  EXPECT_NEAR(back->fixed_bytes / r.fixed_bytes, 1, 1e-5);
  // Not measured: absent from the YAML, read back as 0.
  EXPECT_EQ(StepRatesToYaml(r).find("rank_sync"), std::string::npos);
  EXPECT_EQ(back->rank_sync_ranks, 0);

  r.rank_sync_ranks = 2;
  r.rank_sync_overhead = 0.125;
  back = StepRatesFromYaml(StepRatesToYaml(r));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank_sync_ranks, 2);
  EXPECT_NEAR(back->rank_sync_overhead, 0.125, 1e-9);
  const std::string negative = absl::StrCat(StepRatesToYaml(Known()), "rank_sync_overhead: -0.5\n");
  EXPECT_FALSE(StepRatesFromYaml(negative).ok());
}

TEST(StepRatesTest, RejectsOtherVersionsAndMissingKeys) {
  EXPECT_FALSE(StepRatesFromYaml("version: 2\ndevice: cuda\n").ok());
  const auto missing = StepRatesFromYaml("version: 1\ndevice: cuda\n");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("gemm_flops_per_s"), std::string::npos);
  EXPECT_FALSE(ReadStepRates("/nonexistent/rates.yaml").ok());
}

}  // namespace
}  // namespace recfleet::engine
