#include "data/dataset_file.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

std::string TempPath(const std::string& name) {
  return std::string(testing::TempDir()) + "/" + name;
}

Schema TestSchema() {
  Schema s;
  s.features = {{"sample_id", DType::kInt64, Layout::kScalar, ""},
                {"item_id", DType::kInt64, Layout::kScalar, "item"},
                {"label", DType::kFloat32, Layout::kScalar, ""},
                {"history", DType::kInt64, Layout::kJagged, "item"},
                {"weights", DType::kFloat32, Layout::kJagged, ""}};
  s.metadata["source"] = "test";
  return s;
}

// `rows` rows with history lengths 0..max_len (0 and 1 included).
Batch MakeRows(const Schema& s, int rows, int max_len, uint32_t seed) {
  Batch b(std::make_shared<const Schema>(s));
  std::mt19937 rng(seed);
  for (int r = 0; r < rows; ++r) {
    b.AddInt64(0, r);
    b.AddInt64(1, rng() % 1000);
    b.AddFloat(2, static_cast<float>(rng() % 2));
    int len = r < 2 ? r : static_cast<int>(rng() % (max_len + 1));
    std::vector<int64_t> h(len);
    std::vector<float> w(len / 2);
    for (auto& x : h) x = rng() % 100000;
    for (auto& x : w) x = static_cast<float>(rng() % 100) / 7.0f;
    b.AddJaggedInt64(3, h.data(), h.size());
    b.AddJaggedFloat(4, w.data(), w.size());
    EXPECT_TRUE(b.CommitRow().ok());
  }
  return b;
}

std::string WriteFile(const std::string& path, const Batch& rows, size_t rows_per_block) {
  WriterOptions o;
  o.max_rows_per_block = rows_per_block;
  auto w = DatasetWriter::Create(path, rows.schema(), o);
  EXPECT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE((*w)->Write(rows).ok());
  EXPECT_TRUE((*w)->Close().ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Overwrite(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
}

// Reads `path` both ways; returns the first error, or OK if both read
// everything and got exactly `want`.
absl::Status ReadBothWays(const std::string& path, const Batch& want) {
  auto all = ReadAll(path);
  if (!all.ok()) return all.status();
  if (!(*all == want)) return absl::InternalError("streaming reader returned different rows");
  auto f = DatasetFile::Open(path);
  if (!f.ok()) return f.status();
  Batch got(want.schema_ptr()), block;
  for (size_t b = 0; b < (*f)->num_blocks(); ++b) {
    if (auto s = (*f)->ReadBlock(b, &block); !s.ok()) return s;
    for (size_t r = 0; r < block.num_rows(); ++r) got.AppendRow(block, r);
  }
  if (!(got == want)) return absl::InternalError("random-access reader returned different rows");
  Batch viewed(want.schema_ptr());
  BlockView view;
  for (size_t b = 0; b < (*f)->num_blocks(); ++b) {
    if (auto s = (*f)->ReadBlockView(b, &view); !s.ok()) return s;
    for (size_t r = 0; r < view.num_rows(); ++r) viewed.AppendRow(view, r);
  }
  if (!(viewed == want)) return absl::InternalError("block views returned different rows");
  return absl::OkStatus();
}

TEST(DatasetFileTest, RoundTripBothReaders) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 300, 40, 1);
  std::string path = TempPath("roundtrip.rfd");
  WriteFile(path, rows, 64);
  EXPECT_TRUE(ReadBothWays(path, rows).ok());
  auto f = DatasetFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)->num_blocks(), 5u);  // 64 * 4 + 44.
  EXPECT_EQ((*f)->num_rows(), 300u);
  EXPECT_EQ((*f)->block_rows(4), 44u);
  EXPECT_TRUE(*(*f)->schema() == s);
}

TEST(DatasetFileTest, EmptyFileHasNoBlocks) {
  Schema s = TestSchema();
  Batch rows(std::make_shared<const Schema>(s));
  std::string path = TempPath("empty.rfd");
  WriteFile(path, rows, 8);
  EXPECT_TRUE(ReadBothWays(path, rows).ok());
}

