// GEM-lite on CUDA against the CPU reference (needs a GPU; tag gpu):
// fp32 mode trains like the CPU model step for step, bf16 mode reaches the
// fp32 model's eval NE, the prefetched input path changes nothing, and the
// device allocator reports its memory.

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "engine/tensor.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "engine/testing/train_loop.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

MovieLensCtr Data(int max_history) {
  SyntheticOptions s;
  s.num_users = 300;
  s.num_items = 400;
  CtrOptions o;
  o.max_history = max_history;
  return *MovieLensCtr::Create(SyntheticMovieLens(s), o);
}

Batch TrainBatch(const MovieLensCtr& data, int64_t k, int64_t size) {
  return CyclicTrainBatch(data, k, size);
}

GemLiteConfig SmallConfig() { return SmallCudaTestConfig(); }
GemLiteConfig ComparisonConfig() { return StepComparisonConfig(); }

std::unique_ptr<GemLite<float>> Make(const GemLiteConfig& c, const FeatureSchema& schema,
                                     Device device, bool bf16, bool graphs = false) {
  ExecutionOptions e;
  e.device = device;
  e.bf16 = bf16;
  e.cuda_graphs = graphs;
  absl::StatusOr<std::unique_ptr<GemLite<float>>> m =
      GemLite<float>::Create(c, schema, TableStorage::kInternal, e);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : nullptr;
}

// Trains `steps` steps, returning the CTR loss of each (empty on failure).
std::vector<double> Train(GemLite<float>& m, const MovieLensCtr& data, int steps, int64_t batch,
                          bool prefetch) {
  absl::StatusOr<std::vector<double>> losses = TrainSteps(m, data, steps, batch, prefetch);
  EXPECT_TRUE(losses.ok()) << losses.status();
  return losses.ok() ? *std::move(losses) : std::vector<double>();
}

BinaryMetrics Evaluate(GemLite<float>& m, const MovieLensCtr& data) {
  absl::StatusOr<BinaryMetrics> e = EvaluateCtr(m, data);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? *e : BinaryMetrics();
}

