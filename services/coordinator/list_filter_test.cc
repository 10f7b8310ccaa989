#include "services/coordinator/list_filter.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(ListFilterTest, EmptyMatchesEverything) {
  EXPECT_TRUE(ParseLabelFilter("")->empty());
  EXPECT_TRUE(ParseLabelFilter("   ")->empty());
}

TEST(ListFilterTest, QuotedAndBareTermsJoinedByAnd) {
  absl::StatusOr<std::map<std::string, std::string>> f =
      ParseLabelFilter(R"(labels.team = "rank ing" AND labels.owner=alice AND labels.a/b.c = "x\"y")");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_THAT(*f, UnorderedElementsAre(Pair("team", "rank ing"), Pair("owner", "alice"),
                                       Pair("a/b.c", "x\"y")));
  // The same pair twice is fine; two values for one key can match nothing.
  EXPECT_TRUE(ParseLabelFilter("labels.a = x AND labels.a = x").ok());
  EXPECT_THAT(std::string(ParseLabelFilter("labels.a = x AND labels.a = y").status().message()),
              HasSubstr("no job can match"));
}

TEST(ListFilterTest, AnythingElseIsRejectedWithTheColumn) {
  for (const char* bad : {"team = x", "labels. = x", "labels.team x", "labels.team = ",
                          "labels.team = \"open", "labels.a = x and labels.b = y",
                          "labels.a = x OR labels.b = y", "labels.a = x AND", "labels.a = x y",
                          "labels.a = x ANDlabels.b = y", "labels.a = a*b"}) {
    absl::StatusOr<std::map<std::string, std::string>> f = ParseLabelFilter(bad);
    EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(f.status().message()), HasSubstr("column")) << bad;
  }
  EXPECT_THAT(std::string(ParseLabelFilter("labels.a = x OR labels.b = y").status().message()),
              HasSubstr("expected AND or the end of the filter at column 14"));
}

}  // namespace
}  // namespace recfleet::coordinator
