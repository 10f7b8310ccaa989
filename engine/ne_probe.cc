// The eval-NE distribution of model_cuda_test's bf16-vs-fp32 training
// (EvalNeSetup, EvalNeData and EvalNeConfig in engine/testing/train_loop.h)
// and of variants of it, so that one process measures a grid: the
// training set's size, the batch, the dense learning rate, the batch order,
// the seeds, fp32 and bf16, and repeats of one seed (what the order of the
// GPU's fp32 atomics alone changes). One JSON line per training on stdout:
// what a regression in the CUDA training path is judged by, since one run of
// three seeds cannot tell a shifted distribution from chance. Seeds are the
// outer loop, so a run cut short still has fp32 and bf16 for its first seeds.
//
// Optionally (--compare-cpu-steps N) the CPU model trains on the same batches
// in lockstep at the step-comparison learning rates and the per-step loss
// difference is reported: a data race or a stale buffer shows there as a
// jump, which the chaotic default-rate training would hide.
//
//   ne_probe [--users N | --movielens DIR] [--seeds 1,2,3] [--steps N]
//            [--batch B,...] [--lr LR,...] [--order cyclic,shuffled]
//            [--precision fp32,bf16,fp8,fp8w,fp8hs,fp8a,fp8ab] [--fp8-modules M,...]
//            [--fp8-attention B,...] [--heads H] [--repeats R] [--no-prefetch] [--compare-cpu-steps N]
//            [--trace-nonfinite]
// Defaults: EvalNeSetup's, fp32 only, one repeat.
//
// fp8 is bf16 with the linear layers of --fp8-modules (Fp8ModuleNames;
// default dense_proj,dcn,moe.experts,towers) on block-scaled FP8 GEMMs,
// fp8w the same with FP8 weight gradients, fp8hs with FP8 weight gradients
// after the random Hadamard transform with dy rounded stochastically
// (weight_gradient: FP8_HADAMARD_STOCHASTIC): the low-precision recipe's
// quality against bf16, on the same batches and initial parameters. A layer
// with a side that is not a multiple of 16 keeps bf16 (in this model only
// dcn and the experts' l1 run FP8). fp8a is bf16 with the attention
// forward of the blocks of --fp8-attention (Fp8AttentionNames; default
// sequence,pma) on the FP8 attention kernel, every linear layer bf16; that
// kernel takes head dim 128, so give --heads 1 (this model's dim is 128;
// --heads applies to every precision of the run, so bf16 is its baseline).
// fp8ab is fp8a with those blocks' attention backward FP8 as well
// (attention_backward: ATTENTION_BACKWARD_FP8).
// --movielens reads a MovieLens-format
// dataset folder (ReadMovieLens: NAME.inter, optional NAME.user/NAME.item)
// instead of the synthetic users, e.g. the public ml-100k.
//
// A training whose loss goes non-finite is not evaluated: its line says
// "diverged": true with the first step whose CTR loss was not finite (and
// the loss before it), and the probe goes on with the next training. With
// --trace-nonfinite such a training is then repeated from the same start,
// step by step, waiting for the GPU at every module boundary: one "trace"
// line per step (from a few steps before the divergence) gives each
// module's largest |gradient| and |parameter| and the count of non-finite
// ones, and "first_nonfinite" names where a non-finite value showed first
// (a parameter before a forward, or a gradient in backward order).

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "engine/metrics.h"
#include "engine/layers/ops.h"
#include "engine/model.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/train_loop.h"

