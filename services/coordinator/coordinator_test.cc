#include "services/coordinator/coordinator.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "data/dataset_file.h"
#include "gtest/gtest.h"
#include "services/common/data_grant.h"
#include "services/common/exposition.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::Assignment;
using ::recfleet::v1::HeartbeatRequest;
using ::recfleet::v1::HeartbeatResponse;
using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::TaskStatus;
using ::recfleet::v1::WatchJobResponse;

// Time that only moves when the test says so.
struct ManualClock {
  std::atomic<int64_t> ns{absl::ToUnixNanos(absl::FromUnixSeconds(1700000000))};
  absl::Time Now() const { return absl::FromUnixNanos(ns.load()); }
  void Advance(absl::Duration d) { ns += absl::ToInt64Nanoseconds(d); }
};

std::string TempDb(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((path + suffix).c_str());
  return path;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(":memory:"); }

  void Start(const std::string& db) {
    coordinator_.reset();
    registry_ = std::make_unique<metrics::MetricRegistry>();
    CoordinatorOptions options;
    options.lease = absl::Seconds(10);
    options.progress_interval = absl::ZeroDuration();
    options.clock = [this] { return clock_.Now(); };
    options.loader_address = "127.0.0.1:7000";
    options.data_grant_key = "grant-key";
    if (configure_) configure_(options);
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::unique_ptr<Coordinator>> c =
        Coordinator::Create(*std::move(store), options, registry_.get());
    ASSERT_TRUE(c.ok()) << c.status();
    coordinator_ = *std::move(c);
  }

  std::string Register(const std::string& host, const std::string& id = "",
                       const std::string& node = "", int64_t resident_bytes = 0) {
    ::recfleet::v1::RegisterWorkerRequest r;
    r.set_host(host);
    r.set_resident_memory_bytes(resident_bytes);
    r.set_worker_id(id);
    r.mutable_topology()->set_node(node.empty() ? host : node);
    absl::StatusOr<::recfleet::v1::RegisterWorkerResponse> resp = coordinator_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    EXPECT_EQ(resp->worker_credential().size(), 64u);
    credentials_[resp->worker_id()] = resp->worker_credential();
    return resp->worker_id();
  }

  // The credential of `worker`'s latest registration.
  std::string Cred(const std::string& worker) { return credentials_[worker]; }

  Job Submit(int workers, const std::string& request_id = "") {
    ::recfleet::v1::CreateJobRequest r;
    *r.mutable_spec() = BuildableSpec(workers);
    r.set_request_id(request_id);
    absl::StatusOr<Job> job = coordinator_->CreateJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return *job;
  }

  Job Get(const std::string& name) {
    ::recfleet::v1::GetJobRequest r;
    r.set_name(name);
    return coordinator_->GetJob(r).value();
  }

  HeartbeatResponse Beat(const std::string& worker, const std::string& job = "", int64_t epoch = 0,
                         TaskStatus::Phase phase = TaskStatus::PHASE_UNSPECIFIED,
                         const std::string& message = "") {
    HeartbeatRequest r;
    r.set_worker_id(worker);
    r.set_worker_credential(Cred(worker));
    if (!job.empty()) {
      r.mutable_task()->set_job(job);
      r.mutable_task()->set_restart_epoch(epoch);
      r.mutable_task()->set_phase(phase);
      r.mutable_task()->set_message(message);
    }
    absl::StatusOr<HeartbeatResponse> resp = coordinator_->Heartbeat(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? *resp : HeartbeatResponse();
  }

  // Reports steps `from`..`to` of `rank` (one sample each).
  absl::Status ReportSteps(const std::string& worker, const std::string& job, int64_t epoch,
                           int rank, int64_t from, int64_t to) {
    ::recfleet::v1::ReportStepRequest rep;
    rep.set_worker_id(worker);
    rep.set_worker_credential(Cred(worker));
    rep.set_job(job);
    rep.set_restart_epoch(epoch);
    rep.set_rank(rank);
    for (int64_t step = from; step <= to; ++step) {
      auto* s = rep.add_steps();
      s->set_step(step);
      s->set_samples(1);
      s->set_step_seconds(0.01);
    }
    return coordinator_->ReportStep(rep).status();
  }

  // Rank 0 on `worker` reports every step of the job, then SUCCEEDED.
  void Finish(const std::string& worker, const std::string& job, int64_t epoch) {
    const int64_t steps = Get(job).spec().training().steps();
    EXPECT_TRUE(ReportSteps(worker, job, epoch, 0, 1, steps).ok());
    Beat(worker, job, epoch, TaskStatus::SUCCEEDED);
  }

  // The status codes of KvSet, KvGet and KvWait of `key` in `job` at
  // `epoch`, called as `worker` presenting `credential`. For calls that do
  // not block (KvWait of a key that is set, or a refused call).
  std::vector<absl::StatusCode> KvCodes(const std::string& worker, const std::string& credential,
                                        const std::string& job, int64_t epoch,
                                        const std::string& key) {
    ::recfleet::v1::KvSetRequest set;
    ::recfleet::v1::KvGetRequest get;
    ::recfleet::v1::KvWaitRequest wait;
    set.set_job(job);
    set.set_restart_epoch(epoch);
    set.set_key(key);
    set.set_value("from " + worker);
    set.set_worker_id(worker);
    set.set_worker_credential(credential);
    get.set_job(job);
    get.set_restart_epoch(epoch);
    get.set_key(key);
    get.set_worker_id(worker);
    get.set_worker_credential(credential);
    wait.set_job(job);
    wait.set_restart_epoch(epoch);
    wait.add_keys(key);
    wait.set_worker_id(worker);
    wait.set_worker_credential(credential);
    absl::StatusCode wait_code = absl::StatusCode::kUnknown;
    coordinator_->KvWait(wait, [&](absl::StatusOr<::recfleet::v1::KvWaitResponse> r) {
      wait_code = r.status().code();
    });
    return {coordinator_->KvSet(set).code(), coordinator_->KvGet(get).status().code(), wait_code};
  }

  // The assignment in a heartbeat reply, if any.
  static const Assignment* AssignmentOf(const HeartbeatResponse& r) {
    for (const auto& c : r.commands()) {
      if (c.has_assignment()) return &c.assignment();
    }
    return nullptr;
  }

  // Walks `job` to RUNNING on `workers`; returns the epoch.
  int64_t StartRunning(const std::string& job, const std::vector<std::string>& workers) {
    int64_t epoch = 0;
    for (const std::string& w : workers) {
      HeartbeatResponse r = Beat(w);
      const Assignment* a = AssignmentOf(r);
      EXPECT_NE(a, nullptr) << w;
      if (a == nullptr) return 0;
      epoch = a->restart_epoch();
    }
    for (const std::string& w : workers) Beat(w, job, epoch, TaskStatus::RUNNING);
    EXPECT_EQ(Get(job).status().state(), JobStatus::RUNNING);
    return epoch;
  }

  std::vector<JobState> History(const std::string& name) {
    std::vector<JobState> out;
    auto log = coordinator_->WaitJobEvents(name, 0, clock_.Now());
    for (const auto& [seq, e] : *log) {
      if (e.kind() == WatchJobResponse::STATE_CHANGE) out.push_back(e.transition().to());
    }
    return out;
  }

  ManualClock clock_;
  // Applied to the options of every Start (planning tests).
  std::function<void(CoordinatorOptions&)> configure_;
  std::map<std::string, std::string> credentials_;
  std::unique_ptr<metrics::MetricRegistry> registry_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, CreateJobWithSameRequestIdYieldsOneJob) {
  Job a = Submit(2, "retry-me");
  Job b = Submit(2, "retry-me");
  EXPECT_EQ(a.name(), b.name());
  ::recfleet::v1::ListJobsRequest list;
  EXPECT_EQ(coordinator_->ListJobs(list)->jobs_size(), 1);
  ::recfleet::v1::CreateJobRequest different;
  *different.mutable_spec() = BuildableSpec(3);
  different.set_request_id("retry-me");
  EXPECT_EQ(coordinator_->CreateJob(different).status().code(), absl::StatusCode::kAlreadyExists);
}

