#include "tests/e2e/local_cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "data/synth.h"
#include "grpcpp/grpcpp.h"

extern char** environ;

namespace recfleet::e2e {

std::string RunfilesPath(const std::string& workspace_relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_relative;
  return absl::StrCat(srcdir, "/", workspace == nullptr ? "recfleet" : workspace, "/", workspace_relative);
}

absl::StatusOr<std::unique_ptr<Process>> Process::Start(const std::vector<std::string>& argv,
                                                        const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return absl::InternalError(absl::StrCat("cannot start ", argv[0], ": ", std::strerror(rc)));
  return std::unique_ptr<Process>(new Process(pid, log));
}

Process::~Process() {
  if (!running()) return;
  Signal(SIGTERM);
  for (int i = 0; i < 100 && running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (running()) Signal(SIGKILL);
  Wait();
}

void Process::Signal(int sig) {
  if (!reaped_) ::kill(pid_, sig);
}

int Process::Wait() {
  if (!reaped_ && ::waitpid(pid_, &status_, 0) == pid_) reaped_ = true;
  return status_;
}

bool Process::running() {
  if (reaped_) return false;
  if (::waitpid(pid_, &status_, WNOHANG) == pid_) reaped_ = true;
  return !reaped_;
}

absl::StatusOr<std::string> Process::WaitForLine(const std::string& prefix, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(log_);
    std::string line;
    while (std::getline(in, line)) {
      if (absl::StartsWith(line, prefix)) return line.substr(prefix.size());
    }
    if (!running()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("no line starting with '", prefix, "' in ", log_));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const ClusterOptions& options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster(options));
  ::mkdir(options.dir.c_str(), 0755);
  ::mkdir(c->sample_log_dir().c_str(), 0755);
  std::vector<std::string> server_security, loader_security;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls) {
    const std::string tls = options.dir + "/tls";
    std::string command = absl::StrCat(RunfilesPath("deploy/tls/make-certs.sh"), " '", tls, "'");
    for (const char* server : {"coordinator", "loader"}) absl::StrAppend(&command, " --name ", c->Place(server).address);
    absl::StrAppend(&command, " >/dev/null");
    if (std::system(command.c_str()) != 0) return absl::InternalError(absl::StrCat("`", command, "` failed"));
    // Users, workers and the coordinator-loader pair each hold their own
    // secret, as a deployment does.
    constexpr char kToken[] = "e2e-user-token";
    std::ofstream(options.dir + "/token") << kToken << "\n";
    std::ofstream(options.dir + "/worker-token") << "e2e-worker-token\n";
    std::ofstream(options.dir + "/data-grant-key") << "e2e-data-grant-key\n";
    const std::vector<std::string> tls_server = {"--tls_cert=" + tls + "/server.pem",
                                                 "--tls_key=" + tls + "/server.key",
                                                 "--data_grant_key_file=" + options.dir + "/data-grant-key"};
    server_security = tls_server;
    server_security.push_back("--auth_token_file=" + options.dir + "/token");
    server_security.push_back("--worker_token_file=" + options.dir + "/worker-token");
    // The loader's callers are workers: its bearer token is theirs. It is
    // `recfleet data serve`, whose flags are kebab-case.
    loader_security = {"--tls-cert=" + tls + "/server.pem", "--tls-key=" + tls + "/server.key",
                       "--data-grant-key-file=" + options.dir + "/data-grant-key",
                       "--auth-token-file=" + options.dir + "/worker-token"};
    c->worker_security_ = {"--tls_ca=" + tls + "/ca.pem", "--worker_token_file=" + options.dir + "/worker-token"};
    std::ifstream ca_in(tls + "/ca.pem");
    std::stringstream ca;
    ca << ca_in.rdbuf();
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ca.str();
    // Adds "authorization: Bearer <token>" to every call.
    credentials = grpc::CompositeChannelCredentials(grpc::SslCredentials(ssl), grpc::AccessTokenCredentials(kToken));
  }
  if (options.loader) {
    std::vector<std::string> argv = {RunfilesPath("cli/recfleet"), "data", "serve", "--cache-dir",
                                     options.dir + "/synthetic", "--host", c->Place("loader").address,
                                     "--port", "0", "--metrics-port", "0"};
    argv.insert(argv.end(), loader_security.begin(), loader_security.end());
    absl::StatusOr<std::unique_ptr<Process>> loader =
        Process::Start(c->Command("loader", argv), options.dir + "/loader.log");
    if (!loader.ok()) return loader.status();
    c->loader_ = std::move(*loader);
    absl::StatusOr<std::string> serving = c->loader_->WaitForLine("data loader on ", absl::Seconds(20));
    if (!serving.ok()) return serving.status();
    c->loader_address_ = serving->substr(0, serving->find(' '));
  }
  const std::string address_file = options.dir + "/coordinator.address";
  std::vector<std::string> coordinator_argv = {
      RunfilesPath("services/coordinator/recfleet-coordinator"), "--listen=" + c->Place("coordinator").address + ":0",
      "--db=" + options.dir + "/coordinator.db", absl::StrCat("--lease_seconds=", options.lease_seconds),
      "--address_file=" + address_file, "--metrics_address=127.0.0.1:0",
      "--loader_address=" + c->loader_address_};
  coordinator_argv.insert(coordinator_argv.end(), server_security.begin(), server_security.end());
  absl::StatusOr<std::unique_ptr<Process>> coord =
      Process::Start(c->Command("coordinator", coordinator_argv), options.dir + "/coordinator.log");
  if (!coord.ok()) return coord.status();
  c->coordinator_ = std::move(*coord);
  absl::StatusOr<std::string> serving = c->coordinator_->WaitForLine("recfleet coordinator serving on ", absl::Seconds(20));
  if (!serving.ok()) return serving.status();
  c->coordinator_address_ = serving->substr(0, serving->find(' '));
  c->jobs_ = v1::JobService::NewStub(grpc::CreateChannel(c->coordinator_address_, credentials));
  for (int i = 0; i < options.workers; ++i) {
    if (absl::Status s = c->AddWorker(); !s.ok()) return s;
  }
  return c;
}

