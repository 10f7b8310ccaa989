// Trains GEM-lite on a job's synthetic batches under several precision
// recipes, one after another in one process, and follows the FP8 weight
// gradients layer by layer: for a variant marked `compare`, a twin model
// with the same FP8 forward and input gradients but weight gradients at the
// base precision takes the variant's parameters at the chosen steps, runs
// the same batch, and every weight gradient that differs is printed with
// its cosine and relative error against the twin's. Each variant ends with
// its loss per step and the CTR head's eval NE / AUC.
//
// usage: fp8_recipe_probe JOB.yaml cpu|cuda BATCH STEPS COMPARE_STEPS VARIANT...
//   COMPARE_STEPS  comma list of step indices (0-based)
//   VARIANT        label:MODULES:WGRAD[:compare]; MODULES a comma list of
//                  model.precision.fp8_modules names or "-" for none; WGRAD
//                  1 for FP8 weight gradients
// Batches: bench::SyntheticBatches of the spec with seed 1, 8 trained
// (cycling) and 2 held out: the batches `make_batches --seed 1` writes and
// engine_bench --eval-batches 2 uses. cuda models run bf16 (engine_bench's
// default); cpu models fp32 (with the FP8 layers emulated).

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/e2e/synthetic_batches.h"
#include "cli/jobs/spec_file.h"
#include "engine/metrics.h"
#include "engine/model.h"

