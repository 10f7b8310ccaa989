#include "engine/model.h"

#include <chrono>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/cuda_device.h"
#include "engine/layers/attention.h"
#include "engine/layers/dcn.h"
#include "engine/layers/layer.h"
#include "engine/layers/linear.h"
#include "engine/layers/moe.h"
#include "engine/layers/ops.h"
#include "engine/layers/parameters.h"
#include "engine/layers/staged_batch.h"
#include "engine/layers/tower.h"
#include "kernels/ops/adam.h"

namespace recfleet::engine {
namespace {

constexpr int kNumHeads = 2;  // CTR, CVR.
constexpr const char* kHeadNames[kNumHeads] = {"ctr", "cvr"};

template <typename T>
constexpr DType kDType = std::is_same_v<T, double> ? DType::kFloat64 : DType::kFloat32;

TensorView HostOffsets(const std::vector<int64_t>& offsets) {
  return MakeView(const_cast<int64_t*>(offsets.data()), DType::kInt64,
                  {static_cast<int64_t>(offsets.size())});
}

}  // namespace

double InitialTableValue(const GemLiteConfig& config, int table, int64_t row, int64_t col) {
  return layers::InitialTableValue(config.seed, config.embedding_init_std, table, row, col);
}

// The composition of the layers (engine/layers/) and the activations of the
// last forward that connect them. Construction order is registration order,
// which fixes parameter names, their order and their initial values.
template <typename T>
struct GemLite<T>::Impl {
  Impl(const GemLiteConfig& c, const FeatureSchema& s, TableStorage st,
       const ExecutionOptions& e, Allocator* allocator)
      : config(c),
        schema(s),
        storage(st),
        execution(e),
        num_tokens(static_cast<int64_t>(s.id_lists.size()) + (s.num_dense > 0 ? 1 : 0)),
        interaction_dim((num_tokens + c.pma_queries) * c.dim),
        params(kDType<T>, c.seed, allocator),
        ctx(MakeContext(c, e, allocator, &params, &flops, &phases)),
        sparse(ctx, s, c.dim, st, c.seed, c.embedding_init_std),
        bce{layers::BinaryCrossEntropy(ctx), layers::BinaryCrossEntropy(ctx)} {
    const int64_t d = c.dim;
    // Each top-level module's parameters are the ones registered while it
    // is built.
    auto module = [&](const std::string& name) {
      module_names.push_back(name);
      module_ends.push_back(params.all().size());
      return static_cast<int>(module_names.size()) - 1;
    };
    sparse_parameters = params.all().size();  // Create checks that there are none.
    if (s.num_dense > 0) {
      dense_proj = std::make_unique<layers::Linear>(ctx, "dense_proj", s.num_dense, d, true);
      dense_proj_module = module("dense_proj");
    }
    for (int l = 0; l < c.seq_layers; ++l) {
      blocks.push_back(std::make_unique<layers::SelfAttentionBlock>(
          ctx, absl::StrCat("seq", l), d, c.heads, SequenceAttentionOptions(c)));
      // Its input, history[l], stays alive until block l - 1's backward
      // (unless the block keeps its own FP8 copy).
      const layers::BlockCheckpoint mode =
          !e.attention_checkpoint.empty() ? e.attention_checkpoint[l]
          : l < e.recompute_attention_blocks ? layers::BlockCheckpoint::kBlock
                                             : layers::BlockCheckpoint::kNone;
      blocks.back()->set_checkpoint(mode, e.fp8_saved_activations);
      block_modules.push_back(module(absl::StrCat("seq", l)));
    }
    final_norm = std::make_unique<layers::RmsNorm>(ctx, "seq.final_norm", d);
    final_norm_module = module("seq.final_norm");
    if (c.cross_attention) {
      cross = std::make_unique<layers::CrossAttention>(ctx, "cross", d, c.heads,
                                                       c.fp8.AttentionPrecision("cross"),
                                                       c.fp8.AttentionBackwardPrecision("cross"));
      cross_module = module("cross");
    }
    if (c.pma_queries > 0) {
      pma = std::make_unique<layers::Pma>(ctx, "pma", d, c.heads, c.pma_queries,
                                          c.fp8.AttentionPrecision("pma"),
                                          c.fp8.AttentionBackwardPrecision("pma"));
      pma_module = module("pma");
    }
    dcn = std::make_unique<layers::Dcn>(ctx, "dcn", c.dcn_layers, interaction_dim);
    dcn_module = module("dcn");
    moe = std::make_unique<layers::MixtureOfExperts>(ctx, "moe", interaction_dim, c.num_experts,
                                                     c.expert_hidden, c.expert_out,
                                                     c.mlp_activation);
    moe_module = module("moe");
    for (int h = 0; h < kNumHeads; ++h) {
      towers[h] = std::make_unique<layers::Tower>(ctx, kHeadNames[h], c.expert_out,
                                                  c.tower_hidden, c.mlp_activation);
      tower_modules[h] = module(kHeadNames[h]);
    }
  }

  // SetModuleHooks: the calls at module boundaries (module -1: none).
  absl::Status BeforeForward(int module) {
    if (module < 0 || !hooks.before_forward) return absl::OkStatus();
    return hooks.before_forward(module);
  }
  absl::Status AfterBackward(int module) {
    if (module < 0 || !hooks.after_backward) return absl::OkStatus();
    // The hook reads the module's gradients: one its layers did not write
    // this step must read as zero. Later modules' gradients stay pending
    // (their backward is still to come and may overwrite them).
    RECFLEET_RETURN_IF_ERROR(params.SettleGradients(
        module > 0 ? module_ends[module - 1] : 0, module_ends[module]));
    return hooks.after_backward(module);
  }

