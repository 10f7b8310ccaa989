#ifndef RECFLEET_ENGINE_TESTING_TRAIN_LOOP_H_
#define RECFLEET_ENGINE_TESTING_TRAIN_LOOP_H_

// The training and evaluation loops of the CUDA model's tests and of
// engine/ne_probe (the eval-NE distribution of model_cuda_test's bf16-vs-fp32
// training), in one place so that the probe measures exactly what the test
// trains.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "engine/testing/compare.h"
#include "engine/testing/movielens.h"
#include "engine/testing/synthetic.h"

namespace recfleet::engine {

// The data of model_cuda_test's bf16-vs-fp32 eval-NE test: enough users
// (4,000) that 1,000 steps of 128 stay under one epoch (on a small set the
// runs overfit and the NE measures the noise of memorization).
inline MovieLensCtr EvalNeData() {
  SyntheticOptions s;
  s.num_users = 4000;
  s.num_items = 400;
  CtrOptions o;
  o.max_history = 64;
  return *MovieLensCtr::Create(SyntheticMovieLens(s), o);
}

// Its model: head dim 64 (the bf16 tensor-core attention's size) and a dense
// learning rate of 1e-3. At the default 2e-3 some fp32 trainings diverge
// (training loss in the hundreds or thousands after 600-900 steps, eval NE
// 0.72-1.20; bench/RESULTS.md, "Run 9"), and which ones do changes from run
// to run, so the test compared a diverged fp32 run with bf16 now and then.
inline GemLiteConfig EvalNeConfig(uint64_t seed) {
  GemLiteConfig c = SmallCudaTestConfig();
  c.dim = 128;
  c.heads = 2;
  c.learning_rate = 1e-3;
  c.seed = seed;
  return c;
}

// Batch k of size `size`, cycling through the training samples.
inline Batch CyclicTrainBatch(const MovieLensCtr& data, int64_t k, int64_t size) {
  std::vector<int64_t> idx(size);
  for (int64_t i = 0; i < size; ++i) idx[i] = (k * size + i) % data.num_train();
  return data.MakeBatch(false, idx);
}

// Trains `steps` steps of `batch` samples and returns the CTR loss of each;
// with `prefetch`, batch s + 1 is prefetched before step s runs. The first
// failing call's status otherwise.
inline absl::StatusOr<std::vector<double>> TrainSteps(GemLite<float>& m, const MovieLensCtr& data,
                                                      int steps, int64_t batch, bool prefetch) {
  std::vector<double> losses;
  std::vector<Batch> batches(2);
  batches[0] = CyclicTrainBatch(data, 0, batch);
  for (int s = 0; s < steps; ++s) {
    Batch& now = batches[s % 2];
    if (prefetch && s + 1 < steps) {
      batches[(s + 1) % 2] = CyclicTrainBatch(data, s + 1, batch);
      if (absl::Status p = m.Prefetch(batches[(s + 1) % 2]); !p.ok()) return p;
    }
    absl::StatusOr<StepResult> r = m.ForwardBackward(now);
    if (!r.ok()) return r.status();
    if (absl::Status u = m.ApplyUpdates(); !u.ok()) return u;
    losses.push_back(r->ctr_loss);
    if (!prefetch && s + 1 < steps) batches[(s + 1) % 2] = CyclicTrainBatch(data, s + 1, batch);
  }
  return losses;
}

// CTR metrics of the model's predictions on the whole eval set, in batches
// of 256.
inline absl::StatusOr<BinaryMetrics> EvaluateCtr(GemLite<float>& m, const MovieLensCtr& data) {
  std::vector<double> logits, labels;
  for (int64_t b = 0; b < data.num_eval(); b += 256) {
    std::vector<int64_t> idx;
    for (int64_t i = b; i < std::min<int64_t>(data.num_eval(), b + 256); ++i) idx.push_back(i);
    const Batch batch = data.MakeBatch(true, idx);
    absl::StatusOr<std::vector<double>> p = m.Predict(batch, Head::kCtr);
    if (!p.ok()) return p.status();
    logits.insert(logits.end(), p->begin(), p->end());
    labels.insert(labels.end(), batch.ctr_labels.begin(), batch.ctr_labels.end());
  }
  return ComputeBinaryMetrics(logits, labels);
}

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TESTING_TRAIN_LOOP_H_
