// `recfleet data serve` (run a data-loader instance) and `recfleet data
// fetch` (stream one rank's batches from a loader and report throughput).

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "cli/flags.h"
#include "services/common/data_grant.h"
#include "services/common/flags.h"
#include "services/common/log.h"
#include "services/common/tls.h"
#include "services/dataloader/client.h"
#include "services/dataloader/server.h"
#include "spdlog/spdlog.h"

namespace recfleet::dataloader {
namespace {

using cli::Flags;

int Fail(const absl::Status& s, const char* cmd) {
  std::fprintf(stderr, "recfleet data %s: %s\n", cmd, std::string(s.message()).c_str());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return cli::kExitUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return cli::kExitUnavailable;
    case absl::StatusCode::kNotFound:
      return cli::kExitNotFound;
    default:
      return cli::kExitFailure;
  }
}

// The secret shared with the coordinator, from --data-grant-key-file or
// $RECFLEET_DATA_GRANT_KEY ("" = none).
absl::StatusOr<std::string> DataGrantKey(const Flags& f) {
  return LoadSecret("--data-grant-key-file", f.Str("data-grant-key-file"),
                    std::getenv("RECFLEET_DATA_GRANT_KEY"));
}

// TLS and bearer token of the server from the security flags (the daemons'
// flags of services/common/tls.h, in the CLI's kebab-case); prints the
// plain-text notice.
absl::Status SecureServer(const Flags& f, ServerOptions* so) {
  absl::StatusOr<std::string> token =
      LoadAuthToken(f.Str("auth-token-file"), std::getenv("RECFLEET_AUTH_TOKEN"));
  if (!token.ok()) return token.status();
  so->auth_token = *token;
  absl::StatusOr<std::string> key = DataGrantKey(f);
  if (!key.ok()) return key.status();
  so->data_grant_key = *key;
  TlsOptions tls;
  tls.cert_file = f.Str("tls-cert");
  tls.key_file = f.Str("tls-key");
  tls.client_ca_file = f.Str("tls-client-ca");
  const std::string insecure = f.Str("insecure-plaintext", "no");
  if (insecure != "yes" && insecure != "no") {
    return absl::InvalidArgumentError(
        absl::StrCat("--insecure-plaintext takes yes or no, got '", insecure, "'"));
  }
  tls.insecure_plaintext = insecure == "yes";
  absl::StatusOr<ServerTransport> transport = MakeServerTransport(tls, so->host);
  if (!transport.ok()) return transport.status();
  if (!transport->tls) spdlog::warn("{}", transport->description);
  so->credentials = transport->credentials;
  return absl::OkStatus();
}

// The client side: TLS from --tls-ca/--tls-cert/--tls-key, the token from
// --auth-token-file or $RECFLEET_AUTH_TOKEN, and, for an operator holding
// the data-grant key, `config`'s grant signed with it.
absl::StatusOr<ConnectOptions> SecureClient(const Flags& f, const v1::DataConfig& config) {
  ConnectOptions connect;
  absl::StatusOr<std::string> token =
      LoadAuthToken(f.Str("auth-token-file"), std::getenv("RECFLEET_AUTH_TOKEN"));
  if (!token.ok()) return token.status();
  connect.auth_token = *token;
  absl::StatusOr<std::string> key = DataGrantKey(f);
  if (!key.ok()) return key.status();
  if (!key->empty()) connect.data_grant = SignDataGrant(*key, config);
  TlsOptions tls;
  tls.ca_file = f.Str("tls-ca");
  tls.cert_file = f.Str("tls-cert");
  tls.key_file = f.Str("tls-key");
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  connect.credentials = *credentials;
  return connect;
}

int RunServe(const std::vector<std::string>& args) {
  auto f = cli::ParseCommandFlags("data serve", args,
                                  {"data-root", "cache-dir", "host", "port", "metrics-port", "prefetch",
                                   "auth-token-file", "data-grant-key-file", "tls-cert", "tls-key", "tls-client-ca",
                                   "insecure-plaintext"});
  if (!f.ok()) return cli::kExitUsage;
  // A daemon from here on: log lines with time and level on stderr.
  InitLogging("recfleet-dataloader");
  // Block the stop signals before any thread starts (gRPC starts its own as
  // soon as credentials are made), then wait for them on a dedicated thread.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  ServerOptions so;
  for (auto [name, ptr] : std::vector<std::pair<const char*, int*>>{
           {"port", &so.port}, {"metrics-port", &so.metrics_port}, {"prefetch", &so.service.prefetch}}) {
    if (auto st = f->Get(name, ptr); !st.ok()) return Fail(st, "serve");
  }
  if (f->Has("host")) so.host = f->Str("host");
  so.datasets.root = f->Str("data-root", "");
  so.datasets.cache_dir = f->Str("cache-dir", "");
  if (auto st = SecureServer(*f, &so); !st.ok()) return Fail(st, "serve");

  auto server = LoaderServer::Start(so);
  if (!server.ok()) return Fail(server.status(), "serve");
  std::printf("data loader on %s (metrics: http://%s:%d/metrics), serving every job that asks; datasets from %s\n",
              (*server)->address().c_str(), so.host.c_str(), (*server)->metrics_port(),
              so.datasets.root.empty() ? "the working directory" : so.datasets.root.c_str());
  std::fflush(stdout);
  LoaderServer* s = server->get();
  std::thread waiter([s, stop] {
    int sig;
    sigwait(&stop, &sig);
    spdlog::info("signal {}, shutting down", sig);
    s->Shutdown();
  });
  s->Wait();
  waiter.join();
  spdlog::info("stopped");
  return cli::kExitOk;
}

int RunFetch(const std::vector<std::string>& args) {
  auto f = cli::ParseCommandFlags("data fetch", args,
                                  {"server", "dataset", "job", "ranks", "batch-size", "base-batch", "policy", "cost",
                                   "seed", "rank", "epoch", "start-step", "end-step", "auth-token-file",
                                   "data-grant-key-file", "tls-ca", "tls-cert", "tls-key"});
  if (!f.ok()) return cli::kExitUsage;
  // The job's data configuration, as the coordinator would derive it.
  v1::DataConfig config;
  config.set_job(f->Str("job", "fetch"));
  config.set_dataset(f->Str("dataset", ""));
  int ranks = 1, batch_size = 1024, base = 128;
  uint64_t seed = 1;
  if (auto st = f->Get("ranks", &ranks); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("batch-size", &batch_size); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("base-batch", &base); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("seed", &seed); !st.ok()) return Fail(st, "fetch");
  config.set_num_ranks(ranks);
  config.set_local_batch_size(batch_size);
  config.set_base_batch_size(base);
  config.set_micro_batches(1);
  config.set_policy(f->Str("policy", "recfleet"));
  config.set_cost_model(f->Str("cost", "linear"));
  config.set_seed(seed);
  if (config.dataset().empty()) return Fail(absl::InvalidArgumentError("--dataset is required"), "fetch");
  int rank = 0;
  int64_t epoch = 0, start = 0, end = 0;
  if (auto st = f->Get("rank", &rank); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("epoch", &epoch); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("start-step", &start); !st.ok()) return Fail(st, "fetch");
  if (auto st = f->Get("end-step", &end); !st.ok()) return Fail(st, "fetch");
  if (!f->Has("server")) return Fail(absl::InvalidArgumentError("--server is required"), "fetch");
  auto connect = SecureClient(*f, config);
  if (!connect.ok()) return Fail(connect.status(), "fetch");
  auto client = DataLoaderClient::Connect(f->Str("server"), config, *std::move(connect));
  if (!client.ok()) return Fail(client.status(), "fetch");
  auto stream = (*client)->StreamBatches(rank, epoch, start, end);
  if (!stream.ok()) return Fail(stream.status(), "fetch");
  data::RankBatch batch;
  int64_t steps = 0, samples = 0, bytes = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (true) {
    auto more = (*stream)->Next(&batch);
    if (!more.ok()) return Fail(more.status(), "fetch");
    if (!*more) break;
    ++steps;
    samples += static_cast<int64_t>(batch.samples.num_rows());
    bytes += static_cast<int64_t>(batch.samples.ByteSize());
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank %d epoch %lld: %lld steps, %lld samples, %.1f MB in %.3f s (%.0f samples/s)\n",
              rank, static_cast<long long>(epoch), static_cast<long long>(steps),
              static_cast<long long>(samples), bytes / 1e6, secs, samples / std::max(secs, 1e-9));
  return cli::kExitOk;
}

}  // namespace