LocalCluster::~LocalCluster() {
  workers_.clear();
  coordinator_.reset();
  loader_.reset();
}

Placement LocalCluster::Place(const std::string& process) const {
  return options_.place ? options_.place(process) : Placement();
}

std::vector<std::string> LocalCluster::Command(const std::string& process, std::vector<std::string> argv) const {
  std::vector<std::string> command = Place(process).exec_prefix;
  command.insert(command.end(), argv.begin(), argv.end());
  return command;
}

absl::Status LocalCluster::AddWorker() {
  const int i = static_cast<int>(workers_.size());
  const std::string name = absl::StrCat("worker", i);
  const std::string work_dir = options_.dir + "/" + name;
  ::mkdir(work_dir.c_str(), 0755);
  const std::string host = Place(name).address;
  std::vector<std::string> argv = {RunfilesPath("worker/recfleet-worker"),
                                   "--coordinator=" + coordinator_address_,
                                   "--host=" + host,
                                   absl::StrCat("--node=node", i),
                                   "--work_dir=" + work_dir,
                                   "--checkpoint_root=" + options_.dir + "/checkpoints",
                                   "--metrics_address=" + host + ":0",
                                   absl::StrCat("--comm_timeout=", options_.comm_timeout_seconds)};
  if (options_.sample_logs) argv.push_back("--sample_log_dir=" + sample_log_dir());
  argv.insert(argv.end(), worker_security_.begin(), worker_security_.end());
  argv.insert(argv.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  absl::StatusOr<std::unique_ptr<Process>> p = Process::Start(Command(name, argv), work_dir + ".log");
  if (!p.ok()) return p.status();
  workers_.push_back(std::move(*p));
  absl::StatusOr<std::string> metrics = workers_.back()->WaitForLine("worker metrics: http://", absl::Seconds(20));
  if (!metrics.ok()) return metrics.status();
  metrics_addresses_.push_back(metrics->substr(0, metrics->find('/')));
  absl::StatusOr<std::string> id = workers_.back()->WaitForLine("worker id: ", absl::Seconds(20));
  if (!id.ok()) return id.status();
  worker_ids_.push_back(*id);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> LocalCluster::CreateJob(const v1::JobSpec& spec) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::Job job;
  grpc::Status s = jobs_->CreateJob(&ctx, request, &job);
  if (!s.ok()) return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  return job;
}

absl::Status LocalCluster::CheckTrainedExactlyOnce(const v1::Job& job, const SampleLogCheck& check) const {
  absl::StatusOr<SampleLog> logs = ReadSampleLogs(sample_log_dir(), job.name().substr(job.name().find('/') + 1));
  if (!logs.ok()) return logs.status();
  return CheckExactlyOnce(*logs, check);
}

absl::StatusOr<v1::Job> LocalCluster::WaitForJob(const std::string& name,
                                                 const std::function<bool(const v1::Job&)>& done,
                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::Job job;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::GetJobRequest req;
    req.set_name(name);
    grpc::Status s = jobs_->GetJob(&ctx, req, &job);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("GetJob ", name, ": ", s.error_message()));
    if (done(job)) return job;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job ", name, " still ", v1::JobStatus::State_Name(job.status().state()),
                                                      " at step ", job.status().progress().step()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string LocalCluster::DumpLogs() const {
  std::string out;
  auto dump = [&](const Process& p) {
    std::ifstream in(p.log());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.size() > 6000) text = "...\n" + text.substr(text.size() - 6000);
    absl::StrAppend(&out, "==== ", p.log(), "\n", text, "\n");
  };
  if (loader_ != nullptr) dump(*loader_);
  if (coordinator_ != nullptr) dump(*coordinator_);
  for (const auto& w : workers_) dump(*w);
  return out;
}

}  // namespace recfleet::e2e