// A CPU tensor against a CUDA one of its shape: the largest absolute
// difference and the CPU tensor's largest magnitude.
struct Difference {
  double err = 0, norm = 0;
};
Difference Compare(const TensorView& cpu, const TensorView& gpu) {
  std::vector<float> host(gpu.numel());
  EXPECT_EQ(cudaMemcpy(host.data(), gpu.data, gpu.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  Difference d;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    d.err = std::max<double>(d.err, std::abs(host[i] - cpu.as<float>()[i]));
    d.norm = std::max<double>(d.norm, std::abs(cpu.as<float>()[i]));
  }
  return d;
}

// An fp32 CUDA tensor's values on the host.
std::vector<float> HostCopy(const TensorView& t) {
  std::vector<float> host(t.numel());
  EXPECT_EQ(cudaMemcpy(host.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

void ExpectSameTraining(const GemLiteConfig& config, const MovieLensCtr& data,
                        bool graphs = false) {
  auto cpu = Make(config, data.schema(), Device::kCpu, false);
  auto gpu = Make(config, data.schema(), Device::kCuda, false, graphs);
  ASSERT_TRUE(cpu && gpu);
  const std::vector<double> a = Train(*cpu, data, 50, 64, false);
  const std::vector<double> b = Train(*gpu, data, 50, 64, false);
  ASSERT_EQ(a.size(), 50u);
  ASSERT_EQ(b.size(), 50u);
  double worst = 0;
  for (int s = 0; s < 50; ++s) {
    const double rel = std::abs(a[s] - b[s]) / std::abs(a[s]);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << "step " << s << ": cpu " << a[s] << " cuda " << b[s];
  }
  std::printf("fp32 cuda vs cpu, 50 steps%s: worst relative loss difference %.3g (first %.5f, "
              "last %.5f)\n",
              graphs ? " (dense part as CUDA graphs)" : "", worst, a.front(), a.back());
  // Step 0 warms the graphs up, step 1 captures them, the rest replay.
  EXPECT_EQ(gpu->cuda_graph_replays(), graphs ? 48 : 0);
  // It trains: the last ten steps' mean loss is below the first ten's.
  EXPECT_LT(std::accumulate(a.end() - 10, a.end(), 0.0), std::accumulate(a.begin(), a.begin() + 10, 0.0));
  // And the parameters agree at the end.
  for (const std::string& name : cpu->DenseParameterNames()) {
    const Difference d = Compare(cpu->DenseParameter(name), gpu->DenseParameter(name));
    EXPECT_LT(d.err, 1e-3 * std::max(1.0, d.norm)) << name;
  }
}

TEST(GemLiteCudaTest, Fp32TrainsLikeTheCpuModelSoftmaxCausalRope) {
  ExpectSameTraining(ComparisonConfig(), Data(64));
}

TEST(GemLiteCudaTest, Fp32TrainsLikeTheCpuModelSiluBlockQkNorm) {
  GemLiteConfig c = ComparisonConfig();
  c.seq_activation = attention::Activation::kSilu;
  c.seq_mask = attention::Mask::kBlock;
  c.qk_norm = true;
  ExpectSameTraining(c, Data(100));
}

// Global-norm clipping of the dense gradients, active (the limit is half
// the first step's norm): the fp32 CUDA model, whose norm and factor never
// leave the device, trains like the CPU model with the same clip, and the
// clip changes the CPU run.
TEST(GemLiteCudaTest, Fp32WithGradientClippingTrainsLikeTheCpuModel) {
  const MovieLensCtr data = Data(64);
  GemLiteConfig config = ComparisonConfig();
  auto probe = Make(config, data.schema(), Device::kCpu, false);
  ASSERT_TRUE(probe);
  ASSERT_TRUE(probe->ForwardBackward(TrainBatch(data, 0, 64)).ok());
  const double norm = DenseGradientNorm(*probe);
  ASSERT_GT(norm, 0);
  config.dense_grad_clip_norm = 0.5 * norm;
  std::printf("clip at %.4g (half the first step's dense gradient norm)\n", config.dense_grad_clip_norm);
  ExpectSameTraining(config, data);
  auto clipped = Make(config, data.schema(), Device::kCpu, false);
  auto plain = Make(ComparisonConfig(), data.schema(), Device::kCpu, false);
  ASSERT_TRUE(clipped && plain);
  ASSERT_EQ(Train(*clipped, data, 10, 64, false).size(), 10u);
  ASSERT_EQ(Train(*plain, data, 10, 64, false).size(), 10u);
  // A factor of exactly 1 (an inactive clip) would leave the run bit for bit
  // the same. AdamW is nearly blind to a constant factor, so the runs part
  // only as far as the norm varies between steps.
  const std::vector<float> a = FlatDenseParameters(*clipped), b = FlatDenseParameters(*plain);
  EXPECT_NE(a, b) << "the clip never acted";
  const double effect = MaxRelativeError(a.data(), b.data(), static_cast<int64_t>(a.size()));
  std::printf("10 steps clipped vs unclipped (cpu): dense parameters' max relative difference %.3g\n",
              effect);
  // The GPU applied the clip: after the same 10 steps its parameters are far
  // closer to the clipped CPU run than the clip's own effect, which an
  // ignored clip on the device would leave between them.
  auto gpu = Make(config, data.schema(), Device::kCuda, false);
  ASSERT_TRUE(gpu);
  ASSERT_EQ(Train(*gpu, data, 10, 64, false).size(), 10u);
  std::vector<float> g;
  for (const std::string& name : gpu->DenseParameterNames()) {
    const TensorView v = gpu->DenseParameter(name);
    std::vector<float> host(v.numel());
    ASSERT_EQ(cudaMemcpy(host.data(), v.data, v.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    g.insert(g.end(), host.begin(), host.end());
  }
  ASSERT_EQ(g.size(), a.size());
  const double gpu_vs_clipped = MaxRelativeError(g.data(), a.data(), static_cast<int64_t>(a.size()));
  std::printf("10 steps, cuda clipped vs cpu clipped: %.3g (the clip's effect: %.3g)\n", gpu_vs_clipped, effect);
  EXPECT_LT(gpu_vs_clipped, 0.1 * effect);
}

// The dense part replayed as CUDA graphs computes what the eager launches
// compute: the same step-for-step agreement with the CPU model.
TEST(GemLiteCudaTest, Fp32WithCudaGraphsTrainsLikeTheCpuModel) {
  ExpectSameTraining(ComparisonConfig(), Data(64), /*graphs=*/true);
}

// Graphs on, a batch of another size in between (it runs eagerly and the
// graphs are captured again for it), and an eval forward of a third size:
// the losses equal those of the eager model's.
TEST(GemLiteCudaTest, CudaGraphsFollowBatchSizeChanges) {
  const MovieLensCtr data = Data(64);
  auto eager = Make(ComparisonConfig(), data.schema(), Device::kCuda, false);
  auto graphs = Make(ComparisonConfig(), data.schema(), Device::kCuda, false, true);
  ASSERT_TRUE(eager && graphs);
  const int64_t sizes[] = {64, 64, 64, 48, 48, 48, 48, 64, 64, 64, 64};
  for (size_t s = 0; s < std::size(sizes); ++s) {
    const Batch batch = TrainBatch(data, static_cast<int64_t>(s), sizes[s]);
    absl::StatusOr<StepResult> a = eager->ForwardBackward(batch);
    absl::StatusOr<StepResult> b = graphs->ForwardBackward(batch);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    ASSERT_TRUE(eager->ApplyUpdates().ok() && graphs->ApplyUpdates().ok());
    // The fp32 attention's dK/dV atomics may sum in another order.
    EXPECT_NEAR(a->ctr_loss, b->ctr_loss, 1e-5 * a->ctr_loss) << "step " << s;
    EXPECT_EQ(a->flops, b->flops) << "step " << s;
    if (s == 5) {
      const Batch eval = TrainBatch(data, 0, 32);
      absl::StatusOr<std::vector<double>> pa = eager->Predict(eval, Head::kCtr);
      absl::StatusOr<std::vector<double>> pb = graphs->Predict(eval, Head::kCtr);
      ASSERT_TRUE(pa.ok() && pb.ok());
      for (size_t i = 0; i < pa->size(); ++i) EXPECT_NEAR((*pa)[i], (*pb)[i], 1e-4);
    }
  }
  // 64: warm-up, capture, replay (step 2); 48: warm-up, capture, replay
  // (step 5); the eval forward of 32 drops the graphs, so step 6 warms up
  // again; 64: warm-up, capture, replays at steps 9 and 10.
  EXPECT_EQ(graphs->cuda_graph_replays(), 4);
}

TEST(GemLiteCudaTest, PrefetchedBatchesTrainIdentically) {
  const MovieLensCtr data = Data(64);
  auto a = Make(SmallConfig(), data.schema(), Device::kCuda, false);
  auto b = Make(SmallConfig(), data.schema(), Device::kCuda, false);
  ASSERT_TRUE(a && b);
  const std::vector<double> plain = Train(*a, data, 20, 64, false);
  const std::vector<double> prefetched = Train(*b, data, 20, 64, true);
  ASSERT_EQ(plain.size(), prefetched.size());
  // The fp32 attention's dK/dV atomics may sum in another order.
  for (size_t s = 0; s < plain.size(); ++s) EXPECT_NEAR(plain[s], prefetched[s], 1e-5 * plain[s]);
}

// Deferred read-back: the host runs a step ahead and reads each step's
// losses one step later; they equal the losses read at once, and reading
// too late is refused rather than answered with another step's values.
TEST(GemLiteCudaTest, DeferredLossesEqualImmediateOnes) {
  const MovieLensCtr data = Data(64);
  auto a = Make(SmallConfig(), data.schema(), Device::kCuda, false);
  ExecutionOptions e;
  e.device = Device::kCuda;
  e.defer_loss_readback = true;
  absl::StatusOr<std::unique_ptr<GemLite<float>>> made =
      GemLite<float>::Create(SmallConfig(), data.schema(), TableStorage::kInternal, e);
  ASSERT_TRUE(a && made.ok()) << made.status();
  GemLite<float>& b = **made;
  const std::vector<double> immediate = Train(*a, data, 12, 64, false);
  std::vector<double> deferred;
  StepResult previous;
  for (int s = 0; s < 12; ++s) {
    const Batch batch = TrainBatch(data, s, 64);
    absl::StatusOr<StepResult> r = b.ForwardBackward(batch);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->losses_pending);
    EXPECT_EQ(r->step, s);
    ASSERT_TRUE(b.ApplyUpdates().ok());
    if (s > 0) {
      ASSERT_TRUE(b.ReadLosses(&previous).ok());
      EXPECT_FALSE(previous.losses_pending);
      deferred.push_back(previous.ctr_loss);
    }
    previous = *r;
  }
  ASSERT_TRUE(b.ReadLosses(&previous).ok());
  deferred.push_back(previous.ctr_loss);
  ASSERT_EQ(deferred.size(), immediate.size());
  // The fp32 attention's dK/dV atomics may sum in another order.
  for (size_t s = 0; s < immediate.size(); ++s) {
    EXPECT_NEAR(deferred[s], immediate[s], 1e-5 * immediate[s]) << "step " << s;
  }
  StepResult stale;
  stale.losses_pending = true;
  stale.step = 9;  // slot rewritten by step 11
  EXPECT_EQ(b.ReadLosses(&stale).code(), absl::StatusCode::kFailedPrecondition);
}

// Issue #15: in bf16 mode the eval NE after 1,000 steps on synthetic data is
// within 0.1% (relative) of fp32's, as means over the seeds of EvalNeSetup.
// Each seed trains in both precisions; the paired relative differences and
// their standard error say how precisely the gap is measured. On the setup
// this test had before (batches of 128 from 4,000 users in storage order)
// the fp32 NE moved by 2-5% with the seed and the bar was below the noise;
// EvalNeSetup's comment says how the present one was chosen.
TEST(GemLiteCudaTest, Bf16EvalNeWithinPointOnePercentOfFp32) {
  const EvalNeSetup setup;
  const MovieLensCtr data = EvalNeData(setup.users);
  const std::vector<int64_t> order =
      setup.shuffled ? ShuffledOrder(data, setup.order_seed) : std::vector<int64_t>();
  std::vector<double> ne[2];
  for (uint64_t seed = 1; seed <= static_cast<uint64_t>(setup.seeds); ++seed) {
    for (int bf16 = 0; bf16 < 2; ++bf16) {
      auto m = Make(EvalNeConfig(seed, setup.learning_rate), data.schema(), Device::kCuda,
                    bf16 == 1);
      ASSERT_TRUE(m);
      absl::StatusOr<std::vector<double>> losses =
          TrainSteps(*m, data, setup.steps, setup.batch, true, order);
      ASSERT_TRUE(losses.ok()) << losses.status();
      const BinaryMetrics e = Evaluate(*m, data);
      ne[bf16].push_back(e.normalized_entropy);
      std::printf("%s seed %d: eval NE %.5f AUC %.4f", bf16 ? "bf16" : "fp32",
                  static_cast<int>(seed), e.normalized_entropy, e.auc);
      if (bf16 == 1) {
        std::printf(", %+.3f%% against fp32", 100 * (ne[1].back() - ne[0].back()) / ne[0].back());
      }
      std::printf("\n");
      // Every run learns (the comparison below is meaningless against a
      // diverged run: constant predictions score NE ~1).
      EXPECT_LT(e.normalized_entropy, setup.learned_ne) << (bf16 ? "bf16" : "fp32") << " seed "
                                                        << seed;
    }
  }
  const double n = static_cast<double>(ne[0].size());
  const double fp32 = std::accumulate(ne[0].begin(), ne[0].end(), 0.0) / n;
  const double bf16 = std::accumulate(ne[1].begin(), ne[1].end(), 0.0) / n;
  // Paired: seed s in bf16 against seed s in fp32.
  double mean_diff = 0, var_diff = 0, var_fp32 = 0;
  for (size_t s = 0; s < ne[0].size(); ++s) mean_diff += (ne[1][s] - ne[0][s]) / ne[0][s] / n;
  for (size_t s = 0; s < ne[0].size(); ++s) {
    const double d = (ne[1][s] - ne[0][s]) / ne[0][s] - mean_diff;
    var_diff += d * d / (n - 1);
    var_fp32 += (ne[0][s] - fp32) * (ne[0][s] - fp32) / (n - 1);
  }
  const double rel = (bf16 - fp32) / fp32;
  std::printf("eval NE over %d seeds: fp32 %.5f (seed-to-seed standard deviation %.3f%%), bf16 "
              "%.5f: %+.3f%%; paired relative difference %+.3f%% +- %.3f%% (standard error)\n",
              setup.seeds, fp32, 100 * std::sqrt(var_fp32) / fp32, bf16, 100 * rel,
              100 * mean_diff, 100 * std::sqrt(var_diff / n));
  EXPECT_LE(std::abs(rel), 1e-3);
}

// Trains `c` in bf16 on CUDA for the eval-NE setup's steps (batches in
// `order`) and returns the CTR head's eval NE: NaN, with a failure naming
// `what` and the step, when a loss is not finite or a call fails.
double EvalNeAfterTraining(const GemLiteConfig& c, const MovieLensCtr& data, const EvalNeSetup& setup,
                           absl::Span<const int64_t> order, const std::string& what) {
  auto m = Make(c, data.schema(), Device::kCuda, /*bf16=*/true);
  if (!m) return std::nan("");
  absl::StatusOr<std::vector<double>> losses = TrainSteps(*m, data, setup.steps, setup.batch, true, order);
  if (!losses.ok()) {
    ADD_FAILURE() << what << ": " << losses.status();
    return std::nan("");
  }
  for (size_t s = 0; s < losses->size(); ++s) {
    if (!std::isfinite((*losses)[s])) {
      ADD_FAILURE() << what << ": non-finite loss at step " << s;
      return std::nan("");
    }
  }
  const BinaryMetrics e = Evaluate(*m, data);
  EXPECT_LT(e.normalized_entropy, setup.learned_ne) << what;
  return e.normalized_entropy;
}

// Issue #20: the FP8 recipe (ne_probe's default modules: here dcn0/dcn1
// [896, 896] and the experts' l1 [48, 896] run FP8, the rest bf16) trains
// the eval-NE setup for 1,000 steps without a non-finite loss and ends near
// bf16. Before 24a211e seed 1 diverged at step 24-25: a nearly unused
// expert's gradient block (zeros and values near 1e-37) got a subnormal
// scale whose reciprocal overflowed, and its zeros encoded NaN. The bar is
// per seed, 3% relative, above the spread of the difference seen on
// 2026-12-03 (ne_probe, 20 seeds: -0.76% to +0.51%; this test: -1.04% and
// +0.68%): it catches a diverged or collapsed run, not a 0.1% gap, which
// takes the 20 seeds of bench/RESULTS.md (-0.10% +- 0.09%).
TEST(GemLiteCudaTest, Fp8RecipeTrainsWithoutDivergenceNearBf16) {
  const EvalNeSetup setup;
  const MovieLensCtr data = EvalNeData(setup.users);
  const std::vector<int64_t> order =
      setup.shuffled ? ShuffledOrder(data, setup.order_seed) : std::vector<int64_t>();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    double ne[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      GemLiteConfig c = EvalNeConfig(seed, setup.learning_rate);
      if (fp8 == 1) c.fp8.modules = {"dense_proj", "dcn", "moe.experts", "towers"};
      ne[fp8] = EvalNeAfterTraining(c, data, setup, order,
                                    absl::StrCat(fp8 ? "fp8" : "bf16", " seed ", seed));
    }
    std::printf("seed %d: eval NE bf16 %.5f, fp8 %.5f (%+.3f%%)\n", static_cast<int>(seed), ne[0],
                ne[1], 100 * (ne[1] - ne[0]) / ne[0]);
    EXPECT_LE(std::abs(ne[1] - ne[0]) / ne[0], 0.03) << "seed " << seed;
  }
}

// Issue #20 item 5: the recipe's fp8_attention runs the attention forward of
// the self-attention blocks, the cross-attention and PMA on the FP8 kernel
// (head dim 128: one head of the eval-NE model's 128), the backward in bf16.
// One step from the same parameters: the loss and every dense gradient stay
// near bf16's (the forward's output is ~5% off the exact one relative to
// its norm, bf16's ~0.2%), and the attention blocks' gradients differ from
// bf16's (the FP8 kernel ran). Then 1,000 steps of the eval-NE setup per
// seed without a non-finite loss, ending within 3% of bf16's eval NE: a
// diverged or collapsed run, not a 0.1% gap (ne_probe --precision fp8a
// measures that over many seeds).
// With fp8_backward (attention_backward FP8) the attention backward runs the
// FP8 kernels too; its gradients carry ~6-8% error of their own (the
// kernel's test), so the one-step gradient bound is looser.
void Fp8AttentionTrainsNearBf16(bool fp8_backward) {
  const EvalNeSetup setup;
  const MovieLensCtr data = EvalNeData(setup.users);
  auto config = [&](uint64_t seed, bool fp8) {
    GemLiteConfig c = EvalNeConfig(seed, setup.learning_rate);
    c.heads = 1;
    c.cross_attention = true;
    if (fp8) c.fp8.attention = {"sequence", "cross", "pma"};
    c.fp8.attention_backward = fp8 && fp8_backward;
    return c;
  };
  {
    auto bf16 = Make(config(1, false), data.schema(), Device::kCuda, /*bf16=*/true);
    auto fp8 = Make(config(1, true), data.schema(), Device::kCuda, /*bf16=*/true);
    ASSERT_TRUE(bf16 && fp8);
    const Batch batch = CyclicTrainBatch(data, 0, setup.batch);
    absl::StatusOr<StepResult> r16 = bf16->ForwardBackward(batch);
    absl::StatusOr<StepResult> r8 = fp8->ForwardBackward(batch);
    ASSERT_TRUE(r16.ok()) << r16.status();
    ASSERT_TRUE(r8.ok()) << r8.status();
    std::printf("one step: CTR loss bf16 %.6f, fp8 attention %.6f\n", r16->ctr_loss, r8->ctr_loss);
    ASSERT_TRUE(std::isfinite(r8->ctr_loss));
    EXPECT_LE(std::abs(r8->ctr_loss - r16->ctr_loss), 0.01 * r16->ctr_loss);
    int attention_differs = 0;
    double worst = 0;
    std::string worst_name;
    for (const std::string& name : bf16->DenseParameterNames()) {
      const std::vector<float> g16 = HostCopy(bf16->DenseGradient(name)),
                               g8 = HostCopy(fp8->DenseGradient(name));
      ASSERT_EQ(g16.size(), g8.size()) << name;
      double diff = 0, ref = 0;
      for (size_t i = 0; i < g16.size(); ++i) {
        ASSERT_TRUE(std::isfinite(g8[i])) << name << "[" << i << "]";
        diff += (double(g8[i]) - g16[i]) * (double(g8[i]) - g16[i]);
        ref += double(g16[i]) * g16[i];
      }
      const double rel = std::sqrt(diff / std::max(ref, 1e-30));
      if (ref > 0 && rel > worst) {
        worst = rel;
        worst_name = name;
      }
      const bool in_attention = name.rfind("seq0.", 0) == 0 || name.rfind("cross.", 0) == 0 ||
                                name.rfind("pma.", 0) == 0;
      if (in_attention && diff > 0) ++attention_differs;
    }
    std::printf("one step: largest relative gradient difference (L2) to bf16 %.4f (%s); %d attention "
                "parameters differ\n",
                worst, worst_name.c_str(), attention_differs);
    EXPECT_LE(worst, fp8_backward ? 0.4 : 0.25) << worst_name;
    EXPECT_GT(attention_differs, 0);
  }
  const std::vector<int64_t> order =
      setup.shuffled ? ShuffledOrder(data, setup.order_seed) : std::vector<int64_t>();
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    double ne[2];
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      ne[fp8] = EvalNeAfterTraining(config(seed, fp8 == 1), data, setup, order,
                                    absl::StrCat(fp8 ? "fp8 attention" : "bf16", " seed ", seed));
    }
    std::printf("seed %d: eval NE bf16 %.5f, fp8 attention%s %.5f (%+.3f%%)\n",
                static_cast<int>(seed), ne[0], fp8_backward ? " fwd+bwd" : "", ne[1],
                100 * (ne[1] - ne[0]) / ne[0]);
    EXPECT_LE(std::abs(ne[1] - ne[0]) / ne[0], 0.03) << "seed " << seed;
  }
}

TEST(GemLiteCudaTest, Fp8AttentionForwardTrainsNearBf16) { Fp8AttentionTrainsNearBf16(false); }

// Issue #20 item 5, backward: attention_backward FP8 as well.
TEST(GemLiteCudaTest, Fp8AttentionForwardAndBackwardTrainNearBf16) {
  Fp8AttentionTrainsNearBf16(true);
}

// The linears' weight gradients are overwritten by their step's first
// write instead of zeroed and added to. A step whose batch has no CVR
// labels writes nothing into the CVR tower: its gradients (left from the
// step before, which had labels) must read as zero, and every other
// gradient must equal the CPU model's after the same two steps.
TEST(GemLiteCudaTest, GradientsOfAnUnlabelledHeadReadZero) {
  const MovieLensCtr data = Data(64);
  auto cpu = Make(ComparisonConfig(), data.schema(), Device::kCpu, false);
  auto gpu = Make(ComparisonConfig(), data.schema(), Device::kCuda, false);
  ASSERT_TRUE(cpu && gpu);
  Batch unlabelled = TrainBatch(data, 1, 64);
  unlabelled.cvr_labels.clear();
  for (GemLite<float>* m : {cpu.get(), gpu.get()}) {
    ASSERT_TRUE(m->ForwardBackward(TrainBatch(data, 0, 64)).ok());
    ASSERT_TRUE(m->ApplyUpdates().ok());
    ASSERT_TRUE(m->ForwardBackward(unlabelled).ok());
  }
  int cvr = 0;
  for (const std::string& name : cpu->DenseParameterNames()) {
    const Difference d = Compare(cpu->DenseGradient(name), gpu->DenseGradient(name));
    if (name.rfind("cvr", 0) == 0) {
      ++cvr;
      EXPECT_EQ(d.norm, 0.0) << name;
      EXPECT_EQ(d.err, 0.0) << name;
    } else {
      EXPECT_LT(d.err, 1e-3 * std::max(1e-3, d.norm)) << name;
    }
  }
  EXPECT_GT(cvr, 0);
}

// bf16: each AdamW pass also writes the bf16 weight copies and the next
// forward uses them without re-rounding. A forward on those copies gives
// the loss of a forward on copies rounded anew from the values (what every
// forward does once a mutable view of the parameters is out), bit for bit;
// copies one update stale would not.
TEST(GemLiteCudaTest, Bf16CopiesWrittenByAdamWEqualRefreshedOnes) {
  const MovieLensCtr data = Data(64);
  GemLiteConfig c = ComparisonConfig();
  c.dim = 128;
  c.heads = 2;
  auto m = Make(c, data.schema(), Device::kCuda, /*bf16=*/true);
  ASSERT_TRUE(m);
  ASSERT_EQ(Train(*m, data, 6, 64, true).size(), 6u);
  const Batch probe = TrainBatch(data, 6, 64);
  absl::StatusOr<double> trusted = m->Loss(probe);
  ASSERT_TRUE(trusted.ok()) << trusted.status();
  const std::vector<std::string> names = m->DenseParameterNames();
  ASSERT_FALSE(names.empty());
  // Reading views (checkpoints, fingerprints) leaves the copies trusted; a
  // write through one, announced, costs one refresh and is then seen.
  EXPECT_TRUE(m->Bf16CopiesTrusted());
  const TensorView w = m->DenseParameterView(names.front());
  ASSERT_NE(w.data, nullptr);
  EXPECT_TRUE(m->Bf16CopiesTrusted());
  std::vector<float> saved(w.numel());
  ASSERT_EQ(cudaMemcpy(saved.data(), w.data, saved.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(cudaMemset(w.data, 0, saved.size() * sizeof(float)), cudaSuccess);
  m->DenseParametersWritten();
  EXPECT_FALSE(m->Bf16CopiesTrusted());
  absl::StatusOr<double> zeroed = m->Loss(probe);
  ASSERT_TRUE(zeroed.ok()) << zeroed.status();
  EXPECT_NE(*zeroed, *trusted);
  EXPECT_TRUE(m->Bf16CopiesTrusted());
  ASSERT_EQ(cudaMemcpy(w.data, saved.data(), saved.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  m->DenseParametersWritten();
  absl::StatusOr<double> restored = m->Loss(probe);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(*restored, *trusted);
  // A mutable view: every later forward re-rounds.
  ASSERT_NE(m->DenseParameter(names.front()).data, nullptr);
  EXPECT_FALSE(m->Bf16CopiesTrusted());
  absl::StatusOr<double> refreshed = m->Loss(probe);
  ASSERT_TRUE(refreshed.ok()) << refreshed.status();
  EXPECT_EQ(*trusted, *refreshed);
  // One more step with the view out (AdamW leaves the copies alone, the
  // forward rounds them) still trains on current weights: the loss moves.
  ASSERT_EQ(Train(*m, data, 1, 64, false).size(), 1u);
  absl::StatusOr<double> after = m->Loss(probe);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_NE(*after, *refreshed);
  std::printf("bf16 loss on AdamW-written copies %.9f, on refreshed copies %.9f, after one more "
              "step %.9f\n", *trusted, *refreshed, *after);
}

// Activation checkpointing on CUDA (50 steps of 64, dim 128 so that the
// bf16 run takes the bf16 flow, the benchmark's path). fp32: the blocks
// recomputing their projections (an exact mode) train like the stored path
// up to the attention's atomics (measured on one H200: 9.6e-7 worst
// relative loss difference), and with FP8-saved block inputs and attention
// outputs every step's loss stays within 5% of the stored path's (measured:
// 3.4%). bf16: the runs drift apart over 50 steps (measured: the exact
// mode 6.7% worst step, FP8 22%; how far two stored bf16 runs drift, from
// the attention's atomics, was not measured), so the bf16 runs are held to
// what cannot drift: the first step's loss (the forward is unchanged)
// equal, and every run still training (its last ten steps' mean loss below
// its first ten's). Every checkpointed run
// holds fewer bytes after the forward (the memory timeline's forward.heads
// mark).
TEST(GemLiteCudaTest, CheckpointedBlocksTrainLikeTheStoredPath) {
  const MovieLensCtr data = Data(64);
  GemLiteConfig c = ComparisonConfig();
  c.dim = 128;
  c.heads = 2;
  for (const bool bf16 : {false, true}) {
    ExecutionOptions stored;
    stored.device = Device::kCuda;
    stored.bf16 = bf16;
    ExecutionOptions projections = stored;
    projections.attention_checkpoint.assign(c.seq_layers, layers::BlockCheckpoint::kProjections);
    ExecutionOptions fp8 = projections;
    fp8.fp8_saved_activations = true;
    std::vector<double> losses[3];
    int64_t after_forward[3] = {};
    int i = 0;
    for (const ExecutionOptions* e : {&stored, &projections, &fp8}) {
      absl::StatusOr<std::unique_ptr<GemLite<float>>> m =
          GemLite<float>::Create(c, data.schema(), TableStorage::kInternal, *e);
      ASSERT_TRUE(m.ok()) << m.status();
      losses[i] = Train(**m, data, 50, 64, false);
      (*m)->set_report_regions(true);
      absl::StatusOr<StepResult> r = (*m)->ForwardBackward(TrainBatch(data, 50, 64));
      ASSERT_TRUE(r.ok()) << r.status();
      for (const StepResult::MemoryMark& k : r->memory) {
        if (k.name == "forward.heads") after_forward[i] = k.in_use_bytes - r->memory[0].in_use_bytes;
      }
      ASSERT_EQ(losses[i].size(), 50u);
      ++i;
    }
    double worst[2] = {0, 0};
    for (int s = 0; s < 50; ++s) {
      for (int v = 0; v < 2; ++v) {
        worst[v] = std::max(worst[v], std::abs(losses[v + 1][s] - losses[0][s]) / losses[0][s]);
      }
    }
    std::printf("%s, 50 steps, worst relative loss difference to the stored path: projections "
                "recomputed %.3g, + fp8-saved %.3g; bytes held after the forward: %lld / %lld / "
                "%lld\n",
                bf16 ? "bf16" : "fp32", worst[0], worst[1], static_cast<long long>(after_forward[0]),
                static_cast<long long>(after_forward[1]), static_cast<long long>(after_forward[2]));
    for (int v = 0; v < 3; ++v) {
      EXPECT_EQ(losses[v][0], losses[0][0]) << "variant " << v;
      EXPECT_LT(std::accumulate(losses[v].end() - 10, losses[v].end(), 0.0),
                std::accumulate(losses[v].begin(), losses[v].begin() + 10, 0.0))
          << "variant " << v;
    }
    if (!bf16) {
      EXPECT_LT(worst[0], 1e-4);
      EXPECT_LT(worst[1], 5e-2);
    }
    EXPECT_LT(after_forward[1], after_forward[0]);
    EXPECT_LT(after_forward[2], after_forward[1]);
  }
}

TEST(GemLiteCudaTest, AllocatorReportsMemory) {
  ASSERT_TRUE(ResetCudaMemoryPeak().ok());
  const MovieLensCtr data = Data(64);
  auto m = Make(SmallConfig(), data.schema(), Device::kCuda, false);
  ASSERT_TRUE(m);
  Train(*m, data, 2, 64, false);
  absl::StatusOr<DeviceMemoryStats> s = CudaMemoryStats();
  ASSERT_TRUE(s.ok()) << s.status();
  const int64_t params = m->num_dense_parameters() + m->num_table_parameters();
  // Values, gradients and two moments of fp32 parameters at least.
  EXPECT_GE(s->in_use, static_cast<uint64_t>(params) * 4);
  EXPECT_GE(s->peak, s->in_use);
  EXPECT_GE(s->reserved, s->peak);
  std::printf("device memory: in use %.1f MB, peak %.1f MB, reserved %.1f MB\n", s->in_use / 1e6,
              s->peak / 1e6, s->reserved / 1e6);
}

TEST(GemLiteCudaTest, RejectsWhatItCannotRun) {
  const MovieLensCtr data = Data(64);
  ExecutionOptions e;
  e.device = Device::kCuda;
  EXPECT_EQ(GemLite<double>::Create(SmallConfig(), data.schema(), TableStorage::kInternal, e)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  ExecutionOptions cpu_bf16;
  cpu_bf16.bf16 = true;
  EXPECT_EQ(GemLite<float>::Create(SmallConfig(), data.schema(), TableStorage::kInternal, cpu_bf16)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::engine