  static layers::LayerContext MakeContext(const GemLiteConfig& c, const ExecutionOptions& e,
                                          Allocator* allocator, layers::ParameterRegistry* params,
                                          layers::FlopCounter* flops,
                                          const layers::PhaseHook* phases) {
    layers::LayerContext ctx{kDType<T>, allocator, params, flops, phases};
    if (e.bf16) {
      ctx.recipe = LinearRecipe{GemmPrecision::kBf16, GemmPrecision::kBf16, GemmPrecision::kBf16};
      ctx.bf16_attention = true;
    }
    if (!c.fp8.modules.empty()) {
      ctx.linear_recipe_of = [fp8 = c.fp8, base = ctx.recipe](const std::string& linear) {
        return fp8.Holds(linear) ? fp8.Recipe() : base;
      };
    }
    return ctx;
  }

  GemLiteConfig config;
  FeatureSchema schema;
  TableStorage storage;
  ExecutionOptions execution;
  int64_t num_tokens;  // F: one per id-list feature (+1 for numeric features).
  int64_t interaction_dim;
  layers::FlopCounter flops;
  layers::PhaseHook phases;
  layers::ParameterRegistry params;
  layers::LayerContext ctx;
  layers::SparseEmbeddings sparse;
  std::unique_ptr<layers::Linear> dense_proj;  // Null without numeric features.
  std::vector<std::unique_ptr<layers::SelfAttentionBlock>> blocks;
  std::unique_ptr<layers::RmsNorm> final_norm;
  std::unique_ptr<layers::CrossAttention> cross;  // Null when off.
  std::unique_ptr<layers::Pma> pma;               // Null without PMA queries.
  std::unique_ptr<layers::Dcn> dcn;
  std::unique_ptr<layers::MixtureOfExperts> moe;
  std::unique_ptr<layers::Tower> towers[kNumHeads];
  layers::BinaryCrossEntropy bce[kNumHeads];
  // Top-level modules in forward order: names, and the end of each one's
  // parameters in params.all() (the previous one's end is its start).
  std::vector<std::string> module_names;
  std::vector<size_t> module_ends;
  size_t sparse_parameters = 0;
  int dense_proj_module = -1, final_norm_module = -1, cross_module = -1, pma_module = -1;
  int dcn_module = -1, moe_module = -1;
  int tower_modules[kNumHeads] = {-1, -1};
  std::vector<int> block_modules;
  ModuleHooks hooks;
  int64_t adam_step = 0;
  // DenseParameter handed out a mutable view: its holder may write the
  // values (a checkpoint restore, DistributedModel's gathers) where the
  // registry cannot see it, so every forward refreshes the bf16 copies.
  bool dense_views_out = false;
  // set_report_regions: per block, filled by the backward.
  bool report_regions = false;
  std::vector<StepResult::Region> regions;
  std::unique_ptr<CudaStreamTimer> region_timer;  // Two marks per block.

  // set_report_regions: the memory timeline (StepResult::memory).
  std::vector<StepResult::MemoryMark> memory;
  // Appends a mark: waits for the device (CUDA), reads the bytes in use and
  // the peak since the last mark, and resets the peak. A no-op unless
  // reporting.
  absl::Status Mark(std::string name) {
    if (!report_regions) return absl::OkStatus();
    StepResult::MemoryMark m;
    m.name = std::move(name);
    if (on_device()) {
      RECFLEET_RETURN_IF_ERROR(SynchronizeCudaStream());
      absl::StatusOr<DeviceMemoryStats> mem = CudaMemoryStats();
      if (!mem.ok()) return mem.status();
      m.in_use_bytes = static_cast<int64_t>(mem->in_use);
      m.peak_bytes = static_cast<int64_t>(mem->peak);
      RECFLEET_RETURN_IF_ERROR(ResetCudaMemoryPeak());
    } else {
      const HostMemoryStats mem = CpuMemoryStats();
      m.in_use_bytes = static_cast<int64_t>(mem.in_use);
      m.peak_bytes = static_cast<int64_t>(mem.peak);
      ResetCpuMemoryPeak();
    }
    memory.push_back(std::move(m));
    return absl::OkStatus();
  }

  // Block l's backward is next: its kept bytes, the memory peak reset, its
  // recomputation (timed).
  absl::Status BeginRegion(int l) {
    StepResult::Region& r = regions[l];
    r.name = absl::StrCat("seq", l);
    r.recomputed = blocks[l]->recompute();
    r.checkpoint = blocks[l]->checkpoint();
    r.fp8_saved = blocks[l]->fp8_saved();
    r.saved = blocks[l]->Saved();
    r.kept_bytes = r.saved.Own();
    if (on_device()) {
      RECFLEET_RETURN_IF_ERROR(Mark(absl::StrCat("backward.before_seq", l)));
      if (region_timer == nullptr) region_timer = std::make_unique<CudaStreamTimer>(2 * static_cast<int>(blocks.size()));
      RECFLEET_RETURN_IF_ERROR(region_timer->Mark(2 * l));
      RECFLEET_RETURN_IF_ERROR(blocks[l]->Recompute());
      return region_timer->Mark(2 * l + 1);
    }
    RECFLEET_RETURN_IF_ERROR(Mark(absl::StrCat("backward.before_seq", l)));
    const auto start = std::chrono::steady_clock::now();
    RECFLEET_RETURN_IF_ERROR(blocks[l]->Recompute());
    if (r.recomputed) r.recompute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return absl::OkStatus();
  }
  // Block l's backward ran: the peak during it.
  absl::Status EndRegion(int l) {
    RECFLEET_RETURN_IF_ERROR(Mark(absl::StrCat("backward.seq", l)));
    regions[l].peak_bytes = memory.back().peak_bytes;
    return absl::OkStatus();
  }
  double loss_weight = 1.0;  // set_loss_weight.
  // The batch arrays on the model's device: staged[current] serves the step
  // in flight, the other one takes a prefetched batch.
  layers::StagedBatch staged[2];
  // defer_loss_readback: the per-head losses of the last two steps, slot
  // step % 2, and which heads that step had.
  layers::DeferredMean deferred_loss[2][kNumHeads];
  bool deferred_heads[2][kNumHeads] = {};
  int64_t steps_enqueued = 0;
  int current = 0;
  bool prefetched = false;
  // ExecutionOptions::cuda_graphs: the dense forward (x0 -> logits) and
  // backward (dlogits -> dx0), and the forward's linear FLOPs, which a
  // replay must count without running the layers' host code.
  CudaGraphRegion dense_forward_graph, dense_backward_graph;
  double dense_forward_flops = 0;
  // Both regions are keyed on the step's batch size and labelled heads, so
  // they capture and replay in lockstep: a backward run eagerly after a
  // replayed forward would read layer state (e.g. Linear's bf16 input copy)
  // that the replay, skipping all host code, never set.
  uint64_t graph_key = 0;
  static uint64_t GraphKey(int64_t B, const bool has_head[kNumHeads]) {
    return static_cast<uint64_t>(B) * 4 + (has_head[0] ? 1 : 0) + (has_head[1] ? 2 : 0);
  }
  bool routed = false;  // SetExpertRouter: the MoE's host code runs every step.

