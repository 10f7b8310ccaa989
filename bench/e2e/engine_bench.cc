// recfleet's CUDA engine on the batches of bench/e2e/make_batches (the
// same file the PyTorch side trains on): GEM-lite built from the job spec
// exactly as a job builds it (engine/job_model.h), trained for --steps
// timed steps after --warmup, cycling over the file's batches with the next
// batch prefetched during each step and each step's losses read back one
// step later (ExecutionOptions::defer_loss_readback), so the host never
// waits for the GPU between timed steps. Reports samples/s, the median step
// time (CUDA events at the step boundaries), useful model FLOPs from the real
// jagged lengths and local MFU against 989 TFLOP/s (dense bf16 H100/H200
// SXM) and against the measured ~790 TFLOP/s bf16 GEMM ceiling, and the
// device memory peak (the pool's peak in use; beside it the whole device's
// bytes in use after the timed steps, which also count what is allocated
// outside the pool, and other processes on the same GPU). Then at least 5
// more steps back to back under CUPTI (bench/e2e/gpu_busy.h), twice: GPU
// idle, and the busy and idle time per kernel name, from an empty queue
// ("gpu_idle_cold" in the JSON) and in steady training, two steps into the
// pipeline ("gpu_idle"). Then --profile-steps more steps with CUDA events
// around every phase the layers mark (embedding, attention, GEMM,
// optimizer; the rest of the step is "other", idle gaps included) and the
// host's time to issue each step; and, with --search-s > 0, the largest
// batch that fits: k file batches concatenated into one, k doubling until
// the device is out of memory, then bisected (bounded by that many
// seconds).
// --fp8 MODULES (comma list, model.precision.fp8_modules of the spec, e.g.
// "dcn,moe.experts"), --fp8-attention BLOCKS (model.precision.fp8_attention,
// e.g. "sequence,cross,pma"), --fp8-attention-bwd bf16|fp8 (model.precision.
// attention_backward) and --fp8-wgrad bf16|fp8|hadamard set the spec's per-layer
// precision recipe before the model is built; --eval-batches N holds the
// file's last N batches out of training and reports the CTR head's eval NE
// and AUC on them right after the timed steps (the same steps for every
// recipe). --ne-baseline (with --fp8 or --fp8-attention, and --eval-batches) then trains the
// same model without the recipe (bf16) on the same steps' batches from the
// same initial parameters and reports both NEs side by side with the
// relative increase and the quality gate's verdict at --ne-tolerance
// (default 0.001, i.e. 0.1%; engine/quality_gate.h, the check a job's
// model.precision.quality_gate runs).
// --recompute-attention-blocks N: the first N self-attention blocks keep
// only their input and recompute their activations in the backward
// (ExecutionOptions::recompute_attention_blocks); without it, the job's
// model.activation_memory decides (every block, or the planner's choice on
// one H200 for a budget). The JSON gives the recomputed forward FLOPs per
// step beside the useful ones and the peak, and "regions": per block, the
// activations it kept, the memory peak during its backward and its
// recomputation time (CUDA events), from one extra step.
// --attention-checkpoint MODE[,MODE...]: what each self-attention block
// keeps (none, norm, projections, block: layers::BlockCheckpoint; one mode
// for every block or one per block; replaces --recompute-attention-blocks)
// and --fp8-saved 1 keeps the recomputing blocks' inputs and attention
// outputs in FP8 (ExecutionOptions::fp8_saved_activations). The same extra
// step gives "memory": the step's memory timeline (StepResult::memory), the
// bytes in use when the step starts (parameters, gradients, optimizer
// state, tables, staged batches), the step's peak and where it was, and the
// activation peak (the peak minus the step-start bytes).
//
//   engine_bench --job config_a.yaml --batches batches.bin --json out.json
//                [--steps 20] [--warmup 5] [--profile-steps 3]
//                [--precision bf16|fp32] [--search-s 60]
//                [--fp8 MODULES] [--fp8-attention BLOCKS] [--fp8-attention-bwd bf16|fp8]
//                [--fp8-wgrad bf16|fp8|hadamard] [--eval-batches N]
//                [--ne-baseline 1] [--ne-tolerance 0.001]
//                [--recompute-attention-blocks N] [--cuda-graphs 1]
//                [--attention-checkpoint none|norm|projections|block[,...]]
//                [--fp8-saved 1] [--probe K] [--start-after FILE]
//
// --start-after FILE: build the model and read the batches, then wait until
// FILE exists before the first step (runs whose peaks, not times, are
// wanted can start while another run has the GPU).
// --probe K: only whether one batch of K file batches concatenated trains
// for --steps steps (exit 0, "fits" and the peak) or runs out of device
// memory (exit 3, the error; another error exits 1); bench/e2e/max_batch.sh
// bisects on it, one process per probe.
// --cuda-graphs 1: the dense part of every step (DCN, MoE, towers, forward
// and backward) replays as CUDA graphs (ExecutionOptions::cuda_graphs); the
// JSON's "cuda_graph_replays" counts the steps that replayed them.
// --host-sample-steps N --host-sample-out FILE [--host-sample-us 50]: after
// the CUPTI steps, N more steps as the timed ones with the stepping thread's
// stack sampled every US microseconds of wall time (bench/e2e/host_sampler.h),
// each sample tagged with the loop part (forward_backward, prefetch, update,
// read_losses) or the phase being issued; FILE holds the raw samples, which
// bench/e2e/host_profile.py symbolizes against the unstripped binary.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/e2e/batch_file.h"
#include "bench/e2e/gpu_busy.h"
#include "bench/e2e/host_sampler.h"
#include "cli/jobs/spec_file.h"
#include "common/status_macros.h"
#include "engine/batch_concat.h"
#include "engine/job_model.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "engine/quality_gate.h"
#include "engine/tensor.h"
#include "services/coordinator/plan_adapter.h"

