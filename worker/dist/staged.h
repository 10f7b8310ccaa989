#ifndef RECFLEET_WORKER_DIST_STAGED_H_
#define RECFLEET_WORKER_DIST_STAGED_H_

// Collectives on host vectors, staged through buffers on the
// communicator's device (plain copies on the host): what the distributed
// building blocks use to keep their routing (which rows go where) host
// logic whatever the device, with the same code on Gloo and NCCL. Built to
// be right on any device, not fast on a GPU: every call allocates and
// copies.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"

namespace recfleet {
namespace dist {

template <typename T>
DType DTypeOf();
template <>
inline DType DTypeOf<int64_t>() { return DType::kInt64; }
template <>
inline DType DTypeOf<float>() { return DType::kFloat32; }

// A copy of a host vector on `device`.
template <typename T>
absl::StatusOr<DeviceBuffer> Stage(Device device, const std::vector<T>& v) {
  return DeviceBuffer::FromHost(device, v.data(), v.size() * sizeof(T));
}

template <typename T>
TensorView View(const DeviceBuffer& b, int64_t n) {
  return b.View(DTypeOf<T>(), {n});
}

// Runs the collective `op(in, out)` on host vectors through buffers on
// `device`.
template <typename T, typename Op>
absl::Status Staged(Device device, const std::vector<T>& in, std::vector<T>& out, Op op) {
  absl::StatusOr<DeviceBuffer> din = Stage(device, in);
  if (!din.ok()) return din.status();
  absl::StatusOr<DeviceBuffer> dout = DeviceBuffer::Zeros(device, out.size() * sizeof(T));
  if (!dout.ok()) return dout.status();
  absl::Status s = op(View<T>(*din, in.size()), View<T>(*dout, out.size()));
  if (!s.ok()) return s;
  return dout->CopyToHost(out.data(), out.size() * sizeof(T));
}

template <typename T>
absl::Status StagedBroadcast(comm::Communicator& c, std::vector<T>& v, int root) {
  absl::StatusOr<DeviceBuffer> d = Stage(c.device(), v);
  if (!d.ok()) return d.status();
  if (absl::Status s = c.Broadcast(View<T>(*d, v.size()), root); !s.ok()) return s;
  return d->CopyToHost(v.data(), v.size() * sizeof(T));
}

// `out` must already have Sum(recv_counts) elements.
template <typename T>
absl::Status StagedAllToAll(comm::Communicator& c, const std::vector<T>& in, const std::vector<int64_t>& send_counts,
                            std::vector<T>& out, const std::vector<int64_t>& recv_counts) {
  return Staged(c.device(), in, out, [&](const TensorView& i, const TensorView& o) {
    return c.AllToAll(i, send_counts, o, recv_counts);
  });
}

// `out` must already have size() x in.size() elements.
template <typename T>
absl::Status StagedAllGather(comm::Communicator& c, const std::vector<T>& in, std::vector<T>& out) {
  return Staged(c.device(), in, out, [&](const TensorView& i, const TensorView& o) { return c.AllGather(i, o); });
}

// In place, like Communicator::AllReduce.
template <typename T>
absl::Status StagedAllReduce(comm::Communicator& c, std::vector<T>& v, comm::ReduceOp op) {
  absl::StatusOr<DeviceBuffer> d = Stage(c.device(), v);
  if (!d.ok()) return d.status();
  if (absl::Status s = c.AllReduce(View<T>(*d, v.size()), op); !s.ok()) return s;
  return d->CopyToHost(v.data(), v.size() * sizeof(T));
}

inline int64_t Sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_STAGED_H_