// AIP-133 / 158 / 160: a chosen job id, page_size clamped, a label filter.
TEST_F(CoordinatorTest, ChosenJobIdLabelFilterAndPageSizeClamp) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec();
  (*r.mutable_spec()->mutable_labels())["team"] = "ranking";
  r.set_job_id("ctr-nightly");
  absl::StatusOr<Job> job = coordinator_->CreateJob(r);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->name(), "jobs/ctr-nightly");
  r.set_job_id("Bad_Id");
  absl::StatusOr<Job> bad = coordinator_->CreateJob(r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("job_id must be"), std::string::npos);
  r.set_job_id("ctr-nightly");
  EXPECT_EQ(coordinator_->CreateJob(r).status().code(), absl::StatusCode::kAlreadyExists);
  Submit(1);  // No labels.

  ::recfleet::v1::ListJobsRequest list;
  list.set_filter("labels.team = \"ranking\"");
  absl::StatusOr<::recfleet::v1::ListJobsResponse> ranked = coordinator_->ListJobs(list);
  ASSERT_TRUE(ranked.ok()) << ranked.status();
  ASSERT_EQ(ranked->jobs_size(), 1);
  EXPECT_EQ(ranked->jobs(0).name(), "jobs/ctr-nightly");
  list.set_filter("team = ranking");
  EXPECT_EQ(coordinator_->ListJobs(list).status().code(), absl::StatusCode::kInvalidArgument);
  list.clear_filter();
  list.set_page_size(5000);  // read as 1000
  EXPECT_EQ(coordinator_->ListJobs(list)->jobs_size(), 2);
  list.set_page_size(-1);
  EXPECT_EQ(coordinator_->ListJobs(list).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, BadSpecIsRejectedWithFieldPath) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec();
  r.mutable_spec()->mutable_model()->mutable_tables(1)->set_dim(0);
  absl::StatusOr<Job> job = coordinator_->CreateJob(r);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("spec.model.tables[1].dim must be > 0, got 0"),
            std::string::npos);
  r.mutable_spec()->mutable_model()->mutable_tables(1)->set_dim(8);
  r.set_request_id("has space");
  EXPECT_EQ(coordinator_->CreateJob(r).status().code(), absl::StatusCode::kInvalidArgument);
}

// With --data_root set, a spec cannot name files elsewhere: CreateJob and
// PlanJob refuse it with the field, create nothing, and answer alike whether
// the path outside exists or not.
TEST_F(CoordinatorTest, DatasetsOutsideTheDataRootAreRefused) {
  const std::string root = std::string(testing::TempDir()) + "/coordinator_data_root";
  std::filesystem::create_directories(root + "/inside");
  configure_ = [&root](CoordinatorOptions& o) { o.data_root = root; };
  Start(":memory:");
  Register("host-a");
  auto create = [this](const std::string& dataset, const std::string& eval) {
    ::recfleet::v1::CreateJobRequest r;
    *r.mutable_spec() = BuildableSpec();
    r.mutable_spec()->mutable_data()->set_dataset(dataset);
    r.mutable_spec()->mutable_data()->set_eval_dataset(eval);
    return coordinator_->CreateJob(r).status();
  };
  const std::string exists = std::string(testing::TempDir());  // Outside the root, and there.
  for (const std::string& outside : {exists, std::string("/no/such/place"), std::string("../x"),
                                     root + "/inside/../../x", "file://" + exists, root + "-sibling/x"}) {
    absl::Status s = create(outside, "");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_EQ(s.message(), "spec.data.dataset: dataset '" + outside +
                               "' lies outside the data root; name a path under it (relative paths resolve "
                               "there) or a synthetic:// dataset")
        << outside;
    s = create("inside", outside);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << outside;
    EXPECT_TRUE(absl::StartsWith(s.message(), "spec.data.eval_dataset: dataset '" + outside + "'")) << s;
    ::recfleet::v1::PlanJobRequest plan;
    *plan.mutable_spec() = BuildableSpec();
    plan.mutable_spec()->mutable_data()->set_dataset(outside);
    EXPECT_EQ(coordinator_->PlanJob(plan).status().code(), absl::StatusCode::kInvalidArgument) << outside;
  }
  EXPECT_EQ(coordinator_->ListJobs({}).value().jobs_size(), 0);
  // Inside the root, relative or absolute, and synthetic data are accepted.
  for (const std::string& ok : {std::string("inside"), root + "/inside", "file://" + root + "/inside/../inside",
                                std::string("synthetic://t?samples=100")}) {
    EXPECT_TRUE(create(ok, "").ok()) << ok;
  }
  EXPECT_EQ(coordinator_->ListJobs({}).value().jobs_size(), 4);
}

TEST_F(CoordinatorTest, OversizedSpecIsRejectedAtCreate) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec(1);
  (*r.mutable_spec()->mutable_labels())["notes"] = std::string(2 << 20, 'x');
  absl::StatusOr<Job> job = coordinator_->CreateJob(r);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(job.status().message().find("at most 262144 bytes (256 KiB)"), std::string::npos)
      << job.status();
  EXPECT_TRUE(coordinator_->ListJobs({}).value().jobs().empty());
}

TEST_F(CoordinatorTest, SchedulerAssignsThePlansGroupsAndRecordsItsSummary) {
  Job job = Submit(2);
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  Job placed = Get(job.name());
  ASSERT_EQ(placed.status().state(), JobStatus::SCHEDULING);
  EXPECT_NE(placed.status().message().find("plan: FSDP"), std::string::npos)
      << placed.status().message();
  EXPECT_EQ(placed.status().plan_summary().rfind("plan: FSDP", 0), 0u)
      << placed.status().plan_summary();
  HeartbeatResponse reply = Beat(w0);
  const Assignment* a = AssignmentOf(reply);
  ASSERT_NE(a, nullptr);
  std::set<std::string> names;
  for (const auto& g : a->groups()) names.insert(g.name());
  EXPECT_EQ(a->groups(0).name(), "world");
  EXPECT_EQ(names.count("fsdp/0"), 1u);
  EXPECT_EQ(names.count("tables/0"), 1u);
  // The plan itself travels along: every table's placement, in spec order,
  // for the ranks to execute exactly.
  ASSERT_EQ(a->plan().sparse().tables_size(), placed.spec().model().tables_size());
  for (int t = 0; t < placed.spec().model().tables_size(); ++t) {
    EXPECT_EQ(a->plan().sparse().tables(t).table(), placed.spec().model().tables(t).name());
    EXPECT_FALSE(a->plan().sparse().tables(t).sharding().empty());
  }
  EXPECT_EQ(a->plan().world_size(), 2);
  EXPECT_NE(AssignmentOf(Beat(w1)), nullptr);
}

