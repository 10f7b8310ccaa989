#include "cli/jobs/job_format.h"

#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;

Job Sample() {
  Job j;
  j.set_name("jobs/j123");
  j.mutable_spec()->set_display_name("gemlite-demo");
  j.mutable_spec()->mutable_resources()->set_workers(2);
  j.mutable_spec()->mutable_training()->set_steps(200);
  j.mutable_status()->set_state(JobStatus::RUNNING);
  j.mutable_status()->set_reason("AllRanksStarted");
  j.mutable_status()->mutable_create_time()->set_seconds(1700000000);
  auto* p = j.mutable_status()->mutable_progress();
  p->set_step(120);
  p->set_samples(61440);
  p->set_loss(0.5123);
  p->set_samples_per_second(2048);
  p->set_step_seconds(0.25);
  p->set_straggler_gap(0.041);
  p->set_slowest_rank(1);
  return j;
}

TEST(JobFormatTest, EventTableHasOneRowPerTransition) {
  std::vector<::recfleet::v1::JobTransition> events(2);
  events[0].set_to(JobStatus::QUEUED);
  events[0].set_reason("Created");
  events[0].mutable_time()->set_seconds(1700000000);
  events[1].set_from(JobStatus::QUEUED);
  events[1].set_to(JobStatus::SCHEDULING);
  events[1].set_restart_epoch(1);
  events[1].set_reason("Placed");
  events[1].set_message("2 workers");
  events[1].mutable_time()->set_seconds(1700000061);
  EXPECT_EQ(FormatEventTable(events),
            "TIME                     FROM    TO          EPOCH  REASON   MESSAGE\n"
            "2023-11-14 22:13:20 UTC  -       QUEUED      0      Created  -\n"
            "2023-11-14 22:14:21 UTC  QUEUED  SCHEDULING  1      Placed   2 workers\n");
}

TEST(JobFormatTest, WorkerTableShowsGpusPlacementAndLease) {
  std::vector<::recfleet::v1::WorkerInfo> workers(2);
  workers[0].set_worker_id("w-1");
  workers[0].set_host("10.0.0.5");
  for (int i = 0; i < 8; ++i) workers[0].add_gpus()->set_name("NVIDIA H200");
  workers[0].mutable_topology()->set_node("node-1");
  workers[0].mutable_topology()->set_nvlink_domain("nvl-a");
  workers[0].set_state(::recfleet::v1::WorkerInfo::ASSIGNED);
  workers[0].set_job("jobs/j1");
  workers[0].set_rank(8);
  workers[0].mutable_task()->set_phase(::recfleet::v1::TaskStatus::RUNNING);
  workers[0].mutable_lease_expire_time()->set_seconds(1700000012);
  workers[1].set_worker_id("w-2");
  workers[1].set_host("cpu-host");
  workers[1].set_state(::recfleet::v1::WorkerInfo::IDLE);
  workers[1].mutable_lease_expire_time()->set_seconds(1699999999);  // Already past.
  EXPECT_EQ(FormatWorkerTable(workers, absl::FromUnixSeconds(1700000010)),
            "WORKER  HOST      GPUS    NODE    NVLINK  ZONE  STATE     JOB      RANK  TASK     "
            "LEASE_LEFT\n"
            "w-1     10.0.0.5  8xH200  node-1  nvl-a   -     ASSIGNED  jobs/j1  8     RUNNING  "
            "2.0s\n"
            "w-2     cpu-host  cpu     -       -       -     IDLE      -        -     -        "
            "0.0s\n");
}

TEST(JobFormatTest, TableAlignsColumns) {
  Job other = Sample();
  other.set_name("jobs/jlonger-name");
  other.mutable_status()->set_state(JobStatus::QUEUED);
  EXPECT_EQ(FormatJobTable({Sample(), other}),
            "NAME               DISPLAY_NAME  STATE    STEP     WORKERS  CREATED                  "
            "REASON\n"
            "jobs/j123          gemlite-demo  RUNNING  120/200  2        2023-11-14 22:13:20 UTC  "
            "AllRanksStarted\n"
            "jobs/jlonger-name  gemlite-demo  QUEUED   120/200  2        2023-11-14 22:13:20 UTC  "
            "AllRanksStarted\n");
}

