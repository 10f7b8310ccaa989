// Step time and exposed communication of DistributedModel with the FSDP
// units' collectives prefetched (overlapping the compute) against the same
// units gathered and reduced blocking, on Gloo ranks over loopback (threads
// of this process, each with its own transport): the baseline is the
// synchronous path of the same code, in the same run.
//
//   bazel build -c opt //worker:fsdp_prefetch_bench
//   bazel-bin/worker/fsdp_prefetch_bench --ranks=4 --rounds=5
//
// Each round trains a fresh model with prefetch off and one with it on (the
// order alternating between rounds, the machine being shared) for --warmup
// + --steps steps; per run it reports the slowest rank's mean step and that
// rank's mean exposed communication (Times::comm_seconds: the time the step
// waited on collectives, the table all-to-alls included). The FSDP group is
// the whole world; the tables are sharded over it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/distributed_model.h"

ABSL_FLAG(int, ranks, 2, "Gloo ranks (threads)");
ABSL_FLAG(int, rounds, 3, "interleaved rounds of prefetch off / on");
ABSL_FLAG(int, warmup, 2, "steps before timing");
ABSL_FLAG(int, steps, 8, "timed steps");
ABSL_FLAG(int, batch, 32, "samples per rank and step");
ABSL_FLAG(int, dim, 64, "model width");
ABSL_FLAG(int, seq_layers, 4, "self-attention blocks");
ABSL_FLAG(int, expert_hidden, 512, "hidden width of each expert");

namespace recfleet::worker {
namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  double step_s = 0, comm_s = 0;
};

double LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double one = 0;
  f >> one;
  return one;
}

int Main() {
  const int ranks = absl::GetFlag(FLAGS_ranks);
  engine::SyntheticOptions synthetic;
  synthetic.num_users = 200;
  synthetic.num_items = 300;
  engine::CtrOptions ctr;
  ctr.max_history = 50;
  absl::StatusOr<engine::MovieLensCtr> data = engine::MovieLensCtr::Create(engine::SyntheticMovieLens(synthetic), ctr);
  if (!data.ok()) {
    std::fprintf(stderr, "data: %s\n", data.status().ToString().c_str());
    return 1;
  }
  engine::GemLiteConfig config;
  config.dim = absl::GetFlag(FLAGS_dim);
  config.heads = 4;
  config.seq_layers = absl::GetFlag(FLAGS_seq_layers);
  config.pma_queries = 2;
  config.dcn_layers = 2;
  config.num_experts = 4;
  config.expert_hidden = absl::GetFlag(FLAGS_expert_hidden);
  config.expert_out = 64;
  config.tower_hidden = 64;

  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(600);
  std::vector<std::unique_ptr<comm::Communicator>> worlds(ranks);
  std::vector<std::optional<dist::TrainingGroups>> groups(ranks);
  std::vector<std::shared_ptr<comm::GlooTransport>> transports(ranks);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        transports[r] = *comm::GlooTransport::Create("127.0.0.1");
        const comm::CommFactory factory = [&](comm::KvStore& s, int rank, int size) {
          return comm::ConnectGloo(s, rank, size, transports[r], options);
        };
        comm::PrefixKvStore world_store(&store, "world/");
        worlds[r] = *factory(world_store, r, ranks);
        auto specs = dist::TrainingGroupSpecs(r, ranks, {}, {});
        groups[r].emplace(*dist::TrainingGroups::BuildFromSpecs(r, *specs, store, factory));
      });
    }
    for (std::thread& t : threads) t.join();
  }
  int64_t dense_bytes = 0;
  const int warmup = absl::GetFlag(FLAGS_warmup), steps = absl::GetFlag(FLAGS_steps);
  const int batch = absl::GetFlag(FLAGS_batch);
  auto train = [&](bool prefetch) {
    std::vector<Run> runs(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        auto m = DistributedModel::Create(config, data->schema(), &*groups[r], worlds[r].get());
        if (!m.ok()) {
          std::fprintf(stderr, "rank %d: %s\n", r, m.status().ToString().c_str());
          std::abort();
        }
        (*m)->set_prefetch(prefetch);
        if (r == 0) dense_bytes = (*m)->engine_model().num_dense_parameters() * 4;
        Clock::time_point start;
        for (int step = 0; step < warmup + steps; ++step) {
          if (step == warmup) {
            runs[r] = Run();
            start = Clock::now();
          }
          std::vector<int64_t> samples;
          for (int i = 0; i < batch; ++i) samples.push_back(((step * ranks + r) * batch + i) % data->num_train());
          DistributedModel::Times times;
          auto result = (*m)->TrainStep(data->MakeBatch(false, samples), &times);
          if (!result.ok()) {
            std::fprintf(stderr, "rank %d step %d: %s\n", r, step, result.status().ToString().c_str());
            std::abort();
          }
          runs[r].comm_s += times.comm_seconds;
        }
        runs[r].step_s = std::chrono::duration<double>(Clock::now() - start).count() / steps;
        runs[r].comm_s /= steps;
      });
    }
    for (std::thread& t : threads) t.join();
    return *std::max_element(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.step_s < b.step_s; });
  };
  std::printf("ranks %d, batch %d per rank, dim %lld, %d blocks, expert_hidden %lld\n", ranks, batch,
              static_cast<long long>(config.dim), config.seq_layers, static_cast<long long>(config.expert_hidden));
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (int k = 0; k < 2; ++k) {
      const bool prefetch = (round + k) % 2 == 1;
      const double load = LoadAverage();
      const Run run = train(prefetch);
      std::printf("round %d prefetch %-3s step %8.2f ms  exposed comm %8.2f ms  (dense %.1f MB, load %.1f)\n",
                  round, prefetch ? "on" : "off", run.step_s * 1e3, run.comm_s * 1e3, dense_bytes / 1e6, load);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace recfleet::worker

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return recfleet::worker::Main();
}
