#ifndef RECFLEET_WORKER_DIST_EXPERT_PARALLEL_H_
#define RECFLEET_WORKER_DIST_EXPERT_PARALLEL_H_

// Expert parallelism for one mixture-of-experts layer over an
// expert-parallel group (the plan's "expert/<module>/<i>" groups): the
// experts are split into contiguous blocks, block i on group rank i, and
// every rank's tokens travel to the ranks computing experts and back.
//
// One step, per rank with B tokens (engine/layers/moe.h calls these):
//   Route                 all-gather of the ranks' token counts, so every
//                         rank knows what it sends and receives;
//   DispatchTokens        all-to-all of tokens to every rank that computes
//                         an expert (GEM-lite gates every expert with every
//                         token);
//   ReturnOutputs         all-to-all of each expert's outputs back to the
//                         tokens' ranks;
//   DispatchGradients     all-to-all of the output gradients to the experts'
//                         ranks;
//   ReturnTokenGradients  all-to-all of the input gradients back, summed
//                         over the experts' ranks in rank order.
// The gradients of an expert's parameters thus accumulate, on its rank, over
// the tokens of the whole group.
//
// Same path on every device, and no host round trip: the rows go from the
// engine's tensors through scratch buffers on the communicator's device
// (host with Gloo, the GPU with NCCL), packed and unpacked by device copies
// on the legacy default stream (the engine's), summed by the engine's ops.
// Only the token counts (Route) pass through the host. Not thread-safe.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/layers/moe.h"
#include "worker/comm/communicator.h"
#include "worker/dist/device_buffer.h"

namespace recfleet {
namespace dist {

// Experts [first, second) of `num_experts` on rank `rank` of a group of
// `group_size`: contiguous blocks of ceil(num_experts / group_size).
std::pair<int, int> ExpertBlock(int num_experts, int group_size, int rank);

class ExpertAllToAll : public engine::layers::ExpertRouter {
 public:
  // `group` (not owned, outlives the router): the expert-parallel group.
  // The experts' input and output widths come from the tensors.
  static absl::StatusOr<std::unique_ptr<ExpertAllToAll>> Create(comm::Communicator* group, int num_experts);

  const std::vector<int>& local_experts() const override { return local_; }
  absl::StatusOr<int64_t> Route(int64_t batch) override;
  absl::Status DispatchTokens(const TensorView& x, const TensorView& routed) override;
  absl::Status ReturnOutputs(const TensorView& local_out, const TensorView& outputs) override;
  absl::Status DispatchGradients(const TensorView& d_outputs, const TensorView& d_local_out) override;
  absl::Status ReturnTokenGradients(const TensorView& d_routed, const TensorView& dx) override;

 private:
  ExpertAllToAll(comm::Communicator* group, int num_experts);
  int Experts(int rank) const;  // How many experts group rank `rank` computes.
  // Rows exchanged with every rank: `width` floats per row; send_rows[q],
  // recv_rows[p] rows; `in` packed in destination order, `out` filled in
  // source order.
  absl::Status Exchange(const TensorView& in, const std::vector<int64_t>& send_rows, const TensorView& out,
                        const std::vector<int64_t>& recv_rows, int64_t width);
  // [rows, width] fp32 of the scratch buffer on the group's device,
  // grown as needed and kept for later steps.
  absl::StatusOr<TensorView> Scratch(int64_t rows, int64_t width);

  comm::Communicator* group_;
  int num_experts_;
  int64_t in_ = 0, out_ = 0;  // Widths of the current step's rows.
  std::vector<int> local_;
  // Each rank's token count in the current step, and the first routed row
  // of each rank's tokens.
  std::vector<int64_t> batch_, first_;
  int64_t routed_ = 0;
  DeviceBuffer scratch_;
};

}  // namespace dist
}  // namespace recfleet

#endif  // RECFLEET_WORKER_DIST_EXPERT_PARALLEL_H_
