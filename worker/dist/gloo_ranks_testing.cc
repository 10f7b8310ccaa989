#include "worker/dist/gloo_ranks_testing.h"

#include "gtest/gtest.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/kv_store.h"
#include "worker/comm/testing.h"

namespace recfleet {
namespace dist {

void RunOnGlooRanks(int world_size, const std::vector<NamedGroup>& plan_groups, const ParallelismHints& hints,
                    const std::function<void(int, const TrainingGroups&, comm::Communicator&)>& fn) {
  comm::InProcessKvStore store;
  comm::CommOptions options;
  options.timeout = absl::Seconds(60);
  comm::RunOnThreads(world_size, [&](int rank) {
    auto transport = comm::GlooTransport::Create("127.0.0.1");
    ASSERT_TRUE(transport.ok()) << transport.status();
    const comm::CommFactory factory = [&](comm::KvStore& s, int r, int n) {
      return comm::ConnectGloo(s, r, n, *transport, options);
    };
    comm::PrefixKvStore world_store(&store, "world/");
    auto world = factory(world_store, rank, world_size);
    ASSERT_TRUE(world.ok()) << world.status();
    auto specs = TrainingGroupSpecs(rank, world_size, plan_groups, hints);
    ASSERT_TRUE(specs.ok()) << specs.status();
    auto groups = TrainingGroups::BuildFromSpecs(rank, *specs, store, factory);
    ASSERT_TRUE(groups.ok()) << groups.status();
    fn(rank, *groups, **world);
  });
}

}  // namespace dist
}  // namespace recfleet