TEST_F(CoordinatorTest, JobWhoseTablesCannotFitFailsWithThePlannersReason) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec(2);
  // 4e10 rows x 32 fp32 = 5 TB: more than two ranks hold in any layout.
  r.mutable_spec()->mutable_model()->mutable_tables(1)->set_rows(40000000000);
  absl::StatusOr<Job> job = coordinator_->CreateJob(r);
  ASSERT_TRUE(job.ok()) << job.status();
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  Job failed = Get(job->name());
  EXPECT_EQ(failed.status().state(), JobStatus::FAILED);
  EXPECT_EQ(failed.status().reason(), "PlanFailed");
  EXPECT_NE(failed.status().message().find("users"), std::string::npos)
      << failed.status().message();
  // The workers stay free for other jobs.
  EXPECT_EQ(AssignmentOf(Beat(w0)), nullptr);
  EXPECT_EQ(AssignmentOf(Beat(w1)), nullptr);
}

TEST_F(CoordinatorTest, PlanJobNeedsEnoughRegisteredWorkers) {
  ::recfleet::v1::PlanJobRequest r;
  *r.mutable_spec() = BuildableSpec(2);
  Register("host-a");
  auto none = coordinator_->PlanJob(r);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("spec.resources.workers"), std::string::npos);
  Register("host-b");
  auto plan = coordinator_->PlanJob(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->plan().world_size(), 2);
  EXPECT_EQ(plan->workers_size(), 2);
  // A dry run: nothing was created.
  EXPECT_TRUE(coordinator_->ListJobs({}).value().jobs().empty());
}

TEST_F(CoordinatorTest, JobRunsToSuccessWithAssignmentsAndProgress) {
  Job job = Submit(2);
  EXPECT_EQ(job.status().state(), JobStatus::QUEUED);
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::SCHEDULING);

  HeartbeatResponse r0 = Beat(w0), r1 = Beat(w1);
  const Assignment* a0 = AssignmentOf(r0);
  const Assignment* a1 = AssignmentOf(r1);
  ASSERT_NE(a0, nullptr);
  ASSERT_NE(a1, nullptr);
  EXPECT_EQ(a0->job(), job.name());
  EXPECT_EQ(a0->world_size(), 2);
  EXPECT_EQ(std::set<int>({a0->rank(), a1->rank()}), std::set<int>({0, 1}));
  EXPECT_EQ(a0->restart_epoch(), 1);
  EXPECT_EQ(a0->loader_address(), "127.0.0.1:7000");
  // Each rank gets the grant of its job's data configuration, which opens
  // that configuration at a loader sharing the key.
  EXPECT_EQ(a0->data().job(), job.name());
  EXPECT_TRUE(CheckDataGrant("grant-key", a0->data(), a0->data_grant()).ok());
  EXPECT_EQ(a1->data_grant(), a0->data_grant());
  EXPECT_EQ(a0->spec().display_name(), "gemlite-test");
  ASSERT_GE(a0->groups_size(), 1);
  EXPECT_EQ(a0->groups(0).name(), "world");
  // Repeated until acknowledged, so a lost reply is harmless.
  EXPECT_NE(AssignmentOf(Beat(w0)), nullptr);
  EXPECT_EQ(AssignmentOf(Beat(w0, job.name(), 1, TaskStatus::STARTING)), nullptr);
  Beat(w0, job.name(), 1, TaskStatus::RUNNING);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::SCHEDULING);
  Beat(w1, job.name(), 1, TaskStatus::RUNNING);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);

  const std::string rank0 = a0->rank() == 0 ? w0 : w1;
  const std::string rank1 = a0->rank() == 0 ? w1 : w0;
  for (int step = 1; step <= 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ::recfleet::v1::ReportStepRequest rep;
      rep.set_worker_id(rank == 0 ? rank0 : rank1);
      rep.set_worker_credential(Cred(rep.worker_id()));
      rep.set_job(job.name());
      rep.set_restart_epoch(1);
      rep.set_rank(rank);
      auto* s = rep.add_steps();
      s->set_step(step);
      s->set_samples(256);
      s->set_step_seconds(rank == 0 ? 0.1 : 0.3);  // Rank 1 straggles.
      s->set_compute_seconds(0.08);
      s->set_loss(rank == 0 ? 0.6 : 0.4);
      ASSERT_TRUE(coordinator_->ReportStep(rep).ok());
    }
  }
  const auto& p = Get(job.name()).status().progress();
  EXPECT_EQ(p.step(), 3);
  EXPECT_EQ(p.samples(), 6 * 256);
  EXPECT_DOUBLE_EQ(p.loss(), 0.5);
  EXPECT_EQ(p.slowest_rank(), 1);
  EXPECT_NEAR(p.straggler_gap(), 0.3 / 0.2 - 1, 1e-9);
  // Each rank's first step (warm-up) is left out of the timing window.
  EXPECT_NEAR(p.samples_per_second(), 4 * 256 / 0.6, 1e-6);
  // A report for a rank the worker does not hold is refused.
  ::recfleet::v1::ReportStepRequest wrong;
  wrong.set_worker_id(rank0);
  wrong.set_worker_credential(Cred(rank0));
  wrong.set_job(job.name());
  wrong.set_restart_epoch(1);
  wrong.set_rank(1);
  EXPECT_EQ(coordinator_->ReportStep(wrong).status().code(),
            absl::StatusCode::kFailedPrecondition);

  Beat(rank1, job.name(), 1, TaskStatus::SUCCEEDED);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);  // Only rank 0 decides.
  // Rank 0 at step 3 of 100: not finished, whatever its heartbeat says.
  Beat(rank0, job.name(), 1, TaskStatus::SUCCEEDED);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);
  ASSERT_TRUE(ReportSteps(rank0, job.name(), 1, 0, 4, 100).ok());
  Beat(rank0, job.name(), 1, TaskStatus::SUCCEEDED);
  Job done = Get(job.name());
  EXPECT_EQ(done.status().state(), JobStatus::SUCCEEDED);
  EXPECT_EQ(done.status().reason(), "TrainingFinished");
  EXPECT_TRUE(done.status().has_start_time());
  EXPECT_TRUE(done.status().has_end_time());
  EXPECT_EQ(History(job.name()),
            std::vector<JobState>({JobStatus::QUEUED, JobStatus::SCHEDULING, JobStatus::RUNNING,
                                   JobStatus::SUCCEEDED}));
}

