#include "engine/movielens.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>

#include "engine/synthetic.h"
#include "engine/test_data.h"
#include "gtest/gtest.h"

namespace recfleet::engine {
namespace {

std::string WriteDataset(const std::string& inter, const std::string& item = "") {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/tiny";
  mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/tiny.inter") << inter;
  if (!item.empty()) std::ofstream(dir + "/tiny.item") << item;
  return dir;
}

TEST(MovieLensTest, ReadsAtomicFilesAndSplitsPerUserByTimeWithStableTies) {
  // User a: 5 events, two share t=20 (file order u2 before u3). floor(0.2*5)
  // = 1 held out: the last by (time, file order) is item u3.
  const std::string dir = WriteDataset(
      "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
      "a\tu1\t5\t10\n"
      "a\tu2\t4\t20\n"
      "b\tu1\t2\t5\n"
      "a\tu3\t1\t20\n"
      "a\tu4\t3\t15\n"
      "b\tu2\t5\t6\n"
      "a\tu5\t4\t1\n",
      "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
      "u1\tA\t1995\tDrama Comedy\n"
      "u3\tB\t1971\tDrama\n");
  absl::StatusOr<MovieLensData> data = ReadMovieLens(dir + "/");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_users, 2);
  EXPECT_EQ(data->num_items, 5);
  EXPECT_EQ(data->item_attr_vocab, 4);  // decade=199, Drama, Comedy, decade=197.
  EXPECT_EQ(data->item_attrs[0].size(), 3u);
  EXPECT_TRUE(data->item_attrs[1].empty());

  CtrOptions options;
  options.max_history = 2;
  absl::StatusOr<MovieLensCtr> ctr = MovieLensCtr::Create(*data, options);
  ASSERT_TRUE(ctr.ok()) << ctr.status();
  EXPECT_EQ(ctr->num_train(), 4 + 2);
  EXPECT_EQ(ctr->num_eval(), 1);
  Batch eval = ctr->MakeBatch(/*eval=*/true, {0});
  // Held out: a/u3 (index 2), rating 1 -> label 0; history = last 2 training
  // events by time: u4 (t=15), u2 (t=20).
  EXPECT_EQ(eval.id_lists[1].ids, std::vector<int64_t>{2});
  EXPECT_EQ(eval.ctr_labels, std::vector<float>{0.0f});
  EXPECT_EQ(eval.sequence[0].ids, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(eval.sequence[1].ids, (std::vector<int64_t>{3, 4}));
  // First training event of user a (u5, t=1) has an empty history.
  Batch first = ctr->MakeBatch(false, {0});
  EXPECT_EQ(first.sequence[0].offsets, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(first.ctr_labels, std::vector<float>{1.0f});
}

TEST(MovieLensTest, ErrorsNameFileAndLine) {
  const std::string dir = WriteDataset(
      "user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
      "a\tu1\t5\t10\n"
      "a\tu1\tfive\t10\n");
  absl::Status s = ReadMovieLens(dir).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tiny.inter: data row 2"), std::string::npos) << s.message();
  EXPECT_EQ(ReadMovieLens(dir + "/missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(MovieLensTest, SyntheticDataHasLearnableBaselines) {
  absl::StatusOr<MovieLensCtr> ctr = MovieLensCtr::Create(SyntheticMovieLens({}), CtrOptions());
  ASSERT_TRUE(ctr.ok());
  EXPECT_GT(ctr->num_eval(), 0);
  absl::StatusOr<BaselineAucs> base = ctr->Baselines();
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_GT(base->item_popularity, 0.6);
  EXPECT_GT(base->user_item_rate, base->item_popularity);
}

// The real ml-100k split; the expected baselines were computed by an
// independent script on the same definition.
TEST(MovieLensTest, Ml100kSplitAndBaselines) {
  const std::string root = SharedDataDir("engine/movielens_test.cc");
  if (root.empty()) GTEST_SKIP() << "shared/data not present";
  absl::StatusOr<MovieLensData> data = ReadMovieLens(root + "/ml-100k");
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->ratings.size(), 100000u);
  EXPECT_EQ(data->num_users, 943);
  EXPECT_EQ(data->num_items, 1682);
  absl::StatusOr<MovieLensCtr> ctr = MovieLensCtr::Create(*std::move(data), CtrOptions());
  ASSERT_TRUE(ctr.ok());
  EXPECT_EQ(ctr->num_train(), 80367);
  EXPECT_EQ(ctr->num_eval(), 19633);
  absl::StatusOr<BaselineAucs> base = ctr->Baselines();
  ASSERT_TRUE(base.ok());
  EXPECT_NEAR(base->item_popularity, 0.72326, 1e-4);
  EXPECT_NEAR(base->user_item_rate, 0.76940, 1e-4);
}

}  // namespace
}  // namespace recfleet::engine
