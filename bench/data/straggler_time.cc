// The straggler gap in measured compute time, not in modelled cost: R ranks
// emulated on one device. Each step's window (R x batch samples, lengths
// drawn from a heavy-tailed distribution) is dealt by every policy (naive,
// sort-interleave, recfleet); each rank's share becomes a batch of the
// job's real GEM-lite (engine/calibrate.h SyntheticBatch) whose
// forward + backward is timed one rank after another on the same device.
// Per policy: the mean over steps of max rank time / mean rank time - 1,
// next to the gap the cost model predicted for the same deal.
//
//   straggler_time --spec JOB.yaml [--device cuda|cpu] [--precision bf16|fp32]
//                  [--lengths SPEC | --dataset PATH] [--ranks 8]
//                  [--batch-size 1024] [--base-batch 128] [--steps 3]
//                  [--cost SPEC] [--seed 1]
//
// --dataset takes the windows a job's loader would deal from a dataset
// (data::EpochWindows: the loader's own order) instead of independent draws.
//
// The spec's sequence max_length caps the drawn lengths (as the model
// truncates histories). When several GPUs are lent, the same comparison
// runs for real on the loader's deals (recfleet_worker step times).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "cli/jobs/spec_file.h"
#include "data/bbs.h"
#include "data/cost_model.h"
#include "data/loader.h"
#include "data/synth.h"
#include "engine/calibrate.h"
#include "engine/job_model.h"
#include "engine/model.h"

namespace {

int Fail(const std::string& why) {
  std::fprintf(stderr,
               "straggler_time: %s\nusage: straggler_time --spec JOB.yaml [--device cuda|cpu] "
               "[--precision bf16|fp32] [--lengths SPEC] [--ranks 8] [--batch-size 1024] "
               "[--base-batch 128] [--steps 3] [--cost SPEC] [--seed 1]\n",
               why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace engine = recfleet::engine;
  namespace data = recfleet::data;
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc),
      {"spec", "device", "precision", "lengths", "ranks", "batch-size", "base-batch", "steps",
       "cost", "seed", "dataset"});
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  if (!flags->Has("spec")) return Fail("--spec is required");
  int64_t ranks = 8, batch = 1024, base = 128, steps = 3, seed = 1;
  for (auto [name, value] : {std::pair<const char*, int64_t*>{"ranks", &ranks},
                             {"batch-size", &batch},
                             {"base-batch", &base},
                             {"steps", &steps},
                             {"seed", &seed}}) {
    if (absl::Status s = flags->Get(name, value); !s.ok()) return Fail(std::string(s.message()));
  }
  if (ranks < 1 || steps < 1 || base < 1 || batch % base != 0) {
    return Fail("need --ranks, --steps >= 1 and --batch-size a multiple of --base-batch");
  }
  const std::string device = flags->Str("device", "cuda");
  const std::string precision = flags->Str("precision", "bf16");
  if ((device != "cuda" && device != "cpu") || (precision != "bf16" && precision != "fp32")) {
    return Fail("--device is cuda or cpu, --precision bf16 or fp32");
  }
  auto dist = data::LengthDistribution::Parse(
      flags->Str("lengths", "lognormal:mean=600,sigma=1.0,min=16,max=8192"));
  auto cost = data::CostModel::Parse(flags->Str("cost", "linear"));
  if (!dist.ok()) return Fail(std::string(dist.status().message()));
  if (!cost.ok()) return Fail(std::string(cost.status().message()));
  auto spec = recfleet::cli::LoadJobSpec(flags->Str("spec"));
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  auto model = engine::BuildJobModel(*spec);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  engine::ExecutionOptions exec;
  exec.device = device == "cuda" ? recfleet::Device::kCuda : recfleet::Device::kCpu;
  exec.bf16 = device == "cuda" && precision == "bf16";
  auto gem = engine::GemLite<float>::Create(model->config, model->schema,
                                            engine::TableStorage::kInternal, exec);
  if (!gem.ok()) return Fail(std::string(gem.status().message()));
  engine::GemLite<float>& m = **gem;

