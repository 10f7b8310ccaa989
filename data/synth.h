#ifndef RECFLEET_DATA_SYNTH_H_
#define RECFLEET_DATA_SYNTH_H_

// Synthetic training data with production-like shape: heavy-tailed history
// lengths (log-normal or power law, clipped to [min, max]), item ids with a
// Zipf popularity, and labels drawn from a planted logistic model over the
// sample's features, so a model can learn and its AUC can be compared with
// the best achievable one (the planted model's own AUC on the same labels).
//
// The planted model is stored in the dataset's metadata and recomputed from
// the features, so no "answer" column ever sits next to the features.

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recfleet::data {

struct LengthDistribution {
  enum class Kind { kLogNormal, kPowerLaw, kFixed };
  Kind kind = Kind::kLogNormal;
  double mean = 1000;  // Log-normal: mean before clipping.
  double sigma = 1.2;  // Log-normal: sigma of log L.
  double alpha = 1.5;  // Power law: density ~ L^-(alpha + 1) above min.
  int64_t min = 10;
  int64_t max = 50000;

  // "lognormal:mean=1000,sigma=1.2,min=10,max=50000",
  // "powerlaw:alpha=1.5,min=10,max=50000" or "fixed:100".
  static absl::StatusOr<LengthDistribution> Parse(absl::string_view spec);
  int64_t Sample(std::mt19937_64& rng) const;
};

// Ids 1..n with P(k) proportional to 1 / k^s (inverse-CDF table, 8 bytes
// per id). Thread-compatible; Sample is const.
class ZipfSampler {
 public:
  ZipfSampler(uint64_t n, double s);
  uint64_t Sample(std::mt19937_64& rng) const;

 private:
  std::vector<double> cdf_;
};

struct SynthOptions {
  int64_t samples = 10000;
  LengthDistribution lengths;
  int64_t num_items = 100000;
  int64_t num_users = 10000;
  double zipf = 1.1;
  int dense_features = 4;
  int clusters = 32;           // Item categories; users prefer one.
  double eval_fraction = 0.1;  // Each sample goes to eval with this chance.
  uint64_t seed = 1;
  size_t rows_per_block = 256;
  // Called with the number of samples generated so far, every 1024 samples
  // and once at the end (for a progress display); may be empty.
  std::function<void(int64_t)> progress;
};

// The planted logistic model: logit = bias + sum_j w_j * dense_j
//   + item_weight * effect(item) + affinity_weight * (C * share - 1)
//   + length_weight * log(L / 100),
// where effect(item) in [-1, 1] is a hash of (item, seed) and share is the
// fraction of the history in the candidate's category (item % C).
struct PlantedModel {
  double bias = -0.3;
  std::vector<double> dense_weights;
  double item_weight = 0.8;
  double affinity_weight = 0.6;
  double length_weight = 0.15;
  int clusters = 32;
  uint64_t seed = 1;

  double ItemEffect(int64_t item) const;
  double Logit(const float* dense, int64_t item, const int64_t* history, size_t len) const;
  std::string Serialize() const;
  static absl::StatusOr<PlantedModel> Parse(absl::string_view text);
};

// Writes `dir`/train.rfd and `dir`/eval.rfd (created if needed). Schema:
// sample_id, user_id[user], item_id[item], item_category[item_category],
// dense_0..dense_{d-1}, history_items (jagged)[item], label (0/1).
absl::Status GenerateSynthetic(const SynthOptions& options, const std::string& dir);

// AUC of `scores` against binary `labels` (ties count one half).
double Auc(const std::vector<double>& scores, const std::vector<float>& labels);

// The planted model's AUC on a synthetic dataset file: the best AUC any
// model can expect there. Error if the file has no planted model.
absl::StatusOr<double> PlantedAuc(const std::string& path);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_SYNTH_H_