namespace recfleet::e2e {

absl::Status MakeSyntheticDataset(const std::string& dir, int64_t samples) {
  data::SynthOptions o;
  o.samples = samples;
  o.num_items = 400;
  o.num_users = 200;
  o.clusters = 8;
  o.dense_features = 4;
  o.eval_fraction = 0.2;
  absl::StatusOr<data::LengthDistribution> lengths =
      data::LengthDistribution::Parse("lognormal:mean=12,sigma=0.8,min=1,max=40");
  if (!lengths.ok()) return lengths.status();
  o.lengths = *lengths;
  return data::GenerateSynthetic(o, dir);
}

v1::JobSpec SmallJobSpec(const std::string& dataset_dir, const std::string& checkpoint_dir, int64_t steps,
                         int64_t checkpoint_every, int workers, int local_batch) {
  v1::JobSpec spec;
  spec.set_display_name("e2e-small");
  v1::ModelSpec* m = spec.mutable_model();
  auto table = [&](const char* name, int64_t rows) {
    v1::EmbeddingTable* t = m->add_tables();
    t->set_name(name);
    t->set_rows(rows);
    t->set_dim(8);
  };
  table("item", 401);
  table("user", 201);
  table("item_category", 8);
  auto feature = [&](const std::string& name, v1::Feature::Kind kind, const char* t) {
    v1::Feature* f = m->add_features();
    f->set_name(name);
    f->set_kind(kind);
    if (kind == v1::Feature::NUMERIC) {
      f->set_width(1);
    } else {
      f->set_table(t);
    }
    if (kind == v1::Feature::SEQUENCE) f->set_max_length(32);
  };
  feature("user_id", v1::Feature::ID_LIST, "user");
  feature("item_id", v1::Feature::CANDIDATE, "item");
  feature("item_category", v1::Feature::CANDIDATE, "item_category");
  feature("history_items", v1::Feature::SEQUENCE, "item");
  for (int j = 0; j < 4; ++j) feature(absl::StrCat("dense_", j), v1::Feature::NUMERIC, "");
  v1::SequenceBranch* seq = m->mutable_sequence();
  seq->add_features("history_items");
  seq->set_num_layers(1);
  seq->set_model_dim(8);
  seq->set_num_heads(2);
  seq->mutable_attention()->set_kind(v1::AttentionSpec::FULL);
  m->mutable_cross()->set_num_cross_layers(1);
  m->mutable_cross()->set_pma_queries(2);
  m->mutable_cross()->set_num_heads(2);
  m->add_dense()->mutable_dcn()->set_num_layers(1);
  v1::MoeSpec* moe = m->add_dense()->mutable_moe();
  moe->set_num_experts(2);
  moe->set_top_k(2);
  moe->add_expert_hidden_dims(16);
  moe->add_expert_hidden_dims(8);
  v1::Head* head = m->add_heads();
  head->set_kind(v1::Head::CTR);
  head->set_label("label");
  head->add_hidden_dims(8);
  spec.mutable_data()->set_dataset(dataset_dir);
  spec.mutable_data()->set_local_batch_size(local_batch);
  spec.mutable_data()->mutable_bbs()->set_enabled(true);
  spec.mutable_data()->mutable_bbs()->set_base_batch_size(local_batch % 16 == 0 ? 16 : local_batch);
  spec.mutable_data()->mutable_bbs()->mutable_cost_weights()->set_linear(1);
  spec.mutable_resources()->set_workers(workers);
  v1::TrainingSpec* t = spec.mutable_training();
  t->set_steps(steps);
  t->set_checkpoint_every(checkpoint_every);
  t->set_checkpoint_dir(checkpoint_dir);
  t->set_dense_learning_rate(0.01);
  t->set_sparse_learning_rate(0.1);
  t->set_seed(7);
  t->set_max_restarts(5);
  return spec;
}

v1::JobSpec ShardedTwoWorkerJobSpec(const std::string& dataset_dir, const std::string& checkpoint_dir, int64_t steps,
                                    int64_t checkpoint_every, int local_batch) {
  v1::JobSpec spec = SmallJobSpec(dataset_dir, checkpoint_dir, steps, checkpoint_every, 2, local_batch);
  spec.mutable_parallelism()->set_fsdp_group_size(2);
  spec.mutable_parallelism()->set_table_sharding_group_size(2);
  return spec;
}

absl::StatusOr<SampleLog> ReadSampleLogs(const std::string& dir, const std::string& job_id) {
  SampleLog out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrCat("no sample log directory ", dir));
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    int rank = 0, epoch = 0;
    const std::string prefix = job_id + ".rank-";
    if (!absl::StartsWith(name, prefix) ||
        std::sscanf(name.c_str() + prefix.size(), "%d.epoch-%d.log", &rank, &epoch) != 2) {
      continue;
    }
    std::ifstream in(dir + "/" + name);
    std::string line;
    while (std::getline(in, line)) {
      std::vector<int64_t> ids;
      int64_t step = 0;
      bool first = true;
      for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
        int64_t v;
        if (!absl::SimpleAtoi(word, &v)) return absl::DataLossError(absl::StrCat("bad line in ", name, ": ", line));
        if (first) {
          step = v;
          first = false;
        } else {
          ids.push_back(v);
        }
      }
      out[rank][epoch][step] = std::move(ids);
    }
  }
  ::closedir(d);
  return out;
}

