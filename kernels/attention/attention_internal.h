#ifndef RECFLEET_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_
#define RECFLEET_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_

// Pieces shared by the CPU reference and the CUDA launcher: the mask as key
// ranges, the resolved scale, and the device-specific entry points.

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention.h"

namespace recfleet::attention::internal {

// Half-open range [begin, end) of key indices.
struct KeyRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end > begin ? end - begin : 0; }
};

inline int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The keys that query i of a sequence with lengths (lq, lk) sees: every mask
// of the API selects one contiguous range.
inline KeyRange VisibleKeys(const AttentionOptions& o, int64_t lq, int64_t lk, int64_t i) {
  const int64_t pq = i + (lk - lq);
  KeyRange r{0, lk};
  switch (o.mask) {
    case Mask::kNone:
      break;
    case Mask::kCausal:
      r.end = std::min(lk, pq + 1);
      break;
    case Mask::kSlidingWindow:
      r.begin = std::max<int64_t>(0, pq - o.window + 1);
      r.end = std::min(lk, pq + 1);
      break;
    case Mask::kBlock: {
      const int64_t blk = FloorDiv(pq, kAttentionBlockSize);
      r.begin = std::max<int64_t>(0, blk * kAttentionBlockSize);
      r.end = std::min(lk, (blk + 1) * kAttentionBlockSize);
      break;
    }
  }
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// The sum over the queries of a sequence with lengths (lq, lk) of
// VisibleKeys(o, lq, lk, i).size(), in closed form (kBlock: one term per
// 64-token block), so that counting a batch's FLOPs costs O(batch), not
// O(tokens): the engine counts every forward call of every step.
inline int64_t VisiblePairs(const AttentionOptions& o, int64_t lq, int64_t lk) {
  if (lq <= 0 || lk <= 0) return 0;
  if (o.mask == Mask::kNone) return lq * lk;
  // Query positions run over [lk - lq, lk); those below 0 see no key.
  const int64_t first = std::max<int64_t>(0, lk - lq);
  if (o.mask == Mask::kBlock) {
    int64_t pairs = 0;
    for (int64_t b0 = first / kAttentionBlockSize * kAttentionBlockSize; b0 < lk;
         b0 += kAttentionBlockSize) {
      const int64_t end = std::min(lk, b0 + kAttentionBlockSize);
      pairs += (end - std::max(b0, first)) * (end - b0);
    }
    return pairs;
  }
  // Causal and sliding window: position p sees min(p + 1, w) keys.
  const int64_t w = o.mask == Mask::kCausal ? lk : std::max<int64_t>(0, o.window);
  auto prefix = [w](int64_t n) {  // sum over t in [1, n] of min(t, w)
    return n <= w ? n * (n + 1) / 2 : w * (w + 1) / 2 + (n - w) * w;
  };
  return prefix(lk) - prefix(first);
}

inline double ResolvedScale(const AttentionOptions& o, int64_t head_dim) {
  return o.scale != 0.0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

absl::Status ForwardCpu(const AttentionInputs& in, const AttentionOptions& opts, TensorView out,
                        TensorView lse);
absl::Status BackwardCpu(const AttentionInputs& in, const AttentionOptions& opts,
                         const TensorView& d_out, const AttentionGrads& grads);
absl::Status ForwardCuda(const AttentionInputs& in, const AttentionOptions& opts, TensorView out,
                         TensorView lse);
// The fp32 CUDA path (attention_cuda_fp32.cc): no tensor cores, no bias.
absl::Status ForwardCudaFp32(const AttentionInputs& in, const AttentionOptions& opts,
                             TensorView out, TensorView lse);
absl::Status BackwardCudaFp32(const AttentionInputs& in, const AttentionOptions& opts,
                              const TensorView& out, const TensorView& lse,
                              const TensorView& d_out, const AttentionGrads& grads);
absl::Status BackwardCuda(const AttentionInputs& in, const AttentionOptions& opts,
                          const TensorView& out, const TensorView& lse, const TensorView& d_out,
                          const AttentionGrads& grads);

}  // namespace recfleet::attention::internal

#endif  // RECFLEET_KERNELS_ATTENTION_ATTENTION_INTERNAL_H_
