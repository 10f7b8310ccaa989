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

TEST(FlagsTest, SwitchesShortNamesPositionalsAndRepeats) {
  FlagSpec spec;
  spec.values = {"output", "state"};
  spec.switches = {"watch", "all"};
  spec.short_names = {{'o', "output"}};
  spec.positional = true;
  absl::StatusOr<Flags> f =
      Flags::Parse({"jobs/a", "--watch", "-o", "json", "--state", "RUNNING", "--state=FAILED", "--all=false", "--",
                    "--not-a-flag"},
                   spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Bool("watch"));
  EXPECT_FALSE(f->Bool("all"));  // Given, but false.
  EXPECT_TRUE(f->Has("all"));
  EXPECT_EQ(f->Str("output"), "json");
  EXPECT_EQ(f->All("state"), (std::vector<std::string>{"RUNNING", "FAILED"}));
  EXPECT_EQ(f->Str("state"), "FAILED");  // The last one.
  EXPECT_EQ(f->positional(), (std::vector<std::string>{"jobs/a", "--not-a-flag"}));
  EXPECT_TRUE(f->deprecations().empty());
  // A switch takes no value from the next word.
  f = Flags::Parse({"--watch", "jobs/b"}, spec);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->positional(), (std::vector<std::string>{"jobs/b"}));
  EXPECT_EQ(Flags::Parse({"-x"}, spec).status().message(), "unknown flag -x");
  EXPECT_EQ(Flags::Parse({"jobs/a"}, FlagSpec()).status().message(), "unexpected argument 'jobs/a'");
}

TEST(FlagsTest, SnakeCaseIsAcceptedAsDeprecated) {
  FlagSpec spec;
  spec.values = {"auth-token-file", "page-size"};
  spec.switches = {"dry-run"};
  absl::StatusOr<Flags> f = Flags::Parse({"--auth_token_file", "t", "--page-size=3", "--dry_run"}, spec);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->Str("auth-token-file"), "t");
  EXPECT_EQ(f->Str("page-size"), "3");
  EXPECT_TRUE(f->Bool("dry-run"));
  EXPECT_EQ(f->deprecations(), (std::vector<std::string>{"--auth_token_file is deprecated; use --auth-token-file",
                                                         "--dry_run is deprecated; use --dry-run"}));
  // Only known flags are translated.
  EXPECT_EQ(Flags::Parse({"--no_such=1"}, spec).status().message(), "unknown flag --no_such");
}

}  // namespace
}  // namespace recfleet::cli