absl::Status CheckExactlyOnce(const SampleLog& logs, const SampleLogCheck& check) {
  std::vector<std::string> problems;
  std::set<int64_t> seen;
  int64_t trained = 0;
  for (int rank = 0; rank < check.ranks; ++rank) {
    auto found = logs.find(rank);
    if (found == logs.end()) {
      problems.push_back(absl::StrCat("rank ", rank, " has no sample log"));
      continue;
    }
    const auto& attempts = found->second;
    if (check.restarted && attempts.size() < 2) problems.push_back(absl::StrCat("rank ", rank, " was not restarted"));
    for (auto it = std::next(attempts.begin()); it != attempts.end(); ++it) {
      if (it->second.empty()) continue;
      // A resumed attempt starts right after a checkpoint...
      const int64_t first = it->second.begin()->first;
      if (check.checkpoint_every > 0 && (first - 1) % check.checkpoint_every != 0) {
        problems.push_back(absl::StrCat("rank ", rank, " epoch ", it->first, " resumed at step ", first));
      }
      // ...and replays exactly the samples the earlier attempts had there.
      for (const auto& [step, ids] : it->second) {
        for (auto prev = attempts.begin(); prev != it; ++prev) {
          auto same = prev->second.find(step);
          if (same != prev->second.end() && same->second != ids) {
            problems.push_back(absl::StrCat("rank ", rank, " step ", step, ": epoch ", it->first,
                                            " trained other samples than epoch ", prev->first));
          }
        }
      }
    }
    for (int64_t step = 1; step <= check.steps; ++step) {
      const std::vector<int64_t>* ids = nullptr;
      for (const auto& [epoch, steps] : attempts) {
        auto s = steps.find(step);
        if (s != steps.end()) ids = &s->second;
      }
      if (ids == nullptr) {
        problems.push_back(absl::StrCat("rank ", rank, " never trained step ", step));
        continue;
      }
      for (int64_t id : *ids) {
        if (!seen.insert(id).second) problems.push_back(absl::StrCat("sample ", id, " trained twice"));
      }
      trained += static_cast<int64_t>(ids->size());
    }
  }
  const int64_t expected = check.steps * check.ranks * check.samples_per_rank_step;
  if (trained != expected) problems.push_back(absl::StrCat(trained, " samples trained, expected ", expected));
  if (problems.empty()) return absl::OkStatus();
  if (problems.size() > 20) problems.resize(20);
  return absl::DataLossError(absl::StrJoin(problems, "; "));
}

}  // namespace recfleet::e2e
