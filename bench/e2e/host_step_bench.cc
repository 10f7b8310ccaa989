// Host-only pieces of the CUDA engine's training step, timed on the CPU on
// a job's real batch shape (bench/e2e/config_b.yaml by default):
//
//   host_step_bench --job bench/e2e/config_b.yaml [--batches 8] [--reps 20] [--seed 1]
//
// The CUDA GemLite step (engine/model.cc) runs these per step besides its
// launches; none of them touches a GPU, so their cost is measured here
// without one. Per step, as the engine calls them for the job's model:
//   attention_validate  ValidateAttention of every attention call (forward
//                       and backward of each self-attention block, the
//                       cross-attention and PMA)
//   attention_flops     AttentionForwardFlops of every forward call (the
//                       engine's FLOP counter)
//   plan_key            the tile-plan cache's key of every call (the cache
//                       lookup; kernels/attention/tile_plan.h)
//   plan_build          MakeTilePlan of each distinct key of the step (what
//                       a step with new offsets pays once per key; repeated
//                       batches, as engine_bench cycles them, hit the cache)
//   table_uses          TableUses (the copy of every id that the gradient
//                       deduplication reads, made on the calling thread)
//   deduplicate         DeduplicateTables (on a thread of its own during the
//                       forward when the batch was prefetched)
// Prints one line per piece (microseconds per step: the fastest and the
// median of `reps` passes over the batches) and a JSON line of both.
// Timings only; nothing is asserted.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/e2e/synthetic_batches.h"
#include "cli/flags.h"
#include "cli/jobs/spec_file.h"
#include "engine/batch.h"
#include "engine/layers/embeddings.h"
#include "engine/model_config.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/tile_plan.h"
#include "kernels/tensor.h"

