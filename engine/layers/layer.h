#ifndef RECFLEET_ENGINE_LAYERS_LAYER_H_
#define RECFLEET_ENGINE_LAYERS_LAYER_H_

// What the layers of one model share, and the conventions every layer in
// engine/layers/ follows:
//
//   Forward(inputs..., Tensor* output) computes on views and allocates its
//   output through the context's allocator. It keeps the *views* of its
//   inputs for Backward: the caller keeps those tensors alive and unchanged
//   until Backward returns (the model holds every activation of a step).
//   Backward(output gradients..., input gradients...) writes input gradients
//   into caller-allocated views, overwriting them or, where the signature
//   says `accumulate`, adding to them (fan-in without extra copies), and adds
//   its parameters' gradients to Parameter::grad.
//
// Every computation goes through the kernel API (kernels/) or the glue ops
// (engine/layers/ops.h), which dispatch on the tensors' device, so a layer
// runs wherever its allocator puts its tensors. Layers are not thread-safe
// and not movable (the parameter registry holds pointers into them).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "engine/tensor.h"
#include "kernels/gemm/linear.h"
#include "kernels/tensor.h"

namespace recfleet::engine::layers {

class ParameterRegistry;

// Model FLOPs of the current forward (DESIGN section 3): useful work only,
// counted from the real jagged lengths.
struct FlopCounter {
  double linear = 0;     // 2 * M * N * K per linear layer.
  double attention = 0;  // The attention kernels' own count of visible pairs.
  // Forward FLOPs run a second time in the backward by layers that
  // recompute their activations instead of keeping them (activation
  // checkpointing): extra work, so not part of StepFlops.
  double recomputed = 0;

  void Reset() { linear = attention = recomputed = 0; }
  // Forward + backward: backward counted as 2x (linear) and 2.5x (attention)
  // the forward.
  double StepFlops() const { return 3.0 * linear + 3.5 * attention; }
};

// The device-time phases of a training step that benchmarks split out;
// everything else (glue ops, norms, conversions, the loss) is "other".
enum class Phase : uint8_t { kEmbedding = 0, kAttention, kGemm, kOptimizer };
inline constexpr int kNumPhases = 4;

// Told where each phase starts and ends in the compute stream's order (a
// CUDA implementation records events). Phases never nest.
class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void Mark(Phase phase, bool begin) = 0;
};

// Where layers find the timer; the model owns it and may set `timer` at
// any time (null: off, the default).
struct PhaseHook {
  PhaseTimer* timer = nullptr;
};

// Marks `phase` for the lifetime of the scope when a timer is set.
class ScopedPhase {
 public:
  ScopedPhase(const PhaseHook* hook, Phase phase)
      : timer_(hook == nullptr ? nullptr : hook->timer), phase_(phase) {
    if (timer_ != nullptr) timer_->Mark(phase_, true);
  }
  ~ScopedPhase() {
    if (timer_ != nullptr) timer_->Mark(phase_, false);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseTimer* timer_;
  Phase phase_;
};

struct LayerContext {
  DType dtype = DType::kFloat32;  // Of parameters and activations.
  Allocator* allocator = CpuAllocator();
  ParameterRegistry* parameters = nullptr;  // Where layers register theirs.
  FlopCounter* flops = nullptr;             // May be null: not counted.
  const PhaseHook* phases = nullptr;        // May be null: not timed.
  // Precision of every linear layer's GEMMs. The CPU engine computes at the
  // storage precision.
  LinearRecipe recipe{GemmPrecision::kNative, GemmPrecision::kNative, GemmPrecision::kNative};
  // CUDA: attention runs on the bf16 tensor-core kernels where the head dim
  // is 64 or 128 (with an all-bf16 linear recipe the attention layers keep
  // q/k/v and their gradients, and the sequence residual stream, in bf16:
  // the bf16 flow of JaggedAttention::Bf16Flow; otherwise q/k/v are
  // converted from the fp32 activations and the gradients back); false (or
  // another head dim) keeps the attention in the activations' dtype.
  bool bf16_attention = false;
  // Per-layer exceptions to `recipe` (the job's precision recipe, e.g. FP8
  // expert MLPs): the recipe of the linear layer named `name`. Unset:
  // `recipe` for every layer. AllBf16Linears speaks of `recipe` only.
  std::function<LinearRecipe(const std::string& name)> linear_recipe_of;

  // Every GEMM of every linear layer in bf16 (the CUDA bf16 mode).
  bool AllBf16Linears() const { return AllBf16(recipe); }
  static bool AllBf16(const LinearRecipe& r) {
    return r.forward == GemmPrecision::kBf16 && r.dgrad == GemmPrecision::kBf16 &&
           r.wgrad == GemmPrecision::kBf16;
  }
};

// `*t` becomes an uninitialized tensor of `shape` (storage reused when it
// already has that shape and dtype). Never null storage, even when empty.
absl::Status AllocateTensor(const LayerContext& ctx, Shape shape, Tensor* t);
// Same, zero-filled.
absl::Status AllocateZeros(const LayerContext& ctx, Shape shape, Tensor* t);
// AllocateTensor with an explicit dtype.
absl::Status AllocateTyped(const LayerContext& ctx, DType dtype, Shape shape, Tensor* t);

// The same storage seen with another shape of equal numel.
TensorView Reshaped(const TensorView& t, Shape shape);
// Rows [begin, end) of a row-major tensor (first dimension sliced).
TensorView RowSlice(const TensorView& t, int64_t begin, int64_t end);

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_LAYER_H_