TEST(DatasetFileTest, BlockBytesBoundCutsBlocks) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 200, 500, 2);
  std::string path = TempPath("bytes.rfd");
  WriterOptions o;
  o.max_block_bytes = 16 << 10;
  auto w = DatasetWriter::Create(path, s, o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(rows).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto f = DatasetFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_GT((*f)->num_blocks(), 5u);
  EXPECT_TRUE(ReadBothWays(path, rows).ok());
}

// Flipping any single byte of a small file is always detected, by both
// readers, with a message naming the file and a byte offset.
TEST(DatasetFileTest, EveryCorruptedByteIsDetected) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 16, 6, 3);
  std::string path = TempPath("corrupt.rfd");
  std::string good = WriteFile(path, rows, 5);  // Four blocks, the last one short.
  ASSERT_GT(good.size(), 500u);
  for (size_t i = 0; i < good.size(); ++i) {
    // A single-bit and an all-bits change, on alternate bytes.
    for (uint8_t flip : {i % 2 == 0 ? 0x01 : 0xFF}) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ flip);
      Overwrite(path, bad);
      absl::Status st = ReadBothWays(path, rows);
      ASSERT_FALSE(st.ok()) << "byte " << i << " flip " << int(flip) << " went unnoticed";
      ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
      EXPECT_NE(st.message().find(path), std::string::npos) << st;
      EXPECT_NE(st.message().find("byte offset"), std::string::npos) << st;
    }
  }
}

// A larger file: every block's header and payload, plus a sample of offsets.
TEST(DatasetFileTest, CorruptionInEveryBlockOfALargerFile) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 1200, 200, 4);
  std::string path = TempPath("corrupt_large.rfd");
  std::string good = WriteFile(path, rows, 100);
  auto f = DatasetFile::Open(path);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ((*f)->num_blocks(), 12u);
  std::mt19937 rng(5);
  std::vector<size_t> positions;
  for (size_t k = 0; k < 60; ++k) positions.push_back(rng() % good.size());
  // Walk the block index from the streaming reader's error offsets: one
  // corruption at each block's header and one mid-payload.
  auto index = DatasetFile::Open(path);
  ASSERT_TRUE(index.ok());
  size_t header_end = 12 + 4;
  {
    uint32_t schema_len;
    std::memcpy(&schema_len, good.data() + 8, 4);
    header_end += schema_len;
  }
  size_t off = header_end;
  for (size_t b = 0; b < (*index)->num_blocks(); ++b) {
    uint64_t payload;
    std::memcpy(&payload, good.data() + off + 8, 8);
    positions.push_back(off + 5);
    positions.push_back(off + 24 + payload / 2);
    off += 24 + payload;
  }
  for (size_t i : positions) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    Overwrite(path, bad);
    absl::Status st = ReadBothWays(path, rows);
    ASSERT_FALSE(st.ok()) << "byte " << i;
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find("byte offset"), std::string::npos) << st;
  }
}

TEST(DatasetFileTest, EveryTruncationIsDetected) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 16, 6, 6);
  std::string path = TempPath("truncate.rfd");
  std::string good = WriteFile(path, rows, 5);
  for (size_t n = 0; n < good.size(); ++n) {
    Overwrite(path, good.substr(0, n));
    absl::Status st = ReadBothWays(path, rows);
    ASSERT_FALSE(st.ok()) << "truncated to " << n;
    ASSERT_EQ(st.code(), absl::StatusCode::kDataLoss) << st;
    EXPECT_NE(st.message().find(path), std::string::npos) << st;
  }
  // Appended garbage is rejected as well.
  Overwrite(path, good + "x");
  EXPECT_FALSE(ReadBothWays(path, rows).ok());
}

TEST(DatasetFileTest, BlockErrorNamesTheBlock) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 64, 6, 7);
  std::string path = TempPath("named.rfd");
  std::string good = WriteFile(path, rows, 8);
  std::string bad = good;
  bad[good.size() - 200] ^= 0x10;  // Inside the last blocks' payloads.
  Overwrite(path, bad);
  auto all = ReadAll(path);
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find(": block "), std::string::npos) << all.status();
}

