// Loader throughput on one core: `loader_bench --dataset FILES|DIR
// [--ranks 8 --batch-size 1024 --base-batch 128 --cost linear --policy recfleet
// --steps 0 (= epoch) --wire yes]`. Times Loader::Step (read, CRC check,
// decode, price, deal, gather) over the epoch, and with --wire yes also the
// service's per-batch protobuf encoding and serialization. The first of
// --epochs (default 2) warms up; the rest are timed.

#include <malloc.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "data/loader.h"
#include "services/dataloader/convert.h"

int main(int argc, char** argv) {
  std::string dataset, cost_spec = "linear", policy_name = "recfleet";
  bool wire = false, verbose = false;
  int ranks = 8, batch = 1024, base = 128;
  int64_t max_steps = 0;
  int epochs = 2;
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc),
      {"dataset", "cost", "policy", "verbose", "wire", "ranks", "batch-size", "base-batch", "epochs",
       "steps"});
  absl::Status parsed = flags.status();
  for (auto [name, value] : {std::pair<const char*, int*>{"ranks", &ranks},
                             {"batch-size", &batch},
                             {"base-batch", &base},
                             {"epochs", &epochs}}) {
    if (parsed.ok()) parsed = flags->Get(name, value);
  }
  if (parsed.ok()) parsed = flags->Get("steps", &max_steps);
  if (!parsed.ok() || epochs < 1) {
    std::fprintf(stderr, "loader_bench: %s\n",
                 parsed.ok() ? "--epochs must be >= 1" : std::string(parsed.message()).c_str());
    return 2;
  }
  dataset = flags->Str("dataset");
  cost_spec = flags->Str("cost", cost_spec);
  policy_name = flags->Str("policy", policy_name);
  verbose = flags->Str("verbose") == "yes";
  wire = flags->Str("wire") == "yes";
  auto files = recfleet::data::ExpandDatasetPaths(dataset);
  auto cost = recfleet::data::CostModel::Parse(cost_spec);
  auto policy = recfleet::data::ParsePolicy(policy_name);
  if (!files.ok() || !cost.ok() || !policy.ok() || base < 1 || batch % base != 0) {
    std::fprintf(stderr,
                 "usage: loader_bench --dataset FILES|DIR [--ranks R --batch-size B "
                 "--base-batch 128 --cost C --policy P --steps N --wire yes]\n");
    return 2;
  }
  recfleet::data::LoaderOptions o;
  o.files = *files;
  o.deal.ranks = ranks;
  o.deal.base_batch = base;
  o.deal.base_batches_per_rank = batch / base;
  o.cost = *cost;
  o.policy = *policy;
  // Full steps only, so the printed gaps are those of full windows.
  o.drop_remainder = true;
  // As in `recfleet data serve`: keep freed batch memory in the process
  // instead of returning it to the kernel after every step.
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  auto loader = recfleet::data::Loader::Open(o);
  if (!loader.ok()) {
    std::fprintf(stderr, "loader_bench: %s\n", std::string(loader.status().message()).c_str());
    return 1;
  }
  int64_t steps = (*loader)->steps_per_epoch();
  if (max_steps > 0 && max_steps < steps) steps = max_steps;
  int64_t samples = 0, bytes = 0, wire_bytes = 0;
  double gap = 0, naive = 0;
  std::string buf;
  // CPU time of this (single) thread: the per-core rate, independent of
  // other load on the machine.
  auto cpu_now = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  // Epoch 0 warms the block cache and the allocator; epochs 1.. are timed.
  double cpu0 = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t e = 0; e < epochs; ++e)
    for (int64_t s = 0; s < steps; ++s) {
      if (s == 0 && e == (epochs > 1 ? 1 : 0)) {
        cpu0 = cpu_now();
        t0 = std::chrono::steady_clock::now();
        samples = bytes = wire_bytes = 0;
        gap = naive = 0;
      }
      auto step = (*loader)->Step(e, s);
      if (!step.ok()) {
        std::fprintf(stderr, "loader_bench: %s\n", std::string(step.status().message()).c_str());
        return 1;
      }
      if (verbose) {
        std::printf("epoch %lld step %lld: gap %.4f%% naive %.4f%%\n", static_cast<long long>(e),
                    static_cast<long long>(s), 100 * step->gap, 100 * step->naive_gap);
      }
      gap += step->gap;
      naive += step->naive_gap;
      for (const auto& rb : step->ranks) {
        samples += static_cast<int64_t>(rb.samples.num_rows());
        bytes += static_cast<int64_t>(rb.samples.ByteSize());
        if (wire) {
          recfleet::v1::RankBatch msg;
          recfleet::dataloader::RankBatchToProto(rb, step->gap, step->naive_gap, &msg);
          msg.SerializeToString(&buf);
          wire_bytes += static_cast<int64_t>(buf.size());
        }
      }
    }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = cpu_now() - cpu0;
  const int timed = epochs > 1 ? epochs - 1 : 1;
  std::printf(
      "loader_bench %s: %lld steps x %d ranks x %d, cost %s, policy %s, wire %s, "
      "%d timed epoch(s) after 1 warm-up\n",
      dataset.c_str(), static_cast<long long>(steps), ranks, batch, cost_spec.c_str(),
      policy_name.c_str(), wire ? "yes" : "no", epochs > 1 ? epochs - 1 : 0);
  std::printf(
      "  %lld samples, %.1f MB of batch data; wall %.3f s, thread CPU %.3f s\n"
      "  per core (CPU time): %.0f samples/s, %.1f MB/s; wall: %.0f samples/s\n"
      "  mean gap %.4f%%, naive %.4f%%\n",
      static_cast<long long>(samples), bytes / 1e6, secs, cpu, samples / cpu, bytes / cpu / 1e6,
      samples / secs, 100 * gap / (steps * timed), 100 * naive / (steps * timed));
  if (wire) std::printf("  serialized %.1f MB\n", wire_bytes / 1e6);
  return 0;
}