namespace {

constexpr double kPeakBf16 = 989e12;
constexpr double kMeasuredGemm = 790e12;

using recfleet::engine::Batch;
using recfleet::engine::layers::Phase;

// Events at every phase boundary of a step; sums per phase after a sync.
class EventPhaseTimer : public recfleet::engine::layers::PhaseTimer {
 public:
  ~EventPhaseTimer() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }
  void Mark(Phase phase, bool begin) override {
    // The host's side: how long issuing each phase took (its launches,
    // allocations and host work, plus these event records).
    const auto now = std::chrono::steady_clock::now();
    if (begin) {
      host_open_[static_cast<int>(phase)] = now;
    } else {
      host_ms_[static_cast<int>(phase)] +=
          std::chrono::duration<double, std::milli>(now - host_open_[static_cast<int>(phase)]).count();
    }
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      cudaEventCreate(&e);
      pool_.push_back(e);
    }
    cudaEventRecord(pool_[used_], nullptr);
    marks_.push_back({phase, begin, used_++});
  }
  // Milliseconds per phase of the marks since the last call (synchronizes).
  std::array<double, recfleet::engine::layers::kNumPhases> Collect() {
    std::array<double, recfleet::engine::layers::kNumPhases> ms{};
    if (!marks_.empty()) cudaEventSynchronize(pool_[marks_.back().event]);
    size_t open[recfleet::engine::layers::kNumPhases] = {};
    for (const MarkAt& m : marks_) {
      if (m.begin) {
        open[static_cast<int>(m.phase)] = m.event;
      } else {
        float t = 0;
        cudaEventElapsedTime(&t, pool_[open[static_cast<int>(m.phase)]], pool_[m.event]);
        ms[static_cast<int>(m.phase)] += t;
      }
    }
    marks_.clear();
    used_ = 0;
    return ms;
  }
  // Host milliseconds per phase since the last call.
  std::array<double, recfleet::engine::layers::kNumPhases> CollectHost() {
    const auto ms = host_ms_;
    host_ms_ = {};
    return ms;
  }

 private:
  struct MarkAt {
    Phase phase;
    bool begin;
    size_t event;
  };
  std::vector<cudaEvent_t> pool_;
  std::vector<MarkAt> marks_;
  std::array<std::chrono::steady_clock::time_point, recfleet::engine::layers::kNumPhases> host_open_{};
  std::array<double, recfleet::engine::layers::kNumPhases> host_ms_{};
  size_t used_ = 0;
};

// Tags the host sampler's samples with the phase being issued (no events).
class TagPhaseTimer : public recfleet::engine::layers::PhaseTimer {
 public:
  explicit TagPhaseTimer(const char* const* outer) : outer_(outer) {}
  void Mark(Phase phase, bool begin) override {
    static constexpr const char* kNames[] = {"embedding", "attention", "gemm", "optimizer"};
    recfleet::bench::HostSampler::SetTag(begin ? kNames[static_cast<int>(phase)] : *outer_);
  }

 private:
  const char* const* outer_;  // The loop's current tag.
};

int Fail(const std::string& m) {
  std::fprintf(stderr, "engine_bench: %s\n", m.c_str());
  return 1;
}

// Bytes in use on the whole device (cudaMemGetInfo): the pool's reserved
// bytes plus what is allocated outside it (the CUDA context, library
// workspaces, the FP8 linears' cudaMalloc'd operand caches); 0 on error.
uint64_t DeviceUsedBytes() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return total_bytes - free_bytes;
}

