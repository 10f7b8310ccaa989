#ifndef RECFLEET_WORKER_COMM_PROCESS_GROUPS_H_
#define RECFLEET_WORKER_COMM_PROCESS_GROUPS_H_

// Process groups for each parallel dimension. The world's ranks are laid out
// as a row-major grid (DeviceMesh) with named dimensions, e.g.
// {replica: 2, fsdp: 4}: the last dimension varies fastest, so its groups
// are runs of consecutive ranks (the GPUs of one node when ranks are
// numbered node by node). A group along a set of dimensions holds the ranks
// that agree on every other coordinate: with {replica: 2, fsdp: 2}, "fsdp"
// groups are {0,1} and {2,3}, "replica" groups {0,2} and {1,3}, and
// "replica+fsdp" is the whole world.
//
// DeviceMesh is pure arithmetic; ProcessGroups connects one communicator per
// requested group through the backend the caller passes in, each in its own
// key namespace of the rendezvous store.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/comm/communicator.h"
#include "worker/comm/kv_store.h"

namespace recfleet {
namespace comm {

struct MeshDim {
  std::string name;
  int size = 1;
};

struct ProcessGroupSpec {
  // The dimensions joined by '+', e.g. "fsdp" or "replica+fsdp".
  std::string name;
  // Which of the groups of that name (0 .. world / group size - 1).
  int index = 0;
  // World ranks; a rank's position here is its group rank (ascending for
  // groups cut from a DeviceMesh).
  std::vector<int> ranks;

  // Position of `world_rank` in `ranks`, or -1.
  int GroupRank(int world_rank) const;
  // "group/<name>/<index>/": the group's rendezvous namespace.
  std::string StoreNamespace() const;
};

// Immutable; thread-safe.
class DeviceMesh {
 public:
  // The product of the dimension sizes must equal `world_size`; names must
  // be distinct, non-empty and free of '+' and '/'.
  static absl::StatusOr<DeviceMesh> Create(int world_size, std::vector<MeshDim> dims);

  int world_size() const { return world_size_; }
  const std::vector<MeshDim>& dims() const { return dims_; }

  // Coordinates of `rank`, one per dimension.
  std::vector<int> Coordinates(int rank) const;
  // The group along `dims` that contains `rank`.
  absl::StatusOr<ProcessGroupSpec> GroupOf(int rank, absl::Span<const std::string> dims) const;
  // Every group along `dims`, by index: a partition of the world.
  absl::StatusOr<std::vector<ProcessGroupSpec>> AllGroups(absl::Span<const std::string> dims) const;

 private:
  DeviceMesh(int world_size, std::vector<MeshDim> dims) : world_size_(world_size), dims_(std::move(dims)) {}
  absl::StatusOr<std::vector<bool>> Select(absl::Span<const std::string> dims) const;

  int world_size_;
  std::vector<MeshDim> dims_;
};

// Connects a communicator of `size` ranks as `rank` through `store` (already
// namespaced for the group), e.g. a lambda around ConnectGloo or ConnectNccl.
using CommFactory =
    std::function<absl::StatusOr<std::unique_ptr<Communicator>>(KvStore& store, int rank, int size)>;

// The communicators of one rank, one per requested group. Not thread-safe;
// the communicators themselves follow communicator.h.
class ProcessGroups {
 public:
  // Connects this rank's group along each entry of `groups` (a list of mesh
  // dimension names), in order. Every rank must pass the same `groups` in
  // the same order, since each connection waits for the group's members.
  static absl::StatusOr<ProcessGroups> Build(const DeviceMesh& mesh, int rank,
                                             const std::vector<std::vector<std::string>>& groups, KvStore& store,
                                             const CommFactory& factory);

  // Connects this rank's communicator in each of `specs`, in order, given
  // explicitly (e.g. from a coordinator assignment): a spec's `ranks` are in
  // communicator order, and `rank` must be in every one. Every member of a
  // group must pass its spec with the same name, index and ranks, and the
  // groups in the same relative order.
  static absl::StatusOr<ProcessGroups> BuildFromSpecs(int rank, std::vector<ProcessGroupSpec> specs,
                                                      KvStore& store, const CommFactory& factory);

  // The communicator of the group called `name` ("fsdp", "replica+fsdp"),
  // or nullptr if it was not built.
  Communicator* Get(absl::string_view name) const;
  // Its spec; nullptr if it was not built.
  const ProcessGroupSpec* Spec(absl::string_view name) const;

 private:
  struct Group {
    ProcessGroupSpec spec;
    std::unique_ptr<Communicator> comm;
  };
  std::map<std::string, Group, std::less<>> groups_;
};

}  // namespace comm
}  // namespace recfleet

#endif  // RECFLEET_WORKER_COMM_PROCESS_GROUPS_H_
