#include "services/coordinator/gang_scheduler.h"

#include "gtest/gtest.h"
#include "services/coordinator/test_specs.h"

namespace recfleet::coordinator {
namespace {

WorkerView Worker(const std::string& id, int gpus, const std::string& node,
                  const std::string& domain, const std::string& zone = "z1") {
  WorkerView w;
  w.id = id;
  w.gpus = gpus;
  w.topology.set_node(node);
  w.topology.set_nvlink_domain(domain);
  w.topology.set_zone(zone);
  return w;
}

std::vector<std::string> Ids(const Placement& p) {
  std::vector<std::string> out;
  for (const auto& w : p.workers) out.push_back(w.id);
  return out;
}

TEST(GangSchedulerTest, NeedsTheWholeGang) {
  auto spec = ValidSpec(3);
  EXPECT_FALSE(PlaceGang(spec, {Worker("a", 0, "n1", "d1"), Worker("b", 0, "n1", "d1")}));
  EXPECT_TRUE(PlaceGang(spec, {Worker("a", 0, "n1", "d1"), Worker("b", 0, "n1", "d1"),
                               Worker("c", 0, "n2", "d1")}));
}

TEST(GangSchedulerTest, SkipsWorkersWithTooFewGpus) {
  auto spec = ValidSpec(2);
  spec.mutable_resources()->set_gpus_per_worker(8);
  EXPECT_FALSE(PlaceGang(spec, {Worker("a", 8, "n1", "d1"), Worker("b", 4, "n2", "d1")}));
  auto p = PlaceGang(spec, {Worker("a", 8, "n1", "d1"), Worker("b", 4, "n2", "d1"),
                            Worker("c", 8, "n3", "d1")});
  ASSERT_TRUE(p);
  EXPECT_EQ(Ids(*p), std::vector<std::string>({"a", "c"}));
  EXPECT_EQ(p->ranks_per_worker, 8);
}

TEST(GangSchedulerTest, PrefersOneNvlinkDomainAndGroupsNodes) {
  auto spec = ValidSpec(3);
  // d2 fits the gang exactly; d1 is bigger; a best fit keeps d1 free.
  auto p = PlaceGang(spec, {Worker("a", 0, "n1", "d1"), Worker("b", 0, "n1", "d1"),
                            Worker("c", 0, "n2", "d1"), Worker("d", 0, "n3", "d1"),
                            Worker("x", 0, "n9", "d2"), Worker("y", 0, "n8", "d2"),
                            Worker("z", 0, "n9", "d2")});
  ASSERT_TRUE(p);
  // Same-node workers get consecutive ranks.
  EXPECT_EQ(Ids(*p), std::vector<std::string>({"y", "x", "z"}));
}

TEST(GangSchedulerTest, DefaultGroupsCoverWorldAndNodes) {
  auto spec = ValidSpec(2);
  spec.mutable_resources()->set_gpus_per_worker(2);
  Placement p;
  p.workers = {Worker("a", 2, "n1", "d1"), Worker("b", 2, "n2", "d1")};
  p.ranks_per_worker = 2;
  auto plan = DefaultGroups(spec, p);
  ASSERT_TRUE(plan.ok());
  const auto* groups = &plan->groups;
  ASSERT_EQ(groups->size(), 3u);
  EXPECT_EQ((*groups)[0].name(), "world");
  EXPECT_EQ((*groups)[0].ranks_size(), 4);
  EXPECT_EQ((*groups)[2].name(), "node/n2");
  EXPECT_EQ((*groups)[2].ranks(0), 2);
  EXPECT_EQ((*groups)[2].ranks(1), 3);
}

}  // namespace
}  // namespace recfleet::coordinator
