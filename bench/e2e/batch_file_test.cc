#include "bench/e2e/batch_file.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recfleet::bench {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

// Ragged on purpose: an empty id list, a zero-length history, a sample
// with one id, labels on one head only, and a batch with nothing.
std::vector<engine::Batch> SampleBatches() {
  engine::Batch a;
  a.size = 3;
  a.id_lists.resize(2);
  a.id_lists[0].Append({7});
  a.id_lists[0].Append({});
  a.id_lists[0].Append({1, 2, 3});
  for (int s = 0; s < 3; ++s) a.id_lists[1].Append({int64_t{1} << 40, s});
  a.sequence.resize(2);
  a.sequence[0].Append({});
  a.sequence[0].Append({5, 6, 7, 8});
  a.sequence[0].Append({9});
  a.sequence[1].Append({});
  a.sequence[1].Append({0, 1, 0, 1});
  a.sequence[1].Append({63});
  a.dense = {0.5f, -1.25f, 3e-8f, 1e30f, -0.0f, 2.0f};
  a.ctr_labels = {1, 0, 1};
  engine::Batch b;
  b.size = 1;
  b.id_lists.resize(1);
  b.id_lists[0].Append({42});
  b.sequence.resize(1);
  b.sequence[0].Append({1, 2});
  b.ctr_labels = {0};
  b.cvr_labels = {1};
  engine::Batch empty;
  return {a, b, empty};
}

void ExpectSame(const engine::IdList& x, const engine::IdList& y) {
  EXPECT_EQ(x.offsets, y.offsets);
  EXPECT_EQ(x.ids, y.ids);
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Spit(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

TEST(BatchFileTest, RoundTripKeepsEveryField) {
  const std::string path = TempPath("round_trip.bin");
  const std::vector<engine::Batch> in = SampleBatches();
  ASSERT_TRUE(WriteBatchFile(path, in).ok());
  absl::StatusOr<std::vector<engine::Batch>> out = ReadBatchFile(path);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const engine::Batch &x = in[i], &y = (*out)[i];
    EXPECT_EQ(x.size, y.size);
    ASSERT_EQ(x.id_lists.size(), y.id_lists.size());
    for (size_t f = 0; f < x.id_lists.size(); ++f) ExpectSame(x.id_lists[f], y.id_lists[f]);
    ASSERT_EQ(x.sequence.size(), y.sequence.size());
    for (size_t f = 0; f < x.sequence.size(); ++f) ExpectSame(x.sequence[f], y.sequence[f]);
    EXPECT_EQ(x.dense, y.dense);
    EXPECT_EQ(x.ctr_labels, y.ctr_labels);
    EXPECT_EQ(x.cvr_labels, y.cvr_labels);
  }
}

TEST(BatchFileTest, LayoutIsTheDocumentedOne) {
  // One batch: size 1, no id lists, one sequence field [4], one dense value
  // 0.5, one CTR label 1, no CVR labels.
  engine::Batch b;
  b.size = 1;
  b.sequence.resize(1);
  b.sequence[0].Append({4});
  b.dense = {0.5f};
  b.ctr_labels = {1.0f};
  const std::string path = TempPath("layout.bin");
  ASSERT_TRUE(WriteBatchFile(path, {b}).ok());
  const std::string data = Slurp(path);
  auto i64 = [&](size_t at) {
    int64_t v;
    std::memcpy(&v, data.data() + at, 8);
    return v;
  };
  auto f32 = [&](size_t at) {
    float v;
    std::memcpy(&v, data.data() + at, 4);
    return v;
  };
  ASSERT_EQ(data.size(), 8u + 8 * 10 + 4 + 8 + 4 + 8);
  EXPECT_EQ(data.substr(0, 8), "RFBATCH1");
  EXPECT_EQ(i64(8), 1);    // batches
  EXPECT_EQ(i64(16), 1);   // size
  EXPECT_EQ(i64(24), 0);   // id lists
  EXPECT_EQ(i64(32), 1);   // sequence fields
  EXPECT_EQ(i64(40), 2);   // offsets
  EXPECT_EQ(i64(48), 1);   // ids
  EXPECT_EQ(i64(56), 0);   // offsets[0]
  EXPECT_EQ(i64(64), 1);   // offsets[1]
  EXPECT_EQ(i64(72), 4);   // ids[0]
  EXPECT_EQ(i64(80), 1);   // dense count
  EXPECT_EQ(f32(88), 0.5f);
  EXPECT_EQ(i64(92), 1);   // CTR labels
  EXPECT_EQ(f32(100), 1.0f);
  EXPECT_EQ(i64(104), 0);  // CVR labels
}

TEST(BatchFileTest, WriterRejectsBadOffsets) {
  std::vector<engine::Batch> in = SampleBatches();
  in[0].sequence[1].offsets[1] = 5;  // 0, 5, 4, 5: decreasing
  absl::Status s = WriteBatchFile(TempPath("bad.bin"), in);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch 0: sequence field 1"), std::string::npos) << s;
  in = SampleBatches();
  in[1].cvr_labels.push_back(0);  // 2 labels for 1 sample
  EXPECT_EQ(WriteBatchFile(TempPath("bad.bin"), in).code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchFileTest, ReaderRejectsDamagedFiles) {
  const std::string path = TempPath("damaged.bin");
  ASSERT_TRUE(WriteBatchFile(path, SampleBatches()).ok());
  const std::string good = Slurp(path);

  Spit(path, good.substr(0, good.size() - 3));
  absl::StatusOr<std::vector<engine::Batch>> r = ReadBatchFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("batch 2"), std::string::npos) << r.status();  // the last

  Spit(path, good + "x");
  EXPECT_EQ(ReadBatchFile(path).status().code(), absl::StatusCode::kDataLoss);

  std::string bad_magic = good;
  bad_magic[0] = 'X';
  Spit(path, bad_magic);
  EXPECT_EQ(ReadBatchFile(path).status().code(), absl::StatusCode::kDataLoss);

  // A huge batch count must fail cleanly, not allocate.
  std::string huge = good;
  const int64_t count = int64_t{1} << 60;
  std::memcpy(&huge[8], &count, 8);
  Spit(path, huge);
  EXPECT_EQ(ReadBatchFile(path).status().code(), absl::StatusCode::kDataLoss);

  // An offset past the id count (first id list's offsets[1] of batch 0, at
  // byte 8 + 8 + 8 + 8 + 8 + 8 + 8).
  std::string past = good;
  const int64_t big = 1000;
  std::memcpy(&past[56], &big, 8);
  Spit(path, past);
  r = ReadBatchFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("id list"), std::string::npos) << r.status();

  EXPECT_EQ(ReadBatchFile(TempPath("missing.bin")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recfleet::bench
