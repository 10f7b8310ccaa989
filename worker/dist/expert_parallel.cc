#include "worker/dist/expert_parallel.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/layers/ops.h"
#include "worker/dist/staged.h"

namespace recfleet {
namespace dist {
namespace {

absl::Status CheckShape(const TensorView& v, const char* what, int64_t rows, int64_t cols) {
  if (v.dtype != DType::kFloat32 || v.rank() != 2 || v.dim(0) != rows || v.dim(1) != cols) {
    return absl::InvalidArgumentError(absl::StrCat("expert all-to-all: ", what, " must be fp32 [", rows, ", ", cols,
                                                   "], got ", v.DebugString()));
  }
  return absl::OkStatus();
}

// Rows [first, first + rows) of a [*, width] fp32 buffer.
float* Rows(void* data, int64_t first, int64_t width) { return static_cast<float*>(data) + first * width; }
const float* Rows(const void* data, int64_t first, int64_t width) {
  return static_cast<const float*>(data) + first * width;
}

}  // namespace

std::pair<int, int> ExpertBlock(int num_experts, int group_size, int rank) {
  const int per = (num_experts + group_size - 1) / group_size;
  const int first = std::min(num_experts, rank * per);
  return {first, std::min(num_experts, first + per)};
}

absl::StatusOr<std::unique_ptr<ExpertAllToAll>> ExpertAllToAll::Create(comm::Communicator* group, int num_experts) {
  if (group == nullptr) return absl::InvalidArgumentError("expert all-to-all: group is null");
  if (num_experts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("expert all-to-all: ", num_experts, " experts; need >= 1"));
  }
  return std::unique_ptr<ExpertAllToAll>(new ExpertAllToAll(group, num_experts));
}

ExpertAllToAll::ExpertAllToAll(comm::Communicator* group, int num_experts)
    : group_(group), num_experts_(num_experts) {
  const auto [first, end] = ExpertBlock(num_experts, group->size(), group->rank());
  for (int e = first; e < end; ++e) local_.push_back(e);
}

int ExpertAllToAll::Experts(int rank) const {
  const auto [first, end] = ExpertBlock(num_experts_, group_->size(), rank);
  return end - first;
}

absl::Status ExpertAllToAll::Exchange(const TensorView& in, const std::vector<int64_t>& send_rows,
                                      const TensorView& out, const std::vector<int64_t>& recv_rows, int64_t width) {
  std::vector<int64_t> send_counts(send_rows.size()), recv_counts(recv_rows.size());
  for (size_t q = 0; q < send_rows.size(); ++q) send_counts[q] = send_rows[q] * width;
  for (size_t p = 0; p < recv_rows.size(); ++p) recv_counts[p] = recv_rows[p] * width;
  return group_->AllToAll(in, send_counts, out, recv_counts);
}

absl::StatusOr<TensorView> ExpertAllToAll::Scratch(int64_t rows, int64_t width) {
  const size_t bytes = static_cast<size_t>(rows * width) * sizeof(float);
  DeviceBuffer& b = scratch_;
  if (b.data() == nullptr || b.size() < bytes) {
    absl::StatusOr<DeviceBuffer> fresh = DeviceBuffer::Zeros(group_->device(), bytes);
    if (!fresh.ok()) return fresh.status();
    b = *std::move(fresh);
  }
  return b.View(DType::kFloat32, {rows, width});
}

absl::StatusOr<int64_t> ExpertAllToAll::Route(int64_t batch) {
  const int group = group_->size();
  batch_.assign(group, 0);
  if (absl::Status s = StagedAllGather(*group_, std::vector<int64_t>{batch}, batch_); !s.ok()) return s;
  first_.assign(group, 0);
  for (int p = 1; p < group; ++p) first_[p] = first_[p - 1] + batch_[p - 1];
  routed_ = local_.empty() ? 0 : first_.back() + batch_.back();
  return routed_;
}

absl::Status ExpertAllToAll::DispatchTokens(const TensorView& x, const TensorView& routed) {
  const int group = group_->size(), me = group_->rank();
  in_ = x.rank() == 2 ? x.dim(1) : 0;
  if (absl::Status s = CheckShape(x, "tokens", batch_[me], in_); !s.ok()) return s;
  if (absl::Status s = CheckShape(routed, "routed tokens", routed_, in_); !s.ok()) return s;
  // A copy of the tokens for every rank computing experts; they arrive in
  // rank order, the layout of `routed`.
  std::vector<int64_t> send_rows(group, 0), recv_rows(group, 0);
  int64_t copies = 0;
  for (int q = 0; q < group; ++q) {
    if (Experts(q) == 0) continue;
    send_rows[q] = batch_[me];
    ++copies;
  }
  absl::StatusOr<TensorView> send = Scratch(copies * batch_[me], in_);
  if (!send.ok()) return send.status();
  for (int64_t c = 0; c < copies; ++c) {
    if (absl::Status s = CopyOnDevice(x.device, Rows(send->data, c * batch_[me], in_), x.data, x.nbytes()); !s.ok()) {
      return s;
    }
  }
  for (int p = 0; p < group && !local_.empty(); ++p) recv_rows[p] = batch_[p];
  return Exchange(*send, send_rows, routed, recv_rows, in_);
}

absl::Status ExpertAllToAll::ReturnOutputs(const TensorView& local_out, const TensorView& outputs) {
  const int group = group_->size(), me = group_->rank();
  const int64_t num_local = static_cast<int64_t>(local_.size());
  out_ = outputs.rank() == 2 ? outputs.dim(1) : 0;
  if (absl::Status s = CheckShape(local_out, "local expert outputs", num_local * routed_, out_); !s.ok()) return s;
  if (absl::Status s = CheckShape(outputs, "expert outputs", num_experts_ * batch_[me], out_); !s.ok()) return s;
  // Rank p gets, per local expert, the rows of its tokens.
  absl::StatusOr<TensorView> send = Scratch(num_local * routed_, out_);
  if (!send.ok()) return send.status();
  std::vector<int64_t> send_rows(group, 0), recv_rows(group, 0);
  int64_t row = 0;
  for (int p = 0; p < group; ++p) {
    for (int64_t i = 0; i < num_local; ++i, row += batch_[p]) {
      if (absl::Status s = CopyOnDevice(local_out.device, Rows(send->data, row, out_),
                                        Rows(local_out.data, i * routed_ + first_[p], out_),
                                        batch_[p] * out_ * sizeof(float));
          !s.ok()) {
        return s;
      }
    }
    send_rows[p] = num_local * batch_[p];
    recv_rows[p] = Experts(p) * batch_[me];
  }
  // Experts arrive in rank order, each rank's in ascending order: expert
  // order, the layout of `outputs`.
  return Exchange(*send, send_rows, outputs, recv_rows, out_);
}

absl::Status ExpertAllToAll::DispatchGradients(const TensorView& d_outputs, const TensorView& d_local_out) {
  const int group = group_->size(), me = group_->rank();
  const int64_t num_local = static_cast<int64_t>(local_.size());
  if (absl::Status s = CheckShape(d_outputs, "expert output gradients", num_experts_ * batch_[me], out_); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckShape(d_local_out, "local expert output gradients", num_local * routed_, out_); !s.ok()) {
    return s;
  }
  // d_outputs is in expert order: rank q's block at its experts.
  absl::StatusOr<TensorView> recv = Scratch(num_local * routed_, out_);
  if (!recv.ok()) return recv.status();
  std::vector<int64_t> send_rows(group, 0), recv_rows(group, 0);
  for (int q = 0; q < group; ++q) send_rows[q] = Experts(q) * batch_[me];
  for (int p = 0; p < group; ++p) recv_rows[p] = num_local * batch_[p];
  if (absl::Status s = Exchange(d_outputs, send_rows, *recv, recv_rows, out_); !s.ok()) return s;
  // From each rank p: per local expert i, its tokens' rows.
  int64_t row = 0;
  for (int p = 0; p < group; ++p) {
    for (int64_t i = 0; i < num_local; ++i, row += batch_[p]) {
      if (absl::Status s = CopyOnDevice(d_local_out.device, Rows(d_local_out.data, i * routed_ + first_[p], out_),
                                        Rows(recv->data, row, out_), batch_[p] * out_ * sizeof(float));
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ExpertAllToAll::ReturnTokenGradients(const TensorView& d_routed, const TensorView& dx) {
  const int group = group_->size(), me = group_->rank();
  if (absl::Status s = CheckShape(d_routed, "routed token gradients", routed_, in_); !s.ok()) return s;
  if (absl::Status s = CheckShape(dx, "token gradients", batch_[me], in_); !s.ok()) return s;
  // d_routed is in rank order: rank p's rows at first_[p].
  std::vector<int64_t> send_rows(group, 0), recv_rows(group, 0);
  int64_t copies = 0;
  for (int p = 0; p < group && !local_.empty(); ++p) send_rows[p] = batch_[p];
  for (int q = 0; q < group; ++q) {
    recv_rows[q] = Experts(q) > 0 ? batch_[me] : 0;
    copies += Experts(q) > 0 ? 1 : 0;
  }
  absl::StatusOr<TensorView> recv = Scratch(copies * batch_[me], in_);
  if (!recv.ok()) return recv.status();
  if (absl::Status s = Exchange(d_routed, send_rows, *recv, recv_rows, in_); !s.ok()) return s;
  // Summed over the experts' ranks in rank order.
  const int64_t n = batch_[me] * in_;
  if (copies == 0 || n == 0) return absl::OkStatus();
  if (absl::Status s = CopyOnDevice(dx.device, dx.data, recv->data, n * sizeof(float)); !s.ok()) return s;
  for (int64_t c = 1; c < copies; ++c) {
    const TensorView part = MakeView(Rows(recv->data, c * batch_[me], in_), DType::kFloat32, {n}, dx.device);
    const TensorView sum = MakeView(dx.data, DType::kFloat32, {n}, dx.device);
    if (absl::Status s = engine::ops::Add(sum, part, sum); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dist
}  // namespace recfleet