  bool UseGraphs() const {
    // Module hooks run collectives and the memory marks synchronize: neither
    // can be captured.
    return execution.cuda_graphs && on_device() && phases.timer == nullptr && !routed &&
           config.fp8.empty() && !hooks.before_forward && !hooks.after_backward && !report_regions;
  }

  // The dense forward: x0 -> z -> mix -> logits.
  absl::Status DenseForward() {
    RECFLEET_RETURN_IF_ERROR(BeforeForward(dcn_module));
    RECFLEET_RETURN_IF_ERROR(dcn->Forward(x0.view(), &z));
    RECFLEET_RETURN_IF_ERROR(BeforeForward(moe_module));
    RECFLEET_RETURN_IF_ERROR(moe->Forward(z.view(), &mix));
    RECFLEET_RETURN_IF_ERROR(Mark("forward.dcn_moe"));
    for (int k = 0; k < kNumHeads; ++k) {
      RECFLEET_RETURN_IF_ERROR(BeforeForward(tower_modules[k]));
      RECFLEET_RETURN_IF_ERROR(towers[k]->Forward(mix.view(), &logits[k]));
    }
    return Mark("forward.heads");
  }

  // The dense backward: dlogits of the labelled heads -> dx0 (and the dense
  // layers' parameter gradients).
  absl::Status DenseBackward(int64_t B, const bool has_head[kNumHeads]) {
    // The first labelled head writes dmix, the other adds to it (in the
    // GEMM epilogue): no memset. ForwardBackward ensures one head at least.
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, config.expert_out}, &dmix));
    bool dmix_written = false;
    for (int k = 0; k < kNumHeads; ++k) {
      if (!has_head[k]) continue;
      RECFLEET_RETURN_IF_ERROR(towers[k]->Backward(dlogits[k].view(), dmix.view(), dmix_written));
      dmix_written = true;
    }
    // A head without labels has no backward: its gradients stay zero.
    for (int k = 0; k < kNumHeads; ++k) RECFLEET_RETURN_IF_ERROR(AfterBackward(tower_modules[k]));
    RECFLEET_RETURN_IF_ERROR(Mark("backward.heads"));
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, interaction_dim}, &dz));
    RECFLEET_RETURN_IF_ERROR(moe->Backward(dmix.view(), dz.view(), /*accumulate=*/false));
    RECFLEET_RETURN_IF_ERROR(AfterBackward(moe_module));
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, interaction_dim}, &dx0));
    RECFLEET_RETURN_IF_ERROR(dcn->Backward(dz.view(), dx0.view()));
    RECFLEET_RETURN_IF_ERROR(AfterBackward(dcn_module));
    return Mark("backward.dcn_moe");
  }

  // Activations of the last forward.
  Tensor token_offsets;
  std::vector<Tensor> features;  // Pooled id lists, [B, d] each.
  Tensor dense_in, dense_token;
  Tensor tokens;                 // [B, F * d]: the non-sequence tokens.
  std::vector<Tensor> history;   // history[l]: input of block l; the last one the branch's output.
  Tensor history_normed;         // [L, d]
  Tensor cross_out;              // [B * F, d]
  Tensor pma_out;                // [B * P, d]
  Tensor x0, z, mix;             // [B, D], [B, D], [B, expert_out]
  Tensor logits[kNumHeads];      // [B, 1]
  // Gradients of the last backward.
  Tensor dlogits[kNumHeads];
  Tensor dmix, dz, dx0, dcross, dpma, dhistory_normed, dtokens, dhistory, ddense;
  std::vector<Tensor> dfeatures;

  absl::Status CheckBatch(const Batch& b) const {
    if (b.size < 1) return absl::InvalidArgumentError("batch is empty");
    if (b.id_lists.size() != schema.id_lists.size()) {
      return absl::InvalidArgumentError(absl::StrCat("batch has ", b.id_lists.size(),
                                                     " id-list features, schema has ",
                                                     schema.id_lists.size()));
    }
    if (b.sequence.size() != schema.sequence_fields.size() || b.sequence.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("batch has ", b.sequence.size(),
                                                     " sequence fields, schema has ",
                                                     schema.sequence_fields.size(), " (>= 1)"));
    }
    auto check_list = [&](const IdList& l, const std::string& what) -> absl::Status {
      if (static_cast<int64_t>(l.offsets.size()) != b.size + 1 || l.offsets.front() != 0 ||
          l.offsets.back() != static_cast<int64_t>(l.ids.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ".offsets must have batch size + 1 = ", b.size + 1,
            " entries from 0 to the id count ", l.ids.size()));
      }
      return absl::OkStatus();
    };
    for (size_t f = 0; f < b.id_lists.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(check_list(b.id_lists[f], schema.id_lists[f].name));
    }
    for (size_t f = 0; f < b.sequence.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(check_list(b.sequence[f], schema.sequence_fields[f].name));
      if (b.sequence[f].offsets != b.sequence[0].offsets) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence field ", schema.sequence_fields[f].name, " has offsets unlike field ",
            schema.sequence_fields[0].name, "; all fields of an event share them"));
      }
    }
    if (static_cast<int64_t>(b.dense.size()) != b.size * schema.num_dense) {
      return absl::InvalidArgumentError(absl::StrCat("batch.dense has ", b.dense.size(),
                                                     " values, expected size x num_dense = ",
                                                     b.size * schema.num_dense));
    }
    for (const std::vector<float>* labels : {&b.ctr_labels, &b.cvr_labels}) {
      if (!labels->empty() && static_cast<int64_t>(labels->size()) != b.size) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch labels have ", labels->size(), " entries, expected ", b.size));
      }
    }
    return absl::OkStatus();
  }

  bool on_device() const { return execution.device != Device::kCpu; }

  absl::Status Prefetch(const Batch& b) {
    RECFLEET_RETURN_IF_ERROR(CheckBatch(b));
    if (!on_device()) return absl::OkStatus();
    RECFLEET_RETURN_IF_ERROR(staged[1 - current].Stage(b, execution.device));
    sparse.PrepareGradientIds(staged[1 - current]);
    prefetched = true;
    return absl::OkStatus();
  }

  // Makes `b` the batch of the step: the prefetched copy when it is this
  // Batch object, else a copy made now; the compute stream waits for it.
  absl::Status StageStep(const Batch& b) {
    const int next = 1 - current;
    if (!(prefetched && staged[next].batch() == &b) || !on_device()) {
      RECFLEET_RETURN_IF_ERROR(staged[next].Stage(b, execution.device));
    }
    prefetched = false;
    current = next;
    return staged[current].WaitReady(nullptr);
  }

  const layers::StagedBatch& step_batch() const { return staged[current]; }

  // `step`: the forward of a training step (ForwardBackward), the only one
  // whose dense part may run as a CUDA graph.
  absl::Status Forward(const Batch& b, absl::Span<const TensorView> pooled = {},
                       bool step = false) {
    RECFLEET_RETURN_IF_ERROR(CheckBatch(b));
    RECFLEET_RETURN_IF_ERROR(StageStep(b));
    if (storage == TableStorage::kExternal || !pooled.empty()) {
      RECFLEET_RETURN_IF_ERROR(sparse.CheckPooled(b, pooled));
    }
    flops.Reset();
    memory.clear();
    if (report_regions) {
      RECFLEET_RETURN_IF_ERROR(Mark("step_start"));
      memory.back().peak_bytes = memory.back().in_use_bytes;
    }
    // The bf16 weight copies of the bf16 linears, in one launch, from the
    // values as they are now (whoever wrote them last). Skipped when the
    // last AdamW pass wrote them and no one else can have written the
    // values since (no mutable view of them was handed out).
    if (on_device() && (dense_views_out || !params.bf16_copies_current())) {
      RECFLEET_RETURN_IF_ERROR(params.RefreshBf16Copies());
    }
    const int64_t d = config.dim, B = b.size, F = num_tokens, P = config.pma_queries;
    const TensorView hist_off = HostOffsets(b.sequence[0].offsets);
    RECFLEET_RETURN_IF_ERROR(layers::UniformOffsets(B, F, &token_offsets));

    // Sparse part and numeric features -> the non-sequence tokens; history
    // events -> one token each.
    history.resize(blocks.size() + 1);
    RECFLEET_RETURN_IF_ERROR(sparse.Forward(step_batch(), pooled, &features, &history[0]));
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, F * d}, &tokens));
    for (size_t f = 0; f < features.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(ops::ScatterColumns(features[f].view(), f * d, tokens.view()));
    }
    if (dense_proj != nullptr) {
      // On a device the staged fp32 copy is the input; the host model
      // converts to its own dtype.
      TensorView dense = step_batch().dense();
      if (!on_device()) {
        RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, schema.num_dense}, &dense_in));
        RECFLEET_RETURN_IF_ERROR(ops::CopyFromHost(b.dense, dense_in.view()));
        dense = dense_in.view();
      }
      RECFLEET_RETURN_IF_ERROR(BeforeForward(dense_proj_module));
      RECFLEET_RETURN_IF_ERROR(dense_proj->Forward(dense, &dense_token));
      RECFLEET_RETURN_IF_ERROR(ops::ScatterColumns(dense_token.view(), (F - 1) * d, tokens.view()));
    }
    const JaggedView token_rows{layers::Reshaped(tokens.view(), {B * F, d}), token_offsets.view()};
    RECFLEET_RETURN_IF_ERROR(Mark("forward.embeddings"));

    // Sequence branch: pre-norm self-attention blocks, then a final norm.
    for (size_t l = 0; l < blocks.size(); ++l) {
      RECFLEET_RETURN_IF_ERROR(BeforeForward(block_modules[l]));
      RECFLEET_RETURN_IF_ERROR(blocks[l]->Forward({history[l].view(), hist_off}, &history[l + 1]));
      // A block keeping its own FP8 copy of its input no longer needs the
      // bf16 one (block l + 1 reads history[l + 1]).
      if (on_device() && blocks[l]->fp8_saved()) history[l] = Tensor();
      RECFLEET_RETURN_IF_ERROR(Mark(absl::StrCat("forward.seq", l)));
    }
    // A bf16 history (the blocks' bf16 flow) stays bf16 through the final
    // norm: cross-attention and PMA take it as their bf16 GEMM operand.
    RECFLEET_RETURN_IF_ERROR(BeforeForward(final_norm_module));
    RECFLEET_RETURN_IF_ERROR(
        final_norm->Forward(history.back().view(), &history_normed, history.back().dtype()));
    const JaggedView hist{history_normed.view(), hist_off};
    RECFLEET_RETURN_IF_ERROR(Mark("forward.final_norm"));

    // Cross branch: tokens attend to the history (residual), PMA pools it.
    TensorView crossed = token_rows.values;
    if (cross != nullptr) {
      RECFLEET_RETURN_IF_ERROR(BeforeForward(cross_module));
      RECFLEET_RETURN_IF_ERROR(cross->Forward(token_rows, hist, &cross_out));
      crossed = cross_out.view();
      RECFLEET_RETURN_IF_ERROR(Mark("forward.cross"));
    }
    if (pma != nullptr) {
      RECFLEET_RETURN_IF_ERROR(BeforeForward(pma_module));
      RECFLEET_RETURN_IF_ERROR(pma->Forward(hist, &pma_out));
      RECFLEET_RETURN_IF_ERROR(Mark("forward.pma"));
    }

    // Dense interaction on x0 = [cross tokens, PMA tokens] per sample.
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, interaction_dim}, &x0));
    RECFLEET_RETURN_IF_ERROR(ops::ScatterColumns(layers::Reshaped(crossed, {B, F * d}), 0, x0.view()));
    if (pma != nullptr) {
      RECFLEET_RETURN_IF_ERROR(
          ops::ScatterColumns(layers::Reshaped(pma_out.view(), {B, P * d}), F * d, x0.view()));
    }
    // DCN, MoE and the CTR and CVR towers.
    if (!(step && UseGraphs())) {
      // The layers may reallocate their buffers for another batch size: a
      // captured graph would then launch on freed memory.
      if (graph_key / 4 != static_cast<uint64_t>(B)) {
        dense_forward_graph.Reset();
        dense_backward_graph.Reset();
      }
      return DenseForward();
    }
    const double before = flops.linear;
    absl::StatusOr<CudaGraphRegion::Mode> mode =
        dense_forward_graph.Run(graph_key, [this] { return DenseForward(); });
    if (!mode.ok()) return mode.status();
    if (*mode == CudaGraphRegion::Mode::kCaptured) dense_forward_flops = flops.linear - before;
    if (*mode == CudaGraphRegion::Mode::kReplayed) flops.linear += dense_forward_flops;
    return absl::OkStatus();
  }

  const std::vector<float>& Labels(const Batch& b, int head) const {
    return head == 0 ? b.ctr_labels : b.cvr_labels;
  }

  // Per-sample BCE of `head` and, when dlogit is given, its gradient w.r.t.
  // the logits; bce[head].ReadLoss() gives the mean.
  absl::Status EnqueueHeadLoss(const Batch& b, int head, Tensor* dlogit) {
    if (on_device()) {
      return bce[head].Enqueue(logits[head].view(), step_batch().labels(head), dlogit);
    }
    return bce[head].Forward(logits[head].view(), Labels(b, head), dlogit).status();
  }

  absl::Status Backward(const Batch& b, const bool has_head[kNumHeads]) {
    RECFLEET_RETURN_IF_ERROR(params.ZeroGradients());
    const int64_t d = config.dim, B = b.size, F = num_tokens;
    const int64_t P = config.pma_queries, L = b.sequence[0].offsets.back();

    for (int k = 0; k < kNumHeads; ++k) {
      if (has_head[k] && loss_weight != 1.0) {
        RECFLEET_RETURN_IF_ERROR(ops::Scale(dlogits[k].view(), loss_weight));
      }
    }
    if (UseGraphs() && dense_forward_graph.holds(graph_key)) {
      absl::StatusOr<CudaGraphRegion::Mode> mode =
          dense_backward_graph.Run(graph_key, [&] { return DenseBackward(B, has_head); });
      if (!mode.ok()) return mode.status();
    } else {
      RECFLEET_RETURN_IF_ERROR(DenseBackward(B, has_head));
    }

    // Split x0's gradient back into cross tokens and PMA tokens.
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, F * d}, &dcross));
    RECFLEET_RETURN_IF_ERROR(ops::GatherColumns(dx0.view(), 0, dcross.view()));
    RECFLEET_RETURN_IF_ERROR(layers::AllocateZeros(ctx, {L, d}, &dhistory_normed));
    if (pma != nullptr) {
      RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, P * d}, &dpma));
      RECFLEET_RETURN_IF_ERROR(ops::GatherColumns(dx0.view(), F * d, dpma.view()));
      RECFLEET_RETURN_IF_ERROR(
          pma->Backward(layers::Reshaped(dpma.view(), {B * P, d}), dhistory_normed.view()));
      RECFLEET_RETURN_IF_ERROR(AfterBackward(pma_module));
      RECFLEET_RETURN_IF_ERROR(Mark("backward.pma"));
    }
    TensorView dtoken_rows = dcross.view();  // Without cross-attention: the identity.
    if (cross != nullptr) {
      RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, F * d}, &dtokens));
      RECFLEET_RETURN_IF_ERROR(cross->Backward(layers::Reshaped(dcross.view(), {B * F, d}),
                                               layers::Reshaped(dtokens.view(), {B * F, d}),
                                               dhistory_normed.view()));
      RECFLEET_RETURN_IF_ERROR(AfterBackward(cross_module));
      dtoken_rows = dtokens.view();
      RECFLEET_RETURN_IF_ERROR(Mark("backward.cross"));
    }

    // Sequence branch, last block first; every block updates dhistory in place.
    RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {L, d}, &dhistory));
    RECFLEET_RETURN_IF_ERROR(final_norm->Backward(dhistory_normed.view(), dhistory.view()));
    RECFLEET_RETURN_IF_ERROR(AfterBackward(final_norm_module));
    if (on_device()) {
      // Cross-attention and PMA are done with the normed history (their
      // backward ran), and so is the final norm, the last reader of the
      // branch's output: free them before the blocks' backward, where the
      // step's memory peaks.
      history_normed = Tensor();
      dhistory_normed = Tensor();
      history.back() = Tensor();
    }
    RECFLEET_RETURN_IF_ERROR(Mark("backward.final_norm"));
    if (report_regions) regions.assign(blocks.size(), StepResult::Region());
    for (int l = static_cast<int>(blocks.size()) - 1; l >= 0; --l) {
      if (report_regions) RECFLEET_RETURN_IF_ERROR(BeginRegion(l));
      RECFLEET_RETURN_IF_ERROR(blocks[l]->Backward(dhistory.view(), dhistory.view()));
      RECFLEET_RETURN_IF_ERROR(AfterBackward(block_modules[l]));
      if (report_regions) RECFLEET_RETURN_IF_ERROR(EndRegion(l));
      // Block l's output was block l + 1's input (its backward ran) and the
      // final norm's: dead now.
      if (on_device()) history[l + 1] = Tensor();
    }
    if (report_regions && on_device()) {
      for (size_t l = 0; l < blocks.size(); ++l) {
        if (!regions[l].recomputed) continue;
        absl::StatusOr<double> s = region_timer->Seconds(2 * l, 2 * l + 1);
        if (!s.ok()) return s.status();
        regions[l].recompute_s = *s;
      }
    }

    // Tokens: numeric-feature projection and the pooled id lists.
    const TensorView dtoken_matrix = layers::Reshaped(dtoken_rows, {B, F * d});
    if (dense_proj != nullptr) {
      RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, d}, &ddense));
      RECFLEET_RETURN_IF_ERROR(ops::GatherColumns(dtoken_matrix, (F - 1) * d, ddense.view()));
      RECFLEET_RETURN_IF_ERROR(dense_proj->Backward(ddense.view(), TensorView(), false));
      RECFLEET_RETURN_IF_ERROR(AfterBackward(dense_proj_module));
    }
    dfeatures.resize(schema.id_lists.size());
    std::vector<TensorView> dfeature_views;
    for (size_t f = 0; f < dfeatures.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(layers::AllocateTensor(ctx, {B, d}, &dfeatures[f]));
      RECFLEET_RETURN_IF_ERROR(ops::GatherColumns(dtoken_matrix, f * d, dfeatures[f].view()));
      dfeature_views.push_back(dfeatures[f].view());
    }
    RECFLEET_RETURN_IF_ERROR(sparse.Backward(step_batch(), dfeature_views, dhistory.view()));
    RECFLEET_RETURN_IF_ERROR(Mark("backward.embeddings"));
    if (on_device()) {
      // The history-sized activations and gradients are dead until the next
      // forward: back to the pool (stream-ordered), so the next step's
      // forward allocates into free memory instead of beside them.
      for (Tensor& t : history) t = Tensor();
      dhistory = Tensor();
    }
    // Gradients the step's layers did not write (a head without labels)
    // are zeroed now, so every reader after the backward sees this step's.
    RECFLEET_RETURN_IF_ERROR(params.SettleGradients());
    return staged[current].MarkConsumed(nullptr);
  }

  absl::Status Update() {
    ++adam_step;
    AdamConfig adam;
    adam.lr = config.learning_rate;
    adam.weight_decay = config.weight_decay;
    {
      const layers::ScopedPhase phase(&phases, layers::Phase::kOptimizer);
      RECFLEET_RETURN_IF_ERROR(params.AdamStep(adam, adam_step, config.dense_grad_clip_norm,
                                               /*write_bf16_copies=*/!dense_views_out));
    }
    return sparse.ApplyUpdates(static_cast<float>(config.adagrad_learning_rate));
  }

  absl::Status CheckSameArchitecture(const Impl& other, const char* what) const {
    if (other.params.all().size() != params.all().size() ||
        other.sparse.num_tables() != sparse.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": different architecture"));
    }
    return absl::OkStatus();
  }
};

