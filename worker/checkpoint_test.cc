#include "worker/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace recfleet::worker {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  std::string dir = std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") + "/" + name;
  fs::remove_all(dir);
  return dir;
}

CheckpointShard ShardFor(int rank, int64_t step) {
  return {{"params", std::string(100 + rank, static_cast<char>('a' + rank))},
          {"step", std::to_string(step)},
          {"empty", ""}};
}

void WriteAll(const std::string& dir, int64_t step, int world) {
  for (int r = 0; r < world; ++r) ASSERT_TRUE(WriteCheckpointShard(dir, step, r, world, ShardFor(r, step)).ok());
}

TEST(CheckpointTest, RoundTripsEveryShard) {
  const std::string dir = TempDir("roundtrip");
  WriteAll(dir, 10, 3);
  ASSERT_TRUE(CommitCheckpoint(dir, 10, 3).ok());
  auto latest = LatestCompleteCheckpoint(dir, 3);
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->value_or(-1), 10);
  for (int r = 0; r < 3; ++r) {
    auto shard = ReadCheckpointShard(dir, 10, r, 3);
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(*shard, ShardFor(r, 10));
  }
}

TEST(CheckpointTest, NoDirectoryMeansNoCheckpoint) {
  auto latest = LatestCompleteCheckpoint(TempDir("absent"), 2);
  ASSERT_TRUE(latest.ok());
  EXPECT_FALSE(latest->has_value());
}

TEST(CheckpointTest, CommitRefusesAMissingShard) {
  const std::string dir = TempDir("missing");
  ASSERT_TRUE(WriteCheckpointShard(dir, 5, 0, 2, ShardFor(0, 5)).ok());
  absl::Status s = CommitCheckpoint(dir, 5, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("shard-00001-of-00002"), std::string::npos) << s;
}

TEST(CheckpointTest, UncommittedAndDamagedCheckpointsAreSkipped) {
  const std::string dir = TempDir("skip");
  WriteAll(dir, 10, 2);
  ASSERT_TRUE(CommitCheckpoint(dir, 10, 2).ok());
  WriteAll(dir, 20, 2);
  ASSERT_TRUE(CommitCheckpoint(dir, 20, 2).ok());
  // Step 30 crashed before its manifest.
  WriteAll(dir, 30, 2);
  EXPECT_EQ(LatestCompleteCheckpoint(dir, 2)->value_or(-1), 20);
  EXPECT_EQ(ReadCheckpointShard(dir, 30, 0, 2).status().code(), absl::StatusCode::kNotFound);

  // Flip one byte of a step-20 shard: 20 no longer counts, 10 does.
  const std::string shard = CheckpointStepDir(dir, 20) + "/shard-00001-of-00002";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('X');
  }
  EXPECT_EQ(LatestCompleteCheckpoint(dir, 2)->value_or(-1), 10);
  EXPECT_EQ(ReadCheckpointShard(dir, 20, 1, 2).status().code(), absl::StatusCode::kDataLoss);
  // A different world size does not match any manifest.
  EXPECT_FALSE(LatestCompleteCheckpoint(dir, 3)->has_value());
}

TEST(CheckpointTest, TruncatedShardIsDetectedAtCommit) {
  const std::string dir = TempDir("trunc");
  WriteAll(dir, 7, 1);
  const std::string shard = CheckpointStepDir(dir, 7) + "/shard-00000-of-00001";
  fs::resize_file(shard, fs::file_size(shard) - 3);
  absl::Status s = CommitCheckpoint(dir, 7, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("damaged at byte offset"), std::string::npos) << s;
}

TEST(CheckpointTest, PruneKeepsTheNewestCompleteAndInFlightSteps) {
  const std::string dir = TempDir("prune");
  for (int64_t step : {10, 20, 30}) {
    WriteAll(dir, step, 2);
    ASSERT_TRUE(CommitCheckpoint(dir, step, 2).ok());
  }
  WriteAll(dir, 15, 2);  // Incomplete and older than the newest: garbage.
  WriteAll(dir, 40, 2);  // Incomplete and newer: being written.
  ASSERT_TRUE(PruneCheckpoints(dir, 2, 2).ok());
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir, 10)));
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir, 15)));
  EXPECT_TRUE(fs::exists(CheckpointStepDir(dir, 20)));
  EXPECT_TRUE(fs::exists(CheckpointStepDir(dir, 30)));
  EXPECT_TRUE(fs::exists(CheckpointStepDir(dir, 40)));
}

// A rank killed while writing leaves "<shard>.tmp"; nothing ever renames it.
void LeavePartialShard(const std::string& dir, int64_t step, int rank, int world) {
  fs::create_directories(CheckpointStepDir(dir, step));
  std::ofstream(CheckpointStepDir(dir, step) + "/shard-0000" + std::to_string(rank) + "-of-0000" +
                std::to_string(world) + ".tmp")
      << "half a shard";
}

int CountTmpFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.path().extension() == ".tmp";
  return n;
}

TEST(CheckpointTest, PruneRemovesPartialShardsOfCompleteCheckpoints) {
  const std::string dir = TempDir("partial_prune");
  // Step 10: rank 1 died mid-write in the first attempt (world of 3), then
  // a world of 2 wrote and committed the step.
  LeavePartialShard(dir, 10, 1, 3);
  WriteAll(dir, 10, 2);
  ASSERT_TRUE(CommitCheckpoint(dir, 10, 2).ok());
  // Step 20 is being written right now.
  LeavePartialShard(dir, 20, 0, 2);
  ASSERT_TRUE(PruneCheckpoints(dir, 2, 2).ok());
  EXPECT_FALSE(fs::exists(CheckpointStepDir(dir, 10) + "/shard-00001-of-00003.tmp"));
  EXPECT_TRUE(fs::exists(CheckpointStepDir(dir, 20) + "/shard-00000-of-00002.tmp")) << "in flight";
  EXPECT_TRUE(ReadCheckpointShard(dir, 10, 1, 2).ok());
}

TEST(CheckpointTest, RestartRemovesEveryPartialShard) {
  const std::string dir = TempDir("partial_restart");
  WriteAll(dir, 10, 2);
  ASSERT_TRUE(CommitCheckpoint(dir, 10, 2).ok());
  LeavePartialShard(dir, 10, 0, 2);
  LeavePartialShard(dir, 20, 0, 2);
  LeavePartialShard(dir, 20, 1, 2);
  ASSERT_EQ(CountTmpFiles(dir), 3);
  ASSERT_TRUE(RemovePartialCheckpointFiles(dir).ok());
  EXPECT_EQ(CountTmpFiles(dir), 0);
  auto latest = LatestCompleteCheckpoint(dir, 2);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->value_or(-1), 10);
  EXPECT_TRUE(RemovePartialCheckpointFiles(dir + "/missing").ok());
}

}  // namespace
}  // namespace recfleet::worker
