#include "data/loader.h"

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "data/balance.h"
#include "data/ingest.h"
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

// An ingested log: histories by reference, a user's samples together.
std::string IngestLog(const std::string& name) {
  std::string text = "user_id\titem_id\trating\ttimestamp\n";
  std::mt19937_64 rng(17);
  for (int u = 0; u < 60; ++u) {
    const int events = 2 + static_cast<int>(std::exp((rng() % 1000) / 170.0));  // 3..~360.
    for (int e = 0; e < events; ++e) {
      text += absl::StrCat("u", u, "\t", rng() % 500, "\t", 1 + rng() % 5, "\t", e * 600, "\n");
    }
  }
  const std::string dir = std::string(testing::TempDir()) + "/" + name;
  std::ofstream(dir + ".tsv") << text;
  IngestOptions o;
  o.path = dir + ".tsv";
  o.max_history = 100;
  o.rows_per_block = 64;
  auto stats = Ingest(o, dir);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return dir;
}

TEST(LoaderTest, DeliversReferencedHistoriesOfAnIngestedLog) {
  const std::string dir = IngestLog("ingested");
  auto all = ReadAll(dir + "/train.rfd");
  ASSERT_TRUE(all.ok()) << all.status();
  const int id = all->schema().Find("sample_id");
  std::map<int64_t, size_t> row_of;
  for (size_t r = 0; r < all->num_rows(); ++r) row_of[all->Int64(id, r)] = r;
  auto l = Loader::Open(Options({dir + "/train.rfd"}));
  ASSERT_TRUE(l.ok()) << l.status();
  size_t delivered = 0;
  for (int64_t s = 0; s < (*l)->steps_per_epoch(); ++s) {
    auto step = (*l)->Step(0, s);
    ASSERT_TRUE(step.ok()) << step.status();
    for (const RankBatch& rb : step->ranks) {
      const Batch& b = rb.samples;
      for (size_t r = 0; r < b.num_rows(); ++r, ++delivered) {
        const size_t want = row_of.at(b.Int64(id, r));
        for (const char* f : {"history_items", "history_actions", "history_time_buckets"}) {
          const int c = b.schema().Find(f);
          ASSERT_EQ(b.RowLength(c, r), all->RowLength(c, want)) << f;
          for (size_t k = 0; k < b.RowLength(c, r); ++k) {
            ASSERT_EQ(b.JaggedInt64(c, r)[k], all->JaggedInt64(c, want)[k]) << f;
          }
        }
      }
    }
  }
  EXPECT_EQ(delivered, all->num_rows());
}

// The report's numbers for naive and recfleet dealing are the loader's own,
// step by step, on the same file.
TEST(LoaderTest, BalanceReportSeesTheLoadersWindows) {
  const std::string dir = IngestLog("report");
  LoaderOptions o = Options({dir + "/train.rfd"});
  o.deal.ranks = 4;
  o.deal.base_batch = 16;
  o.deal.base_batches_per_rank = 4;
  o.cost = CostModel{1.0, 0.01};
  auto l = Loader::Open(o);
  ASSERT_TRUE(l.ok()) << l.status();
  auto windows = EpochWindows(**l, 2);
  ASSERT_TRUE(windows.ok()) << windows.status();
  const int64_t full = (*l)->samples_per_epoch() / o.deal.WindowSize();
  ASSERT_GE(full, 5);
  ASSERT_EQ(static_cast<int64_t>(windows->size()), 2 * full);
  std::vector<double> naive, recfleet;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t s = 0; s < full; ++s) {
      auto plan = (*l)->Plan(epoch, s);
      ASSERT_TRUE(plan.ok());
      naive.push_back((*plan)->naive_gap);
      recfleet.push_back((*plan)->gap);
    }
  }
  auto rows = BalanceOfWindows(*windows, o.cost, o.deal);
  ASSERT_EQ(rows[0].policy, "naive");
  ASSERT_EQ(rows[2].policy, "recfleet");
  EXPECT_EQ(rows[0].gap.steps, naive.size());
  EXPECT_DOUBLE_EQ(rows[0].gap.mean, Summarize(naive).mean);
  EXPECT_DOUBLE_EQ(rows[0].gap.max, Summarize(naive).max);
  EXPECT_DOUBLE_EQ(rows[2].gap.mean, Summarize(recfleet).mean);
  // Dealing independent draws of the same lengths is another experiment:
  // the loader keeps a user's (similar-length) samples together.
  std::vector<int64_t> lengths;
  for (const auto& w : *windows) lengths.insert(lengths.end(), w.begin(), w.end());
  auto shuffled = ComputeBalance(lengths, o.cost, o.deal, 1, 1);
  EXPECT_NE(shuffled[0].gap.mean, rows[0].gap.mean);
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
