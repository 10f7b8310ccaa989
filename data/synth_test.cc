#include "data/synth.h"

#include <set>

#include "data/dataset_file.h"
#include "gtest/gtest.h"

namespace recfleet::data {
namespace {

TEST(SynthTest, LengthDistributionsStayInRangeWithTheirMean) {
  auto ln = LengthDistribution::Parse("lognormal:mean=1000,sigma=1.2,min=10,max=50000");
  ASSERT_TRUE(ln.ok());
  std::mt19937_64 rng(1);
  double sum = 0;
  int64_t mx = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    int64_t l = ln->Sample(rng);
    ASSERT_GE(l, 10);
    ASSERT_LE(l, 50000);
    sum += l;
    mx = std::max(mx, l);
  }
  EXPECT_NEAR(sum / n, 1000, 60);
  EXPECT_GT(mx, 20000);  // Heavy tail reached.
  auto pl = LengthDistribution::Parse("powerlaw:alpha=1.2,min=10,max=50000");
  ASSERT_TRUE(pl.ok());
  for (int i = 0; i < 10000; ++i) {
    int64_t l = pl->Sample(rng);
    ASSERT_GE(l, 10);
    ASSERT_LE(l, 50000);
  }
  EXPECT_EQ(LengthDistribution::Parse("fixed:7")->Sample(rng), 7);
  EXPECT_FALSE(LengthDistribution::Parse("gamma:k=1").ok());
  EXPECT_FALSE(LengthDistribution::Parse("lognormal:mean=1,min=5,max=2").ok());
}

TEST(SynthTest, ZipfIsMonotone) {
  ZipfSampler z(1000, 1.1);
  std::mt19937_64 rng(2);
  std::vector<int> count(1001);
  for (int i = 0; i < 200000; ++i) {
    uint64_t k = z.Sample(rng);
    ASSERT_GE(k, 1u);
    ASSERT_LE(k, 1000u);
    ++count[k];
  }
  EXPECT_GT(count[1], count[2]);
  EXPECT_GT(count[2], count[10]);
  EXPECT_GT(count[10], count[500]);
  // P(1)/P(2) = 2^1.1 ~ 2.14.
  EXPECT_NEAR(static_cast<double>(count[1]) / count[2], 2.14, 0.15);
}

TEST(SynthTest, AucKnownValues) {
  EXPECT_DOUBLE_EQ(Auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(Auc({1, 2, 3}, {0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Auc({1, 1}, {0, 1}), 0.5);
}

TEST(SynthTest, GeneratesLearnableSplitsWithEveryIdOnce) {
  SynthOptions o;
  o.samples = 3000;
  o.lengths = *LengthDistribution::Parse("lognormal:mean=50,sigma=1,min=1,max=500");
  o.num_items = 5000;
  o.eval_fraction = 0.2;
  std::string dir = std::string(testing::TempDir()) + "/synth";
  ASSERT_TRUE(GenerateSynthetic(o, dir).ok());
  auto train = ReadAll(dir + "/train.rfd");
  auto eval = ReadAll(dir + "/eval.rfd");
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(train->num_rows() + eval->num_rows(), 3000u);
  EXPECT_NEAR(static_cast<double>(eval->num_rows()) / 3000, 0.2, 0.03);
  std::set<int64_t> ids;
  for (const Batch* b : {&*train, &*eval}) {
    int sid = b->schema().Find("sample_id");
    for (size_t r = 0; r < b->num_rows(); ++r) EXPECT_TRUE(ids.insert(b->Int64(sid, r)).second);
  }
  EXPECT_EQ(ids.size(), 3000u);
  EXPECT_EQ(*ids.rbegin(), 2999);
  auto auc = PlantedAuc(dir + "/eval.rfd");
  ASSERT_TRUE(auc.ok()) << auc.status();
  EXPECT_GT(*auc, 0.65);  // The labels carry signal ...
  EXPECT_LT(*auc, 0.99);  // ... and noise.
  // Same seed, same data.
  std::string dir2 = std::string(testing::TempDir()) + "/synth2";
  ASSERT_TRUE(GenerateSynthetic(o, dir2).ok());
  EXPECT_TRUE(*ReadAll(dir2 + "/train.rfd") == *train);
}

}  // namespace
}  // namespace recfleet::data