template <typename T>
GemLite<T>::GemLite(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

template <typename T>
GemLite<T>::~GemLite() = default;

template <typename T>
absl::StatusOr<std::unique_ptr<GemLite<T>>> GemLite<T>::Create(const GemLiteConfig& config,
                                                               const FeatureSchema& schema,
                                                               TableStorage storage,
                                                               const ExecutionOptions& execution) {
  RECFLEET_RETURN_IF_ERROR(config.Validate());
  if (schema.sequence_fields.empty()) {
    return absl::InvalidArgumentError("schema needs at least one sequence field (the history)");
  }
  for (const FeatureSchema::Table& t : schema.tables) {
    if (t.rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t.name, " must have >= 1 rows, got ", t.rows));
    }
  }
  auto check_table = [&](int table, const std::string& feature) -> absl::Status {
    if (table < 0 || table >= static_cast<int>(schema.tables.size())) {
      return absl::InvalidArgumentError(absl::StrCat("feature ", feature, " names table ", table,
                                                     " of ", schema.tables.size()));
    }
    return absl::OkStatus();
  };
  for (const auto& f : schema.id_lists) RECFLEET_RETURN_IF_ERROR(check_table(f.table, f.name));
  for (const auto& f : schema.sequence_fields) RECFLEET_RETURN_IF_ERROR(check_table(f.table, f.name));
  Allocator* allocator = CpuAllocator();
  if (execution.device == Device::kCuda) {
    if (!std::is_same_v<T, float>) {
      return absl::InvalidArgumentError("a CUDA model computes in fp32 or bf16: use GemLite<float>");
    }
    absl::StatusOr<Allocator*> cuda = CudaAllocator();
    if (!cuda.ok()) return cuda.status();
    allocator = *cuda;
  } else if (execution.bf16) {
    return absl::InvalidArgumentError("bf16 execution needs device cuda");
  }
  if (execution.recompute_attention_blocks < 0 ||
      execution.recompute_attention_blocks > config.seq_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "recompute_attention_blocks must be 0 to the number of self-attention blocks (",
        config.seq_layers, "), got ", execution.recompute_attention_blocks));
  }
  if (!execution.attention_checkpoint.empty() &&
      static_cast<int>(execution.attention_checkpoint.size()) != config.seq_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attention_checkpoint has ", execution.attention_checkpoint.size(),
        " entries; it needs one per self-attention block (", config.seq_layers, ") or none"));
  }
  auto impl = std::make_unique<Impl>(config, schema, storage, execution, allocator);
  if (impl->sparse_parameters != 0) {
    return absl::InternalError("the sparse part registered dense parameters; the module map assumes it has none");
  }
  // The linears' weight gradients are overwritten by their first write of a
  // step rather than zeroed and added to; not under CUDA graphs, whose
  // replays skip the host code that tracks which were written.
  impl->params.set_overwrite_first(execution.device == Device::kCuda && !execution.cuda_graphs);
  // Every parameter is registered: the one-launch optimizer passes get their
  // device table now, not inside the first step.
  RECFLEET_RETURN_IF_ERROR(impl->params.Prepare());
  return std::unique_ptr<GemLite<T>>(new GemLite<T>(std::move(impl)));
}

