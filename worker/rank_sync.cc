#include "worker/rank_sync.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/dist/layout.h"
#include "worker/distributed_model.h"

namespace recfleet::worker {
namespace {

// Wall seconds per step of `ranks` ranks training `model` on batches of
// `lengths` (each rank its own ids), the slowest rank's mean over `steps`.
absl::StatusOr<double> TimeRanks(int ranks, const engine::JobModel& model, const std::vector<int64_t>& lengths,
                                 int warmup, int steps, uint64_t seed) {
  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(120);
  dist::ParallelLayout layout;
  layout.fsdp_group_size = ranks;
  layout.replicas = 1;
  layout.table_group_size = 1;
  absl::Mutex mu;
  absl::Status failure;
  double slowest = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank]() {
      absl::StatusOr<double> seconds = [&]() -> absl::StatusOr<double> {
        absl::StatusOr<std::shared_ptr<comm::GlooTransport>> transport = comm::GlooTransport::Create("127.0.0.1");
        if (!transport.ok()) return transport.status();
        const comm::CommFactory factory = [&](comm::KvStore& s, int r, int n) {
          return comm::ConnectGloo(s, r, n, *transport, options);
        };
        comm::PrefixKvStore world_store(&store, "world/");
        absl::StatusOr<std::unique_ptr<comm::Communicator>> world = factory(world_store, rank, ranks);
        if (!world.ok()) return world.status();
        absl::StatusOr<dist::TrainingGroups> groups = dist::TrainingGroups::Build(layout, rank, store, factory);
        if (!groups.ok()) return groups.status();
        engine::ExecutionOptions execution;
        execution.device = Device::kCpu;
        absl::StatusOr<std::unique_ptr<DistributedModel>> dm =
            DistributedModel::Create(model.config, model.schema, &*groups, world->get(), {}, execution);
        if (!dm.ok()) return dm.status();
        const engine::Batch batch = engine::SyntheticBatch(model, lengths, seed + rank);
        RankModel::Times times;
        for (int i = 0; i < warmup; ++i) {
          if (auto r = (*dm)->TrainStep(batch, &times); !r.ok()) return r.status();
        }
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i) {
          if (auto r = (*dm)->TrainStep(batch, &times); !r.ok()) return r.status();
        }
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
      }();
      absl::MutexLock lock(&mu);
      if (!seconds.ok()) {
        if (failure.ok()) failure = seconds.status();
        return;
      }
      slowest = std::max(slowest, *seconds);
    });
  }
  for (std::thread& t : threads) t.join();
  if (!failure.ok()) return failure;
  return slowest;
}

}  // namespace

absl::StatusOr<RankSyncResult> MeasureRankSync(int ranks, const engine::RateProbeOptions& options,
                                               int max_probes) {
  if (ranks < 2) return absl::InvalidArgumentError("rank synchronization: ranks must be >= 2");
  if (options.device != Device::kCpu) {
    return absl::InvalidArgumentError("rank synchronization: measured on CPU ranks (Gloo) only");
  }
  RankSyncResult result;
  result.ranks = ranks;
  std::mt19937_64 rng(options.seed ^ 0x5EC5);
  int index = 0;
  std::vector<double> ratios;
  for (const engine::RateProbe& probe : engine::RateProbeModels(Device::kCpu)) {
    if (max_probes > 0 && index >= max_probes) break;
    // The probe's longer histories, drawn as MeasureStepRates draws them.
    const int64_t longest = probe.longest.front();
    std::vector<int64_t> lengths(probe.batch_size);
    const int64_t lowest = std::max<int64_t>(1, longest / 4);
    for (int64_t& l : lengths) l = lowest + static_cast<int64_t>(rng() % (longest - lowest + 1));
    absl::StatusOr<engine::ProbeStep> single = engine::MeasureStep(probe.model, lengths, options);
    if (!single.ok()) return single.status();
    absl::StatusOr<double> together =
        TimeRanks(ranks, probe.model, lengths, options.warmup, std::max(options.repeats, 6), options.seed + index);
    if (!together.ok()) {
      return absl::Status(together.status().code(),
                          absl::StrCat("rank synchronization, probe", index, ": ", together.status().message()));
    }
    RankSyncProbe p;
    p.name = absl::StrCat("probe", index, " d=", probe.model.config.dim, " B=", probe.batch_size, " L<=", longest);
    p.single_seconds = single->seconds;
    p.ranks_seconds = *together;
    result.probes.push_back(p);
    ratios.push_back(p.ranks_seconds / p.single_seconds);
    ++index;
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t n = ratios.size();
  const double median = n % 2 == 1 ? ratios[n / 2] : 0.5 * (ratios[n / 2 - 1] + ratios[n / 2]);
  result.overhead = std::max(0.0, median - 1.0);
  return result;
}

}  // namespace recfleet::worker
