#include "services/coordinator/job_store.h"

#include <cstdio>

#include "gtest/gtest.h"
#include "services/coordinator/test_specs.h"
#include "services/coordinator/time_util.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::Job;
using ::recfleet::v1::JobStatus;
using ::recfleet::v1::JobTransition;

std::string TempDb(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  return path;
}

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// Moves `job` to `to`, as the coordinator does.
absl::Status Move(JobStore& store, Job& job, JobState to, const std::string& reason) {
  JobTransition t;
  t.set_from(job.status().state());
  t.set_to(to);
  t.set_reason(reason);
  ToProto(kT0, t.mutable_time());
  JobStatus next = job.status();
  next.set_state(to);
  next.set_reason(reason);
  absl::StatusOr<std::string> id = ParseJobName(job.name(), "name");
  absl::Status s = store.RecordTransition(*id, next, t);
  if (s.ok()) *job.mutable_status() = next;
  return s;
}

TEST(JobStoreTest, ReopenAfterRestartKeepsJobsAndTransitions) {
  std::string path = TempDb("reopen.db");
  std::string id;
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    bool created;
    absl::StatusOr<Job> job = (*store)->Create(ValidSpec(), "req-1", kT0, &created);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_TRUE(created);
    id = *ParseJobName(job->name(), "name");
    ASSERT_TRUE(Move(**store, *job, JobStatus::SCHEDULING, "GangPlaced").ok());
    ASSERT_TRUE(Move(**store, *job, JobStatus::RUNNING, "AllRanksStarted").ok());
    JobStatus progressed = job->status();
    progressed.mutable_progress()->set_step(42);
    ASSERT_TRUE((*store)->SaveStatus(id, progressed).ok());
    // The store is dropped without any shutdown step, like a killed process.
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<Job> job = (*store)->Get(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->status().state(), JobStatus::RUNNING);
  EXPECT_EQ(job->status().progress().step(), 42);
  EXPECT_EQ(job->spec().display_name(), "gemlite-test");
  absl::StatusOr<std::vector<JobTransition>> ts = (*store)->Transitions(id);
  ASSERT_TRUE(ts.ok());
  ASSERT_EQ(ts->size(), 3u);
  EXPECT_EQ((*ts)[0].to(), JobStatus::QUEUED);
  EXPECT_EQ((*ts)[1].to(), JobStatus::SCHEDULING);
  EXPECT_EQ((*ts)[2].reason(), "AllRanksStarted");
  // The reopened store still deduplicates by request_id.
  bool created = true;
  absl::StatusOr<Job> again = (*store)->Create(ValidSpec(), "req-1", kT0, &created);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(again->name(), JobName(id));
  absl::StatusOr<std::vector<Job>> active = (*store)->ActiveJobs();
  ASSERT_TRUE(active.ok());
  ASSERT_EQ(active->size(), 1u);
}

