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
  std::map<std::string, int> per_tag;
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
      words >> tag;
      ++per_tag[tag];
      if (words >> frame) ++with_frames;
    }
  }
  EXPECT_GT(maps, 0);
  EXPECT_EQ(lines, kept);
  EXPECT_GT(with_frames, kept * 9 / 10);  // the unwinder got past the signal frame
  // Both halves took 300 ms of wall time: each tag holds a share (on a
  // loaded machine the spinning half gets fewer, its sampling thread
  // waiting for a core).
  EXPECT_GT(per_tag["spin"], kept / 10);
  EXPECT_GT(per_tag["sleep"], kept / 10);
  // A second sampler only after the first stopped.
  absl::StatusOr<std::unique_ptr<HostSampler>> again = HostSampler::Start(200);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(HostSampler::Start(200).ok());
  (*again)->Stop();
}

}  // namespace
}  // namespace recfleet::bench