template <typename T>
absl::StatusOr<StepResult> GemLite<T>::ForwardBackward(const Batch& batch) {
  return ForwardBackward(batch, {});
}

template <typename T>
absl::StatusOr<StepResult> GemLite<T>::ForwardBackward(const Batch& batch,
                                                       absl::Span<const TensorView> pooled) {
  Impl& m = *impl_;
  bool has_head[kNumHeads];
  for (int k = 0; k < kNumHeads; ++k) has_head[k] = !m.Labels(batch, k).empty();
  if (!has_head[0] && !has_head[1]) {
    return absl::InvalidArgumentError("batch has neither CTR nor CVR labels");
  }
  m.graph_key = Impl::GraphKey(batch.size, has_head);
  RECFLEET_RETURN_IF_ERROR(m.Forward(batch, pooled, /*step=*/true));
  for (int k = 0; k < kNumHeads; ++k) {
    if (has_head[k]) RECFLEET_RETURN_IF_ERROR(m.EnqueueHeadLoss(batch, k, &m.dlogits[k]));
  }
  RECFLEET_RETURN_IF_ERROR(m.Backward(batch, has_head));
  StepResult r;
  r.flops = m.flops.StepFlops();
  r.recomputed_flops = m.flops.recomputed;
  if (m.report_regions) {
    r.regions = m.regions;
    r.memory = m.memory;
  }
  r.step = m.steps_enqueued++;
  if (m.on_device() && m.execution.defer_loss_readback) {
    const int slot = static_cast<int>(r.step % 2);
    for (int k = 0; k < kNumHeads; ++k) {
      m.deferred_heads[slot][k] = has_head[k];
      if (has_head[k]) RECFLEET_RETURN_IF_ERROR(m.deferred_loss[slot][k].Enqueue(m.bce[k].losses()));
    }
    r.losses_pending = true;
    return r;
  }
  // The one read-back of the step, after all of it is enqueued.
  for (int k = 0; k < kNumHeads; ++k) {
    if (!has_head[k]) continue;
    absl::StatusOr<double> loss = m.bce[k].ReadLoss();
    if (!loss.ok()) return loss.status();
    (k == 0 ? r.ctr_loss : r.cvr_loss) = *loss;
  }
  return r;
}

