#ifndef RECFLEET_WORKER_DIST_LAYOUT_H_
#define RECFLEET_WORKER_DIST_LAYOUT_H_

// From a job's parallelism hints (or the planner's decision) to the process
// groups a rank trains with:
//   dense   mesh {replica, fsdp}: FSDP groups of consecutive ranks, replicas
//           across them;
//   sparse  mesh {table_replica, tables}: embedding tables sharded over
//           groups of consecutive ranks, replicated across them.
// Pure arithmetic down to group specs, then one
// ProcessGroups::BuildFromSpecs per side (dense, sparse).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/process_groups.h"

namespace recfleet {
namespace dist {

// Mirrors recfleet.v1.ParallelismHints; 0 means "not set".
struct ParallelismHints {
  int fsdp_group_size = 0;
  int replicas = 0;
  int table_group_size = 0;
};

struct ParallelLayout {
  int fsdp_group_size = 1;
  int replicas = 1;
  int table_group_size = 1;

  // Fills unset hints: FSDP over the whole world unless replicas say
  // otherwise, tables over the FSDP group. InvalidArgument when the sizes do
  // not divide the world.
  static absl::StatusOr<ParallelLayout> FromHints(int world_size, const ParallelismHints& hints);

  // Rank `rank`'s four groups (fsdp, replica, tables, table_replica; the
  // order TrainingGroups::BuildFromSpecs takes): FSDP and table groups of
  // consecutive ranks, replicas across them.
  absl::StatusOr<std::vector<comm::ProcessGroupSpec>> GroupSpecs(int rank) const;
};

// A named group of world ranks as a coordinator assignment lists it
// ("fsdp/0", "replica/1", "tables/0", ...; recfleet.v1.ProcessGroup).
struct NamedGroup {
  std::string name;
  std::vector<int> ranks;
};

// The four groups rank `rank` trains with, in the order fsdp, replica,
// tables, table_replica (names without the index, as TrainingGroups wants
// them), taken from a plan's groups:
//   fsdp           the "fsdp/<i>" group holding `rank`;
//   tables         the "tables/<i>" group holding it (the FSDP group when
//                  the plan has no "tables/" groups);
//   replica, table_replica
//                  the ranks at `rank`'s position in every fsdp (tables)
//                  group, in group-index order: those holding the same shard.
//   expert         (only when the plan has expert-parallel groups) the
//                  "expert/<module>/<i>" group holding it;
//   expert_replica (with expert) the ranks at `rank`'s position in every
//                  expert group: those owning the same experts;
//   table_shards   (V3 only) the "table_shards/<i>" group holding it: ranks
//                  at its position in other table groups, which split the
//                  rows of the shards they hold.
// Without any "fsdp/" group the layout comes from `hints` (FromHints).
// InvalidArgument when a prefix's groups do not split the world into
// equal-size groups, when expert groups name more than one module
// (GEM-lite has one mixture of experts), or when a "table_shards/" group
// holds ranks of different table positions.
absl::StatusOr<std::vector<comm::ProcessGroupSpec>> TrainingGroupSpecs(int rank, int world_size,
                                                                       const std::vector<NamedGroup>& plan_groups,
                                                                       const ParallelismHints& hints);

// The communicators of one rank: "fsdp" and "replica" (dense), "tables" and
// "table_replica" (sparse), and "expert", "expert_replica" and
// "table_shards" when the plan has such groups.
struct TrainingGroups {
  comm::ProcessGroups dense;
  comm::ProcessGroups sparse;
  std::optional<comm::ProcessGroups> extra;

  comm::Communicator* fsdp() const { return dense.Get("fsdp"); }
  comm::Communicator* replica() const { return dense.Get("replica"); }
  comm::Communicator* tables() const { return sparse.Get("tables"); }
  comm::Communicator* table_replica() const { return sparse.Get("table_replica"); }
  // Null without expert parallelism / without V3.
  comm::Communicator* expert() const { return extra.has_value() ? extra->Get("expert") : nullptr; }
  comm::Communicator* expert_replica() const {
    return extra.has_value() ? extra->Get("expert_replica") : nullptr;
  }
  comm::Communicator* table_shards() const { return extra.has_value() ? extra->Get("table_shards") : nullptr; }

  // Every rank calls this with the same layout and store namespace.
  static absl::StatusOr<TrainingGroups> Build(const ParallelLayout& layout, int rank, comm::KvStore& store,
                                              const comm::CommFactory& factory);
  // The same from explicit specs (TrainingGroupSpecs' order: the four, then
  // "expert", "expert_replica" and "table_shards" where present).
  static absl::StatusOr<TrainingGroups> BuildFromSpecs(int rank, const std::vector<comm::ProcessGroupSpec>& specs,
                                                       comm::KvStore& store, const comm::CommFactory& factory);
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_LAYOUT_H_