#define CUDA_OR_FAIL(expr)                                                          \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) return Fail(absl::StrCat(#expr, ": ", cudaGetErrorString(e_))); \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  std::string job, batches_path, json, precision = "bf16", fp8, fp8_attention, fp8_wgrad = "bf16",
                                                   fp8_attention_bwd = "bf16";
  int steps = 20, warmup = 5, profile_steps = 3, eval_batches = 0, recompute_blocks = -1, probe = 0;
  int host_sample_steps = 0, host_sample_us = 50;
  std::string host_sample_out, start_after;
  double search_s = 0, ne_tolerance = 0.001;
  bool ne_baseline = false, fp8_saved = false, cuda_graphs = false;
  std::string attention_checkpoint;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--job") {
      job = v;
    } else if (a == "--batches") {
      batches_path = v;
    } else if (a == "--json") {
      json = v;
    } else if (a == "--precision") {
      precision = v;
    } else if (a == "--fp8") {
      fp8 = v;
    } else if (a == "--fp8-attention") {
      fp8_attention = v;
    } else if (a == "--fp8-wgrad") {
      fp8_wgrad = v;
    } else if (a == "--fp8-attention-bwd") {
      fp8_attention_bwd = v;
    } else if (a == "--eval-batches") {
      if (!absl::SimpleAtoi(v, &eval_batches) || eval_batches < 0) {
        return Fail("--eval-batches needs an integer >= 0");
      }
    } else if (a == "--recompute-attention-blocks") {
      if (!absl::SimpleAtoi(v, &recompute_blocks) || recompute_blocks < 0) {
        return Fail("--recompute-attention-blocks needs an integer >= 0");
      }
    } else if (a == "--attention-checkpoint") {
      attention_checkpoint = v;
    } else if (a == "--fp8-saved") {
      fp8_saved = v == "1";
    } else if (a == "--ne-baseline") {
      ne_baseline = v == "1";
    } else if (a == "--ne-tolerance") {
      if (!absl::SimpleAtod(v, &ne_tolerance) || !(ne_tolerance > 0)) return Fail("--ne-tolerance needs a number > 0");
    } else if (a == "--steps") {
      if (!absl::SimpleAtoi(v, &steps) || steps < 1) return Fail("--steps needs an integer >= 1");
    } else if (a == "--profile-steps") {
      if (!absl::SimpleAtoi(v, &profile_steps) || profile_steps < 0) {
        return Fail("--profile-steps needs an integer >= 0");
      }
    } else if (a == "--search-s") {
      if (!absl::SimpleAtod(v, &search_s)) return Fail("--search-s needs seconds");
    } else if (a == "--probe") {
      if (!absl::SimpleAtoi(v, &probe) || probe < 1) return Fail("--probe needs an integer >= 1");
    } else if (a == "--host-sample-steps") {
      if (!absl::SimpleAtoi(v, &host_sample_steps) || host_sample_steps < 0) {
        return Fail("--host-sample-steps needs an integer >= 0");
      }
    } else if (a == "--host-sample-us") {
      if (!absl::SimpleAtoi(v, &host_sample_us) || host_sample_us < 10) {
        return Fail("--host-sample-us needs an integer >= 10");
      }
    } else if (a == "--host-sample-out") {
      host_sample_out = v;
    } else if (a == "--cuda-graphs") {
      cuda_graphs = v == "1";
    } else if (a == "--start-after") {
      start_after = v;
    } else if (a == "--warmup") {
      if (!absl::SimpleAtoi(v, &warmup) || warmup < 0) return Fail("--warmup needs an integer >= 0");
    } else {
      return Fail("unknown flag " + a);
    }
  }
  if (job.empty() || batches_path.empty()) {
    return Fail("usage: engine_bench --job SPEC.yaml --batches FILE [--json OUT] [--steps N] "
                "[--warmup N] [--precision bf16|fp32] [--fp8 MODULES] [--fp8-attention BLOCKS] [--fp8-wgrad bf16|fp8|hadamard] "
                "[--eval-batches N] [--ne-baseline 1] [--ne-tolerance F] [--recompute-attention-blocks N] "
                "[--cuda-graphs 1] [--host-sample-steps N --host-sample-out FILE [--host-sample-us US]]");
  }
  if (precision != "bf16" && precision != "fp32") return Fail("--precision is bf16 or fp32");
  if (host_sample_steps > 0 && host_sample_out.empty()) return Fail("--host-sample-steps needs --host-sample-out");
  if (fp8_wgrad != "bf16" && fp8_wgrad != "fp8" && fp8_wgrad != "hadamard") {
    return Fail("--fp8-wgrad is bf16, fp8 or hadamard (FP8 after a random Hadamard transform, dy rounded stochastically)");
  }
  if (fp8_attention_bwd != "bf16" && fp8_attention_bwd != "fp8") {
    return Fail("--fp8-attention-bwd is bf16 or fp8");
  }
  if (ne_baseline && ((fp8.empty() && fp8_attention.empty()) || eval_batches == 0)) {
    return Fail("--ne-baseline needs --fp8 or --fp8-attention, and --eval-batches");
  }
  absl::StatusOr<recfleet::v1::JobSpec> spec = recfleet::cli::LoadJobSpec(job);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  recfleet::v1::PrecisionRecipe* recipe = spec->mutable_model()->mutable_precision();
  for (absl::string_view module : absl::StrSplit(fp8, ',', absl::SkipEmpty())) {
    recipe->add_fp8_modules(std::string(module));
  }
  for (absl::string_view block : absl::StrSplit(fp8_attention, ',', absl::SkipEmpty())) {
    recipe->add_fp8_attention(std::string(block));
  }
  if (fp8_attention_bwd == "fp8") {
    recipe->set_attention_backward(recfleet::v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8);
  }
  if (fp8_wgrad == "fp8") recipe->set_weight_gradient(recfleet::v1::PrecisionRecipe::FP8);
  if (fp8_wgrad == "hadamard") recipe->set_weight_gradient(recfleet::v1::PrecisionRecipe::FP8_HADAMARD_STOCHASTIC);
  absl::StatusOr<recfleet::engine::JobModel> model = recfleet::engine::BuildJobModel(*spec);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  // Without --recompute-attention-blocks or --attention-checkpoint: the
  // job's model.activation_memory decides, as a job's worker does.
  std::vector<recfleet::engine::layers::BlockCheckpoint> job_checkpoint;
  if (recompute_blocks < 0 && attention_checkpoint.empty()) {
    std::optional<recfleet::v1::Plan> plan;
    if (model->activation_memory.budget_bytes > 0) {
      absl::StatusOr<recfleet::v1::Plan> p =
          recfleet::coordinator::PlanOneGpu(*spec, recfleet::coordinator::DefaultHardware());
      if (!p.ok()) return Fail(std::string(p.status().message()));
      plan = *std::move(p);
    }
    absl::StatusOr<std::vector<recfleet::engine::layers::BlockCheckpoint>> modes =
        recfleet::engine::AttentionCheckpointModes(*model, plan.has_value() ? &*plan : nullptr);
    if (!modes.ok()) return Fail(std::string(modes.status().message()));
    job_checkpoint = *std::move(modes);
    fp8_saved = fp8_saved || model->activation_memory.fp8_saved;
  }
  recompute_blocks = std::max(recompute_blocks, 0);
  absl::StatusOr<std::vector<recfleet::engine::Batch>> batches =
      recfleet::bench::ReadBatchFile(batches_path);
  if (!batches.ok()) return Fail(std::string(batches.status().message()));
  if (static_cast<int>(batches->size()) <= eval_batches) {
    return Fail("the batch file needs more batches than --eval-batches");
  }
  // Training cycles over the first `train` batches; the rest are for eval.
  const size_t train = batches->size() - eval_batches;

  recfleet::engine::ExecutionOptions exec;
  exec.device = recfleet::Device::kCuda;
  exec.bf16 = precision == "bf16";
  exec.defer_loss_readback = true;
  exec.recompute_attention_blocks = recompute_blocks;
  exec.fp8_saved_activations = fp8_saved;
  exec.attention_checkpoint = job_checkpoint;
  if (!attention_checkpoint.empty()) {
    exec.attention_checkpoint.clear();
    for (absl::string_view name : absl::StrSplit(attention_checkpoint, ',')) {
      absl::StatusOr<recfleet::engine::layers::BlockCheckpoint> mode =
          recfleet::engine::layers::ParseBlockCheckpoint(name);
      if (!mode.ok()) return Fail(std::string(mode.status().message()));
      exec.attention_checkpoint.push_back(*mode);
    }
    if (exec.attention_checkpoint.size() == 1) {
      exec.attention_checkpoint.assign(model->config.seq_layers, exec.attention_checkpoint[0]);
    }
  }
  exec.cuda_graphs = cuda_graphs;
  auto gem = recfleet::engine::GemLite<float>::Create(model->config, model->schema,
                                                      recfleet::engine::TableStorage::kInternal, exec);
  if (!gem.ok()) return Fail(std::string(gem.status().message()));
  recfleet::engine::GemLite<float>& m = **gem;
  // --start-after FILE: the model is built and the batches read (the
  // process's long start: the tables are drawn on the host); wait for FILE
  // before any step, so that several runs' starts overlap another's work.
  if (!start_after.empty()) {
    std::fprintf(stderr, "engine_bench: ready, waiting for %s\n", start_after.c_str());
    while (!std::ifstream(start_after).good()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // --probe K: whether a batch of K file batches concatenated fits: --steps
  // training steps on it (forward, backward, update, a device sync after
  // each), nothing else. Exit 0 and "fits" with the pool's peak, exit 3
  // with the error when it ran out of device memory, exit 1 on another
  // error. One probe per process, so that a failed allocation leaves nothing
  // behind for the next probe.
  if (probe > 0) {
    std::vector<Batch> parts;
    for (int i = 0; i < probe; ++i) parts.push_back((*batches)[i % train]);
    const Batch big = recfleet::engine::ConcatBatches(parts);
    parts.clear();
    absl::Status st;
    for (int s = 0; s < steps && st.ok(); ++s) {
      absl::StatusOr<recfleet::engine::StepResult> r = m.ForwardBackward(big);
      st = r.status();
      if (st.ok()) st = m.ApplyUpdates();
      if (st.ok() && cudaDeviceSynchronize() != cudaSuccess) {
        st = absl::InternalError(cudaGetErrorString(cudaGetLastError()));
      }
    }
    absl::StatusOr<recfleet::engine::DeviceMemoryStats> mem = recfleet::engine::CudaMemoryStats();
    std::printf("probe batch %lld (%d x %lld): %s, peak %.3f GiB, device used %.3f GiB\n",
                static_cast<long long>(big.size), probe,
                static_cast<long long>((*batches)[0].size),
                st.ok() ? "fits" : std::string(st.message()).c_str(),
                mem.ok() ? static_cast<double>(mem->peak) / (1ull << 30) : -1.0,
                static_cast<double>(DeviceUsedBytes()) / (1ull << 30));
    // Only running out of device memory is "does not fit"; any other error
    // fails the probe (exit 1), which stops max_batch.sh.
    const bool oom = absl::IsResourceExhausted(st) || absl::StrContains(st.message(), "out of memory");
    return st.ok() ? 0 : oom ? 3 : 1;
  }

  cudaEvent_t begin, end;
  CUDA_OR_FAIL(cudaEventCreate(&begin));
  CUDA_OR_FAIL(cudaEventCreate(&end));
  const int total = warmup + steps;
  // The timed steps run as training does: no host wait inside or between
  // them. Each step's losses are read one step later (deferred read-back),
  // so the host stays at most a step ahead of the GPU; events at every
  // step boundary give the per-step times after one final sync.
  std::vector<cudaEvent_t> marks(steps + 1);
  for (cudaEvent_t& e : marks) CUDA_OR_FAIL(cudaEventCreate(&e));
  std::vector<double> ms, flops, samples;
  double recomputed_flops = 0;  // Of the last timed step.
  double last_loss = 0;
  recfleet::engine::StepResult pending;
  bool have_pending = false;
  // Where the host's time of a timed step goes (ms, summed over the timed
  // steps): issuing ForwardBackward, Prefetch and ApplyUpdates, and waiting
  // for the previous step's losses. Little wait means the host sets the
  // pace.
  using HostClock = std::chrono::steady_clock;
  std::array<double, 4> host_ms{};
  for (int s = 0; s < total; ++s) {
    if (s == warmup) {
      CUDA_OR_FAIL(cudaDeviceSynchronize());
      if (!recfleet::engine::ResetCudaMemoryPeak().ok()) return Fail("memory peak reset");
      CUDA_OR_FAIL(cudaEventRecord(marks[0], nullptr));
    }
    const recfleet::engine::Batch& b = (*batches)[s % train];
    const auto h0 = HostClock::now();
    absl::StatusOr<recfleet::engine::StepResult> r = m.ForwardBackward(b);
    if (!r.ok()) return Fail(std::string(r.status().message()));
    const auto h1 = HostClock::now();
    if (s + 1 < total) {
      if (absl::Status p = m.Prefetch((*batches)[(s + 1) % train]); !p.ok()) {
        return Fail(std::string(p.message()));
      }
    }
    const auto h2 = HostClock::now();
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) return Fail(std::string(u.message()));
    if (s >= warmup) CUDA_OR_FAIL(cudaEventRecord(marks[s - warmup + 1], nullptr));
    const auto h3 = HostClock::now();
    if (have_pending) {
      if (absl::Status l = m.ReadLosses(&pending); !l.ok()) return Fail(std::string(l.message()));
      last_loss = pending.ctr_loss + pending.cvr_loss;
    }
    if (s >= warmup) {
      host_ms[0] += std::chrono::duration<double, std::milli>(h1 - h0).count();
      host_ms[1] += std::chrono::duration<double, std::milli>(h2 - h1).count();
      host_ms[2] += std::chrono::duration<double, std::milli>(h3 - h2).count();
      host_ms[3] += std::chrono::duration<double, std::milli>(HostClock::now() - h3).count();
    }
    pending = *r;
    have_pending = true;
    if (s >= warmup) {
      flops.push_back(r->flops);
      recomputed_flops = r->recomputed_flops;
      samples.push_back(static_cast<double>(b.size));
    }
  }
  CUDA_OR_FAIL(cudaDeviceSynchronize());
  if (absl::Status l = m.ReadLosses(&pending); !l.ok()) return Fail(std::string(l.message()));
  last_loss = pending.ctr_loss + pending.cvr_loss;
  for (int s = 0; s < steps; ++s) {
    float t = 0;
    CUDA_OR_FAIL(cudaEventElapsedTime(&t, marks[s], marks[s + 1]));
    ms.push_back(t);
  }
  for (cudaEvent_t& e : marks) cudaEventDestroy(e);
  // Eval NE / AUC of the CTR head on the held-out batches, after exactly
  // warmup + steps training steps.
  std::string eval = "null";
  double recipe_ne = 0;
  if (eval_batches > 0) {
    std::vector<double> logits, labels;
    for (size_t i = train; i < batches->size(); ++i) {
      const Batch& b = (*batches)[i];
      absl::StatusOr<std::vector<double>> z = m.Predict(b, recfleet::engine::Head::kCtr);
      if (!z.ok()) return Fail(std::string(z.status().message()));
      logits.insert(logits.end(), z->begin(), z->end());
      labels.insert(labels.end(), b.ctr_labels.begin(), b.ctr_labels.end());
    }
    absl::StatusOr<recfleet::engine::BinaryMetrics> metrics =
        recfleet::engine::ComputeBinaryMetrics(logits, labels);
    if (!metrics.ok()) return Fail(std::string(metrics.status().message()));
    recipe_ne = metrics->normalized_entropy;
    eval = absl::StrFormat("{\"samples\": %lld, \"ctr_ne\": %.6f, \"ctr_auc\": %.6f}",
                           static_cast<long long>(metrics->count), metrics->normalized_entropy,
                           metrics->auc);
  }
  absl::StatusOr<recfleet::engine::DeviceMemoryStats> mem = recfleet::engine::CudaMemoryStats();
  if (!mem.ok()) return Fail(std::string(mem.status().message()));
  const uint64_t device_used = DeviceUsedBytes();
  double total_ms = 0, total_flops = 0, total_samples = 0;
  for (size_t i = 0; i < ms.size(); ++i) {
    total_ms += ms[i];
    total_flops += flops[i];
    total_samples += samples[i];
  }
  // One more step as the timed ones run (the GPU idle and host sample
  // passes below): issue file batch s's forward+backward, prefetch the
  // next, update, then read the previous step's losses; `at` is told each
  // part as it begins, and "end" after the last.
  const auto pipelined_step = [&](int s, const std::function<void(const char*)>& at) -> absl::Status {
    at("forward_backward");
    absl::StatusOr<recfleet::engine::StepResult> r = m.ForwardBackward((*batches)[s % train]);
    if (!r.ok()) return r.status();
    at("prefetch");
    if (absl::Status p = m.Prefetch((*batches)[(s + 1) % train]); !p.ok()) return p;
    at("update");
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) return u;
    at("read_losses");
    if (absl::Status l = m.ReadLosses(&pending); !l.ok()) return l;
    at("end");
    pending = *r;
    return absl::OkStatus();
  };
  // GPU idle: a few more steps back to back (as timed above), every kernel,
  // copy and set recorded by CUPTI; idle = the GPU timeline's span minus
  // the union of those intervals. Measured twice. "gpu_idle_cold": the
  // window opens on an empty queue (the timed steps ended with a device
  // sync) and on a batch not prefetched, so its first step is staged and
  // deduplicated inline and the GPU trails the host's issue through it.
  // "gpu_idle": the window opens as training runs, `warm` pipelined steps
  // in (the queue a step deep, the first recorded step's batch
  // prefetched), so it shows only the gaps of steady training.
  int next_step = total;
  const auto measure_idle = [&](int warm, std::string* result) -> absl::Status {
    const int idle_steps = std::max(profile_steps, 5);
    for (int s = 0; s < warm; ++s) {
      RECFLEET_RETURN_IF_ERROR(pipelined_step(next_step++, [](const char*) {}));
    }
    absl::StatusOr<std::unique_ptr<recfleet::bench::GpuBusyMeter>> meter =
        recfleet::bench::GpuBusyMeter::Start();
    if (!meter.ok()) {
      std::fprintf(stderr, "GPU idle not measured: %s\n", std::string(meter.status().message()).c_str());
      if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device sync");
      return m.ReadLosses(&pending);
    }
    // The host's side of the same steps: issuing a step (forward,
    // backward, prefetch, update) and waiting for the previous step's
    // losses. An issue time near the GPU's step time with no wait means
    // the host, not the GPU, sets the pace (launch-bound: what CUDA
    // graphs would remove); a wait means the queue stayed full.
    double issue_ms = 0, wait_ms = 0;
    using Clock = std::chrono::steady_clock;
    Clock::time_point t0, t1;
    const auto timed = [&](const char* part) {
      const absl::string_view what = part;
      if (what == "forward_backward") t0 = Clock::now();
      if (what == "read_losses") t1 = Clock::now();
      if (what == "end") {
        issue_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
        wait_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
      }
    };
    for (int s = 0; s < idle_steps; ++s) {
      RECFLEET_RETURN_IF_ERROR(pipelined_step(next_step++, timed));
    }
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device sync");
    RECFLEET_RETURN_IF_ERROR(m.ReadLosses(&pending));
    absl::StatusOr<recfleet::bench::GpuBusy> busy = (*meter)->Stop();
    if (!busy.ok()) return busy.status();
    // Per-step milliseconds by record name: where the busy and idle time go.
    auto shares = [&](const std::vector<recfleet::bench::GpuBusy::Share>& v) {
      std::string j = "[";
      for (const auto& e : v) {
        absl::StrAppend(&j, j.size() > 1 ? ", " : "",
                        absl::StrFormat("{\"name\": \"%s\", \"ms_per_step\": %.4f, "
                                        "\"count_per_step\": %.1f}",
                                        e.name, e.ms / idle_steps,
                                        static_cast<double>(e.count) / idle_steps));
      }
      return j + "]";
    };
    *result = absl::StrFormat(
        "{\"steps\": %d, \"warm_steps\": %d, \"window_ms\": %.3f, \"busy_ms\": %.3f, "
        "\"idle_fraction\": %.4f, \"records\": %lld, \"gaps\": %lld, \"gaps_over_50us_ms\": %.3f, "
        "\"host_issue_ms_per_step\": %.3f, \"host_wait_ms_per_step\": %.3f, "
        "\"busy_by_name\": %s, \"idle_before\": %s, \"idle_after\": %s}",
        idle_steps, warm, busy->window_ms, busy->busy_ms, busy->idle_fraction(),
        static_cast<long long>(busy->records), static_cast<long long>(busy->gaps),
        busy->gaps_over_50us_ms, issue_ms / idle_steps, wait_ms / idle_steps,
        shares(busy->busy_by_name), shares(busy->idle_before), shares(busy->idle_after));
    return absl::OkStatus();
  };
  std::string gpu_idle_cold = "null", gpu_idle = "null";
  if (absl::Status st = measure_idle(0, &gpu_idle_cold); !st.ok()) return Fail(std::string(st.message()));
  if (absl::Status st = measure_idle(2, &gpu_idle); !st.ok()) return Fail(std::string(st.message()));

  // Host samples: more steps run as the timed ones (no sync inside or
  // between them), the stepping thread's stack sampled on the wall clock,
  // each sample tagged with the loop part and the phase being issued.
  std::string host_sample = "null";
  if (host_sample_steps > 0) {
    const char* where = "-";
    TagPhaseTimer tags(&where);
    m.SetPhaseTimer(&tags);
    auto tag = [&where](const char* t) {
      where = t;
      recfleet::bench::HostSampler::SetTag(t);
    };
    // The first sampled step's batch prefetched too, like every later one.
    if (absl::Status p = m.Prefetch((*batches)[total % train]); !p.ok()) {
      return Fail(std::string(p.message()));
    }
    CUDA_OR_FAIL(cudaDeviceSynchronize());
    absl::StatusOr<std::unique_ptr<recfleet::bench::HostSampler>> sampler =
        recfleet::bench::HostSampler::Start(host_sample_us);
    if (!sampler.ok()) return Fail(std::string(sampler.status().message()));
    CUDA_OR_FAIL(cudaEventRecord(begin, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    for (int s = 0; s < host_sample_steps; ++s) {
      if (absl::Status st = pipelined_step(total + s, tag); !st.ok()) return Fail(std::string(st.message()));
    }
    CUDA_OR_FAIL(cudaEventRecord(end, nullptr));
    CUDA_OR_FAIL(cudaEventSynchronize(end));
    const double wall_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const int64_t kept = (*sampler)->Stop();
    m.SetPhaseTimer(nullptr);
    if (absl::Status l = m.ReadLosses(&pending); !l.ok()) return Fail(std::string(l.message()));
    float gpu_ms = 0;
    CUDA_OR_FAIL(cudaEventElapsedTime(&gpu_ms, begin, end));
    if (absl::Status w = (*sampler)->Write(host_sample_out); !w.ok()) {
      return Fail(std::string(w.message()));
    }
    host_sample = absl::StrFormat(
        "{\"steps\": %d, \"interval_us\": %d, \"samples\": %lld, \"wall_ms_per_step\": %.3f, "
        "\"gpu_ms_per_step\": %.3f, \"file\": \"%s\"}",
        host_sample_steps, host_sample_us, static_cast<long long>(kept), wall_ms / host_sample_steps,
        gpu_ms / host_sample_steps, host_sample_out);
    std::fprintf(stderr, "host samples: %s\n", host_sample.c_str());
  }

  // Phase split and host issue time on a few more steps.
  EventPhaseTimer timer;
  std::array<double, recfleet::engine::layers::kNumPhases> phase_ms{};
  std::array<double, recfleet::engine::layers::kNumPhases> host_phase_ms{};
  double profiled_ms = 0, host_issue_ms = 0, host_fb_ms = 0;
  if (profile_steps > 0) m.SetPhaseTimer(&timer);
  for (int s = 0; s < profile_steps; ++s) {
    const Batch& b = (*batches)[(total + s) % train];
    CUDA_OR_FAIL(cudaEventRecord(begin, nullptr));
    const auto t0 = std::chrono::steady_clock::now();
    absl::StatusOr<recfleet::engine::StepResult> r = m.ForwardBackward(b);
    if (!r.ok()) return Fail(std::string(r.status().message()));
    const auto t1 = std::chrono::steady_clock::now();
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) return Fail(std::string(u.message()));
    const auto t2 = std::chrono::steady_clock::now();
    CUDA_OR_FAIL(cudaEventRecord(end, nullptr));
    CUDA_OR_FAIL(cudaEventSynchronize(end));
    float t = 0;
    CUDA_OR_FAIL(cudaEventElapsedTime(&t, begin, end));
    profiled_ms += t;
    // ForwardBackward returns after the loss read-back (the GPU is done
    // with it): only the update's issue time can leave the GPU waiting.
    host_issue_ms += std::chrono::duration<double, std::milli>(t2 - t1).count();
    host_fb_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
    const auto p = timer.Collect();
    const auto h = timer.CollectHost();
    for (int k = 0; k < recfleet::engine::layers::kNumPhases; ++k) {
      phase_ms[k] += p[k];
      host_phase_ms[k] += h[k];
    }
  }
  m.SetPhaseTimer(nullptr);
  // Per self-attention block, on one more step: the activations it kept,
  // the memory peak during its backward and its recomputation time. Run
  // after the whole-step peak above was read (it resets the pool's peak).
  std::string regions = "[", memory = "null";
  {
    m.set_report_regions(true);
    absl::StatusOr<recfleet::engine::StepResult> r =
        m.ForwardBackward((*batches)[(total + profile_steps) % train]);
    if (!r.ok()) return Fail(std::string(r.status().message()));
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) return Fail(std::string(u.message()));
    m.set_report_regions(false);
    for (const recfleet::engine::StepResult::Region& g : r->regions) {
      absl::StrAppendFormat(
          &regions,
          "%s{\"region\": \"%s\", \"checkpoint\": \"%s\", \"fp8_saved\": %s, "
          "\"recomputed\": %s, \"kept_bytes\": %lld, \"saved_bytes\": {\"input\": %lld, "
          "\"input_owned\": %s, \"normed\": %lld, \"qkv\": %lld, \"attn_out\": %lld, "
          "\"statistics\": %lld}, \"peak_bytes\": %lld, \"recompute_ms\": %.4f}",
          regions.size() > 1 ? ", " : "", g.name,
          recfleet::engine::layers::BlockCheckpointName(g.checkpoint), g.fp8_saved ? "true" : "false",
          g.recomputed ? "true" : "false", static_cast<long long>(g.kept_bytes),
          static_cast<long long>(g.saved.input), g.saved.input_owned ? "true" : "false",
          static_cast<long long>(g.saved.normed), static_cast<long long>(g.saved.qkv),
          static_cast<long long>(g.saved.attn_out), static_cast<long long>(g.saved.statistics),
          static_cast<long long>(g.peak_bytes), g.recompute_s * 1e3);
    }
    regions += "]";
    if (!r->memory.empty()) {
      const int64_t start = r->memory.front().in_use_bytes;
      int64_t peak = 0;
      std::string at, marks = "[";
      for (const recfleet::engine::StepResult::MemoryMark& k : r->memory) {
        if (k.peak_bytes > peak) {
          peak = k.peak_bytes;
          at = k.name;
        }
        absl::StrAppendFormat(&marks, "%s{\"mark\": \"%s\", \"in_use\": %lld, \"peak\": %lld}",
                              marks.size() > 1 ? ", " : "", k.name,
                              static_cast<long long>(k.in_use_bytes),
                              static_cast<long long>(k.peak_bytes));
      }
      memory = absl::StrFormat(
          "{\"step_start_bytes\": %lld, \"peak_bytes\": %lld, \"peak_at\": \"%s\", "
          "\"activation_peak_bytes\": %lld, \"dense_parameters\": %lld, "
          "\"table_parameters\": %lld, \"marks\": %s]}",
          static_cast<long long>(start), static_cast<long long>(peak), at,
          static_cast<long long>(peak - start), static_cast<long long>(m.num_dense_parameters()),
          static_cast<long long>(m.num_table_parameters()), marks);
    }
  }
  std::string phases = "{}";
  if (profile_steps > 0) {
    const double n = profile_steps;
    const double named = phase_ms[0] + phase_ms[1] + phase_ms[2] + phase_ms[3];
    phases = absl::StrFormat(
        "{\"step_ms\": %.3f, \"embedding_ms\": %.3f, \"attention_ms\": %.3f, \"gemm_ms\": %.3f, "
        "\"optimizer_ms\": %.3f, \"other_and_idle_ms\": %.3f, \"update_issue_ms\": %.3f, "
        "\"host_forward_backward_ms\": %.3f, \"host_embedding_ms\": %.3f, "
        "\"host_attention_ms\": %.3f, \"host_gemm_ms\": %.3f, \"host_optimizer_ms\": %.3f}",
        profiled_ms / n, phase_ms[0] / n, phase_ms[1] / n, phase_ms[2] / n, phase_ms[3] / n,
        (profiled_ms - named) / n, host_issue_ms / n, host_fb_ms / n, host_phase_ms[0] / n,
        host_phase_ms[1] / n, host_phase_ms[2] / n, host_phase_ms[3] / n);
  }

  // The largest batch that fits: k file batches in one step, k doubling
  // until a step fails, then bisected between the last k that fit and the
  // first that did not (PyTorch's search steps finer than doubling too).
  int64_t largest = 0;
  if (search_s > 0) {
    const auto start = std::chrono::steady_clock::now();
    auto fits = [&](size_t k) {
      std::vector<Batch> parts;
      for (size_t i = 0; i < k; ++i) parts.push_back((*batches)[i % train]);
      const Batch big = recfleet::engine::ConcatBatches(parts);
      absl::StatusOr<recfleet::engine::StepResult> r = m.ForwardBackward(big);
      absl::Status st = r.status();
      if (st.ok()) st = m.ApplyUpdates();
      if (st.ok() && cudaDeviceSynchronize() != cudaSuccess) {
        st = absl::InternalError(cudaGetErrorString(cudaGetLastError()));
      }
      std::fprintf(stderr, "batch %lld: %s\n", static_cast<long long>(big.size),
                   st.ok() ? "fits" : std::string(st.message()).c_str());
      if (st.ok()) largest = std::max<int64_t>(largest, big.size);
      return st.ok();
    };
    auto out_of_time = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
             search_s;
    };
    size_t good = 0, bad = 0;
    for (size_t k = 1; k <= 1024 && !out_of_time(); k *= 2) {
      if (!fits(k)) {
        bad = k;
        break;
      }
      good = k;
    }
    while (good > 0 && bad > good + 1 && !out_of_time()) {
      const size_t mid = (good + bad) / 2;
      (fits(mid) ? good : bad) = mid;
    }
  }

  // The same steps without the recipe, for NE side by side (after every
  // measurement above: the second model only adds to the pool).
  std::string ne_gate = "null";
  if (ne_baseline) {
    // The recipe's numbers first: the baseline builds a second model
    // (tables included) and may outlast a caller's time limit.
    std::fprintf(stderr, "recipe %s, attention %s (wgrad %s): %.1f samples/s, eval %s; training the bf16 baseline\n",
                 fp8.c_str(), fp8_attention.c_str(), fp8_wgrad.c_str(), total_samples / (total_ms / 1e3), eval.c_str());
    std::fflush(stderr);
    recfleet::engine::ExecutionOptions plain = exec;
    plain.defer_loss_readback = false;
    const std::vector<Batch> held_out(batches->begin() + train, batches->end());
    absl::StatusOr<double> baseline = recfleet::engine::TrainedEvalNe(
        recfleet::engine::WithoutLowPrecision(model->config), model->schema, plain, total,
        [&](int s) -> absl::StatusOr<const Batch*> { return &(*batches)[s % train]; }, held_out);
    if (!baseline.ok()) return Fail(std::string(baseline.status().message()));
    recfleet::engine::NeComparison c;
    c.recipe_ne = recipe_ne;
    c.baseline_ne = *baseline;
    c.steps = total;
    for (const Batch& b : held_out) c.eval_samples += b.size;
    const absl::Status gate = recfleet::engine::CheckNeGate(c, ne_tolerance);
    std::fprintf(stderr, "%s\n", gate.ok() ? c.Describe().c_str() : std::string(gate.message()).c_str());
    ne_gate = absl::StrFormat(
        "{\"recipe_ctr_ne\": %.6f, \"bf16_ctr_ne\": %.6f, \"relative_increase\": %.6f, \"tolerance\": %g, "
        "\"passed\": %s}",
        c.recipe_ne, c.baseline_ne, c.relative_increase(), ne_tolerance, gate.ok() ? "true" : "false");
  }

  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double seconds = total_ms / 1e3;
  const double achieved = total_flops / seconds;
  const std::string out = absl::StrFormat(
      "{\"engine\": \"recfleet\", \"precision\": \"%s\", \"steps\": %d, \"warmup\": %d, "
      "\"batch_size\": %.0f, \"samples_per_s\": %.1f, \"median_step_ms\": %.3f, "
      "\"mean_step_ms\": %.3f, \"useful_flops_per_step\": %.6g, \"tflops\": %.2f, "
      "\"mfu_989\": %.4f, \"mfu_790\": %.4f, \"peak_memory_bytes\": %llu, "
      "\"reserved_memory_bytes\": %llu, \"device_used_bytes\": %llu, \"last_loss\": %.5f, "
      "\"phases\": %s, \"gpu_idle\": %s, \"gpu_idle_cold\": %s, "
      "\"host_ms_per_step\": {\"forward_backward\": %.3f, \"prefetch\": %.3f, \"update\": %.3f, "
      "\"loss_wait\": %.3f}, "
      "\"largest_batch_fitting\": %lld, \"fp8\": \"%s\", \"fp8_attention\": \"%s\", "
      "\"fp8_attention_bwd\": \"%s\", \"fp8_wgrad\": \"%s\", "
      "\"eval\": %s, "
      "\"ne_gate\": %s, \"recompute_attention_blocks\": %d, \"recomputed_flops_per_step\": %.6g, "
      "\"attention_checkpoint\": \"%s\", \"fp8_saved\": %s, \"regions\": %s, \"memory\": %s, "
      "\"cuda_graphs\": %s, \"cuda_graph_replays\": %lld, \"host_sample\": %s}",
      precision, steps, warmup, total_samples / ms.size(), total_samples / seconds, median,
      total_ms / ms.size(), total_flops / ms.size(), achieved / 1e12, achieved / kPeakBf16,
      achieved / kMeasuredGemm, static_cast<unsigned long long>(mem->peak),
      static_cast<unsigned long long>(mem->reserved), static_cast<unsigned long long>(device_used),
      last_loss, phases, gpu_idle, gpu_idle_cold,
      host_ms[0] / steps, host_ms[1] / steps, host_ms[2] / steps, host_ms[3] / steps,
      static_cast<long long>(largest), fp8, fp8_attention, fp8_attention_bwd, fp8_wgrad, eval, ne_gate,
      recompute_blocks,
      recomputed_flops, attention_checkpoint, fp8_saved ? "true" : "false", regions, memory,
      cuda_graphs ? "true" : "false", static_cast<long long>(m.cuda_graph_replays()), host_sample);
  // GCC does not check absl::StrFormat's arguments at compile time: a
  // mismatch gives an empty string, never a valid result.
  if (out.empty()) return Fail("internal: the result's format does not match its arguments");
  std::printf("%s\n", out.c_str());
  if (!json.empty()) std::ofstream(json) << out << "\n";
  return 0;
}