template <typename T>
absl::Status GemLite<T>::ReadLosses(StepResult* result) {
  if (!result->losses_pending) return absl::OkStatus();
  Impl& m = *impl_;
  // Slot step % 2 is rewritten by ForwardBackward of step + 2.
  if (result->step < 0 || result->step + 2 < m.steps_enqueued ||
      result->step >= m.steps_enqueued) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the losses of step ", result->step, " are gone: they stay readable for two steps, and ",
        m.steps_enqueued, " steps have been enqueued"));
  }
  const int slot = static_cast<int>(result->step % 2);
  for (int k = 0; k < kNumHeads; ++k) {
    if (!m.deferred_heads[slot][k]) continue;
    absl::StatusOr<double> loss = m.deferred_loss[slot][k].Read();
    if (!loss.ok()) return loss.status();
    (k == 0 ? result->ctr_loss : result->cvr_loss) = *loss;
  }
  result->losses_pending = false;
  return absl::OkStatus();
}

template <typename T>
absl::Status GemLite<T>::ApplyUpdates() {
  return impl_->Update();
}

template <typename T>
absl::Status GemLite<T>::Prefetch(const Batch& next) {
  return impl_->Prefetch(next);
}

template <typename T>
void GemLite<T>::SetPhaseTimer(layers::PhaseTimer* timer) {
  impl_->phases.timer = timer;
}

