#include "bench/e2e/host_sampler.h"

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace recfleet::bench {
namespace {

// Burns CPU for `ms` milliseconds (not optimized away).
double __attribute__((noinline)) Spin(int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  double x = 1.0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; ++i) x = x * 1.0000001 + 1e-9;
  }
  return x;
}

TEST(HostSamplerTest, SamplesWallTimePerTagWithStacks) {
  absl::StatusOr<std::unique_ptr<HostSampler>> s = HostSampler::Start(200);
  ASSERT_TRUE(s.ok()) << s.status();
  HostSampler::SetTag("spin");
  EXPECT_GT(Spin(300), 0.0);
  HostSampler::SetTag("sleep");
  // Blocked time is sampled too (wall clock). The signals cut a sleep
  // short (EINTR), so sleep until the deadline.
  const auto wake = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  while (std::chrono::steady_clock::now() < wake) usleep(1000);
  HostSampler::SetTag("-");
  const int64_t kept = (*s)->Stop();
  // 600 ms at one sample per 200 us: about 3,000; a loaded machine delays
  // the sampling thread (a shared 2-core builder gave a tenth), so only a
  // floor.
  EXPECT_GT(kept, 60);
  EXPECT_LT(kept, 3300);
  const std::string path = ::testing::TempDir() + "/samples.txt";
  ASSERT_TRUE((*s)->Write(path).ok());

  std::ifstream in(path);
  std::string line, section;
  std::map<std::string, int64_t> us_per_tag;
  int64_t total_us = 0;
  int lines = 0, maps = 0, with_frames = 0;
  while (std::getline(in, line)) {
    if (line == "maps" || line == "samples") {
      section = line;
      continue;
    }
    if (section == "maps") {
      ++maps;
    } else if (section == "samples") {
      ++lines;
      std::istringstream words(line);
      std::string tag, frame;
      int64_t us = -1;
      words >> tag >> us;
      ASSERT_GE(us, 0) << line;
      us_per_tag[tag] += us;
      total_us += us;
      if (words >> frame) ++with_frames;
    }
  }
  EXPECT_GT(maps, 0);
  EXPECT_EQ(lines, kept);
  EXPECT_GT(with_frames, kept * 9 / 10);  // the unwinder got past the signal frame
  // The weights add up to the sampled wall time (600 ms, and the moments
  // around it), and each half holds its 300 ms. On a loaded machine the
  // spinning thread waits for a core, its signals merge and it gets far
  // fewer samples than the sleeping half (73 against ~1,700 on a shared
  // 2-core builder), but each stands for the time since the previous one;
  // the slack is the last wait of a half, booked to the sample after it.
  EXPECT_GT(total_us, 590'000);
  EXPECT_LT(total_us, 900'000);
  EXPECT_GT(us_per_tag["spin"], 200'000);
  EXPECT_LT(us_per_tag["spin"], 400'000);
  EXPECT_GT(us_per_tag["sleep"], 200'000);
  EXPECT_LT(us_per_tag["sleep"], 400'000);
  // A second sampler only after the first stopped.
  absl::StatusOr<std::unique_ptr<HostSampler>> again = HostSampler::Start(200);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(HostSampler::Start(200).ok());
  (*again)->Stop();
}

}  // namespace
}  // namespace recfleet::bench
