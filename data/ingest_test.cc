#include "data/ingest.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "data/dataset_file.h"
#include "data/test_data_dir.h"
#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

std::string Dir(const std::string& name) { return std::string(testing::TempDir()) + "/" + name; }

std::string WriteText(const std::string& name, const std::string& text) {
  std::string path = Dir(name);
  std::ofstream(path) << text;
  return path;
}

Batch Read(const std::string& path) {
  auto b = ReadAll(path);
  EXPECT_TRUE(b.ok()) << b.status();
  return *std::move(b);
}

std::vector<int64_t> History(const Batch& b, size_t row) {
  int c = b.schema().Find("history_items");
  return std::vector<int64_t>(b.JaggedInt64(c, row), b.JaggedInt64(c, row) + b.RowLength(c, row));
}

int64_t Get(const Batch& b, const char* name, size_t row) {
  return b.Int64(b.schema().Find(name), row);
}

TEST(IngestTest, AtomicTabFileWithAttributesTiesAndTimeSplit) {
  // User u1's events at times 10, 10, 5, 20, 30: ties keep file order.
  std::string inter = WriteText("a.inter",
                                "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
                                "u1\tA\t5\t10\n"
                                "u2\tA\t2\t1\n"
                                "u1\tB\t3\t10\n"
                                "u1\tC\t4\t5\n"
                                "\n"
                                "u1\tD\t1\t20\n"
                                "u1\tE\t4\t30\n");
  std::string user = WriteText("a.user", "user_id:token\tage:token\tgender:token\nu1\t24\tM\n");
  std::string item = WriteText("a.item",
                               "item_id:token\tyear:token\tclass:token_seq\n"
                               "A\t1995\tComedy Drama\nB\t1996\tDrama\n");
  IngestOptions o;
  o.path = inter;
  o.user_features = user;
  o.item_features = item;
  o.max_history = 3;
  o.eval_fraction = 0.2;
  auto stats = Ingest(o, Dir("out_a"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->users, 2);
  EXPECT_EQ(stats->events, 6);
  EXPECT_EQ(stats->skipped_lines, 1);
  Batch train = Read(Dir("out_a/train.rfd"));
  Batch eval = Read(Dir("out_a/eval.rfd"));
  // u1: 5 events -> last 1 in eval; u2: 1 event -> round(0.2) = 0 in eval.
  ASSERT_EQ(train.num_rows(), 5u);
  ASSERT_EQ(eval.num_rows(), 1u);
  // Dense ids by first appearance: u1=1, u2=2; A=1, B=2, C=3, D=4, E=5.
  // u1 in time order: C(5), A(10), B(10), D(20), E(30).
  std::vector<int64_t> cands;
  for (size_t r = 0; r < 4; ++r) cands.push_back(Get(train, "item_id", r));
  EXPECT_EQ(cands, (std::vector<int64_t>{3, 1, 2, 4}));
  EXPECT_EQ(History(train, 0), (std::vector<int64_t>{}));
  EXPECT_EQ(History(train, 2), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(History(eval, 0), (std::vector<int64_t>{1, 2, 4}));  // Capped at 3.
  int label = train.schema().Find("label");
  EXPECT_EQ(train.Float(label, 0), 1.0f);  // C rated 4.
  EXPECT_EQ(train.Float(label, 2), 0.0f);  // B rated 3.
  // Side features: u1's gender, item A's genres (a jagged id list).
  int gender = train.schema().Find("user_gender");
  int genres = train.schema().Find("item_class");
  ASSERT_GE(gender, 0);
  ASSERT_GE(genres, 0);
  EXPECT_EQ(train.schema().features[genres].layout, Layout::kJagged);
  EXPECT_EQ(train.Int64(gender, 0), 1);
  EXPECT_EQ(train.RowLength(genres, 1), 2u);  // A: Comedy Drama.
  EXPECT_EQ(train.RowLength(genres, 0), 0u);  // C: no attributes.
  EXPECT_EQ(train.Int64(gender, 4), 0);       // u2: unknown user.
  EXPECT_EQ(train.schema().metadata.at("table.item.rows"), "6");
  // Sample ids are unique across the splits.
  std::set<int64_t> ids;
  for (const Batch* b : {&train, &eval}) {
    for (size_t r = 0; r < b->num_rows(); ++r) ids.insert(Get(*b, "sample_id", r));
  }
  EXPECT_EQ(ids.size(), 6u);
}

TEST(IngestTest, DoubleColonWithoutHeaderUsesDefaultColumns) {
  std::string path = WriteText("ratings.dat", "1::10::5::100\n1::11::2::50\n2::10::4::7\n");
  IngestOptions o;
  o.path = path;
  o.eval_fraction = 0;
  auto stats = Ingest(o, Dir("out_b"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  Batch train = Read(Dir("out_b/train.rfd"));
  ASSERT_EQ(train.num_rows(), 3u);
  EXPECT_EQ(Get(train, "item_id", 0), 2);  // Item "11" at time 50 comes first.
  EXPECT_EQ(Get(train, "timestamp", 0), 50);
  EXPECT_EQ(stats->positives, 2);
}

// Times are stored as int64: one beyond that range is refused by name (a
// fuzzer found 4.4e35 converted to an integer: undefined behaviour), and
// negative times order events like any other.
TEST(IngestTest, OutOfRangeTimesAreRefusedNegativeOnesOrder) {
  IngestOptions o;
  o.path = WriteText("huge.dat", "1::10::5::444444444444444444444444444444444444\n1::11::2::7\n");
  o.eval_fraction = 0;
  auto huge = Ingest(o, Dir("out_huge"));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("is not a finite number within +-9.2e18"),
            std::string::npos)
      << huge.status();
  o.path = WriteText("negative.dat", "1::10::5::30\n1::11::2::-5\n1::12::4::7\n");
  auto stats = Ingest(o, Dir("out_negative"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  Batch train = Read(Dir("out_negative/train.rfd"));
  ASSERT_EQ(train.num_rows(), 3u);
  EXPECT_EQ(Get(train, "item_id", 0), 2);  // Item "11" at time -5 first, "10" last.
  EXPECT_EQ(Get(train, "item_id", 2), 1);
}

TEST(IngestTest, CsvWithColumnMappingAndUserSplit) {
  std::string text = "ts,who,what,stars\n";
  for (int u = 0; u < 200; ++u) {
    for (int k = 0; k < 3; ++k)
      text += std::to_string(k) + ",user" + std::to_string(u) + ",i" + std::to_string(k + u % 7) +
              ",5\n";
  }
  IngestOptions o;
  o.path = WriteText("log.csv", text);
  o.user_column = "who";
  o.item_column = "what";
  o.time_column = "ts";
  o.rating_column = "stars";
  o.split = IngestOptions::Split::kUser;
  o.eval_fraction = 0.25;
  auto stats = Ingest(o, Dir("out_c"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  Batch train = Read(Dir("out_c/train.rfd"));
  Batch eval = Read(Dir("out_c/eval.rfd"));
  std::set<int64_t> train_users, eval_users;
  for (size_t r = 0; r < train.num_rows(); ++r) train_users.insert(Get(train, "user_id", r));
  for (size_t r = 0; r < eval.num_rows(); ++r) eval_users.insert(Get(eval, "user_id", r));
  for (int64_t u : eval_users) EXPECT_EQ(train_users.count(u), 0u);
  EXPECT_EQ(train_users.size() + eval_users.size(), 200u);
  EXPECT_NEAR(eval_users.size() / 200.0, 0.25, 0.08);
  EXPECT_EQ(eval.num_rows(), 3 * eval_users.size());
}

// Lines are read in chunks: a line longer than a chunk, CRLF endings and
// a last line without '\n' still parse. Ids are raw strings ("007" and
// "7" differ) however they are looked up, and times in any number form
// order with the integer ones.
TEST(IngestTest, LongLinesLineEndingsAndIdForms) {
  std::string line = "u1";
  for (int i = 0; i < 300000; ++i) line += " x" + std::to_string(i % 5000);
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = WriteText("long.txt", line + "\r\nu2 x1 x2\r\nu3 x3 x4");
  o.max_history = 8;
  auto stats = Ingest(o, Dir("out_long"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->users, 3);
  EXPECT_EQ(stats->items, 5000);
  EXPECT_EQ(stats->events, 300004);

  o = IngestOptions();
  o.path = WriteText("forms.csv",
                     "user_id,item_id,rating,timestamp\r\n7,007,4.5,1e3\r\n07,7,5,999\r\n7,7,3,1000");
  o.eval_fraction = 0;
  stats = Ingest(o, Dir("out_forms"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->users, 2);
  EXPECT_EQ(stats->items, 2);
  Batch train = Read(Dir("out_forms/train.rfd"));
  ASSERT_EQ(train.num_rows(), 3u);
  // User "7": item "007" at 1e3 and item "7" at 1000 tie; file order wins.
  EXPECT_EQ(Get(train, "user_id", 0), 1);
  EXPECT_EQ(Get(train, "item_id", 0), 1);
  EXPECT_EQ(Get(train, "timestamp", 0), 1000);
  EXPECT_EQ(Get(train, "item_id", 1), 2);
  EXPECT_EQ(train.Float(train.schema().Find("label"), 0), 1.0f);  // 4.5 >= 4.
  EXPECT_EQ(train.Float(train.schema().Find("label"), 1), 0.0f);
  EXPECT_EQ(Get(train, "user_id", 2), 2);
}

TEST(IngestTest, SequenceFileGetsSampledNegatives) {
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = WriteText("seq.txt", "1 1 2 3 4 5\n2 6 7 8 4 9\n3 1 2 6 7 8\n");
  o.eval_fraction = 0.2;
  auto stats = Ingest(o, Dir("out_d"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->events, 15);
  EXPECT_EQ(stats->positives, 15);
  EXPECT_EQ(stats->train_samples + stats->eval_samples, 30);
  Batch train = Read(Dir("out_d/train.rfd"));
  // Every negative is an item its user never interacted with.
  std::map<int64_t, std::set<int64_t>> seen;
  int label = train.schema().Find("label");
  for (size_t r = 0; r < train.num_rows(); ++r) {
    if (train.Float(label, r) > 0.5f)
      seen[Get(train, "user_id", r)].insert(Get(train, "item_id", r));
  }
  for (size_t r = 0; r < train.num_rows(); ++r) {
    if (train.Float(label, r) < 0.5f) {
      EXPECT_EQ(seen[Get(train, "user_id", r)].count(Get(train, "item_id", r)), 0u);
    }
  }
  // User 1's 4th event: history = its first three items.
  EXPECT_EQ(History(train, 6), (std::vector<int64_t>{1, 2, 3}));
}

// The old way, for comparison: each sample's history computed from the raw
// log (user's earlier events in time order, capped).
TEST(IngestTest, HistoriesByReferenceReadAsInlineHistories) {
  std::string text = "user_id\titem_id\trating\ttimestamp\n";
  std::mt19937 rng(3);
  for (int i = 0; i < 400; ++i) {
    text += absl::StrCat("u", rng() % 9, "\ti", rng() % 40, "\t", 1 + rng() % 5, "\t",
                         1000000 + (rng() % 50) * 3600 * (1 + rng() % 40), "\n");
  }
  IngestOptions o;
  o.path = WriteText("ref.tsv", text);
  o.max_history = 7;
  o.negatives_per_positive = 2;
  o.eval_fraction = 0.3;
  auto stats = Ingest(o, Dir("out_ref"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  // The sample files store references, not histories.
  auto stored = DatasetReader::Open(Dir("out_ref/train.rfd"));
  ASSERT_TRUE(stored.ok());
  auto seqs = ReadAll(Dir("out_ref/sequences.rfs"));
  ASSERT_TRUE(seqs.ok()) << seqs.status();
  EXPECT_EQ(seqs->num_rows(), 9u);
  const int items = seqs->schema().Find("items"), times = seqs->schema().Find("times"),
            actions = seqs->schema().Find("actions");
  size_t rows = 0;
  for (const char* f : {"out_ref/train.rfd", "out_ref/eval.rfd"}) {
    Batch b = Read(Dir(f));
    rows += b.num_rows();
    const int hist = b.schema().Find("history_items");
    const int buckets = b.schema().Find("history_time_buckets");
    const int acts = b.schema().Find("history_actions");
    ASSERT_GE(hist, 0);
    ASSERT_GE(buckets, 0);
    ASSERT_GE(acts, 0);
    for (size_t r = 0; r < b.num_rows(); ++r) {
      const int64_t seq = Get(b, "history_seq", r), end = Get(b, "history_end", r);
      const int64_t from = std::max<int64_t>(0, end - 7);
      ASSERT_EQ(static_cast<int64_t>(b.RowLength(hist, r)), end - from);
      const int64_t now = Get(b, "timestamp", r);
      EXPECT_EQ(now, seqs->JaggedInt64(times, seq)[end]);  // The sample's own event.
      for (int64_t k = from; k < end; ++k) {
        EXPECT_EQ(b.JaggedInt64(hist, r)[k - from], seqs->JaggedInt64(items, seq)[k]);
        EXPECT_EQ(b.JaggedInt64(acts, r)[k - from], seqs->JaggedInt64(actions, seq)[k]);
        const double hours = (now - seqs->JaggedInt64(times, seq)[k]) / 3600.0;
        EXPECT_EQ(b.JaggedInt64(buckets, r)[k - from],
                  std::min<int64_t>(63, static_cast<int64_t>(std::log2(1 + hours))));
      }
      // A negative (label 0 right after its positive) shares its history.
      if (r > 0 && Get(b, "history_end", r - 1) == end && Get(b, "history_seq", r - 1) == seq) {
        EXPECT_EQ(History(b, r), History(b, r - 1));
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(rows), stats->train_samples + stats->eval_samples);
  EXPECT_EQ(rows, 400u * 3);  // Explicit ratings with 2 negatives each.
}

TEST(IngestTest, SpilledSortGivesTheSameFiles) {
  std::string text;
  std::mt19937 rng(5);
  for (int i = 0; i < 500; ++i) {
    text += absl::StrCat(rng() % 30, "::", rng() % 60, "::", 1 + rng() % 5, "::", rng() % 20, "\n");
  }
  IngestOptions o;
  o.path = WriteText("spill.dat", text);
  o.negatives_per_positive = 1;
  auto in_memory = Ingest(o, Dir("out_mem"));
  ASSERT_TRUE(in_memory.ok()) << in_memory.status();
  EXPECT_EQ(in_memory->sort_runs, 0);
  o.sort_buffer_events = 37;
  auto spilled = Ingest(o, Dir("out_spill"));
  ASSERT_TRUE(spilled.ok()) << spilled.status();
  EXPECT_EQ(spilled->sort_runs, 14);  // ceil(500 / 37).
  for (const char* f : {"train.rfd", "eval.rfd"}) {
    EXPECT_TRUE(Read(Dir(std::string("out_mem/") + f)) == Read(Dir(std::string("out_spill/") + f)))
        << f;
  }
  // No run files are left behind.
  for (const auto& e : std::filesystem::directory_iterator(Dir("out_spill"))) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }
}

TEST(IngestTest, ByteOrderMarksAndNanRatings) {
  IngestOptions o;
  o.path = WriteText("bom.tsv", "\xEF\xBB\xBFuser_id\titem_id\trating\ttimestamp\n1\t2\t5\t10\n"
                                "1\t3\tnan\t11\n2\t3\t4\t12\n");
  auto stats = Ingest(o, Dir("out_bom"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("line 3, column 2: rating 'nan' is not a finite number"),
            std::string::npos)
      << stats.status();
  o.bad_ratings = IngestOptions::BadRatings::kSkip;
  stats = Ingest(o, Dir("out_bom"));
  ASSERT_TRUE(stats.ok()) << stats.status();  // The UTF-8 mark did not hide the header.
  EXPECT_EQ(stats->events, 2);
  EXPECT_EQ(stats->skipped_ratings, 1);
  o.path = WriteText("utf16.tsv", "\xFF\xFEu\0s\0e\0r\0\n");
  stats = Ingest(o, Dir("out_bom"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("UTF-16"), std::string::npos) << stats.status();
}

TEST(IngestTest, PopularityWeightedNegativesAreSeededAndFollowCounts) {
  // Item "hot" has 60 of the 100 events, 40 others one each. The 40 users
  // who never saw "hot" draw it as their negative with probability ~0.6
  // under popularity sampling, 1/41 under uniform sampling.
  std::string text;
  for (int u = 0; u < 60; ++u) text += absl::StrCat("fan", u, " hot\n");
  for (int i = 0; i < 40; ++i) text += absl::StrCat("x", i, " c", i, "\n");
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = WriteText("pop.txt", text);
  o.eval_fraction = 0;
  o.negatives_per_positive = 1;
  auto count_hot = [&](const std::string& out) {
    EXPECT_TRUE(Ingest(o, Dir(out)).ok());
    Batch b = Read(Dir(out + "/train.rfd"));
    int hot = 0, negatives = 0;
    for (size_t r = 0; r < b.num_rows(); ++r) {
      if (b.Float(b.schema().Find("label"), r) > 0.5f) continue;
      ++negatives;
      hot += Get(b, "item_id", r) == 1;
    }
    return std::make_pair(hot, negatives);
  };
  auto uniform = count_hot("out_uni");
  o.negative_sampling = IngestOptions::Negatives::kPopularity;
  auto popular = count_hot("out_pop");
  EXPECT_EQ(uniform.second, 100);
  EXPECT_EQ(popular.second, 100);
  EXPECT_LT(uniform.first, 8);   // Expected ~1.
  EXPECT_GT(popular.first, 14);  // Expected ~24.
  count_hot("out_pop2");  // Same seed, same negatives.
  EXPECT_TRUE(Read(Dir("out_pop/train.rfd")) == Read(Dir("out_pop2/train.rfd")));
}

TEST(IngestTest, MissingOrForeignSequenceFileSaysReingest) {
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = WriteText("s1.txt", "1 1 2 3\n2 2 3 4\n");
  ASSERT_TRUE(Ingest(o, Dir("out_s1")).ok());
  o.path = WriteText("s2.txt", "1 5 6 7\n");
  ASSERT_TRUE(Ingest(o, Dir("out_s2")).ok());
  std::filesystem::copy_file(Dir("out_s2/sequences.rfs"), Dir("out_s1/sequences.rfs"),
                             std::filesystem::copy_options::overwrite_existing);
  auto foreign = DatasetFile::Open(Dir("out_s1/train.rfd"));
  ASSERT_FALSE(foreign.ok());
  EXPECT_NE(foreign.status().message().find("re-ingest"), std::string::npos) << foreign.status();
  std::filesystem::remove(Dir("out_s1/sequences.rfs"));
  auto missing = ReadAll(Dir("out_s1/eval.rfd"));
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("sequences.rfs"), std::string::npos)
      << missing.status();
  EXPECT_NE(missing.status().message().find("re-ingest"), std::string::npos) << missing.status();
}

TEST(IngestTest, ReportsProgressAndEnds) {
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = WriteText("prog.txt", "1 1 2 3\n2 2 3 4\n");
  std::vector<std::string> phases;
  int64_t samples = 0;
  o.progress = [&](const IngestProgress& p) {
    phases.push_back(p.phase);
    samples = p.samples;
  };
  auto stats = Ingest(o, Dir("out_prog"));
  ASSERT_TRUE(stats.ok());
  ASSERT_FALSE(phases.empty());
  EXPECT_EQ(phases.back(), "done");
  EXPECT_EQ(samples, stats->train_samples + stats->eval_samples);
}

TEST(IngestTest, MalformedInputNamesLineAndColumn) {
  IngestOptions o;
  o.path =
      WriteText("bad.tsv", "user_id\titem_id\trating\ttimestamp\n1\t2\t5\t10\n1\t3\tfive\t11\n");
  auto stats = Ingest(o, Dir("out_e"));
  ASSERT_FALSE(stats.ok());
  EXPECT_NE(stats.status().message().find("line 3"), std::string::npos) << stats.status();
  EXPECT_NE(stats.status().message().find("rating 'five'"), std::string::npos) << stats.status();
  o.path = WriteText("short.tsv", "user_id\titem_id\trating\ttimestamp\n1\t2\n");
  EXPECT_FALSE(Ingest(o, Dir("out_e")).ok());
  o.path = WriteText("cols.tsv", "a\tb\n1\t2\n");
  o.header = IngestOptions::Header::kYes;
  auto missing = Ingest(o, Dir("out_e"));
  EXPECT_NE(missing.status().message().find("no column 'user_id'"), std::string::npos)
      << missing.status();
}

TEST(IngestTest, RealMovieLens100k) {
  std::string dir = RealDataDir();
  if (dir.empty()) GTEST_SKIP() << "shared/data not found; set RECFLEET_DATA_DIR";
  IngestOptions o;
  o.path = dir + "/ml-100k/ml-100k.inter";
  o.user_features = dir + "/ml-100k/ml-100k.user";
  o.item_features = dir + "/ml-100k/ml-100k.item";
  o.item_feature_columns = {"release_year", "class"};
  auto stats = Ingest(o, Dir("ml100k"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->users, 943);
  EXPECT_EQ(stats->items, 1682);
  EXPECT_EQ(stats->events, 100000);
  EXPECT_EQ(stats->train_samples + stats->eval_samples, 100000);
  EXPECT_NEAR(stats->eval_samples / 100000.0, 0.2, 0.01);
  EXPECT_NEAR(stats->positives / 100000.0, 0.55, 0.01);  // Ratings >= 4.
  auto f = DatasetFile::Open(Dir("ml100k/train.rfd"));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_GE(f->get()->schema()->Find("user_occupation"), 0);
  EXPECT_GE(f->get()->schema()->Find("item_class"), 0);
}

TEST(IngestTest, RealAmazonBeautySequences) {
  std::string dir = RealDataDir();
  if (dir.empty()) GTEST_SKIP() << "shared/data not found; set RECFLEET_DATA_DIR";
  IngestOptions o;
  o.input = IngestOptions::Input::kSequences;
  o.path = dir + "/amazon-beauty/Beauty.txt";
  auto stats = Ingest(o, Dir("beauty"));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->users, 22363);
  EXPECT_EQ(stats->items, 12101);
  EXPECT_EQ(stats->events, 198502);
  EXPECT_EQ(stats->positives, 198502);
  EXPECT_EQ(stats->train_samples + stats->eval_samples, 2 * 198502);
}

}  // namespace
}  // namespace recfleet::data
