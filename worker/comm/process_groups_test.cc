#include "worker/comm/process_groups.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace comm {
namespace {

using ::testing::ElementsAre;

std::vector<std::vector<int>> RanksOf(const std::vector<ProcessGroupSpec>& groups) {
  std::vector<std::vector<int>> out;
  for (const ProcessGroupSpec& g : groups) out.push_back(g.ranks);
  return out;
}

TEST(DeviceMeshTest, FsdpTimesReplicas) {
  auto mesh = DeviceMesh::Create(4, {{"replica", 2}, {"fsdp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(RanksOf(*mesh->AllGroups({"fsdp"})), ElementsAre(ElementsAre(0, 1), ElementsAre(2, 3)));
  EXPECT_THAT(RanksOf(*mesh->AllGroups({"replica"})), ElementsAre(ElementsAre(0, 2), ElementsAre(1, 3)));
  EXPECT_THAT(RanksOf(*mesh->AllGroups({"fsdp", "replica"})), ElementsAre(ElementsAre(0, 1, 2, 3)));
  auto g = mesh->GroupOf(3, {"replica"});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->name, "replica");
  EXPECT_EQ(g->index, 1);
  EXPECT_EQ(g->GroupRank(3), 1);
  EXPECT_EQ(g->GroupRank(0), -1);
  EXPECT_EQ(g->StoreNamespace(), "group/replica/1/");
  // Names follow mesh order whatever order the caller used.
  EXPECT_EQ(mesh->GroupOf(0, {"fsdp", "replica"})->name, "replica+fsdp");
}

TEST(DeviceMeshTest, ThreeDimensionsPartitionTheWorld) {
  // 2 replicas x 3 model-parallel x 2 fsdp = 12 ranks.
  auto mesh = DeviceMesh::Create(12, {{"replica", 2}, {"mp", 3}, {"fsdp", 2}});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->Coordinates(7), ElementsAre(1, 0, 1));
  EXPECT_THAT(RanksOf(*mesh->AllGroups({"mp"})),
              ElementsAre(ElementsAre(0, 2, 4), ElementsAre(1, 3, 5), ElementsAre(6, 8, 10), ElementsAre(7, 9, 11)));
  EXPECT_THAT(RanksOf(*mesh->AllGroups({"replica", "fsdp"})),
              ElementsAre(ElementsAre(0, 1, 6, 7), ElementsAre(2, 3, 8, 9), ElementsAre(4, 5, 10, 11)));
  for (const char* dim : {"replica", "mp", "fsdp"}) {
    auto groups = mesh->AllGroups({dim});
    ASSERT_TRUE(groups.ok());
    std::vector<int> count(12, 0);
    for (const ProcessGroupSpec& g : *groups) {
      for (int r : g.ranks) {
        ++count[r];
        EXPECT_EQ(mesh->GroupOf(r, {dim})->index, g.index);
      }
    }
    EXPECT_THAT(count, ::testing::Each(1)) << dim;
  }
}

TEST(DeviceMeshTest, RejectsBadMeshes) {
  EXPECT_EQ(DeviceMesh::Create(4, {{"a", 3}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceMesh::Create(4, {{"a", 2}, {"a", 2}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceMesh::Create(4, {{"a+b", 4}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DeviceMesh::Create(0, {{"a", 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  auto mesh = DeviceMesh::Create(4, {{"a", 4}});
  EXPECT_EQ(mesh->GroupOf(0, {"b"}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(mesh->GroupOf(4, {"a"}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Four Gloo ranks build fsdp, replica and world groups; an all-reduce in each
// sums exactly over that group's members.
TEST(ProcessGroupsTest, GlooGroupsReduceOverTheirMembers) {
  auto mesh = DeviceMesh::Create(4, {{"replica", 2}, {"fsdp", 2}});
  ASSERT_TRUE(mesh.ok());
  InProcessKvStore base;
  PrefixKvStore store(&base, RendezvousNamespace("job-a", 1));
  CommOptions options;
  options.timeout = absl::Seconds(20);
  RunOnThreads(4, [&](int rank) {
    auto transport = GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok());
    auto groups = ProcessGroups::Build(
        *mesh, rank, {{"fsdp"}, {"replica"}, {"replica", "fsdp"}}, store,
        [&](KvStore& s, int r, int n) { return ConnectGloo(s, r, n, *transport, options); });
    ASSERT_TRUE(groups.ok()) << groups.status();
    for (const char* name : {"fsdp", "replica", "replica+fsdp"}) {
      Communicator* c = groups->Get(name);
      ASSERT_NE(c, nullptr) << name;
      const ProcessGroupSpec* spec = groups->Spec(name);
      EXPECT_EQ(c->rank(), spec->GroupRank(rank));
      int64_t v = int64_t{1} << rank;
      ASSERT_TRUE(c->AllReduce(MakeView(&v, DType::kInt64, {1}), ReduceOp::kSum).ok());
      int64_t want = 0;
      for (int r : spec->ranks) want |= int64_t{1} << r;
      EXPECT_EQ(v, want) << name << " on rank " << rank;
    }
    EXPECT_EQ(groups->Get("mp"), nullptr);
  });
}

// Groups given as explicit rank lists, in communicator order (as an
// assignment carries them): rank 3 is group rank 0 of "tables/0".
TEST(ProcessGroupsTest, BuildsGroupsFromExplicitSpecs) {
  InProcessKvStore store;
  CommOptions options;
  options.timeout = absl::Seconds(20);
  const std::vector<int> order = {3, 1, 0, 2};
  RunOnThreads(4, [&](int rank) {
    auto transport = GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok());
    ProcessGroupSpec tables{"tables/0", 0, order};
    ProcessGroupSpec pair{"pair", rank / 2, {2 * (rank / 2), 2 * (rank / 2) + 1}};
    auto groups = ProcessGroups::BuildFromSpecs(
        rank, {tables, pair}, store, [&](KvStore& s, int r, int n) { return ConnectGloo(s, r, n, *transport, options); });
    ASSERT_TRUE(groups.ok()) << groups.status();
    Communicator* c = groups->Get("tables/0");
    EXPECT_EQ(c->rank(), static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin()));
    // Gathering world ranks shows the communicator order.
    int64_t mine = rank;
    std::vector<int64_t> all(4);
    ASSERT_TRUE(c->AllGather(MakeView(&mine, DType::kInt64, {1}), MakeView(all.data(), DType::kInt64, {4})).ok());
    EXPECT_THAT(all, ElementsAre(3, 1, 0, 2));
    EXPECT_EQ(groups->Get("pair")->size(), 2);
  });
  InProcessKvStore unused;
  auto bad = ProcessGroups::BuildFromSpecs(0, {ProcessGroupSpec{"g", 0, {1, 2}}}, unused,
                                           [](KvStore&, int, int) -> absl::StatusOr<std::unique_ptr<Communicator>> {
                                             return absl::InternalError("must not connect");
                                           });
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("rank 0 is not among"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace comm
}  // namespace recfleet