namespace {

using recfleet::Device;
using recfleet::TensorView;
using recfleet::engine::GemLite;

int Fail(const std::string& message) {
  std::fprintf(stderr, "fp8_recipe_probe: %s\n", message.c_str());
  return 1;
}

absl::StatusOr<std::unique_ptr<GemLite<float>>> Make(recfleet::engine::GemLiteConfig c,
                                                     const recfleet::engine::FeatureSchema& schema,
                                                     Device device, const std::string& modules,
                                                     bool wgrad) {
  c.fp8.modules.clear();
  if (modules != "-") {
    for (absl::string_view m : absl::StrSplit(modules, ',', absl::SkipEmpty())) {
      c.fp8.modules.emplace_back(m);
    }
  }
  c.fp8.fp8_weight_gradients = wgrad;
  recfleet::engine::ExecutionOptions e;
  e.device = device;
  e.bf16 = device == Device::kCuda;
  return GemLite<float>::Create(c, schema, recfleet::engine::TableStorage::kInternal, e);
}

std::vector<float> ToHost(const TensorView& v) {
  std::vector<float> out(v.numel());
  if (v.device == Device::kCuda) {
    cudaMemcpy(out.data(), v.data, out.size() * sizeof(float), cudaMemcpyDeviceToHost);
  } else {
    std::copy(v.as<float>(), v.as<float>() + v.numel(), out.begin());
  }
  return out;
}

// Prints every dense gradient of `test` that differs from `ref`'s.
void PrintDifferingGradients(GemLite<float>& test, GemLite<float>& ref, int step) {
  for (const std::string& name : test.DenseParameterNames()) {
    const std::vector<float> g = ToHost(test.DenseGradient(name)), r = ToHost(ref.DenseGradient(name));
    absl::StatusOr<recfleet::engine::VectorAgreement> a = recfleet::engine::CompareVectors(g, r);
    if (!a.ok() || a->relative_error == 0) continue;
    std::printf("  step %2d %-18s n=%9zu cos=%.5f relerr=%.4f |g|=%.3e |g_ref|=%.3e\n", step,
                name.c_str(), g.size(), a->cosine, a->relative_error, a->test_norm, a->ref_norm);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    return Fail("usage: fp8_recipe_probe JOB.yaml cpu|cuda BATCH STEPS COMPARE_STEPS "
                "label:MODULES:WGRAD[:compare]...");
  }
  absl::StatusOr<recfleet::v1::JobSpec> spec = recfleet::cli::LoadJobSpec(argv[1]);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  const Device device = std::string(argv[2]) == "cuda" ? Device::kCuda : Device::kCpu;
  const int64_t batch_size = std::atoll(argv[3]);
  const int steps = std::atoi(argv[4]);
  std::vector<int> compare_steps;
  for (absl::string_view s : absl::StrSplit(argv[5], ',', absl::SkipEmpty())) {
    compare_steps.push_back(std::atoi(std::string(s).c_str()));
  }
  absl::StatusOr<recfleet::bench::SyntheticBatches> gen =
      recfleet::bench::SyntheticBatches::Create(*spec, 1);
  if (!gen.ok()) return Fail(std::string(gen.status().message()));
  std::vector<recfleet::engine::Batch> train, eval;
  for (int i = 0; i < 8; ++i) train.push_back(gen->Next(batch_size));
  for (int i = 0; i < 2; ++i) eval.push_back(gen->Next(batch_size));
  for (int v = 6; v < argc; ++v) {
    const std::vector<std::string> f = absl::StrSplit(argv[v], ':');
    if (f.size() < 3) return Fail(std::string("bad variant ") + argv[v]);
    const bool wgrad = f[2] == "1", compare = f.size() > 3 && f[3] == "compare";
    const auto t0 = std::chrono::steady_clock::now();
    auto model = Make(gen->model().config, gen->model().schema, device, f[1], wgrad);
    if (!model.ok()) return Fail(std::string(model.status().message()));
    std::unique_ptr<GemLite<float>> twin;
    if (compare) {
      auto made = Make(gen->model().config, gen->model().schema, device, f[1], false);
      if (!made.ok()) return Fail(std::string(made.status().message()));
      twin = *std::move(made);
    }
    std::printf("== %s modules=%s wgrad=%d\n", f[0].c_str(), f[1].c_str(), wgrad);
    std::string losses;
    for (int s = 0; s < steps; ++s) {
      const recfleet::engine::Batch& b = train[s % train.size()];
      const bool check = twin != nullptr && std::count(compare_steps.begin(), compare_steps.end(), s) > 0;
      if (check) {
        if (absl::Status st = twin->CopyParametersFrom(**model); !st.ok()) return Fail(std::string(st.message()));
        if (auto r = twin->ForwardBackward(b); !r.ok()) return Fail(std::string(r.status().message()));
      }
      absl::StatusOr<recfleet::engine::StepResult> r = (*model)->ForwardBackward(b);
      if (!r.ok()) return Fail(std::string(r.status().message()));
      if (check) PrintDifferingGradients(**model, *twin, s);
      if (absl::Status u = (*model)->ApplyUpdates(); !u.ok()) return Fail(std::string(u.message()));
      char loss[32];
      std::snprintf(loss, sizeof loss, " %.3f", r->ctr_loss + r->cvr_loss);
      losses += loss;
    }
    std::vector<double> logits, labels;
    for (const recfleet::engine::Batch& b : eval) {
      absl::StatusOr<std::vector<double>> z = (*model)->Predict(b, recfleet::engine::Head::kCtr);
      if (!z.ok()) return Fail(std::string(z.status().message()));
      logits.insert(logits.end(), z->begin(), z->end());
      labels.insert(labels.end(), b.ctr_labels.begin(), b.ctr_labels.end());
    }
    absl::StatusOr<recfleet::engine::BinaryMetrics> m = recfleet::engine::ComputeBinaryMetrics(logits, labels);
    if (!m.ok()) return Fail(std::string(m.status().message()));
    const auto [lo, hi] = std::minmax_element(logits.begin(), logits.end());
    std::printf("  losses (ctr + cvr):%s\nEVAL %-14s modules=%s wgrad=%d steps=%d ne=%.5f auc=%.5f "
                "logits=[%.4f, %.4f] (%.1f s)\n",
                losses.c_str(), f[0].c_str(), f[1].c_str(), wgrad, steps, m->normalized_entropy, m->auc,
                *lo, *hi, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    std::fflush(stdout);
  }
  return 0;
}