TEST(JobFormatTest, DetailShowsStateProgressAndStragglers) {
  std::string d = FormatJobDetail(Sample());
  EXPECT_NE(d.find("state:         RUNNING (AllRanksStarted)\n"), std::string::npos) << d;
  EXPECT_NE(d.find("progress:      step 120/200, 61440 samples, loss 0.5123, 2048.0 samples/s"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("slowest rank 1, straggler gap 4.1%"), std::string::npos) << d;
  EXPECT_NE(d.find("ended:         -\n"), std::string::npos) << d;
  EXPECT_NE(d.find("plan:          -\n"), std::string::npos) << d;
}

TEST(JobFormatTest, DetailShowsThePlanSummary) {
  Job job = Sample();
  job.mutable_status()->set_plan_summary("plan: FSDP 1 x 2 replicas; V1 tables over groups of 2");
  std::string d = FormatJobDetail(job);
  EXPECT_NE(d.find("plan:          plan: FSDP 1 x 2 replicas; V1 tables over groups of 2\n"),
            std::string::npos)
      << d;
}

TEST(JobFormatTest, DetailShowsPredictedAndMeasuredSideBySide) {
  Job job = Sample();  // Measured step 0.25 s.
  job.mutable_status()->set_predicted_step_seconds(0.2);
  job.mutable_status()->set_predicted_peak_memory_bytes(int64_t{3} << 30);
  job.mutable_status()->mutable_progress()->set_peak_memory_bytes(int64_t{4} << 30);
  std::string d = FormatJobDetail(job);
  EXPECT_NE(d.find("step vs plan:  predicted 200.0 ms, measured 250.0 ms (error -20.0%)\n"),
            std::string::npos)
      << d;
  EXPECT_NE(d.find("memory vs plan: predicted 3.0 GiB peak per rank, measured 4.0 GiB peak per rank "
                   "(error -25.0%)\n"),
            std::string::npos)
      << d;
  // A CPU rank's peak, below a GiB, in MiB.
  job.mutable_status()->set_predicted_peak_memory_bytes(int64_t{210} << 20);
  job.mutable_status()->mutable_progress()->set_peak_memory_bytes(int64_t{200} << 20);
  d = FormatJobDetail(job);
  EXPECT_NE(d.find("memory vs plan: predicted 210.0 MiB peak per rank, measured 200.0 MiB peak per rank "
                   "(error +5.0%)\n"),
            std::string::npos)
      << d;
}

TEST(JobFormatTest, WatchLinesAndJson) {
  ::recfleet::v1::WatchJobResponse e;
  e.set_kind(::recfleet::v1::WatchJobResponse::STATE_CHANGE);
  e.mutable_transition()->set_to(JobStatus::SCHEDULING);
  e.mutable_transition()->set_reason("GangPlaced");
  e.mutable_transition()->set_message("2 worker(s), epoch 1");
  e.mutable_transition()->mutable_time()->set_seconds(1700000000);
  EXPECT_EQ(FormatWatchEvent(e),
            "2023-11-14 22:13:20 UTC  SCHEDULING  GangPlaced: 2 worker(s), epoch 1");
  std::string json = ToJson(e, false);
  EXPECT_EQ(json.find('\n'), std::string::npos);
  EXPECT_NE(json.find("\"kind\":\"STATE_CHANGE\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"to\":\"SCHEDULING\""), std::string::npos) << json;
}

TEST(ListFilterTest, SelectorPairsBecomeQuotedLabelTerms) {
  EXPECT_EQ(*ListFilter("", ""), "");
  EXPECT_EQ(*ListFilter("", "team=ranking"), "labels.team = \"ranking\"");
  EXPECT_EQ(*ListFilter("labels.a = b", "team=rank ing, owner=a\"b"),
            "labels.a = b AND labels.team = \"rank ing\" AND labels.owner = \"a\\\"b\"");
  EXPECT_EQ(ListFilter("", "team").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ListFilter("", "=x").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recfleet::cli
