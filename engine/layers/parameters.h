#ifndef RECFLEET_ENGINE_LAYERS_PARAMETERS_H_
#define RECFLEET_ENGINE_LAYERS_PARAMETERS_H_

// Dense parameters: each layer owns its Parameter objects and registers them
// by name with the model's ParameterRegistry, which gives the model one
// ordered, named list for checkpoints, gradient checks, data-parallel
// gradient sums and the AdamW step.
//
// Initialization is part of registration: values are drawn from the
// registry's random stream (seeded once) in registration order, so a model
// built from the same config registers, and therefore initializes, the same
// way every time. Not thread-safe.

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/tensor.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/multi_tensor.h"

namespace recfleet::engine::layers {

struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // Of the last backward; layers add to it.
  Tensor m, v;  // AdamW moments.
  // CUDA, for a parameter a bf16 GEMM reads (ParameterRegistry::AddBf16Copy):
  // value rounded to bf16 by RefreshBf16Copies; empty otherwise.
  Tensor bf16;
  // ParameterRegistry::OverwriteGradientFirst: grad is not zeroed by
  // ZeroGradients; while grad_pending, the layer's first write of the step
  // overwrites it (and clears the flag) instead of adding to it.
  bool overwrite_first = false;
  bool grad_pending = false;
  // Set by a CUDA layer whose FP8 GEMMs read this weight
  // (Linear::UseGivenFp8Weight): hands them the weight's FP8 form.
  std::function<absl::Status(const TensorView& codes, const TensorView& tile_scales)> use_fp8_form;
};

// How a parameter starts: N(0, stddev^2) draws when stddev > 0, else every
// element equals `constant`.
struct ParameterInit {
  double stddev = 0;
  double constant = 0;
};

class ParameterRegistry {
 public:
  // Parameters live on `allocator`'s device (initialized on the host and
  // copied there).
  ParameterRegistry(DType dtype, uint64_t seed, Allocator* allocator = CpuAllocator());
  ParameterRegistry(const ParameterRegistry&) = delete;
  ParameterRegistry& operator=(const ParameterRegistry&) = delete;

  // Allocates p's value, gradient and moments (zero), fills the value per
  // `init` and records `p` under `name`. `p` must outlive the registry.
  // Names are unique (a second registration of a name aborts, as does a
  // failed device allocation).
  void Register(Parameter* p, const std::string& name, Shape shape, ParameterInit init);

  // In registration order.
  const std::vector<Parameter*>& all() const { return params_; }
  // nullptr when no parameter has that name.
  Parameter* Find(const std::string& name) const;
  int64_t num_elements() const;

  // A bf16 copy of p's value (p registered here; CUDA registries only,
  // else a no-op): the layer reads p->bf16 instead of converting the weight
  // itself, while bf16_copies_current().
  void AddBf16Copy(Parameter* p);
  // Rounds every parameter that has a bf16 copy into it, in one launch.
  // GemLite calls it at the start of every forward, so copies are current
  // whoever wrote the values since (AdamW, a checkpoint restore, a
  // data-parallel wrapper copying gathered values in through views).
  absl::Status RefreshBf16Copies();
  // True from RefreshBf16Copies until the registry itself next changes the
  // values (AdamStep, CopyValuesFrom) or the list: what a layer checks
  // before it reads a copy. Writes through views the registry does not see
  // are the caller's to follow with a refresh (GemLite's forward does).
  bool bf16_copies_current() const { return bf16_current_; }
  // Values were written through views: the copies are stale until the next
  // RefreshBf16Copies.
  void ValuesWritten() { bf16_current_ = false; }
  // Builds the multi-tensor passes (ZeroGradients, AdamStep,
  // RefreshBf16Copies) over the parameters registered so far; on CUDA it
  // uploads their device table now rather than inside the first step.
  // Idempotent; Register or AddBf16Copy after it rebuilds on the next use.
  absl::Status Prepare();

  // CUDA registries with set_overwrite_first(true) only (else a no-op): p's
  // layer writes its whole gradient once per step and can overwrite it (a
  // GEMM with beta = 0) as readily as add to it, so ZeroGradients marks it
  // pending instead of zeroing it, which saves a write and, in the GEMM, a
  // read of the whole gradient. A gradient still pending when something
  // reads it (SettleGradients) is zeroed then.
  void OverwriteGradientFirst(Parameter* p);
  void set_overwrite_first(bool on);

  absl::Status ZeroGradients();
  // Zeroes the gradients still pending (their layer wrote nothing this
  // step, e.g. a head without labels): every gradient then holds this
  // step's sum. AdamStep, ScaleGradients and AddGradients call it; so must
  // anyone reading gradients directly after a backward.
  absl::Status SettleGradients();
  // The same for parameters [begin, end) of the registration order only (a
  // module's, read by a hook while later modules' backward is to come).
  absl::Status SettleGradients(size_t begin, size_t end);
  // grad *= weight for every parameter.
  absl::Status ScaleGradients(double weight);
  // grad += weight * other's grad, parameter by parameter; InvalidArgument
  // when `other` holds a different list.
  absl::Status AddGradients(const ParameterRegistry& other, double weight);
  absl::Status CopyValuesFrom(const ParameterRegistry& other);
  // One AdamW step on every parameter; `step` is 1-based. On CUDA one
  // launch for all of them (kernels/ops/multi_tensor.h), as ZeroGradients
  // and RefreshBf16Copies. With clip_norm > 0 the gradients are first
  // clipped to that global L2 norm over all of these parameters
  // (kernels/ops/grad_clip.h: PyTorch's clip_grad_norm_); on CUDA the norm
  // and the factor stay on the device (three small launches more, no host
  // wait). The gradients themselves are left as they were.
  // write_bf16_copies (CUDA): the AdamW pass also rounds each new value into
  // its bf16 copy, so the copies stay current and the next forward need not
  // refresh them; only for a caller that knows nothing else writes the
  // values before that forward.
  absl::Status AdamStep(const AdamConfig& config, int64_t step, double clip_norm = 0,
                        bool write_bf16_copies = false);

 private:
  absl::Status CheckSameLayout(const ParameterRegistry& other, const char* what) const;

  DType dtype_;
  Allocator* allocator_;
  std::mt19937_64 rng_;
  std::vector<Parameter*> params_;
  absl::flat_hash_map<std::string, Parameter*> by_name_;
  std::unique_ptr<MultiTensorAdam> multi_;  // Null until Prepare.
  // With overwrite-first gradients: the zero pass over the other ones.
  std::unique_ptr<MultiTensorAdam> zero_multi_;
  bool overwrite_first_ = false;
  bool any_pending_ = false;
  // Gradient clipping, on the parameters' device: {sum of squares, factor}.
  Tensor clip_;
  bool bf16_current_ = false;
};

// A parameter that registers itself on construction. A layer whose own
// parameter precedes its sub-layers' in registration order declares it
// before them (members are constructed in declaration order).
class RegisteredParameter {
 public:
  RegisteredParameter(ParameterRegistry* registry, const std::string& name, Shape shape,
                      ParameterInit init) {
    registry->Register(&p_, name, std::move(shape), init);
  }
  RegisteredParameter(const RegisteredParameter&) = delete;
  RegisteredParameter& operator=(const RegisteredParameter&) = delete;

  Parameter& operator*() { return p_; }
  Parameter* operator->() { return &p_; }

 private:
  Parameter p_;
};

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_PARAMETERS_H_