namespace recfleet::engine {
namespace {

struct Args {
  EvalNeSetup setup;
  std::vector<uint64_t> seeds;
  std::vector<int64_t> batches;
  std::vector<double> lrs;
  std::vector<bool> shuffled;
  std::vector<std::string> precisions = {"fp32"};
  std::vector<std::string> fp8_modules = {"dense_proj", "dcn", "moe.experts", "towers"};
  std::vector<std::string> fp8_attention = {"sequence", "pma"};
  int64_t heads = 0;  // 0: EvalNeConfig's.
  std::string movielens;  // Empty: EvalNeData's synthetic users.
  int repeats = 1;
  bool prefetch = true;
  int compare_cpu_steps = 0;
  bool trace_nonfinite = false;
};

// Whether `precision` runs the attention of --fp8-attention in FP8.
bool Fp8Attention(const std::string& precision) {
  return precision == "fp8a" || precision == "fp8ab";
}

// Whether `precision` runs the linear layers of --fp8-modules in FP8.
bool Fp8Linears(const std::string& precision) {
  return precision == "fp8" || precision == "fp8w" || precision == "fp8hs";
}

std::unique_ptr<GemLite<float>> Make(GemLiteConfig c, const FeatureSchema& schema,
                                     Device device, const std::string& precision,
                                     const std::vector<std::string>& fp8_modules = {},
                                     const std::vector<std::string>& fp8_attention = {}) {
  ExecutionOptions e;
  e.device = device;
  e.bf16 = precision != "fp32";
  if (Fp8Linears(precision)) {
    c.fp8.modules = fp8_modules;
    c.fp8.fp8_weight_gradients = precision != "fp8";
    c.fp8.wgrad_hadamard_stochastic = precision == "fp8hs";
  }
  if (Fp8Attention(precision)) {
    c.fp8.attention = fp8_attention;
    c.fp8.attention_backward = precision == "fp8ab";
  }
  absl::StatusOr<std::unique_ptr<GemLite<float>>> m =
      GemLite<float>::Create(c, schema, TableStorage::kInternal, e);
  if (!m.ok()) {
    std::fprintf(stderr, "create: %s\n", m.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(m);
}

// EvalNeConfig with --heads.
GemLiteConfig ProbeConfig(const Args& a, uint64_t seed, double learning_rate) {
  GemLiteConfig c = EvalNeConfig(seed, learning_rate);
  if (a.heads > 0) c.heads = a.heads;
  return c;
}

std::vector<double> Train(GemLite<float>& m, const MovieLensCtr& data, int steps, int64_t batch,
                          bool prefetch, absl::Span<const int64_t> order) {
  absl::StatusOr<std::vector<double>> losses = TrainSteps(m, data, steps, batch, prefetch, order);
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

void CompareWithCpu(const Args& a, const MovieLensCtr& data, uint64_t seed) {
  GemLiteConfig c = ProbeConfig(a, seed, a.setup.learning_rate);
  const GemLiteConfig slow = StepComparisonConfig();
  c.learning_rate = slow.learning_rate;
  c.adagrad_learning_rate = slow.adagrad_learning_rate;
  auto gpu = Make(c, data.schema(), Device::kCuda, "fp32");
  auto cpu = Make(c, data.schema(), Device::kCpu, "fp32");
  const std::vector<double> g =
      Train(*gpu, data, a.compare_cpu_steps, a.batches[0], a.prefetch, {});
  const std::vector<double> h = Train(*cpu, data, a.compare_cpu_steps, a.batches[0], false, {});
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
}

// Largest |value| and the count of non-finite values of a view (the
// caller has waited for the device).
struct Extent {
  double max_abs = 0;
  int64_t nonfinite = 0;
  void Add(const Extent& e) {
    max_abs = std::max(max_abs, e.max_abs);
    nonfinite += e.nonfinite;
  }
};

Extent ExtentOf(const TensorView& v) {
  Extent e;
  if (v.data == nullptr || v.numel() == 0) return e;
  absl::StatusOr<std::vector<double>> host = ops::CopyToHost(v);
  if (!host.ok()) {
    std::fprintf(stderr, "trace: %s\n", host.status().ToString().c_str());
    std::exit(1);
  }
  for (double x : *host) {
    if (!std::isfinite(x)) {
      ++e.nonfinite;
    } else {
      e.max_abs = std::max(e.max_abs, std::abs(x));
    }
  }
  return e;
}

// --trace-nonfinite: trains `m` (fresh, as the diverged training started)
// again up to step `diverged_at`, checking each module's parameters before
// its forward and its gradients once its backward wrote them.
void TraceNonfinite(GemLite<float>& m, const MovieLensCtr& data, int diverged_at, int64_t batch,
                    absl::Span<const int64_t> order) {
  const std::vector<std::string> modules = m.ModuleNames();
  const std::vector<std::string> names = m.DenseParameterNames();
  const std::vector<int> module_of = m.DenseParameterModules();
  std::vector<Extent> params(modules.size()), grads(modules.size());
  std::string first;  // Where a non-finite value showed first.
  int step = 0;
  auto check = [&](int module, bool gradient) -> absl::Status {
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device error");
    for (size_t i = 0; i < names.size(); ++i) {
      if (module_of[i] != module) continue;
      const Extent e = ExtentOf(gradient ? m.DenseGradient(names[i]) : m.DenseParameterView(names[i]));
      (gradient ? grads : params)[module].Add(e);
      if (e.nonfinite > 0 && first.empty()) {
        first = absl::StrCat("step ", step, ": ", e.nonfinite, " non-finite ",
                             gradient ? "gradients of " : "values of ", names[i],
                             gradient ? " (backward order)" : " before its forward");
      }
    }
    return absl::OkStatus();
  };
  ModuleHooks hooks;
  hooks.before_forward = [&](int module) { return check(module, false); };
  hooks.after_backward = [&](int module) { return check(module, true); };
  m.SetModuleHooks(hooks);
  for (step = 0; step <= diverged_at; ++step) {
    std::fill(params.begin(), params.end(), Extent{});
    std::fill(grads.begin(), grads.end(), Extent{});
    const Batch b = CyclicTrainBatch(data, step, batch, order);
    absl::StatusOr<StepResult> r = m.ForwardBackward(b);
    if (!r.ok()) {
      std::fprintf(stderr, "trace: step %d: %s\n", step, r.status().ToString().c_str());
      return;
    }
    if (step + 5 >= diverged_at) {
      std::string line = absl::StrCat("{\"trace_step\": ", step, ", \"ctr_loss\": ", r->ctr_loss,
                                      ", \"modules\": {");
      for (size_t k = 0; k < modules.size(); ++k) {
        absl::StrAppend(&line, k > 0 ? ", " : "", "\"", modules[k], "\": [", params[k].max_abs,
                        ", ", params[k].nonfinite, ", ", grads[k].max_abs, ", ",
                        grads[k].nonfinite, "]");
      }
      absl::StrAppend(&line, "}}");
      std::printf("%s\n", line.c_str());
    }
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) {
      std::fprintf(stderr, "trace: update %d: %s\n", step, u.ToString().c_str());
      return;
    }
  }
  std::printf("{\"first_nonfinite\": \"%s\", \"trace_columns\": \"max |parameter|, non-finite "
              "parameters, max |gradient|, non-finite gradients\"}\n",
              first.empty() ? "none seen (the loss alone)" : first.c_str());
  std::fflush(stdout);
}

// The synthetic users of EvalNeData, or the MovieLens folder of --movielens
// with the same sample options.
absl::StatusOr<MovieLensCtr> LoadData(const Args& a) {
  if (a.movielens.empty()) return EvalNeData(a.setup.users);
  absl::StatusOr<MovieLensData> raw = ReadMovieLens(a.movielens);
  if (!raw.ok()) return raw.status();
  return MovieLensCtr::Create(*std::move(raw), EvalNeCtrOptions());
}

int Run(const Args& a) {
  const absl::Time t0 = absl::Now();
  absl::StatusOr<MovieLensCtr> loaded = LoadData(a);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s: %s\n", a.movielens.c_str(), loaded.status().ToString().c_str());
    return 1;
  }
  const MovieLensCtr& data = *loaded;
  const std::vector<int64_t> shuffled = ShuffledOrder(data, a.setup.order_seed);
  std::fprintf(stderr, "data (%s): %lld training and %lld eval samples in %.1f s\n",
               a.movielens.empty() ? "synthetic" : a.movielens.c_str(),
               static_cast<long long>(data.num_train()),
               static_cast<long long>(data.num_eval()), absl::ToDoubleSeconds(absl::Now() - t0));
  for (uint64_t seed : a.seeds) {
    if (a.compare_cpu_steps > 0) {
      CompareWithCpu(a, data, seed);
      continue;
    }
    for (int64_t batch : a.batches) {
      for (double lr : a.lrs) {
        for (bool shuffle : a.shuffled) {
          for (const std::string& precision : a.precisions) {
            for (int rep = 0; rep < a.repeats; ++rep) {
              const absl::Time start = absl::Now();
              const GemLiteConfig config = ProbeConfig(a, seed, lr);
              auto m = Make(config, data.schema(), Device::kCuda, precision, a.fp8_modules, a.fp8_attention);
              const std::vector<double> losses =
                  Train(*m, data, a.setup.steps, batch, a.prefetch,
                        shuffle ? absl::Span<const int64_t>(shuffled) : absl::Span<const int64_t>());
              const absl::Time trained = absl::Now();
              const size_t n = losses.size();
              size_t first_nonfinite = 0;
              while (first_nonfinite < n && std::isfinite(losses[first_nonfinite])) ++first_nonfinite;
              if (first_nonfinite < n) {
                // A diverged run: no eval of NaN parameters; say where it
                // started and go on with the next run.
                std::printf(
                    "{\"data\": \"%s\", \"batch\": %lld, \"lr\": %g, \"seed\": %d, \"precision\": \"%s\", "
                    "\"repeat\": %d, \"diverged\": true, \"first_nonfinite_loss_step\": %d, "
                    "\"loss_before\": %.5f, \"train_s\": %.2f}\n",
                    a.movielens.empty() ? "synthetic" : a.movielens.c_str(), static_cast<long long>(batch), lr,
                    static_cast<int>(seed), precision.c_str(), rep, static_cast<int>(first_nonfinite),
                    first_nonfinite > 0 ? losses[first_nonfinite - 1] : 0.0,
                    absl::ToDoubleSeconds(trained - start));
                std::fflush(stdout);
                if (a.trace_nonfinite) {
                  auto again = Make(config, data.schema(), Device::kCuda, precision, a.fp8_modules,
                                    a.fp8_attention);
                  TraceNonfinite(*again, data, static_cast<int>(first_nonfinite), batch,
                                 shuffle ? absl::Span<const int64_t>(shuffled)
                                         : absl::Span<const int64_t>());
                }
                continue;
              }
              const absl::StatusOr<BinaryMetrics> e = EvaluateCtr(*m, data);
              if (!e.ok()) {
                std::fprintf(stderr, "eval failed: %s\n", e.status().ToString().c_str());
                return 1;
              }
              double worst = 0;
              int worst_step = 0;
              for (size_t s = 0; s < n; ++s) {
                if (!(losses[s] <= worst)) {
                  worst = losses[s];
                  worst_step = static_cast<int>(s);
                }
              }
              std::printf(
                  "{\"data\": \"%s\", \"users\": %d, \"batch\": %lld, \"lr\": %g, \"order\": \"%s\", \"steps\": %d, "
                  "\"epochs\": %.3f, \"seed\": %d, \"precision\": \"%s\", \"heads\": %lld, \"repeat\": %d, "
                  "\"ne\": %.6f, \"auc\": %.5f, \"loss_first100\": %.5f, \"loss_last100\": %.5f, "
                  "\"max_loss\": %.4f, \"max_loss_step\": %d, \"train_s\": %.2f, "
                  "\"eval_s\": %.2f}\n",
                  a.movielens.empty() ? "synthetic" : a.movielens.c_str(),
                  a.movielens.empty() ? a.setup.users : -1, static_cast<long long>(batch), lr,
                  shuffle ? "shuffled" : "cyclic", a.setup.steps,
                  static_cast<double>(a.setup.steps) * batch / data.num_train(),
                  static_cast<int>(seed), precision.c_str(),
                  static_cast<long long>(config.heads), rep, e->normalized_entropy,
                  e->auc, Mean(losses, 0, std::min<size_t>(100, n)),
                  Mean(losses, n >= 100 ? n - 100 : 0, n), worst, worst_step,
                  absl::ToDoubleSeconds(trained - start), absl::ToDoubleSeconds(absl::Now() - trained));
              std::fflush(stdout);
            }
          }
        }
      }
    }
  }
  return 0;
}

// Comma-separated values of one flag through `parse`; false on any bad one.
template <typename T, typename F>
bool ParseList(const std::string& text, std::vector<T>& out, F parse) {
  out.clear();
  for (absl::string_view s : absl::StrSplit(text, ',')) {
    T v{};
    if (!parse(s, v)) return false;
    out.push_back(v);
  }
  return !out.empty();
}

// A comma list of names, each one of `known`.
bool ParseNames(const std::string& text, const std::vector<std::string>& known, std::vector<std::string>& out) {
  return ParseList(text, out, [&](absl::string_view s, std::string& v) {
    v = std::string(s);
    return std::find(known.begin(), known.end(), v) != known.end();
  });
}

}  // namespace
}  // namespace recfleet::engine

int main(int argc, char** argv) {
  using recfleet::engine::ParseList;
  using recfleet::engine::ParseNames;
  recfleet::engine::Args a;
  bool users_given = false, fp8_modules_given = false, fp8_attention_given = false;
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
    if (arg == "--users") {
      users_given = true;
      ok = absl::SimpleAtoi(value(), &a.setup.users) && a.setup.users > 0;
    } else if (arg == "--seeds") {
      ok = ParseList(value(), a.seeds, [](absl::string_view s, uint64_t& v) {
        return absl::SimpleAtoi(s, &v);
      });
    } else if (arg == "--steps") {
      ok = absl::SimpleAtoi(value(), &a.setup.steps) && a.setup.steps > 0;
    } else if (arg == "--batch") {
      ok = ParseList(value(), a.batches, [](absl::string_view s, int64_t& v) {
        return absl::SimpleAtoi(s, &v) && v > 0;
      });
    } else if (arg == "--lr") {
      ok = ParseList(value(), a.lrs, [](absl::string_view s, double& v) {
        return absl::SimpleAtod(s, &v) && v > 0;
      });
    } else if (arg == "--order") {
      ok = ParseList(value(), a.shuffled, [](absl::string_view s, bool& v) {
        v = s == "shuffled";
        return s == "shuffled" || s == "cyclic";
      });
    } else if (arg == "--precision") {
      ok = ParseList(value(), a.precisions, [](absl::string_view s, std::string& v) {
        v = std::string(s);
        return s == "fp32" || s == "bf16" || recfleet::engine::Fp8Linears(v) ||
               recfleet::engine::Fp8Attention(v);
      });
    } else if (arg == "--fp8-attention") {
      fp8_attention_given = true;
      ok = ParseNames(value(), recfleet::engine::Fp8AttentionNames(), a.fp8_attention);
    } else if (arg == "--heads") {
      ok = absl::SimpleAtoi(value(), &a.heads) && a.heads > 0;
    } else if (arg == "--fp8-modules") {
      fp8_modules_given = true;
      ok = ParseNames(value(), recfleet::engine::Fp8ModuleNames(), a.fp8_modules);
    } else if (arg == "--movielens") {
      a.movielens = value();
    } else if (arg == "--repeats") {
      ok = absl::SimpleAtoi(value(), &a.repeats) && a.repeats > 0;
    } else if (arg == "--no-prefetch") {
      a.prefetch = false;
    } else if (arg == "--compare-cpu-steps") {
      ok = absl::SimpleAtoi(value(), &a.compare_cpu_steps);
    } else if (arg == "--trace-nonfinite") {
      a.trace_nonfinite = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "bad argument %s (expected --users N, --seeds S,..., --steps N, --batch B,..., "
                   "--lr LR,..., --order cyclic|shuffled,..., --precision fp32|bf16|fp8|fp8w|fp8hs|fp8a|fp8ab,..., "
                   "--fp8-modules M,... (of %s), --fp8-attention B,... (of sequence, cross, pma), "
                   "--heads H, --movielens DIR, --repeats R, --no-prefetch, "
                   "--compare-cpu-steps N, --trace-nonfinite)\n",
                   arg.c_str(), absl::StrJoin(recfleet::engine::Fp8ModuleNames(), ", ").c_str());
      return 2;
    }
  }
  if (users_given && !a.movielens.empty()) {
    std::fprintf(stderr, "--users sets the synthetic users; --movielens reads real ones: give one\n");
    return 2;
  }
  const bool any_fp8 =
      std::any_of(a.precisions.begin(), a.precisions.end(), recfleet::engine::Fp8Linears);
  if (fp8_modules_given && !any_fp8) {
    std::fprintf(stderr, "--fp8-modules needs --precision fp8, fp8w or fp8hs\n");
    return 2;
  }
  if (fp8_attention_given &&
      std::none_of(a.precisions.begin(), a.precisions.end(), recfleet::engine::Fp8Attention)) {
    std::fprintf(stderr, "--fp8-attention needs --precision fp8a or fp8ab\n");
    return 2;
  }
  const recfleet::engine::EvalNeSetup& s = a.setup;
  if (a.seeds.empty()) {
    for (int seed = 1; seed <= s.seeds; ++seed) a.seeds.push_back(seed);
  }
  if (a.batches.empty()) a.batches = {s.batch};
  if (a.lrs.empty()) a.lrs = {s.learning_rate};
  if (a.shuffled.empty()) a.shuffled = {s.shuffled};
  return recfleet::engine::Run(a);
}