// The status page lists jobs, and a job's curves once it reports progress;
// the curves outlive the job's end but not its deletion.
TEST_F(CoordinatorTest, StatusPageShowsJobsAndTheirProgressCurves) {
  Job queued = Submit(1);
  std::string page = coordinator_->StatusPage();
  EXPECT_NE(page.find(queued.name()), std::string::npos);
  EXPECT_NE(page.find("No progress reported yet."), std::string::npos);
  EXPECT_EQ(page.find("<polyline"), std::string::npos);
  std::string w = Register("host-a");
  int64_t epoch = StartRunning(queued.name(), {w});
  for (int64_t step = 1; step <= 40; step += 10) {
    ASSERT_TRUE(ReportSteps(w, queued.name(), epoch, 0, step, step + 9).ok());
    clock_.Advance(absl::Seconds(5));
    Beat(w, queued.name(), epoch, TaskStatus::RUNNING);
    coordinator_->Tick();
  }
  Finish(w, queued.name(), epoch);
  page = coordinator_->StatusPage();
  EXPECT_NE(page.find("<polyline"), std::string::npos) << page;
  EXPECT_NE(page.find("SUCCEEDED"), std::string::npos);
  ::recfleet::v1::DeleteJobRequest del;
  del.set_name(queued.name());
  ASSERT_TRUE(coordinator_->DeleteJob(del).ok());
  EXPECT_EQ(coordinator_->StatusPage().find("<polyline"), std::string::npos);
}

// A heartbeat in the name of another job's rank-0 worker claiming SUCCEEDED
// at step 77 of 400 must not end that job.
TEST_F(CoordinatorTest, EarlySucceededClaimDoesNotEndTheJob) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec(1);
  r.mutable_spec()->mutable_training()->set_steps(400);
  Job job = *coordinator_->CreateJob(r);
  std::string w = Register("host-a");
  int64_t epoch = StartRunning(job.name(), {w});
  ASSERT_TRUE(ReportSteps(w, job.name(), epoch, 0, 1, 77).ok());
  Beat(w, job.name(), epoch, TaskStatus::SUCCEEDED);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);
  // The real end: the last step reported, then SUCCEEDED repeated.
  ASSERT_TRUE(ReportSteps(w, job.name(), epoch, 0, 78, 400).ok());
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);
  Beat(w, job.name(), epoch, TaskStatus::SUCCEEDED);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::SUCCEEDED);
}

// Holding the cluster token is not enough to act as a worker: every worker
// call needs the credential of that worker's registration.
TEST_F(CoordinatorTest, WorkerCallsNeedTheWorkersOwnCredential) {
  Job job = Submit(1);
  std::string victim = Register("host-a");
  std::string other = Register("host-b");
  EXPECT_NE(Cred(victim), Cred(other));
  int64_t epoch = StartRunning(job.name(), {victim});
  ASSERT_TRUE(ReportSteps(victim, job.name(), epoch, 0, 1, 100).ok());

  HeartbeatRequest hb;
  hb.set_worker_id(victim);
  hb.mutable_task()->set_job(job.name());
  hb.mutable_task()->set_restart_epoch(epoch);
  hb.mutable_task()->set_phase(TaskStatus::SUCCEEDED);
  for (const std::string& credential : {std::string(), Cred(other), std::string(64, '0')}) {
    hb.set_worker_credential(credential);
    EXPECT_EQ(coordinator_->Heartbeat(hb).status().code(), absl::StatusCode::kPermissionDenied);
  }
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);

  ::recfleet::v1::ReportStepRequest rep;
  rep.set_worker_id(victim);
  rep.set_worker_credential(Cred(other));
  rep.set_job(job.name());
  rep.set_restart_epoch(epoch);
  rep.add_steps()->set_step(101);
  EXPECT_EQ(coordinator_->ReportStep(rep).status().code(), absl::StatusCode::kPermissionDenied);

  const std::vector<absl::StatusCode> denied(3, absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(KvCodes(victim, Cred(other), job.name(), epoch, "k"), denied);
  EXPECT_EQ(KvCodes(victim, "", job.name(), epoch, "k"), denied);

  // Nor can anyone take over the live worker's id by registering it again.
  ::recfleet::v1::RegisterWorkerRequest again;
  again.set_host("attacker");
  again.set_worker_id(victim);
  EXPECT_EQ(coordinator_->RegisterWorker(again).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);

  // The worker itself, with its credential, finishes the job.
  Beat(victim, job.name(), epoch, TaskStatus::SUCCEEDED);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::SUCCEEDED);
}

TEST_F(CoordinatorTest, ExpiredLeaseIsNoticedAndTheJobRestarts) {
  Job job = Submit(2);
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  int64_t epoch = StartRunning(job.name(), {w0, w1});
  ASSERT_EQ(epoch, 1);
  // w1 keeps beating, w0 goes silent past its lease.
  clock_.Advance(absl::Seconds(6));
  Beat(w1, job.name(), 1, TaskStatus::RUNNING);
  clock_.Advance(absl::Seconds(6));
  Beat(w1, job.name(), 1, TaskStatus::RUNNING);
  coordinator_->Tick();
  EXPECT_EQ(coordinator_->expired_leases(), 1);
  Job j = Get(job.name());
  EXPECT_EQ(j.status().state(), JobStatus::RESTARTING);
  EXPECT_EQ(j.status().reason(), "WorkerLost");
  EXPECT_NE(j.status().message().find(w0), std::string::npos) << j.status().message();
  ::recfleet::v1::HeartbeatRequest late;
  late.set_worker_id(w0);
  late.set_worker_credential(Cred(w0));
  EXPECT_EQ(coordinator_->Heartbeat(late).status().code(), absl::StatusCode::kNotFound);

  // A new worker arrives: the job is placed again with the next epoch, and the
  // survivor is told to abort the old attempt and take the new one.
  std::string w2 = Register("host-c");
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::SCHEDULING);
  HeartbeatResponse r = Beat(w1, job.name(), 1, TaskStatus::RUNNING);
  ASSERT_EQ(r.commands_size(), 2);
  EXPECT_EQ(r.commands(0).abort().restart_epoch(), 1);
  EXPECT_EQ(r.commands(1).assignment().restart_epoch(), 2);
  Beat(w1, job.name(), 2, TaskStatus::RUNNING);
  Beat(w2, job.name(), 2, TaskStatus::RUNNING);
  EXPECT_EQ(Get(job.name()).status().state(), JobStatus::RUNNING);
  EXPECT_EQ(Get(job.name()).status().restart_epoch(), 2);

  absl::StatusOr<metrics::Exposition> e = metrics::ParseExposition(registry_->Render());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->samples.at("recfleet_worker_lease_expirations_total"), 1);
  EXPECT_EQ(e->samples.at("recfleet_jobs{state=\"RUNNING\"}"), 1);
  EXPECT_EQ(e->samples.at("recfleet_workers{state=\"assigned\"}"), 2);
  EXPECT_EQ(e->samples.at("recfleet_job_transitions_total{to=\"RESTARTING\"}"), 1);
}