TEST(JobStoreTest, EveryLegalTransitionIsRecordedAndIllegalOnesRefused) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  // Paths that together take every legal transition at least once.
  const std::vector<std::vector<JobState>> paths = {
      {JobStatus::SCHEDULING, JobStatus::RUNNING, JobStatus::SUCCEEDED},
      {JobStatus::SCHEDULING, JobStatus::QUEUED, JobStatus::CANCELLED},
      {JobStatus::SCHEDULING, JobStatus::FAILED},
      {JobStatus::SCHEDULING, JobStatus::CANCELLED},
      {JobStatus::SCHEDULING, JobStatus::RUNNING, JobStatus::FAILED},
      {JobStatus::SCHEDULING, JobStatus::RUNNING, JobStatus::CANCELLED},
      {JobStatus::SCHEDULING, JobStatus::RUNNING, JobStatus::RESTARTING, JobStatus::SCHEDULING,
       JobStatus::RUNNING, JobStatus::RESTARTING, JobStatus::FAILED},
      {JobStatus::SCHEDULING, JobStatus::RUNNING, JobStatus::RESTARTING, JobStatus::CANCELLED},
  };
  std::set<std::pair<int, int>> taken;
  for (const auto& path : paths) {
    bool created;
    absl::StatusOr<Job> job = (*store)->Create(ValidSpec(), "", kT0, &created);
    ASSERT_TRUE(job.ok());
    for (JobState to : path) {
      taken.insert({job->status().state(), to});
      ASSERT_TRUE(Move(**store, *job, to, "Test").ok())
          << StateName(job->status().state()) << " -> " << StateName(to);
    }
    absl::StatusOr<std::vector<JobTransition>> ts =
        (*store)->Transitions(*ParseJobName(job->name(), "name"));
    ASSERT_EQ(ts->size(), path.size() + 1);
    // The terminal job refuses everything, naming the rule.
    absl::Status s = Move(**store, *job, JobStatus::RUNNING, "Again");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("illegal transition"), std::string::npos) << s;
  }
  int legal = 0;
  for (JobState s : AllStates()) legal += NextStates(s).size();
  EXPECT_EQ(static_cast<int>(taken.size()), legal);

  bool created;
  absl::StatusOr<Job> job = (*store)->Create(ValidSpec(), "", kT0, &created);
  absl::Status s = Move(**store, *job, JobStatus::RUNNING, "Skip");
  EXPECT_EQ(s.message(),
            job->name() + ": illegal transition QUEUED -> RUNNING; from QUEUED the job may go to "
                          "SCHEDULING, CANCELLED");
  // A transition from a state the job is not in is refused too.
  JobTransition stale;
  stale.set_from(JobStatus::SCHEDULING);
  stale.set_to(JobStatus::RUNNING);
  JobStatus st = job->status();
  st.set_state(JobStatus::RUNNING);
  s = (*store)->RecordTransition(*ParseJobName(job->name(), "n"), st, stale);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // SaveStatus cannot sneak in a state change.
  s = (*store)->SaveStatus(*ParseJobName(job->name(), "n"), st);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(JobStoreTest, RequestIdMakesCreateIdempotent) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  bool created;
  absl::StatusOr<Job> a = (*store)->Create(ValidSpec(), "same", kT0, &created);
  ASSERT_TRUE(created);
  absl::StatusOr<Job> b = (*store)->Create(ValidSpec(), "same", kT0, &created);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(a->name(), b->name());
  absl::StatusOr<JobStore::Page> page = (*store)->List(10, "", {});
  EXPECT_EQ(page->jobs.size(), 1u);
  absl::StatusOr<Job> c = (*store)->Create(ValidSpec(3), "same", kT0, &created);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kAlreadyExists);
  // FindCreated answers as Create would for a stored request_id, and
  // creates nothing for one that is not stored.
  absl::StatusOr<std::optional<Job>> found = (*store)->FindCreated(ValidSpec(), "same");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->name(), a->name());
  EXPECT_EQ((*store)->FindCreated(ValidSpec(3), "same").status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*store)->FindCreated(ValidSpec(), "same", "other-id").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE((*store)->FindCreated(ValidSpec(), "new").value().has_value());
  EXPECT_FALSE((*store)->FindCreated(ValidSpec(), "").value().has_value());
  // Jobs without request_id never collide.
  ASSERT_TRUE((*store)->Create(ValidSpec(), "", kT0, &created).ok());
  ASSERT_TRUE((*store)->Create(ValidSpec(), "", kT0, &created).ok());
  EXPECT_EQ((*store)->List(10, "", {})->jobs.size(), 3u);
}

