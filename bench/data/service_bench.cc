// End-to-end data-loader throughput over gRPC on loopback: one in-process
// LoaderServer, one client thread per rank streaming an epoch.
// `service_bench --dataset FILE|DIR [--ranks 8 --batch-size 1024 --cost linear
// --epochs 2]`. Reports wall-clock samples/s and samples per CPU-second of
// the whole process (server and clients together: an upper bound on the
// loader's CPU cost).

#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "cli/flags.h"
#include "data/cost_model.h"
#include "services/dataloader/client.h"
#include "services/dataloader/server.h"

namespace {

double ProcessCpuSeconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dataset, cost_spec = "linear";
  int ranks = 8, batch = 1024, epochs = 2;
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc), {"dataset", "cost", "ranks", "batch-size", "epochs"});
  absl::Status parsed = flags.status();
  for (auto [name, value] :
       {std::pair<const char*, int*>{"ranks", &ranks}, {"batch-size", &batch}, {"epochs", &epochs}}) {
    if (parsed.ok()) parsed = flags->Get(name, value);
  }
  if (!parsed.ok() || epochs < 1) {
    std::fprintf(stderr, "service_bench: %s\n",
                 parsed.ok() ? "--epochs must be >= 1" : std::string(parsed.message()).c_str());
    return 2;
  }
  dataset = flags->Str("dataset");
  cost_spec = flags->Str("cost", cost_spec);
  auto cost = recfleet::data::CostModel::Parse(cost_spec);
  if (dataset.empty() || !cost.ok() || batch % 128 != 0) {
    std::fprintf(stderr,
                 "usage: service_bench --dataset FILES|DIR [--ranks R --batch-size B "
                 "(multiple of 128) --cost C --epochs N]\n");
    return 2;
  }
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // The job's data configuration, as the coordinator derives it from a spec.
  recfleet::v1::DataConfig config;
  config.set_job("jobs/bench");
  config.set_dataset(dataset);
  config.set_num_ranks(ranks);
  config.set_local_batch_size(batch);
  config.set_base_batch_size(128);
  config.set_micro_batches(1);
  config.set_policy("recfleet");
  config.set_cost_model(cost->ToString());
  config.set_seed(1);
  recfleet::dataloader::ServerOptions so;
  so.metrics_port = -1;
  auto server = recfleet::dataloader::LoaderServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "service_bench: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  std::atomic<int64_t> samples{0}, bytes{0};
  std::atomic<bool> failed{false};
  double cpu0 = ProcessCpuSeconds();
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      auto client = recfleet::dataloader::DataLoaderClient::Connect((*server)->address(), config);
      if (!client.ok()) {
        failed = true;
        return;
      }
      recfleet::data::RankBatch b;
      for (int e = 0; e < epochs; ++e) {
        auto stream = (*client)->StreamBatches(r, e, 0);
        if (!stream.ok()) {
          failed = true;
          return;
        }
        while (true) {
          auto more = (*stream)->Next(&b);
          if (!more.ok()) {
            std::fprintf(stderr, "rank %d: %s\n", r, std::string(more.status().message()).c_str());
            failed = true;
            return;
          }
          if (!*more) break;
          samples += static_cast<int64_t>(b.samples.num_rows());
          bytes += static_cast<int64_t>(b.samples.ByteSize());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  double cpu = ProcessCpuSeconds() - cpu0;
  if (failed) return 1;
  std::printf("service_bench %s: %d ranks x %d, cost %s, %d epoch(s) over gRPC loopback\n",
              dataset.c_str(), ranks, batch, cost_spec.c_str(), epochs);
  std::printf(
      "  %lld samples, %.1f MB; wall %.3f s, process CPU %.3f s\n"
      "  wall: %.0f samples/s; per CPU-second (server + clients): %.0f samples/s, %.1f MB/s\n",
      static_cast<long long>(samples.load()), bytes.load() / 1e6, secs, cpu, samples.load() / secs,
      samples.load() / cpu, bytes.load() / cpu / 1e6);
  return 0;
}