TEST_F(CoordinatorTest, ListWorkersShowsResourcesPlacementAndLease) {
  Job job = Submit(2);
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  const int64_t epoch = StartRunning(job.name(), {w0, w1});
  clock_.Advance(absl::Seconds(4));
  std::string idle = Register("host-c", "", "rack-7");
  ::recfleet::v1::ListWorkersResponse list = coordinator_->ListWorkers();
  ASSERT_EQ(list.workers_size(), 3);
  std::map<std::string, ::recfleet::v1::WorkerInfo> by_id;
  for (const auto& w : list.workers()) by_id[w.worker_id()] = w;
  const ::recfleet::v1::WorkerInfo& a = by_id.at(w0);
  EXPECT_EQ(a.host(), "host-a");
  EXPECT_EQ(a.state(), ::recfleet::v1::WorkerInfo::ASSIGNED);
  EXPECT_EQ(a.job(), job.name());
  EXPECT_EQ(a.restart_epoch(), epoch);
  EXPECT_EQ(a.task().phase(), TaskStatus::RUNNING);
  EXPECT_EQ(by_id.at(w1).rank() + a.rank(), 1);  // Ranks 0 and 1, one each.
  const ::recfleet::v1::WorkerInfo& c = by_id.at(idle);
  EXPECT_EQ(c.state(), ::recfleet::v1::WorkerInfo::IDLE);
  EXPECT_EQ(c.job(), "");
  EXPECT_EQ(c.topology().node(), "rack-7");
  // Leases run 10 s from the last registration or heartbeat.
  EXPECT_EQ(c.lease_expire_time().seconds() - c.register_time().seconds(), 10);
  EXPECT_EQ(c.register_time().seconds() - a.register_time().seconds(), 4);
}

