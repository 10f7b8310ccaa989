// The eval-NE distribution of model_cuda_test's Bf16EvalNe training (GEM-lite
// of dim 128, 1,000 steps of 128 on 4,000 synthetic users; EvalNeConfig and
// EvalNeData in engine/testing/train_loop.h), over as many
// seeds as asked, one line per training: what a regression in the CUDA
// training path is judged by, since one run of three seeds cannot tell a
// shifted distribution from chance. Optionally the CPU model trains on the
// same batches in lockstep at the step-comparison learning rates and the
// per-step loss difference is reported: a data race or a stale buffer shows
// there as a jump, which the chaotic default-rate training would hide.
//
//   ne_probe --seeds 1,2,3 [--steps 1000] [--batch 128] [--bf16]
//            [--no-prefetch] [--compare-cpu-steps N] [--lr DENSE_LR]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "engine/testing/train_loop.h"

namespace recfleet::engine {
namespace {

struct Args {
  std::vector<uint64_t> seeds = {1, 2, 3};
  int steps = 1000;
  int64_t batch = 128;
  bool bf16 = false;
  bool prefetch = true;
  int compare_cpu_steps = 0;
  double lr = 0;  // 0: EvalNeConfig's.
};

GemLiteConfig NeConfig(uint64_t seed, double lr) {
  GemLiteConfig c = EvalNeConfig(seed);
  if (lr > 0) c.learning_rate = lr;
  return c;
}

std::unique_ptr<GemLite<float>> Make(const GemLiteConfig& c, const FeatureSchema& schema,
                                     Device device, bool bf16) {
  ExecutionOptions e;
  e.device = device;
  e.bf16 = bf16;
  absl::StatusOr<std::unique_ptr<GemLite<float>>> m =
      GemLite<float>::Create(c, schema, TableStorage::kInternal, e);
  if (!m.ok()) {
    std::fprintf(stderr, "create: %s\n", m.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(m);
}

std::vector<double> Train(GemLite<float>& m, const MovieLensCtr& data, int steps, int64_t batch,
                          bool prefetch) {
  absl::StatusOr<std::vector<double>> losses = TrainSteps(m, data, steps, batch, prefetch);
  if (!losses.ok()) {
    std::fprintf(stderr, "training failed: %s\n", losses.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(losses);
}

double Mean(const std::vector<double>& v, size_t from, size_t to) {
  double s = 0;
  for (size_t i = from; i < to; ++i) s += v[i];
  return s / static_cast<double>(to - from);
}

int Run(const Args& a) {
  const MovieLensCtr data = EvalNeData();
  for (uint64_t seed : a.seeds) {
    if (a.compare_cpu_steps > 0) {
      GemLiteConfig c = NeConfig(seed, 0);
      const GemLiteConfig slow = StepComparisonConfig();
      c.learning_rate = slow.learning_rate;
      c.adagrad_learning_rate = slow.adagrad_learning_rate;
      auto gpu = Make(c, data.schema(), Device::kCuda, false);
      auto cpu = Make(c, data.schema(), Device::kCpu, false);
      const std::vector<double> g = Train(*gpu, data, a.compare_cpu_steps, a.batch, a.prefetch);
      const std::vector<double> h = Train(*cpu, data, a.compare_cpu_steps, a.batch, false);
      double worst = 0;
      int first_bad = -1;
      for (size_t s = 0; s < g.size(); ++s) {
        const double rel = std::abs(g[s] - h[s]) / std::abs(h[s]);
        if (rel > 1e-4 && first_bad < 0) first_bad = static_cast<int>(s);
        worst = std::max(worst, rel);
      }
      std::printf("compare seed %d: %d steps, worst relative loss difference %.3g, first step "
                  "above 1e-4: %d\n",
                  static_cast<int>(seed), a.compare_cpu_steps, worst, first_bad);
      std::fflush(stdout);
      continue;
    }
    auto m = Make(NeConfig(seed, a.lr), data.schema(), Device::kCuda, a.bf16);
    const std::vector<double> losses = Train(*m, data, a.steps, a.batch, a.prefetch);
    const absl::StatusOr<BinaryMetrics> e = EvaluateCtr(*m, data);
    if (!e.ok()) {
      std::fprintf(stderr, "eval failed: %s\n", e.status().ToString().c_str());
      return 1;
    }
    const size_t n = losses.size();
    double worst = 0;
    int worst_step = 0;
    for (size_t s = 0; s < n; ++s) {
      if (!(losses[s] <= worst)) {
        worst = losses[s];
        worst_step = static_cast<int>(s);
      }
    }
    std::printf("%s lr %g seed %d: eval NE %.5f AUC %.4f; train loss mean steps 0-99 %.4f, 400-499 "
                "%.4f, last 100 %.4f; max %.4f at step %d\n",
                a.bf16 ? "bf16" : "fp32", NeConfig(seed, a.lr).learning_rate, static_cast<int>(seed),
                e->normalized_entropy, e->auc,
                Mean(losses, 0, std::min<size_t>(100, n)),
                n >= 500 ? Mean(losses, 400, 500) : 0.0, Mean(losses, n >= 100 ? n - 100 : 0, n),
                worst, worst_step);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace recfleet::engine

int main(int argc, char** argv) {
  recfleet::engine::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    bool ok = true;
    if (arg == "--seeds") {
      a.seeds.clear();
      for (absl::string_view s : absl::StrSplit(value(), ',')) {
        uint64_t seed = 0;
        ok = ok && absl::SimpleAtoi(s, &seed);
        a.seeds.push_back(seed);
      }
    } else if (arg == "--steps") {
      ok = absl::SimpleAtoi(value(), &a.steps);
    } else if (arg == "--batch") {
      ok = absl::SimpleAtoi(value(), &a.batch);
    } else if (arg == "--lr") {
      ok = absl::SimpleAtod(value(), &a.lr);
    } else if (arg == "--bf16") {
      a.bf16 = true;
    } else if (arg == "--no-prefetch") {
      a.prefetch = false;
    } else if (arg == "--compare-cpu-steps") {
      ok = absl::SimpleAtoi(value(), &a.compare_cpu_steps);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "bad argument %s\n", arg.c_str());
      return 2;
    }
  }
  return recfleet::engine::Run(a);
}
