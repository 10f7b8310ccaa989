#include "services/coordinator/job_state.h"

#include <set>

#include "gtest/gtest.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::JobStatus;

TEST(JobStateTest, LegalTransitionsAreExactlyTheDocumentedOnes) {
  const std::set<std::pair<JobState, JobState>> legal = {
      {JobStatus::QUEUED, JobStatus::SCHEDULING},     {JobStatus::QUEUED, JobStatus::CANCELLED},
      {JobStatus::SCHEDULING, JobStatus::RUNNING},    {JobStatus::SCHEDULING, JobStatus::QUEUED},
      {JobStatus::SCHEDULING, JobStatus::FAILED},     {JobStatus::SCHEDULING, JobStatus::CANCELLED},
      {JobStatus::RUNNING, JobStatus::SUCCEEDED},     {JobStatus::RUNNING, JobStatus::FAILED},
      {JobStatus::RUNNING, JobStatus::RESTARTING},    {JobStatus::RUNNING, JobStatus::CANCELLED},
      {JobStatus::RESTARTING, JobStatus::SCHEDULING}, {JobStatus::RESTARTING, JobStatus::FAILED},
      {JobStatus::RESTARTING, JobStatus::CANCELLED},
  };
  for (JobState from : AllStates()) {
    for (JobState to : AllStates()) {
      absl::Status s = CheckTransition("jobs/x", from, to);
      EXPECT_EQ(s.ok(), legal.count({from, to}) > 0) << StateName(from) << " -> " << StateName(to);
      if (!s.ok()) {
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
      }
    }
  }
}

TEST(JobStateTest, IllegalTransitionSaysWhatIsAllowed) {
  absl::Status s = CheckTransition("jobs/abc", JobStatus::RUNNING, JobStatus::QUEUED);
  EXPECT_EQ(s.message(),
            "jobs/abc: illegal transition RUNNING -> QUEUED; from RUNNING the job may go to "
            "SUCCEEDED, FAILED, RESTARTING, CANCELLED");
  s = CheckTransition("jobs/abc", JobStatus::SUCCEEDED, JobStatus::RUNNING);
  EXPECT_NE(s.message().find("nowhere (it is terminal)"), std::string::npos) << s;
}

TEST(JobStateTest, TerminalStates) {
  for (JobState s : AllStates()) {
    EXPECT_EQ(IsTerminal(s), NextStates(s).empty()) << StateName(s);
  }
  EXPECT_TRUE(IsTerminal(JobStatus::CANCELLED));
  EXPECT_FALSE(IsTerminal(JobStatus::RESTARTING));
}

}  // namespace
}  // namespace recfleet::coordinator