TEST_F(CoordinatorTest, ListJobEventsReturnsEveryRecordedTransition) {
  Job job = Submit(2);
  std::string w0 = Register("host-a"), w1 = Register("host-b");
  StartRunning(job.name(), {w0, w1});
  clock_.Advance(absl::Seconds(3));
  ::recfleet::v1::CancelJobRequest cancel;
  cancel.set_name(job.name());
  cancel.set_reason("enough");
  ASSERT_TRUE(coordinator_->CancelJob(cancel).ok());
  ::recfleet::v1::ListJobEventsRequest request;
  request.set_name(job.name());
  absl::StatusOr<::recfleet::v1::ListJobEventsResponse> events =
      coordinator_->ListJobEvents(request);
  ASSERT_TRUE(events.ok()) << events.status();
  std::vector<JobState> to;
  for (const auto& e : events->events()) to.push_back(e.to());
  EXPECT_EQ(to, (std::vector<JobState>{JobStatus::QUEUED, JobStatus::SCHEDULING,
                                       JobStatus::RUNNING, JobStatus::CANCELLED}));
  for (int i = 1; i < events->events_size(); ++i) {
    const auto& e = events->events(i);
    EXPECT_EQ(e.from(), events->events(i - 1).to()) << i;
    EXPECT_FALSE(e.reason().empty()) << i;
    EXPECT_GE(e.time().seconds(), events->events(i - 1).time().seconds()) << i;
  }
  const auto& last = events->events(events->events_size() - 1);
  EXPECT_EQ(last.time().seconds() - events->events(0).time().seconds(), 3);
  EXPECT_NE(last.message().find("enough"), std::string::npos) << last.message();
  // The same history as WatchJob's state changes.
  EXPECT_EQ(History(job.name()), to);

  request.set_name("jobs/nosuchjob");
  EXPECT_EQ(coordinator_->ListJobEvents(request).status().code(), absl::StatusCode::kNotFound);
  request.set_name("nosuchjob");
  EXPECT_EQ(coordinator_->ListJobEvents(request).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, RestartBudgetEndsInFailure) {
  ::recfleet::v1::CreateJobRequest r;
  *r.mutable_spec() = BuildableSpec(1);
  r.mutable_spec()->mutable_training()->set_max_restarts(1);
  Job job = *coordinator_->CreateJob(r);
  std::string w = Register("host-a");
  int64_t epoch = StartRunning(job.name(), {w});
  Beat(w, job.name(), epoch, TaskStatus::FAILED, "CUDA error: out of memory");
  Job j = Get(job.name());
  EXPECT_EQ(j.status().state(), JobStatus::SCHEDULING);  // Restarted on the same worker.
  EXPECT_EQ(j.status().restart_epoch(), 2);
  epoch = StartRunning(job.name(), {w});
  Beat(w, job.name(), epoch, TaskStatus::FAILED, "CUDA error: out of memory");
  j = Get(job.name());
  EXPECT_EQ(j.status().state(), JobStatus::FAILED);
  EXPECT_EQ(j.status().reason(), "RestartBudgetExhausted");
  EXPECT_NE(j.status().message().find("out of memory"), std::string::npos);
}

TEST_F(CoordinatorTest, CancelAbortsWorkersAndIsIdempotent) {
  Job job = Submit(1);
  std::string w = Register("host-a");
  int64_t epoch = StartRunning(job.name(), {w});
  ::recfleet::v1::CancelJobRequest c;
  c.set_name(job.name());
  c.set_reason("wrong learning rate");
  absl::StatusOr<Job> cancelled = coordinator_->CancelJob(c);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->status().state(), JobStatus::CANCELLED);
  EXPECT_EQ(cancelled->status().message(), "wrong learning rate");
  HeartbeatResponse r = Beat(w, job.name(), epoch, TaskStatus::RUNNING);
  ASSERT_EQ(r.commands_size(), 1);
  EXPECT_EQ(r.commands(0).abort().job(), job.name());
  EXPECT_TRUE(coordinator_->CancelJob(c).ok());
  // The cancelled job's rendezvous is closed to its former worker.
  EXPECT_EQ(coordinator_->KvSet([&] {
              ::recfleet::v1::KvSetRequest s;
              s.set_job(job.name());
              s.set_restart_epoch(epoch);
              s.set_key("k");
              s.set_worker_id(w);
              s.set_worker_credential(Cred(w));
              return s;
            }()).code(),
            absl::StatusCode::kPermissionDenied);
  // A finished job cannot be cancelled.
  Job other = Submit(1);
  epoch = StartRunning(other.name(), {w});
  Finish(w, other.name(), epoch);
  c.set_name(other.name());
  EXPECT_EQ(coordinator_->CancelJob(c).status().code(), absl::StatusCode::kFailedPrecondition);
  c.set_name("jobs/missing");
  EXPECT_EQ(coordinator_->CancelJob(c).status().code(), absl::StatusCode::kNotFound);
  c.set_name("missing");
  EXPECT_EQ(coordinator_->CancelJob(c).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, DeleteRemovesOnlyFinishedJobs) {
  Job job = Submit(1);
  ::recfleet::v1::DeleteJobRequest d;
  d.set_name(job.name());
  EXPECT_EQ(coordinator_->DeleteJob(d).code(), absl::StatusCode::kFailedPrecondition);
  ::recfleet::v1::CancelJobRequest c;
  c.set_name(job.name());
  ASSERT_TRUE(coordinator_->CancelJob(c).ok());
  ASSERT_TRUE(coordinator_->DeleteJob(d).ok());
  ::recfleet::v1::GetJobRequest g;
  g.set_name(job.name());
  EXPECT_EQ(coordinator_->GetJob(g).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(coordinator_->ListJobs({}).value().jobs().empty());
  EXPECT_EQ(coordinator_->WatchSnapshot(job.name()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->DeleteJob(d).code(), absl::StatusCode::kNotFound);
  d.set_name("not-a-name");
  EXPECT_EQ(coordinator_->DeleteJob(d).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, GangWaitsForEnoughWorkers) {
  Job big = Submit(3);
  Job small = Submit(1);
  std::string w0 = Register("host-a");
  // The big job cannot start; the small one fits and is not blocked by it.
  EXPECT_EQ(Get(big.name()).status().state(), JobStatus::QUEUED);
  EXPECT_EQ(Get(small.name()).status().state(), JobStatus::SCHEDULING);
  Register("host-b");
  Register("host-c");
  EXPECT_EQ(Get(big.name()).status().state(), JobStatus::QUEUED);
  Register("host-d");
  EXPECT_EQ(Get(big.name()).status().state(), JobStatus::SCHEDULING);
}

TEST_F(CoordinatorTest, RendezvousIsFencedByEpoch) {
  Job job = Submit(1);
  std::string w = Register("host-a");
  int64_t epoch = StartRunning(job.name(), {w});
  ::recfleet::v1::KvSetRequest set;
  set.set_job(job.name());
  set.set_restart_epoch(epoch);
  set.set_key("nccl/unique_id");
  set.set_value("abc");
  set.set_worker_id(w);
  set.set_worker_credential(Cred(w));
  ASSERT_TRUE(coordinator_->KvSet(set).ok());
  ::recfleet::v1::KvGetRequest get;
  get.set_job(job.name());
  get.set_restart_epoch(epoch);
  get.set_key("nccl/unique_id");
  get.set_worker_id(w);
  get.set_worker_credential(Cred(w));
  EXPECT_EQ(coordinator_->KvGet(get)->value(), "abc");

  // The task fails; the next attempt has a fresh, empty namespace.
  Beat(w, job.name(), epoch, TaskStatus::FAILED, "boom");
  StartRunning(job.name(), {w});
  absl::StatusOr<::recfleet::v1::KvGetResponse> stale = coordinator_->KvGet(get);
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.status().message().find("stale restart_epoch 1, the job is at epoch 2"),
            std::string::npos)
      << stale.status();
  get.set_restart_epoch(2);
  EXPECT_EQ(coordinator_->KvGet(get).status().code(), absl::StatusCode::kNotFound);

  ::recfleet::v1::KvWaitRequest wait;
  wait.set_job(job.name());
  wait.set_restart_epoch(2);
  wait.add_keys("a");
  wait.add_keys("b");
  wait.set_worker_id(w);
  wait.set_worker_credential(Cred(w));
  absl::Notification done;
  absl::StatusOr<::recfleet::v1::KvWaitResponse> result;
  coordinator_->KvWait(wait, [&](absl::StatusOr<::recfleet::v1::KvWaitResponse> r) {
    result = std::move(r);
    done.Notify();
  });
  set.set_restart_epoch(2);
  set.set_key("b");
  set.set_value("2");
  ASSERT_TRUE(coordinator_->KvSet(set).ok());
  EXPECT_FALSE(done.HasBeenNotified());
  set.set_key("a");
  set.set_value("1");
  ASSERT_TRUE(coordinator_->KvSet(set).ok());
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->values(0).value(), "1");
  EXPECT_EQ(result->values(1).value(), "2");

  wait.clear_keys();
  wait.add_keys("never");
  wait.mutable_timeout()->set_nanos(50000000);
  absl::Notification timed_out;
  coordinator_->KvWait(wait, [&](absl::StatusOr<::recfleet::v1::KvWaitResponse> r) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
    timed_out.Notify();
  });
  EXPECT_TRUE(timed_out.WaitForNotificationWithTimeout(absl::Seconds(5)));
}

// Job B's worker, though registered and authenticated, can neither read nor
// write job A's rendezvous keys (e.g. its Gloo addresses); nor can an idle
// worker.
TEST_F(CoordinatorTest, RendezvousKeysAreOpenOnlyToTheJobsWorkers) {
  Job a = Submit(1);
  std::string wa = Register("host-a");
  int64_t epoch_a = StartRunning(a.name(), {wa});
  Job b = Submit(1);
  std::string wb = Register("host-b");
  StartRunning(b.name(), {wb});
  std::string idle = Register("host-c");

  const std::vector<absl::StatusCode> ok(3, absl::StatusCode::kOk);
  const std::vector<absl::StatusCode> denied(3, absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(KvCodes(wa, Cred(wa), a.name(), epoch_a, "gloo/0"), ok);
  EXPECT_EQ(KvCodes(wb, Cred(wb), a.name(), epoch_a, "gloo/0"), denied);
  EXPECT_EQ(KvCodes(idle, Cred(idle), a.name(), epoch_a, "gloo/0"), denied);
  // Job A's value is its own worker's, not overwritten by the intruders.
  ::recfleet::v1::KvGetRequest own;
  own.set_job(a.name());
  own.set_restart_epoch(epoch_a);
  own.set_key("gloo/0");
  own.set_worker_id(wa);
  own.set_worker_credential(Cred(wa));
  EXPECT_EQ(coordinator_->KvGet(own)->value(), "from " + wa);
}

TEST_F(CoordinatorTest, RestartKeepsJobsAndRunningWorkersReattach) {
  const std::string db = TempDb("coordinator_restart.db");
  Start(db);
  Job running = Submit(1);
  std::string w = Register("host-a", "worker-a");
  int64_t epoch = StartRunning(running.name(), {w});
  Job queued = Submit(5);
  Job cancelled = Submit(5);
  ::recfleet::v1::CancelJobRequest c;
  c.set_name(cancelled.name());
  ASSERT_TRUE(coordinator_->CancelJob(c).ok());

  Start(db);  // The coordinator restarts on the same database.
  EXPECT_EQ(Get(running.name()).status().state(), JobStatus::RUNNING);
  EXPECT_EQ(Get(queued.name()).status().state(), JobStatus::QUEUED);
  EXPECT_EQ(Get(cancelled.name()).status().state(), JobStatus::CANCELLED);
  ::recfleet::v1::HeartbeatRequest hb;
  hb.set_worker_id(w);
  hb.set_worker_credential(Cred(w));
  EXPECT_EQ(coordinator_->Heartbeat(hb).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Register("host-a", "worker-a"), "worker-a");
  HeartbeatResponse r = Beat(w, running.name(), epoch, TaskStatus::RUNNING);
  EXPECT_EQ(r.commands_size(), 0);
  // Past the re-registration deadline the job keeps running: its worker is back.
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(5));
    Beat(w, running.name(), epoch, TaskStatus::RUNNING);
    coordinator_->Tick();
  }
  EXPECT_EQ(Get(running.name()).status().state(), JobStatus::RUNNING);
  Finish(w, running.name(), epoch);
  EXPECT_EQ(Get(running.name()).status().state(), JobStatus::SUCCEEDED);

  // Without the worker coming back, the recovered job restarts after a lease.
  const std::string db2 = TempDb("coordinator_restart2.db");
  Start(db2);
  Job second = Submit(1);
  std::string w2 = Register("host-b", "worker-b");
  StartRunning(second.name(), {w2});
  Start(db2);
  clock_.Advance(absl::Seconds(11));
  coordinator_->Tick();
  EXPECT_EQ(Get(second.name()).status().state(), JobStatus::RESTARTING);
}