RECFLEET_REGISTER_COMMAND({
    "data serve",
    "Run a data-loader instance: BBS-dealt rank batches of any number of jobs over gRPC, /metrics",
    "recfleet data serve [--data-root DIR] [--cache-dir DIR] [--prefetch 4]\n"
    "  [--host 127.0.0.1] [--port 0] [--metrics-port 0 (-1: none)]\n"
    "  [--auth-token-file FILE (default $RECFLEET_AUTH_TOKEN)]\n"
    "  [--data-grant-key-file FILE (default $RECFLEET_DATA_GRANT_KEY)]\n"
    "  [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]] [--insecure-plaintext no|yes]\n"
    "Each job's dataset, ranks, batch sizes and BBS policy come with its requests (the job's\n"
    "DataConfig, set by the coordinator from the JobSpec); relative dataset paths are taken\n"
    "from --data-root, and with --data-root no dataset outside it is opened; synthetic://\n"
    "datasets are generated into --cache-dir.\n"
    "With a data-grant key (the one the coordinator signs grants with) a job's data goes only\n"
    "to requests carrying its grant, which the coordinator hands to the job's ranks.\n"
    "Serves until SIGINT/SIGTERM. Without --tls-cert only a loopback --host may\n"
    "serve plain text, unless --insecure-plaintext yes is given.",
    RunServe,
});

RECFLEET_REGISTER_COMMAND({
    "data fetch",
    "Stream one rank's batches from a data loader and report throughput",
    "recfleet data fetch --server HOST:PORT --dataset LOCATION [--ranks 1] [--batch-size 1024]\n"
    "  [--base-batch 128] [--policy recfleet|sort-interleave|naive] [--cost linear] [--seed 1]\n"
    "  [--job NAME] [--rank 0] [--epoch 0] [--start-step 0] [--end-step 0 (= end of epoch)]\n"
    "  [--auth-token-file FILE (default $RECFLEET_AUTH_TOKEN)] [--tls-ca PEM [--tls-cert PEM --tls-key PEM]]\n"
    "  [--data-grant-key-file FILE (default $RECFLEET_DATA_GRANT_KEY): sign the grant a loader with that key needs]",
    RunFetch,
});

}  // namespace recfleet::dataloader
