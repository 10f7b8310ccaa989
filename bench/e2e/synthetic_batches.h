#ifndef RECFLEET_BENCH_E2E_SYNTHETIC_BATCHES_H_
#define RECFLEET_BENCH_E2E_SYNTHETIC_BATCHES_H_

// Engine batches (engine/batch.h) of a job's data shape, drawn without a
// dataset, and the model description the PyTorch twin of GEM-lite reads
// (model.json). Both come from the one JobSpec -> model mapping
// (engine/job_model.h), so the engine benchmark and bench/e2e/gemlite_torch.py
// build the same network over the same samples.
//
// What a batch holds, per sample:
//   history length   from the `lengths` of the spec's synthetic:// data.dataset
//                    (data/synth.h syntax, e.g. powerlaw:alpha=0.5,min=256,
//                    max=4096), capped at the sequence features' max_length;
//                    every sequence field gets that many ids
//   ids              Zipf(`zipf` of the same URI) over each table's rows, the
//                    most popular ids first (row 0 the most popular)
//   id lists         CANDIDATE features one id; ID_LIST features 1 to
//                    kMaxIdListLength ids (uniform)
//   dense            N(0, 1), num_dense values
//   labels           CTR ~ Bernoulli(sigmoid(dense[0] - 1.5)) when the spec
//                    has a CTR head; CVR = CTR * Bernoulli(0.3) when it has a
//                    CVR head (so a model has something to learn)
// Deterministic: the same spec and seed give the same batches.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/synth.h"
#include "engine/batch.h"
#include "engine/job_model.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::bench {

inline constexpr int kMaxIdListLength = 8;

class SyntheticBatches {
 public:
  // InvalidArgument when the spec is not buildable (BuildJobModel's
  // message) or its data.dataset is not a synthetic:// URI.
  static absl::StatusOr<SyntheticBatches> Create(const v1::JobSpec& spec, uint64_t seed);

  // The next batch of `size` samples.
  engine::Batch Next(int64_t size);

  const engine::JobModel& model() const { return model_; }
  // After the cap: what history lengths are drawn from.
  const data::LengthDistribution& lengths() const { return lengths_; }

 private:
  SyntheticBatches() = default;
  int64_t Id(int table);

  engine::JobModel model_;
  data::LengthDistribution lengths_;
  std::vector<bool> single_id_;  // Per schema id-list feature: a CANDIDATE.
  std::vector<std::shared_ptr<const data::ZipfSampler>> tables_;
  std::mt19937_64 rng_;
};

// The model as JSON: every GemLiteConfig field (enums by the names
// engine/model_config.h parses), the feature schema, the history cap, which
// heads have labels, and the numeric constants of the engine's layers
// (norm and optimizer epsilons, Adam betas, attention block size, RoPE
// theta), so the PyTorch side needs no JobSpec mapping of its own.
std::string ModelJson(const engine::JobModel& model);

// Names of the enums as ParseMask / ParseAttentionActivation accept them.
const char* MaskName(attention::Mask mask);
const char* AttentionActivationName(attention::Activation activation);

}  // namespace recfleet::bench

#endif  // RECFLEET_BENCH_E2E_SYNTHETIC_BATCHES_H_