TEST_F(CoordinatorTest, WatchSeesStateChangesInOrder) {
  Job job = Submit(1);
  absl::StatusOr<Coordinator::JobEvent> snap = coordinator_->WatchSnapshot(job.name());
  ASSERT_TRUE(snap.ok());
  EXPECT_EQ(snap->second.kind(), WatchJobResponse::SNAPSHOT);
  int64_t after = snap->first;
  std::vector<JobState> seen;
  std::thread watcher([&] {
    while (seen.empty() || !IsTerminal(seen.back())) {
      auto events =
          coordinator_->WaitJobEvents(job.name(), after, absl::Now() + absl::Seconds(10));
      ASSERT_TRUE(events.ok());
      ASSERT_FALSE(events->empty()) << "timed out";
      for (const auto& [seq, e] : *events) {
        after = seq;
        if (e.kind() == WatchJobResponse::STATE_CHANGE) seen.push_back(e.transition().to());
      }
    }
  });
  std::string w = Register("host-a");
  StartRunning(job.name(), {w});
  ::recfleet::v1::CancelJobRequest c;
  c.set_name(job.name());
  ASSERT_TRUE(coordinator_->CancelJob(c).ok());
  watcher.join();
  EXPECT_EQ(seen, std::vector<JobState>({JobStatus::SCHEDULING, JobStatus::RUNNING,
                                         JobStatus::CANCELLED}));
  // A watcher starting late finds the job terminal in its snapshot.
  EXPECT_EQ(coordinator_->WatchSnapshot(job.name())->second.job().status().state(),
            JobStatus::CANCELLED);
}

// ---------------------------------------------------------------------------
// Planning from a job's dataset: read once per job, never under the lock.
// ---------------------------------------------------------------------------

// Writes `rows` rows to `path` whose "history" (the test spec's sequence
// feature) holds r % 41 items: lengths 0..40, mean 20, far below its cap of
// 512, so a plan priced at the cap differs from one priced at the file.
void WriteHistories(const std::string& path, int rows) {
  data::Schema schema;
  schema.features = {{"history", data::DType::kInt64, data::Layout::kJagged, "items"}};
  data::Batch batch(std::make_shared<const data::Schema>(schema));
  for (int r = 0; r < rows; ++r) {
    const std::vector<int64_t> items(r % 41, r);
    batch.AddJaggedInt64(0, items.data(), items.size());
    ASSERT_TRUE(batch.CommitRow().ok());
  }
  data::WriterOptions o;
  o.max_rows_per_block = 100;
  auto w = data::DatasetWriter::Create(path, batch.schema(), o);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE((*w)->Write(batch).ok());
  ASSERT_TRUE((*w)->Close().ok());
}

// Bytes that are no dataset file, where a dataset's training file belongs.
void WriteGarbage(const std::string& path) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << std::string(4096, '\x5a');
}

// A CPU rate table with memory terms: the planner prices a CPU job with it
// from the dataset's lengths and eval set, so the coordinator reads them.
engine::StepRates CpuRates() {
  engine::StepRates cpu;
  cpu.device = "cpu";
  cpu.gemm_flops_per_s = 2e9;
  cpu.attention_flops_per_s = 1e9;
  cpu.seconds_per_step = 1e-3;
  cpu.seconds_per_token_element = 1e-9;
  cpu.fixed_bytes = 8 << 20;
  cpu.bytes_per_token_element = 40;
  cpu.bytes_per_dense_element = 8;
  return cpu;
}

class PlanningDataTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    dir_ = std::string(testing::TempDir()) + "/coordinator_dataset";
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    WriteHistories(dir_ + "/train.rfd", 4100);
    WriteHistories(dir_ + "/eval.rfd", 700);
    configure_ = [this](CoordinatorOptions& o) {
      o.step_rates = {CpuRates()};
      // The real reader, counted, and held at `gate_` while one is set.
      o.planning_data_reader = [this, read = PlanningDatasetReader(o.step_rates, o.data_root)](
                                   const ::recfleet::v1::JobSpec& spec) {
        ++reads_;
        if (absl::Notification* gate = gate_.load(); gate != nullptr) {
          reading_.Notify();
          gate->WaitForNotification();
        }
        return read(spec);
      };
    };
    Start(":memory:");
  }

  // The test spec as a CPU job over `dataset` (default: the test's files).
  ::recfleet::v1::JobSpec CpuSpec(int workers, const std::string& dataset = "") {
    ::recfleet::v1::JobSpec spec = BuildableSpec(workers);
    spec.mutable_resources()->set_gpus_per_worker(0);
    spec.mutable_data()->set_dataset(dataset.empty() ? dir_ : dataset);
    return spec;
  }

  Job Create(const ::recfleet::v1::JobSpec& spec) {
    ::recfleet::v1::CreateJobRequest r;
    *r.mutable_spec() = spec;
    absl::StatusOr<Job> job = coordinator_->CreateJob(r);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : Job();
  }

  std::string dir_;
  std::atomic<int> reads_{0};
  std::atomic<absl::Notification*> gate_{nullptr};
  absl::Notification reading_;
};

