#include "data/loader.h"

#include <fstream>
#include <map>
#include <sstream>

#include "data/synth.h"
#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

// Three files of 0..300 history events per sample, sample ids 0..n-1.
std::vector<std::string> MakeFiles(const std::string& name, int64_t* total) {
  Schema s;
  s.features = {{"sample_id", DType::kInt64, Layout::kScalar, ""},
                {"history_items", DType::kInt64, Layout::kJagged, "item"}};
  auto schema = std::make_shared<const Schema>(s);
  std::mt19937_64 rng(11);
  auto lengths = LengthDistribution::Parse("lognormal:mean=40,sigma=1,min=0,max=300");
  EXPECT_TRUE(lengths.ok());
  std::vector<std::string> files;
  int64_t id = 0;
  for (int f = 0; f < 3; ++f) {
    std::string path = std::string(testing::TempDir()) + "/" + name + std::to_string(f) + ".rfd";
    WriterOptions o;
    o.max_rows_per_block = 17 + 10 * f;
    auto w = DatasetWriter::Create(path, s, o);
    EXPECT_TRUE(w.ok());
    Batch b(schema);
    for (int i = 0; i < 250 + 37 * f; ++i) {
      b.AddInt64(0, id++);
      std::vector<int64_t> h(lengths->Sample(rng), id);
      b.AddJaggedInt64(1, h.data(), h.size());
      EXPECT_TRUE(b.CommitRow().ok());
    }
    EXPECT_TRUE((*w)->Write(b).ok());
    EXPECT_TRUE((*w)->Close().ok());
    files.push_back(path);
  }
  *total = id;
  return files;
}

LoaderOptions Options(const std::vector<std::string>& files) {
  LoaderOptions o;
  o.files = files;
  o.deal.ranks = 3;
  o.deal.base_batch = 8;
  o.deal.base_batches_per_rank = 2;
  o.shuffle_blocks = 3;
  o.seed = 5;
  return o;
}

// sample id -> times delivered, over steps [from, to) of `epoch`.
void Deliver(Loader& l, int64_t epoch, int64_t from, int64_t to, std::map<int64_t, int>* seen) {
  for (int64_t s = from; s < to; ++s) {
    auto step = l.Step(epoch, s);
    ASSERT_TRUE(step.ok()) << step.status();
    for (const RankBatch& rb : step->ranks) {
      ASSERT_EQ(rb.base_batch_offsets.back(), rb.samples.num_rows());
      for (size_t r = 0; r < rb.samples.num_rows(); ++r) ++(*seen)[rb.samples.Int64(0, r)];
    }
  }
}

void ExpectExactlyOnce(const std::map<int64_t, int>& seen, int64_t total) {
  ASSERT_EQ(static_cast<int64_t>(seen.size()), total);
  for (const auto& [id, times] : seen) {
    ASSERT_EQ(times, 1) << "sample " << id;
    ASSERT_LT(id, total);
  }
}

TEST(LoaderTest, EpochDeliversEverySampleOnceWithEvenRanks) {
  int64_t total;
  auto files = MakeFiles("once", &total);
  auto l = Loader::Open(Options(files));
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ((*l)->samples_per_epoch(), total);
  EXPECT_EQ((*l)->steps_per_epoch(), (total + 47) / 48);
  std::map<int64_t, int> seen;
  Deliver(**l, 0, 0, (*l)->steps_per_epoch(), &seen);
  ExpectExactlyOnce(seen, total);
  auto step = (*l)->Step(0, 0);
  ASSERT_TRUE(step.ok());
  for (const RankBatch& rb : step->ranks) {
    EXPECT_EQ(rb.samples.num_rows(), 16u);
    EXPECT_EQ(rb.base_batch_offsets, (std::vector<uint32_t>{0, 8, 16}));
  }
  EXPECT_EQ(step->ranks[2].rank, 2);
  EXPECT_LE(step->gap, step->naive_gap + 1e-12);
}

TEST(LoaderTest, RestartMidEpochResumesExactly) {
  int64_t total;
  auto files = MakeFiles("restart", &total);
  auto first = Loader::Open(Options(files));
  ASSERT_TRUE(first.ok());
  const int64_t steps = (*first)->steps_per_epoch();
  std::map<int64_t, int> seen;
  Deliver(**first, 3, 0, steps / 2, &seen);
  auto again = (*first)->Step(3, steps / 2 - 1);
  first->reset();  // The loader dies; a fresh one resumes at the next step.
  auto second = Loader::Open(Options(files));
  ASSERT_TRUE(second.ok());
  // The resumed loader reproduces any earlier step bit for bit.
  auto replay = (*second)->Step(3, steps / 2 - 1);
  ASSERT_TRUE(again.ok() && replay.ok());
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(again->ranks[r].samples == replay->ranks[r].samples);
  Deliver(**second, 3, steps / 2, steps, &seen);
  ExpectExactlyOnce(seen, total);
}

TEST(LoaderTest, TwoInstancesSplitTheDataWithoutOverlap) {
  int64_t total;
  auto files = MakeFiles("split", &total);
  std::map<int64_t, int> seen;
  int64_t sum = 0;
  for (int i = 0; i < 2; ++i) {
    LoaderOptions o = Options(files);
    o.instance = i;
    o.num_instances = 2;
    o.first_rank = 3 * i;
    auto l = Loader::Open(o);
    ASSERT_TRUE(l.ok());
    sum += (*l)->samples_per_epoch();
    Deliver(**l, 1, 0, (*l)->steps_per_epoch(), &seen);
    EXPECT_EQ((*l)->Step(1, 0)->ranks[0].rank, 3 * i);
  }
  EXPECT_EQ(sum, total);
  ExpectExactlyOnce(seen, total);
}

TEST(LoaderTest, EpochsShuffleDifferentlyAndDropRemainder) {
  int64_t total;
  auto files = MakeFiles("epochs", &total);
  auto l = Loader::Open(Options(files));
  ASSERT_TRUE(l.ok());
  auto a = (*l)->Step(0, 0), b = (*l)->Step(1, 0), c = (*l)->Step(0, 0);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_FALSE(a->ranks[0].samples == b->ranks[0].samples);
  EXPECT_TRUE(a->ranks[0].samples == c->ranks[0].samples);
  LoaderOptions o = Options(files);
  o.drop_remainder = true;
  auto d = Loader::Open(o);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)->steps_per_epoch(), total / 48);
  EXPECT_EQ((*d)->Step(0, total / 48).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(LoaderTest, CorruptBlockIsAnErrorNotData) {
  int64_t total;
  auto files = MakeFiles("corrupt", &total);
  std::string bytes;
  {
    std::ifstream in(files[1], std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    bytes = ss.str();
  }
  bytes[bytes.size() / 2] ^= 0x40;
  std::ofstream(files[1], std::ios::binary | std::ios::trunc) << bytes;
  auto l = Loader::Open(Options(files));
  ASSERT_TRUE(l.ok());
  absl::Status failure;
  for (int64_t s = 0; s < (*l)->steps_per_epoch() && failure.ok(); ++s) {
    failure = (*l)->Step(0, s).status();
  }
  EXPECT_EQ(failure.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failure.message().find(files[1]), std::string::npos) << failure;
}

TEST(LoaderTest, ExpandsDirectories) {
  int64_t total;
  auto files = MakeFiles("dir_", &total);
  auto all = ExpandDatasetPaths(std::string(testing::TempDir()));
  ASSERT_TRUE(all.ok());
  EXPECT_GE(all->size(), 3u);
  EXPECT_FALSE(ExpandDatasetPaths("").ok());
}

}  // namespace
}  // namespace recfleet::data
