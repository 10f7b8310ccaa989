#include "cli/progress.h"

#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

TEST(ProgressTest, BarRateAndEta) {
  EXPECT_EQ(Progress::Format("synth", 5000, 10000, "samples", 5),
            "synth [##########..........]  50%  5000/10000 samples  1.0k/s  ETA 5s");
  EXPECT_EQ(Progress::Format("synth", 0, 10000, "samples", 0), "synth [....................]   0%  0/10000 samples  0/s");
  // Done: the elapsed time instead of an ETA.
  EXPECT_EQ(Progress::Format("train", 300, 300, "steps", 125),
            "train [####################] 100%  300/300 steps  2/s  2m05s");
  EXPECT_EQ(Progress::Format("x", 1, 1000, "rows", 10), "x [....................]   0%  1/1000 rows  0/s  ETA 2h46m");
}

TEST(ProgressTest, UnknownTotalShowsCountRateAndTime) {
  EXPECT_EQ(Progress::Format("ingest: reading", 1300000, 0, "events", 1.2),
            "ingest: reading  1.3M events  1.1M/s  1s");
}

TEST(ProgressTest, NothingWhenNotInteractive) {
  testing::internal::CaptureStderr();
  {
    Progress p("synth", 10, "samples", /*enabled=*/false);
    p.Update(5);
    p.Finish();
  }
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(ProgressTest, DrawsAndEndsTheLineWhenEnabled) {
  testing::internal::CaptureStderr();
  {
    Progress p("synth", 10, "samples", /*enabled=*/true);
    p.Update(10);
  }  // The destructor finishes.
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("\r\033[Ksynth [####################] 100%  10/10 samples"), std::string::npos) << err;
  EXPECT_EQ(err.back(), '\n');
}

}  // namespace
}  // namespace recfleet::cli