// While one job's dataset is being read (held open by the reader here), the
// worker and job APIs and the control loop answer: none waits for the read.
TEST_F(PlanningDataTest, RpcsAreServedWhileAJobsDatasetIsRead) {
  const std::string w0 = Register("host-a", "", "", 64 << 20), w1 = Register("host-b", "", "", 64 << 20);
  const Job waiting = Create(CpuSpec(5));  // More workers than there are: stays QUEUED.
  absl::Notification release;
  gate_ = &release;
  Job created;
  std::thread creator([&] { created = Create(CpuSpec(2)); });
  ASSERT_TRUE(reading_.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::future<void> rpcs = std::async(std::launch::async, [&] {
    EXPECT_EQ(AssignmentOf(Beat(w0)), nullptr);
    EXPECT_EQ(Get(waiting.name()).status().state(), JobStatus::QUEUED);
    EXPECT_EQ(coordinator_->ListJobs({}).value().jobs_size(), 1);
    EXPECT_TRUE(coordinator_->WatchSnapshot(waiting.name()).ok());
    EXPECT_EQ(coordinator_->ListWorkers().workers_size(), 2);
    Register("host-c");
    coordinator_->Tick();
  });
  // Had any of them waited on the read, it would still be waiting: the read
  // is released only after this.
  const bool answered = rpcs.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  EXPECT_FALSE(release.HasBeenNotified());
  release.Notify();
  creator.join();
  rpcs.wait();
  EXPECT_TRUE(answered) << "an RPC waited for a job's dataset to be read";
  gate_ = nullptr;

  // The read job was then placed and planned, from that one read.
  const Job placed = Get(created.name());
  EXPECT_EQ(placed.status().state(), JobStatus::SCHEDULING) << placed.status().DebugString();
  EXPECT_EQ(placed.status().plan_summary().rfind("plan: FSDP", 0), 0u) << placed.status().plan_summary();
  EXPECT_GT(placed.status().predicted_step_seconds(), 0);
  EXPECT_GT(placed.status().predicted_peak_memory_bytes(), 64 << 20);
  EXPECT_EQ(reads_, 2);
  // Placed again after its workers were lost, it is planned again from that
  // read: nothing is read under the lock.
  clock_.Advance(absl::Seconds(11));
  coordinator_->Tick();
  EXPECT_EQ(Get(created.name()).status().state(), JobStatus::QUEUED);
  Register("host-d");
  Register("host-e");
  EXPECT_EQ(Get(created.name()).status().state(), JobStatus::SCHEDULING);
  EXPECT_EQ(Get(created.name()).status().predicted_step_seconds(), placed.status().predicted_step_seconds());
  EXPECT_EQ(reads_, 2);
}

// The plan a job gets from the data read at creation (and again after a
// coordinator restart) is the plan of the planner reading the dataset
// itself: same predicted step and peak; and it is priced at the file's
// lengths, not the cap.
TEST_F(PlanningDataTest, PlanFromTheReadDataIsThePlannersOwnAcrossARestart) {
  const std::string db = TempDb("coordinator_planning.db");
  Start(db);
  const ::recfleet::v1::JobSpec spec = CpuSpec(2);
  const Job job = Create(spec);
  EXPECT_EQ(job.status().state(), JobStatus::QUEUED);
  Start(db);  // Recovered: its data is read again, before RPCs are served.
  EXPECT_EQ(reads_, 2);
  const int64_t resident = 96 << 20;
  const std::string w0 = Register("host-a", "", "", resident), w1 = Register("host-b", "", "", resident);
  const Job placed = Get(job.name());
  ASSERT_EQ(placed.status().state(), JobStatus::SCHEDULING) << placed.status().DebugString();
  EXPECT_EQ(reads_, 2);

  Placement p;
  p.ranks_per_worker = 1;
  for (const std::string& id : placed.status().workers()) {
    WorkerView v;
    v.id = id;
    v.topology.set_node(id == w0 ? "host-a" : "host-b");
    v.resident_memory_bytes = resident;
    p.workers.push_back(v);
  }
  ASSERT_EQ(p.workers.size(), 2u);
  const engine::StepRates cpu = CpuRates();
  absl::StatusOr<planner::Plan> plan = PlanPlacement(spec, p, DefaultHardware(), &cpu);
  ASSERT_TRUE(plan.ok()) << plan.status();
  absl::StatusOr<double> peak = CpuRankPeakBytes(spec, cpu, resident);
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_DOUBLE_EQ(placed.status().predicted_step_seconds(), plan->step.total_s);
  EXPECT_EQ(placed.status().predicted_peak_memory_bytes(), static_cast<int64_t>(*peak));
  absl::StatusOr<GroupPlan> direct = PlanningGroupPlanner(DefaultHardware(), {cpu})(spec, p);
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(placed.status().plan_summary(), direct->summary);
  EXPECT_EQ(static_cast<int64_t>(direct->predicted_peak_bytes), placed.status().predicted_peak_memory_bytes());

  // Priced at the histories' cap instead (no file there), the step is longer
  // and the peak higher: the coordinator's plan came from the file.
  absl::StatusOr<planner::Plan> capped =
      PlanPlacement(CpuSpec(2, dir_ + "/absent"), p, DefaultHardware(), &cpu);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_LT(placed.status().predicted_step_seconds(), capped->step.total_s);
  absl::StatusOr<double> capped_peak = CpuRankPeakBytes(CpuSpec(2, dir_ + "/absent"), cpu, resident);
  ASSERT_TRUE(capped_peak.ok());
  EXPECT_LT(placed.status().predicted_peak_memory_bytes(), static_cast<int64_t>(*capped_peak));
}

// A dataset that is there but cannot be read is refused at CreateJob and
// PlanJob with the file and the cause; other jobs and the workers are
// untouched. A retry of a request whose job was created before its dataset
// broke returns that job, and a recovered job whose dataset broke while the
// coordinator was down fails, as a job the planner cannot fit does.
TEST_F(PlanningDataTest, UnreadableDatasetIsRefusedWithItsCause) {
  const std::string bad = std::string(testing::TempDir()) + "/coordinator_bad_dataset";
  std::filesystem::remove_all(bad);
  std::filesystem::create_directories(bad);
  WriteGarbage(bad + "/train.rfd");
  const std::string w0 = Register("host-a");
  // Refused at CreateJob with the cause; nothing is created.
  ::recfleet::v1::CreateJobRequest create;
  *create.mutable_spec() = CpuSpec(1, bad);
  create.set_request_id("unreadable-1");
  absl::StatusOr<Job> refused = coordinator_->CreateJob(create);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("dataset '" + bad + "/train.rfd' cannot be read for planning: "),
            std::string::npos)
      << refused.status();
  EXPECT_EQ(coordinator_->ListJobs({}).value().jobs_size(), 0);
  ::recfleet::v1::PlanJobRequest plan;
  *plan.mutable_spec() = CpuSpec(1, bad);
  absl::StatusOr<::recfleet::v1::PlanJobResponse> planned = coordinator_->PlanJob(plan);
  EXPECT_EQ(planned.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(planned.status().message().find(bad + "/train.rfd' cannot be read for planning"), std::string::npos)
      << planned.status();
  // The worker stays free: the next job is placed on it.
  const Job good = Create(CpuSpec(1));
  EXPECT_EQ(good.status().state(), JobStatus::SCHEDULING) << good.status().DebugString();
  const HeartbeatResponse reply = Beat(w0);
  const Assignment* a = AssignmentOf(reply);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->job(), good.name());

  const std::string db = TempDb("coordinator_unreadable.db");
  Start(db);
  const std::string breaks = std::string(testing::TempDir()) + "/coordinator_breaking_dataset";
  std::filesystem::remove_all(breaks);
  std::filesystem::create_directories(breaks);
  WriteHistories(breaks + "/train.rfd", 500);
  ::recfleet::v1::CreateJobRequest first;
  *first.mutable_spec() = CpuSpec(2, breaks);
  first.set_request_id("breaks-1");
  const Job queued = coordinator_->CreateJob(first).value();
  const Job other = Create(CpuSpec(2));
  WriteGarbage(breaks + "/train.rfd");
  // A retry of the request that created the job still returns it, without
  // reading the dataset again.
  const int reads_before_retry = reads_;
  absl::StatusOr<Job> retried = coordinator_->CreateJob(first);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->name(), queued.name());
  EXPECT_EQ(reads_, reads_before_retry);
  Start(db);
  EXPECT_EQ(Get(queued.name()).status().state(), JobStatus::QUEUED);
  Register("host-b");
  Register("host-c");
  const Job recovered = Get(queued.name());
  EXPECT_EQ(recovered.status().state(), JobStatus::FAILED);
  EXPECT_EQ(recovered.status().reason(), "PlanFailed");
  EXPECT_NE(recovered.status().message().find(breaks + "/train.rfd' cannot be read for planning"),
            std::string::npos)
      << recovered.status().message();
  coordinator_->Tick();  // The workers it was offered go to the next job.
  EXPECT_EQ(Get(other.name()).status().state(), JobStatus::SCHEDULING);
}

}  // namespace
}  // namespace recfleet::coordinator
