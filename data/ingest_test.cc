#include "data/ingest.h"

#include <fstream>
#include <map>
#include <set>

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