template <typename T>
void GemLite<T>::set_report_regions(bool on) {
  impl_->report_regions = on;
}

template <typename T>
void GemLite<T>::set_loss_weight(double weight) {
  impl_->loss_weight = weight;
}

template <typename T>
void GemLite<T>::SetExpertRouter(layers::ExpertRouter* router) {
  impl_->moe->SetRouter(router);
  impl_->routed = router != nullptr;
}

template <typename T>
int64_t GemLite<T>::cuda_graph_replays() const {
  return impl_->dense_forward_graph.replays();
}

template <typename T>
void GemLite<T>::SetModuleHooks(ModuleHooks hooks) {
  impl_->hooks = std::move(hooks);
}

template <typename T>
std::vector<std::string> GemLite<T>::ModuleNames() const {
  return impl_->module_names;
}

template <typename T>
std::vector<int> GemLite<T>::DenseParameterModules() const {
  std::vector<int> modules;
  for (size_t m = 0; m < impl_->module_ends.size(); ++m) {
    while (modules.size() < impl_->module_ends[m]) modules.push_back(static_cast<int>(m));
  }
  return modules;
}

template <typename T>
const ExecutionOptions& GemLite<T>::execution() const {
  return impl_->execution;
}

template <typename T>
absl::StatusOr<std::unique_ptr<GemLite<T>>> GemLite<T>::Clone() const {
  absl::StatusOr<std::unique_ptr<GemLite<T>>> copy =
      Create(impl_->config, impl_->schema, impl_->storage, impl_->execution);
  if (!copy.ok()) return copy.status();
  RECFLEET_RETURN_IF_ERROR((*copy)->CopyParametersFrom(*this));
  return copy;
}

