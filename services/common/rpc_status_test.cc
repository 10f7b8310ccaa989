#include "services/common/rpc_status.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace recfleet {
namespace {

using ::testing::ElementsAre;
using ::testing::Pair;

TEST(RpcStatusTest, CodeAndMessageCrossUnchanged) {
  const absl::Status s = absl::NotFoundError("jobs/x not found");
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(g.error_message(), "jobs/x not found");
  EXPECT_TRUE(g.error_details().empty());
  EXPECT_EQ(FromGrpcStatus(g), s);
  EXPECT_TRUE(FromGrpcStatus(ToGrpcStatus(absl::OkStatus())).ok());
}

// The violations go out as a google.rpc.Status detail and come back as the
// same list, whatever the message says.
TEST(RpcStatusTest, BadRequestViolationsTravelAsDetails) {
  const absl::Status s = BadRequestError(
      "2 problems; see details", {{"spec.model.tables[2].dim", "must be > 0, got 0"},
                                  {"spec.labels", "keys must be non-empty; got \"\""}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  const grpc::Status g = ToGrpcStatus(s);
  EXPECT_FALSE(g.error_details().empty());
  const absl::Status back = FromGrpcStatus(g);
  EXPECT_EQ(back.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(back.message(), "2 problems; see details");
  EXPECT_THAT(FieldViolationsOf(back),
              ElementsAre(Pair("spec.model.tables[2].dim", "must be > 0, got 0"),
                          Pair("spec.labels", "keys must be non-empty; got \"\"")));
  EXPECT_TRUE(FieldViolationsOf(absl::InvalidArgumentError("plain")).empty());
  // Details a peer sent that are not a google.rpc.Status are ignored.
  const grpc::Status junk(grpc::StatusCode::INTERNAL, "x", "\xff\xff\xff");
  EXPECT_EQ(FromGrpcStatus(junk).code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace recfleet
