#include "services/coordinator/job_event_log.h"

#include "gtest/gtest.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::WatchJobResponse;

WatchJobResponse Progress(int64_t step) {
  WatchJobResponse e;
  e.set_kind(WatchJobResponse::PROGRESS);
  e.mutable_job()->mutable_status()->mutable_progress()->set_step(step);
  return e;
}

TEST(JobEventLogTest, EventsAreNumberedPerJobAndReadAfterASequenceNumber) {
  JobEventLog log(8);
  EXPECT_EQ(log.LastSeq("a"), 0);
  EXPECT_EQ(log.Append("a", Progress(10)), 1);
  EXPECT_EQ(log.Append("a", Progress(20)), 2);
  EXPECT_EQ(log.Append("b", Progress(30)), 1);
  EXPECT_EQ(log.LastSeq("a"), 2);

  JobEventLog::Since all = log.EventsAfter("a", 0);
  EXPECT_FALSE(all.missed);
  ASSERT_EQ(all.events.size(), 2u);
  EXPECT_EQ(all.events[0].first, 1);
  EXPECT_EQ(all.events[1].second.job().status().progress().step(), 20);

  JobEventLog::Since newer = log.EventsAfter("a", 1);
  ASSERT_EQ(newer.events.size(), 1u);
  EXPECT_EQ(newer.events[0].first, 2);

  // Nothing new, and an unknown job: neither events nor a miss.
  JobEventLog::Since none = log.EventsAfter("a", 2);
  EXPECT_FALSE(none.missed);
  EXPECT_TRUE(none.events.empty());
  EXPECT_TRUE(log.EventsAfter("nope", 0).events.empty());
  EXPECT_FALSE(log.EventsAfter("nope", 0).missed);
}

TEST(JobEventLogTest, AWatcherBehindTheBufferIsToldItMissedEvents) {
  JobEventLog log(2);
  for (int i = 1; i <= 5; ++i) log.Append("a", Progress(i));
  // Events 1..3 were dropped; 4 and 5 are kept.
  JobEventLog::Since behind = log.EventsAfter("a", 2);
  EXPECT_TRUE(behind.missed);
  EXPECT_TRUE(behind.events.empty());
  JobEventLog::Since edge = log.EventsAfter("a", 3);
  EXPECT_FALSE(edge.missed);
  ASSERT_EQ(edge.events.size(), 2u);
  EXPECT_EQ(edge.events[0].first, 4);
  EXPECT_EQ(log.LastSeq("a"), 5);
}

TEST(JobEventLogTest, EndedLogsAreDroppedOnlyAfterTheirRetention) {
  JobEventLog log(4);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  log.Append("ended", Progress(1));
  log.Append("running", Progress(1));
  log.MarkEnded("ended", t0);
  log.DropEndedBefore(t0);  // Not before t0: kept.
  EXPECT_EQ(log.LastSeq("ended"), 1);
  log.DropEndedBefore(t0 + absl::Seconds(1));
  EXPECT_EQ(log.LastSeq("ended"), 0);
  EXPECT_EQ(log.LastSeq("running"), 1);  // Never ended: never dropped.
}

}  // namespace
}  // namespace recfleet::coordinator
