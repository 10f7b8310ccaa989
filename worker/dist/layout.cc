#include "worker/dist/layout.h"

#include "absl/strings/str_cat.h"

namespace recfleet {
namespace dist {

absl::StatusOr<ParallelLayout> ParallelLayout::FromHints(int world_size, const ParallelismHints& hints) {
  if (world_size < 1) return absl::InvalidArgumentError(absl::StrCat("layout: world_size ", world_size, " < 1"));
  if (hints.fsdp_group_size < 0 || hints.replicas < 0 || hints.table_group_size < 0) {
    return absl::InvalidArgumentError("layout: parallelism hints must be >= 0 (0 = unset)");
  }
  ParallelLayout l;
  if (hints.fsdp_group_size > 0 && hints.replicas > 0) {
    l.fsdp_group_size = hints.fsdp_group_size;
    l.replicas = hints.replicas;
  } else if (hints.fsdp_group_size > 0) {
    l.fsdp_group_size = hints.fsdp_group_size;
    l.replicas = world_size / hints.fsdp_group_size;
  } else if (hints.replicas > 0) {
    l.replicas = hints.replicas;
    l.fsdp_group_size = world_size / hints.replicas;
  } else {
    l.fsdp_group_size = world_size;
  }
  if (l.fsdp_group_size * l.replicas != world_size) {
    return absl::InvalidArgumentError(absl::StrCat("layout: fsdp_group_size ", l.fsdp_group_size, " x replicas ",
                                                   l.replicas, " must equal the world size ", world_size));
  }
  l.table_group_size = hints.table_group_size > 0 ? hints.table_group_size : l.fsdp_group_size;
  if (world_size % l.table_group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("layout: table_group_size ", l.table_group_size,
                                                   " does not divide the world size ", world_size));
  }
  return l;
}

absl::StatusOr<comm::DeviceMesh> ParallelLayout::DenseMesh() const {
  return comm::DeviceMesh::Create(fsdp_group_size * replicas, {{"replica", replicas}, {"fsdp", fsdp_group_size}});
}

absl::StatusOr<comm::DeviceMesh> ParallelLayout::SparseMesh() const {
  const int world = fsdp_group_size * replicas;
  return comm::DeviceMesh::Create(world, {{"table_replica", world / table_group_size}, {"tables", table_group_size}});
}

absl::StatusOr<TrainingGroups> TrainingGroups::Build(const ParallelLayout& layout, int rank, comm::KvStore& store,
                                                     const comm::CommFactory& factory) {
  absl::StatusOr<comm::DeviceMesh> dense_mesh = layout.DenseMesh();
  if (!dense_mesh.ok()) return dense_mesh.status();
  absl::StatusOr<comm::DeviceMesh> sparse_mesh = layout.SparseMesh();
  if (!sparse_mesh.ok()) return sparse_mesh.status();
  // The two meshes' dimension names differ, so their groups' rendezvous
  // namespaces cannot collide in the shared store.
  absl::StatusOr<comm::ProcessGroups> dense =
      comm::ProcessGroups::Build(*dense_mesh, rank, {{"fsdp"}, {"replica"}}, store, factory);
  if (!dense.ok()) return dense.status();
  absl::StatusOr<comm::ProcessGroups> sparse =
      comm::ProcessGroups::Build(*sparse_mesh, rank, {{"tables"}, {"table_replica"}}, store, factory);
  if (!sparse.ok()) return sparse.status();
  return TrainingGroups{*std::move(dense), *std::move(sparse)};
}

}  // namespace dist
}  // namespace recfleet