TEST(DatasetFileTest, VersionOneFilesStayReadable) {
  Schema s = TestSchema();
  Batch rows = MakeRows(s, 300, 40, 11);
  WriterOptions o;
  o.max_rows_per_block = 64;
  o.format_version = 1;
  std::string v1 = TempPath("v1.rfd");
  auto w = DatasetWriter::Create(v1, s, o);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(rows).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_TRUE(ReadBothWays(v1, rows).ok());
  std::string v2 = TempPath("v2.rfd");
  std::string v2_bytes = WriteFile(v2, rows, 64);
  EXPECT_TRUE(ReadBothWays(v2, rows).ok());
  // sample_id (0, 1, 2, ...) and the offsets code to a byte a value.
  EXPECT_LT(v2_bytes.size() + 300 * 7 * 2, std::filesystem::file_size(v1));
  // A newer version is refused with what to do about it.
  std::string newer = v2_bytes;
  newer[7] = 3;
  Overwrite(v2, newer);
  auto f = DatasetFile::Open(v2);
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("upgrade recfleet"), std::string::npos) << f.status();
}

// A sample file referencing a sequence file: readers present the windows
// as jagged features; a reference outside the sequences is DATA_LOSS.
TEST(DatasetFileTest, ReferencedHistoriesAreMaterializedAndChecked) {
  std::filesystem::create_directories(TempPath("refs"));
  Schema seq;
  seq.features = {{"items", DType::kInt64, Layout::kJagged, "item"},
                  {"times", DType::kInt64, Layout::kJagged, ""}};
  seq.metadata[kSequenceIdKey] = "id1";
  Batch seqs(std::make_shared<const Schema>(seq));
  const std::vector<int64_t> items = {5, 6, 7, 8}, times = {0, 3600, 7 * 3600, 100 * 3600};
  seqs.AddJaggedInt64(0, items.data(), 4);
  seqs.AddJaggedInt64(1, times.data(), 4);
  ASSERT_TRUE(seqs.CommitRow().ok());
  WriteFile(TempPath("refs/seq.rfs"), seqs, 8);

  Schema s;
  s.features = {{"timestamp", DType::kInt64, Layout::kScalar, ""},
                {kHistorySeq, DType::kInt64, Layout::kScalar, ""},
                {kHistoryEnd, DType::kInt64, Layout::kScalar, ""},
                {kHistoryLen, DType::kInt64, Layout::kScalar, ""}};
  s.metadata[kSequenceFileKey] = "seq.rfs";
  s.metadata[kSequenceIdKey] = "id1";
  s.metadata[std::string(kSequenceFeaturePrefix) + "hist"] = "item|items";
  s.metadata[std::string(kSequenceFeaturePrefix) + "hist_age"] = "time_bucket|time_bucket:times:timestamp";
  Batch rows(std::make_shared<const Schema>(s));
  for (auto [end, len] : {std::pair<int64_t, int64_t>{3, 2}, {0, 0}, {3, 3}}) {
    rows.AddInt64(0, times[3]);
    rows.AddInt64(1, 0);
    rows.AddInt64(2, end);
    rows.AddInt64(3, len);
    ASSERT_TRUE(rows.CommitRow().ok());
  }
  WriteFile(TempPath("refs/ok.rfd"), rows, 2);
  auto all = ReadAll(TempPath("refs/ok.rfd"));
  ASSERT_TRUE(all.ok()) << all.status();
  const int hist = all->schema().Find("hist"), age = all->schema().Find("hist_age");
  ASSERT_EQ(hist, 4);
  ASSERT_EQ(all->schema().features[hist].layout, Layout::kJagged);
  EXPECT_EQ(std::vector<int64_t>(all->JaggedInt64(hist, 0), all->JaggedInt64(hist, 0) + 2),
            (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(all->RowLength(hist, 1), 0u);
  // 100, 99 and 93 hours before: floor(log2(1 + h)) = 6 each.
  EXPECT_EQ(std::vector<int64_t>(all->JaggedInt64(age, 2), all->JaggedInt64(age, 2) + 3),
            (std::vector<int64_t>{6, 6, 6}));
  EXPECT_TRUE(ReadBothWays(TempPath("refs/ok.rfd"), *all).ok());

  rows.Clear();
  rows.AddInt64(0, 0);
  rows.AddInt64(1, 0);
  rows.AddInt64(2, 5);  // Past the sequence's 4 events.
  rows.AddInt64(3, 1);
  ASSERT_TRUE(rows.CommitRow().ok());
  WriteFile(TempPath("refs/bad.rfd"), rows, 2);
  auto bad = ReadAll(TempPath("refs/bad.rfd"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("block 0 at byte offset"), std::string::npos)
      << bad.status();
  EXPECT_NE(bad.status().message().find("outside the sequence file"), std::string::npos)
      << bad.status();

  // A crafted sequence file that names a sequence file (itself) is refused,
  // not followed (the nested open used to deadlock).
  Schema loop;
  loop.features = {{kHistorySeq, DType::kInt64, Layout::kScalar, ""},
                   {kHistoryEnd, DType::kInt64, Layout::kScalar, ""},
                   {kHistoryLen, DType::kInt64, Layout::kScalar, ""}};
  loop.metadata[kSequenceFileKey] = "loop.rfs";
  loop.metadata[kSequenceIdKey] = "id2";
  Batch loop_rows(std::make_shared<const Schema>(loop));
  for (int c = 0; c < 3; ++c) loop_rows.AddInt64(c, 0);
  ASSERT_TRUE(loop_rows.CommitRow().ok());
  WriteFile(TempPath("refs/loop.rfs"), loop_rows, 2);
  WriteFile(TempPath("refs/loopy.rfd"), loop_rows, 2);
  auto loopy = ReadAll(TempPath("refs/loopy.rfd"));
  ASSERT_FALSE(loopy.ok());
  EXPECT_NE(loopy.status().message().find("refers to another sequence file"), std::string::npos)
      << loopy.status();
}

// A file sorted by history length (as a time-split dataset is by time):
// the sample spans the whole file, not its first rows, and so does the
// decoded-size estimate.
TEST(DatasetFileTest, SampledLengthsSpanASortedFile) {
  Schema s = TestSchema();
  Batch rows(std::make_shared<const Schema>(s));
  double mean = 0;
  for (int r = 0; r < 1000; ++r) {
    const int len = r / 10;  // 0..99, rising through the file.
    mean += len / 1000.0;
    std::vector<int64_t> h(len, 7);
    std::vector<float> none;
    rows.AddInt64(0, r);
    rows.AddInt64(1, 1);
    rows.AddFloat(2, 0);
    rows.AddJaggedInt64(3, h.data(), h.size());
    rows.AddJaggedFloat(4, none.data(), 0);
    ASSERT_TRUE(rows.CommitRow().ok());
  }
  const std::string path = TempPath("sorted_lengths.rfd");
  WriteFile(path, rows, 25);  // 40 blocks; 16 are read.
  absl::StatusOr<std::vector<int64_t>> lengths = SampleRowLengths(path, "history", 200);
  ASSERT_TRUE(lengths.ok()) << lengths.status();
  ASSERT_EQ(lengths->size(), 200u);
  double sampled = 0;
  for (int64_t l : *lengths) sampled += static_cast<double>(l) / 200;
  EXPECT_NEAR(sampled, mean, 0.05 * mean);
  EXPECT_LE(*std::min_element(lengths->begin(), lengths->end()), 5);
  EXPECT_GE(*std::max_element(lengths->begin(), lengths->end()), 94);

  absl::StatusOr<Batch> all = ReadAll(path);
  ASSERT_TRUE(all.ok());
  absl::StatusOr<double> bytes = EstimateDecodedBytes(path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_NEAR(*bytes, static_cast<double>(all->ByteSize()), 0.05 * static_cast<double>(all->ByteSize()));

  EXPECT_EQ(SampleRowLengths(path, "label", 10).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleRowLengths(TempPath("absent.rfd"), "history", 10).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DatasetFileTest, MissingFileIsNotFound) {
  EXPECT_EQ(DatasetReader::Open(TempPath("nope.rfd")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DatasetFile::Open(TempPath("nope.rfd")).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace recfleet::data