TEST(JobStoreTest, ListPagesNewestFirstAndFiltersByState) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) {
    bool created;
    absl::StatusOr<Job> job = (*store)->Create(ValidSpec(), "", kT0, &created);
    if (i % 2 == 0) {
      ASSERT_TRUE(Move(**store, *job, JobStatus::CANCELLED, "Test").ok());
    }
    names.push_back(job->name());
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    absl::StatusOr<JobStore::Page> page = (*store)->List(3, token, {});
    ASSERT_TRUE(page.ok()) << page.status();
    for (const Job& j : page->jobs) seen.push_back(j.name());
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  std::vector<std::string> newest_first(names.rbegin(), names.rend());
  EXPECT_EQ(seen, newest_first);
  absl::StatusOr<JobStore::Page> cancelled = (*store)->List(100, "", JobStore::Query{{JobStatus::CANCELLED}, {}});
  EXPECT_EQ(cancelled->jobs.size(), 4u);
  EXPECT_EQ((*store)->List(10, "garbage", {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto counts = (*store)->CountByState();
  ASSERT_TRUE(counts.ok());
  for (const auto& [state, n] : *counts) {
    if (state == JobStatus::QUEUED) {
      EXPECT_EQ(n, 3);
    }
    if (state == JobStatus::CANCELLED) {
      EXPECT_EQ(n, 4);
    }
  }
}

// Pages end before ~max_bytes, so large specs cannot make a page too big
// for one gRPC message; following the tokens still yields every job.
TEST(JobStoreTest, ListPagesAreBoundedInBytes) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  ::recfleet::v1::JobSpec big = ValidSpec();
  (*big.mutable_labels())["padding"] = std::string(300 << 10, 'x');
  for (int i = 0; i < 5; ++i) {
    bool created;
    ASSERT_TRUE((*store)->Create(big, "", kT0, &created).ok());
  }
  std::vector<size_t> sizes;
  std::string token;
  do {
    absl::StatusOr<JobStore::Page> page = (*store)->List(50, token, {});
    ASSERT_TRUE(page.ok()) << page.status();
    int64_t bytes = 0;
    for (const Job& j : page->jobs) bytes += j.ByteSizeLong();
    EXPECT_LE(bytes, 1 << 20);
    sizes.push_back(page->jobs.size());
    token = page->next_page_token;
  } while (!token.empty());
  EXPECT_EQ(sizes, std::vector<size_t>({3, 2}));
  // One job larger than the bound still comes back, alone.
  absl::StatusOr<JobStore::Page> tiny = (*store)->List(50, "", {}, /*max_bytes=*/1000);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->jobs.size(), 1u);
  EXPECT_FALSE(tiny->next_page_token.empty());
}

TEST(JobStoreTest, ChosenJobIdsAreUsedOnceAndBoundToTheirRequestId) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  bool created;
  absl::StatusOr<Job> a = (*store)->Create(ValidSpec(), "r1", kT0, &created, "nightly-ctr");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->name(), "jobs/nightly-ctr");
  EXPECT_EQ((*store)->Get("nightly-ctr")->name(), "jobs/nightly-ctr");
  // Another request for the same id: ALREADY_EXISTS naming it.
  absl::StatusOr<Job> b = (*store)->Create(ValidSpec(), "r2", kT0, &created, "nightly-ctr");
  EXPECT_EQ(b.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(b.status().message().find("jobs/nightly-ctr already exists"), std::string::npos);
  // A retry of the first request returns its job; the same request_id asking
  // for another id is refused.
  EXPECT_EQ((*store)->Create(ValidSpec(), "r1", kT0, &created, "nightly-ctr")->name(),
            "jobs/nightly-ctr");
  EXPECT_FALSE(created);
  EXPECT_EQ((*store)->Create(ValidSpec(), "r1", kT0, &created, "other").status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(ValidateJobId("").ok());
  EXPECT_TRUE(ValidateJobId("a").ok());
  EXPECT_TRUE(ValidateJobId("ctr-2026-12-01").ok());
  for (const char* bad : {"1abc", "-abc", "abc-", "Abc", "a_b", "a.b",
                          "a234567890123456789012345678901234567890123456789012345678901234"}) {
    EXPECT_EQ(ValidateJobId(bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Label filters select inside the spec; pages of a filtered listing still
// hold page_size matches, and a token only continues the listing (states and
// labels) that issued it.
TEST(JobStoreTest, ListFiltersByLabelsWithTokensBoundToTheQuery) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  std::vector<std::string> ranking;
  for (int i = 0; i < 9; ++i) {
    ::recfleet::v1::JobSpec spec = ValidSpec();
    (*spec.mutable_labels())["team"] = i % 3 == 0 ? "ranking" : "ads";
    bool created;
    absl::StatusOr<Job> job = (*store)->Create(spec, "", kT0, &created);
    ASSERT_TRUE(job.ok());
    if (i % 3 == 0) ranking.insert(ranking.begin(), job->name());
  }
  JobStore::Query q;
  q.labels["team"] = "ranking";
  absl::StatusOr<JobStore::Page> first = (*store)->List(2, "", q);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->jobs.size(), 2u);
  EXPECT_EQ(first->jobs[0].name(), ranking[0]);
  EXPECT_EQ(first->jobs[1].name(), ranking[1]);
  ASSERT_FALSE(first->next_page_token.empty());
  absl::StatusOr<JobStore::Page> second = (*store)->List(2, first->next_page_token, q);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_EQ(second->jobs.size(), 1u);
  EXPECT_EQ(second->jobs[0].name(), ranking[2]);
  EXPECT_TRUE(second->next_page_token.empty());
  // The token is no readable position, and it is refused for another query
  // or after a change to it.
  EXPECT_EQ(first->next_page_token.find("seq"), std::string::npos);
  JobStore::Query other;
  other.labels["team"] = "ads";
  EXPECT_EQ((*store)->List(2, first->next_page_token, other).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->List(2, first->next_page_token, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::string tampered = first->next_page_token;
  tampered[0] = tampered[0] == 'A' ? 'B' : 'A';
  EXPECT_EQ((*store)->List(2, tampered, q).status().code(), absl::StatusCode::kInvalidArgument);
  q.labels["team"] = "nobody";
  EXPECT_TRUE((*store)->List(2, "", q)->jobs.empty());
}

TEST(JobStoreTest, PageTokensSurviveARestart) {
  const std::string path = TempDb("tokens.db");
  std::string token;
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {
      bool created;
      ASSERT_TRUE((*store)->Create(ValidSpec(), "", kT0, &created).ok());
    }
    token = (*store)->List(2, "", {})->next_page_token;
    ASSERT_FALSE(token.empty());
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<JobStore::Page> rest = (*store)->List(2, token, {});
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_EQ(rest->jobs.size(), 1u);
}

TEST(JobStoreTest, NamesAndErrors) {
  EXPECT_EQ(*ParseJobName("jobs/abc-1", "name"), "abc-1");
  absl::StatusOr<std::string> bad = ParseJobName("job/abc", "name");
  EXPECT_EQ(bad.status().message(),
            "name must be \"jobs/{id}\" with id of [a-z0-9-], got \"job/abc\"");
  EXPECT_FALSE(ParseJobName("jobs/", "name").ok());
  EXPECT_FALSE(ParseJobName("jobs/A B", "name").ok());
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(":memory:");
  EXPECT_EQ((*store)->Get("nope").status().message(), "jobs/nope not found");
  absl::StatusOr<std::unique_ptr<JobStore>> unopenable = JobStore::Open("/nonexistent/dir/x.db");
  EXPECT_EQ(unopenable.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(unopenable.status().message().find("/nonexistent/dir/x.db"), std::string::npos);
}

}  // namespace
}  // namespace recfleet::coordinator