template <typename T>
void GemLite<T>::ScaleGradients(double weight) {
  // Host tensors of the model's own dtype: these cannot fail.
  (void)impl_->params.ScaleGradients(weight);
  (void)impl_->sparse.ScaleGradients(weight);
}

template <typename T>
absl::Status GemLite<T>::AddGradients(const GemLite& replica, double weight) {
  const Impl& r = *replica.impl_;
  RECFLEET_RETURN_IF_ERROR(impl_->CheckSameArchitecture(r, "AddGradients"));
  RECFLEET_RETURN_IF_ERROR(impl_->params.AddGradients(r.params, weight));
  return impl_->sparse.AddGradients(r.sparse, weight);
}

template <typename T>
absl::Status GemLite<T>::CopyParametersFrom(const GemLite& primary) {
  const Impl& p = *primary.impl_;
  RECFLEET_RETURN_IF_ERROR(impl_->CheckSameArchitecture(p, "CopyParametersFrom"));
  RECFLEET_RETURN_IF_ERROR(impl_->params.CopyValuesFrom(p.params));
  return impl_->sparse.CopyTablesFrom(p.sparse);
}

template <typename T>
absl::StatusOr<std::vector<TableLookups>> GemLite<T>::TableLookupsOf(const Batch& batch) const {
  RECFLEET_RETURN_IF_ERROR(impl_->CheckBatch(batch));
  return impl_->sparse.Lookups(batch);
}

template <typename T>
std::vector<TensorView> GemLite<T>::PooledGradients() {
  return impl_->sparse.PooledGradients();
}

template <typename T>
absl::StatusOr<std::vector<double>> GemLite<T>::Predict(const Batch& batch, Head head,
                                                        absl::Span<const TensorView> pooled) {
  RECFLEET_RETURN_IF_ERROR(impl_->Forward(batch, pooled));
  return ops::CopyToHost(impl_->logits[static_cast<int>(head)].view());
}

template <typename T>
absl::StatusOr<std::vector<double>> GemLite<T>::Predict(const Batch& batch, Head head) {
  return Predict(batch, head, {});
}

template <typename T>
absl::StatusOr<double> GemLite<T>::Loss(const Batch& batch) {
  RECFLEET_RETURN_IF_ERROR(impl_->Forward(batch));
  double total = 0;
  for (int k = 0; k < kNumHeads; ++k) {
    if (impl_->Labels(batch, k).empty()) continue;
    RECFLEET_RETURN_IF_ERROR(impl_->EnqueueHeadLoss(batch, k, nullptr));
    absl::StatusOr<double> loss = impl_->bce[k].ReadLoss();
    if (!loss.ok()) return loss.status();
    total += *loss;
  }
  return total;
}

template <typename T>
std::vector<std::string> GemLite<T>::DenseParameterNames() const {
  std::vector<std::string> names;
  for (const layers::Parameter* p : impl_->params.all()) names.push_back(p->name);
  return names;
}

template <typename T>
TensorView GemLite<T>::DenseParameter(const std::string& name) {
  impl_->dense_views_out = true;
  const layers::Parameter* p = impl_->params.Find(name);
  return p == nullptr ? TensorView() : p->value.view();
}

template <typename T>
TensorView GemLite<T>::DenseParameterView(const std::string& name) const {
  const layers::Parameter* p = impl_->params.Find(name);
  return p == nullptr ? TensorView() : p->value.view();
}

template <typename T>
absl::Status GemLite<T>::UseFp8Weight(const std::string& name, const TensorView& codes,
                                      const TensorView& tile_scales) {
  layers::Parameter* p = impl_->params.Find(name);
  if (p == nullptr) return absl::NotFoundError(absl::StrCat("no dense parameter ", name));
  if (!p->use_fp8_form) {
    return absl::FailedPreconditionError(absl::StrCat("no FP8 GEMM reads dense parameter ", name));
  }
  return p->use_fp8_form(codes, tile_scales);
}

template <typename T>
void GemLite<T>::DenseParametersWritten() {
  impl_->params.ValuesWritten();
}

template <typename T>
bool GemLite<T>::Bf16CopiesTrusted() const {
  return !impl_->dense_views_out && impl_->params.bf16_copies_current();
}

template <typename T>
TensorView GemLite<T>::DenseGradient(const std::string& name) {
  const layers::Parameter* p = impl_->params.Find(name);
  return p == nullptr ? TensorView() : p->grad.view();
}

template <typename T>
int GemLite<T>::num_tables() const {
  return impl_->sparse.num_tables();
}

template <typename T>
TensorView GemLite<T>::Table(int table) {
  return impl_->sparse.table(table);
}

template <typename T>
absl::StatusOr<Tensor> GemLite<T>::DenseTableGradient(int table) {
  return impl_->sparse.DenseTableGradient(table);
}

template <typename T>
TensorView GemLite<T>::DenseAdamMoment(const std::string& name, int moment) {
  const layers::Parameter* p = impl_->params.Find(name);
  if (p == nullptr || (moment != 1 && moment != 2)) return TensorView();
  return moment == 1 ? p->m.view() : p->v.view();
}

template <typename T>
TensorView GemLite<T>::TableMomentum(int table) {
  return impl_->sparse.momentum(table);
}

template <typename T>
int64_t GemLite<T>::adam_step() const {
  return impl_->adam_step;
}

template <typename T>
void GemLite<T>::set_adam_step(int64_t step) {
  impl_->adam_step = step;
}

template <typename T>
int64_t GemLite<T>::num_dense_parameters() const {
  return impl_->params.num_elements();
}

template <typename T>
int64_t GemLite<T>::num_table_parameters() const {
  return impl_->sparse.num_parameters();
}

template class GemLite<float>;
template class GemLite<double>;

}  // namespace recfleet::engine
