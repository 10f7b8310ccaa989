#include "cli/flags.h"

#include "gtest/gtest.h"

namespace recfleet::cli {
namespace {

TEST(FlagsTest, BothFormsAndDefaults) {
  absl::StatusOr<Flags> f = Flags::Parse({"--ranks", "8", "--cost=quadratic"}, {"ranks", "cost", "seed"});
  ASSERT_TRUE(f.ok()) << f.status();
  int ranks = 0;
  int64_t seed = 7;
  ASSERT_TRUE(f->Get("ranks", &ranks).ok());
  ASSERT_TRUE(f->Get("seed", &seed).ok());
  EXPECT_EQ(ranks, 8);
  EXPECT_EQ(seed, 7);  // Not given: unchanged.
  EXPECT_EQ(f->Str("cost"), "quadratic");
  EXPECT_EQ(f->Str("seed", "none"), "none");
  EXPECT_TRUE(f->Has("cost"));
  EXPECT_FALSE(f->Has("seed"));
}

TEST(FlagsTest, ErrorsNameTheFlag) {
  EXPECT_EQ(Flags::Parse({"--bogus", "1"}, {"ranks"}).status().message(), "unknown flag --bogus");
  EXPECT_EQ(Flags::Parse({"--ranks"}, {"ranks"}).status().message(), "--ranks needs a value");
  EXPECT_EQ(Flags::Parse({"ranks"}, {"ranks"}).status().message(), "unexpected argument 'ranks'");
  absl::StatusOr<Flags> f = Flags::Parse({"--ranks", "eight"}, {"ranks"});
  ASSERT_TRUE(f.ok());
  int ranks = 3;
  EXPECT_EQ(f->Get("ranks", &ranks).message(), "--ranks: 'eight' is not a number");
  EXPECT_EQ(ranks, 3);
  double x = 0;
  absl::StatusOr<Flags> g = Flags::Parse({"--x=0.25"}, {"x"});
  ASSERT_TRUE(g->Get("x", &x).ok());
  EXPECT_EQ(x, 0.25);
}

}  // namespace
}  // namespace recfleet::cli