namespace {

using recfleet::DType;
using recfleet::Device;
using recfleet::JaggedView;
using recfleet::MakeView;
using recfleet::TensorView;
namespace attention = recfleet::attention;

int Fail(const std::string& message) {
  std::fprintf(stderr, "host_step_bench: %s\n", message.c_str());
  return 1;
}

// One attention call of the step: its inputs (device views on dummy
// storage: nothing here reads values) and options.
struct Call {
  attention::AttentionInputs in;
  attention::AttentionOptions options;
};

// Everything one batch's step feeds the attention host code.
struct StepInputs {
  std::vector<int64_t> token_offsets, pma_offsets;
  std::vector<Call> calls;     // forward calls, in the model's order
  std::vector<size_t> plans;   // indices into calls of each distinct plan key
};

TensorView Values(int64_t rows, int64_t heads, int64_t head_dim) {
  // A non-null address: the views are validated, never read.
  static char storage;
  return MakeView(&storage, DType::kBFloat16, {rows, heads, head_dim}, Device::kCuda);
}

TensorView HostOffsets(const std::vector<int64_t>& offsets) {
  return MakeView(const_cast<int64_t*>(offsets.data()), DType::kInt64,
                  {static_cast<int64_t>(offsets.size())});
}

std::vector<int64_t> Uniform(int64_t batch, int64_t per_sample) {
  std::vector<int64_t> o(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) o[b] = b * per_sample;
  return o;
}

// The attention calls of engine/model.cc's GemLite for `batch`.
void BuildCalls(const recfleet::engine::JobModel& model, const recfleet::engine::Batch& batch,
                StepInputs& step) {
  const recfleet::engine::GemLiteConfig& c = model.config;
  const int64_t B = batch.size, heads = c.heads, dh = c.dim / c.heads;
  const int64_t F = static_cast<int64_t>(model.schema.id_lists.size()) +
                    (model.schema.num_dense > 0 ? 1 : 0);
  step.token_offsets = Uniform(B, F);
  step.pma_offsets = Uniform(B, c.pma_queries);
  const std::vector<int64_t>& hist = batch.sequence[0].offsets;
  const int64_t L = hist.back();
  auto call = [&](const std::vector<int64_t>& q_off, int64_t q_rows,
                  const attention::AttentionOptions& o) {
    Call k;
    k.in.q = {Values(q_rows, heads, dh), HostOffsets(q_off)};
    k.in.k = {Values(L, heads, dh), HostOffsets(hist)};
    k.in.v = Values(L, heads, dh);
    k.options = o;
    step.calls.push_back(k);
  };
  for (int l = 0; l < c.seq_layers; ++l) call(hist, L, recfleet::engine::SequenceAttentionOptions(c));
  step.plans.push_back(0);
  if (c.cross_attention) {
    step.plans.push_back(step.calls.size());
    call(step.token_offsets, B * F, attention::AttentionOptions());
  }
  if (c.pma_queries > 0) {
    step.plans.push_back(step.calls.size());
    call(step.pma_offsets, B * c.pma_queries, attention::AttentionOptions());
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<recfleet::cli::Flags> flags = recfleet::cli::Flags::Parse(
      std::vector<std::string>(argv + 1, argv + argc), {"job", "batches", "reps", "seed"});
  if (!flags.ok()) return Fail(std::string(flags.status().message()));
  int64_t batches = 8, reps = 20;
  uint64_t seed = 1;
  for (const absl::Status& s :
       {flags->Get("batches", &batches), flags->Get("reps", &reps), flags->Get("seed", &seed)}) {
    if (!s.ok()) return Fail(std::string(s.message()));
  }
  const std::string job = flags->Str("job", "bench/e2e/config_b.yaml");
  if (batches < 1 || reps < 1) return Fail("--batches and --reps must be >= 1");
  absl::StatusOr<recfleet::v1::JobSpec> spec = recfleet::cli::LoadJobSpec(job);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  absl::StatusOr<recfleet::bench::SyntheticBatches> gen =
      recfleet::bench::SyntheticBatches::Create(*spec, seed);
  if (!gen.ok()) return Fail(absl::StrCat(job, ": ", gen.status().message()));
  const recfleet::engine::JobModel& model = gen->model();
  const int64_t batch_size = spec->data().local_batch_size();

  std::vector<recfleet::engine::Batch> all;
  std::vector<StepInputs> steps(batches);
  for (int64_t i = 0; i < batches; ++i) all.push_back(gen->Next(batch_size));
  for (int64_t i = 0; i < batches; ++i) BuildCalls(model, all[i], steps[i]);

  // Microseconds per step of `body(step)`: per rep the mean over the
  // batches; reported as the fastest rep and the median rep (the machine
  // may be shared: the fastest is the least disturbed).
  volatile double sink = 0;
  struct Timing {
    double min_us, median_us;
  };
  auto time = [&](const std::function<double(const StepInputs&, const recfleet::engine::Batch&)>&
                      body) {
    std::vector<double> per_rep;
    for (int64_t r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t i = 0; i < batches; ++i) sink = sink + body(steps[i], all[i]);
      const auto t1 = std::chrono::steady_clock::now();
      per_rep.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() /
                        static_cast<double>(batches));
    }
    std::sort(per_rep.begin(), per_rep.end());
    return Timing{per_rep.front(), per_rep[per_rep.size() / 2]};
  };
  const int64_t heads = model.config.heads, dh = model.config.dim / model.config.heads;
  struct Row {
    const char* name;
    Timing us;
  };
  std::vector<Row> rows;
  // Forward and backward validate every call.
  rows.push_back({"attention_validate", time([](const StepInputs& s, const auto&) {
                    double ok = 0;
                    for (int pass = 0; pass < 2; ++pass) {
                      for (const Call& c : s.calls) {
                        ok += attention::ValidateAttention(c.in, c.options).ok();
                      }
                    }
                    return ok;
                  })});
  rows.push_back({"attention_flops", time([&](const StepInputs& s, const auto&) {
                    double f = 0;
                    for (const Call& c : s.calls) {
                      f += attention::AttentionForwardFlops(c.in.q, c.in.k, heads, dh, c.options);
                    }
                    return f;
                  })});
  rows.push_back({"plan_key", time([](const StepInputs& s, const auto&) {
                    double n = 0;
                    for (int pass = 0; pass < 2; ++pass) {
                      for (const Call& c : s.calls) {
                        const attention::internal::TilePlanKey key(0, c.in, c.options);
                        n += static_cast<double>(key.offsets().size());
                      }
                    }
                    return n;
                  })});
  rows.push_back({"plan_build", time([](const StepInputs& s, const auto&) {
                    double n = 0;
                    for (size_t p : s.plans) {
                      const Call& c = s.calls[p];
                      n += static_cast<double>(
                          attention::internal::MakeTilePlan(c.in, c.options).forward_tiles.size());
                    }
                    return n;
                  })});
  // Into one buffer reused across steps, as the engine does.
  std::vector<std::vector<int64_t>> reused;
  rows.push_back({"table_uses", time([&](const StepInputs&, const recfleet::engine::Batch& b) {
                    recfleet::engine::layers::TableUses(model.schema, b, &reused);
                    return static_cast<double>(reused[0].size());
                  })});
  std::vector<std::vector<std::vector<int64_t>>> uses(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    recfleet::engine::layers::TableUses(model.schema, all[i], &uses[i]);
  }
  std::vector<int64_t> table_rows;
  for (const auto& t : model.schema.tables) table_rows.push_back(t.rows);
  size_t next_uses = 0;
  rows.push_back({"deduplicate", time([&](const StepInputs&, const auto&) {
                    const auto d = recfleet::engine::layers::DeduplicateTables(
                        uses[next_uses++ % uses.size()], table_rows);
                    return static_cast<double>(d[0].unique.size());
                  })});

  int64_t tokens = 0;
  for (const recfleet::engine::Batch& b : all) tokens += b.sequence[0].offsets.back();
  std::printf("%s: %lld batches of %lld samples (history tokens %.0f per batch), %lld reps, "
              "%zu attention forward calls per step\n",
              job.c_str(), static_cast<long long>(batches), static_cast<long long>(batch_size),
              static_cast<double>(tokens) / static_cast<double>(batches),
              static_cast<long long>(reps), steps[0].calls.size());
  std::string json = "{";
  Timing total{0, 0};
  auto print = [&json](const char* name, const Timing& t) {
    std::printf("  %-20s %10.1f us/step fastest rep, %10.1f median rep\n", name, t.min_us,
                t.median_us);
    absl::StrAppend(&json, json.size() > 1 ? ", " : "", "\"", name, "_us\": [", t.min_us, ", ",
                    t.median_us, "]");
  };
  for (const Row& r : rows) {
    print(r.name, r.us);
    total.min_us += r.us.min_us;
    total.median_us += r.us.median_us;
  }
  print("sum", total);
  std::printf("%s}\n", json.c_str());
  return 0;
}