  data::DealOptions deal;
  deal.ranks = static_cast<int>(ranks);
  deal.base_batch = static_cast<int>(base);
  deal.base_batches_per_rank = static_cast<int>(batch / base);
  int64_t cap = 0;
  for (const auto& f : spec->model().features()) cap = std::max<int64_t>(cap, f.max_length());
  std::mt19937_64 rng(seed);
  // --dataset: the loader's windows, cycled for --steps.
  std::vector<std::vector<int64_t>> dataset_windows;
  if (flags->Has("dataset")) {
    auto files = data::ExpandDatasetPaths(flags->Str("dataset"));
    if (!files.ok()) return Fail(std::string(files.status().message()));
    data::LoaderOptions lo;
    lo.files = *files;
    lo.deal = deal;
    lo.cost = *cost;
    lo.seed = static_cast<uint64_t>(seed);
    auto loader = data::Loader::Open(lo);
    if (!loader.ok()) return Fail(std::string(loader.status().message()));
    auto windows = data::EpochWindows(**loader, 1);
    if (!windows.ok()) return Fail(std::string(windows.status().message()));
    for (auto& w : *windows) {
      if (static_cast<int>(w.size()) == deal.WindowSize()) dataset_windows.push_back(std::move(w));
    }
    if (dataset_windows.empty()) return Fail("the dataset has no full window at these sizes");
  }
  // Forward + backward of one batch, wall time: ForwardBackward returns
  // after reading the loss back, so the device has finished it. The batch
  // runs once untimed first, so per-shape set-up (the attention's tile plan
  // for these offsets, pool growth) is not charged to one rank, then
  // kTimedRuns times; the median counts (launch jitter matters for short
  // batches).
  constexpr int kTimedRuns = 5;
  auto time_batch = [&](const std::vector<int64_t>& lengths, uint64_t s) -> double {
    const engine::Batch b = engine::SyntheticBatch(*model, lengths, s);
    std::vector<double> ms;
    for (int run = 0; run < 1 + kTimedRuns; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<engine::StepResult> r = m.ForwardBackward(b);
      const auto t1 = std::chrono::steady_clock::now();
      if (!r.ok()) {
        std::fprintf(stderr, "straggler_time: %s\n", std::string(r.status().message()).c_str());
        std::exit(1);
      }
      if (run > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  const data::Policy policies[] = {data::Policy::kNaive, data::Policy::kSortInterleave,
                                   data::Policy::kRecfleet};
  std::vector<double> measured_sum(3, 0), predicted_sum(3, 0), max_ms(3, 0);
  double tokens = 0, longest = 0;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> window(deal.WindowSize());
    std::vector<double> costs(window.size());
    if (!dataset_windows.empty()) window = dataset_windows[step % dataset_windows.size()];
    for (size_t i = 0; i < window.size(); ++i) {
      if (dataset_windows.empty()) window[i] = dist->Sample(rng);
      if (cap > 0) window[i] = std::min(window[i], cap);
      costs[i] = cost->SampleCost(window[i]);
      tokens += window[i];
      longest = std::max<double>(longest, window[i]);
    }
    for (int p = 0; p < 3; ++p) {
      const data::Deal d = data::DealWindow(policies[p], costs, deal);
      std::vector<double> ms;
      for (int r = 0; r < deal.ranks; ++r) {
        std::vector<int64_t> lengths;
        for (const auto& bb : d.ranks[r]) {
          for (uint32_t i : bb) lengths.push_back(window[i]);
        }
        ms.push_back(time_batch(lengths, seed + step * 1000 + r));
      }
      double mean = 0, mx = 0;
      for (double t : ms) mean += t / ms.size(), mx = std::max(mx, t);
      measured_sum[p] += mx / mean - 1;
      predicted_sum[p] += d.Gap();
      max_ms[p] = std::max(max_ms[p], mx);
      std::printf("step %lld %-15s rank ms:", static_cast<long long>(step),
                  std::string(data::PolicyName(policies[p])).c_str());
      for (double t : ms) std::printf(" %.1f", t);
      std::printf("  gap measured %.2f%% predicted %.2f%%\n", 100 * (mx / mean - 1),
                  100 * d.Gap());
    }
  }
  std::printf("\n%s %s, %lld ranks x %lld samples (base batches of %lld), %lld steps, lengths %s "
              "capped at %lld (mean %.1f, longest %.0f), dealing cost %s\n",
              device.c_str(), exec.bf16 ? "bf16" : "fp32", static_cast<long long>(ranks),
              static_cast<long long>(batch), static_cast<long long>(base),
              static_cast<long long>(steps),
              (flags->Has("dataset") ? "of " + flags->Str("dataset")
                                     : flags->Str("lengths", "lognormal:mean=600,sigma=1.0,min=16,max=8192"))
                  .c_str(),
              static_cast<long long>(cap), tokens / (steps * deal.WindowSize()), longest,
              cost->ToString().c_str());
  std::printf("%-16s %22s %22s %16s\n", "policy", "measured gap (mean)", "cost-model gap (mean)",
              "slowest rank ms");
  for (int p = 0; p < 3; ++p) {
    std::printf("%-16s %21.2f%% %21.2f%% %16.1f\n",
                std::string(data::PolicyName(policies[p])).c_str(),
                100 * measured_sum[p] / steps, 100 * predicted_sum[p] / steps, max_ms[p]);
  }
  return 0;
}
