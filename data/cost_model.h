#ifndef RECFLEET_DATA_COST_MODEL_H_
#define RECFLEET_DATA_COST_MODEL_H_

// The price of a sample of sequence length L, as a weighted sum of the
// terms that dominate a GEM-style step: linear layers and embeddings (L),
// full self-attention (L^2), sliding-window attention (L * min(L, W)),
// block attention with blocks of S tokens (L * min(L, S), i.e. L*64 for
// long sequences with S = 64), and a fixed per-sample part (heads, the
// candidate, id-list features). A base batch's cost is the sum over its
// samples. Weights come from a spec string and can be calibrated from
// measured step times. Plain value type.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recfleet::data {

struct CostModel {
  double linear = 1.0;
  double quadratic = 0.0;
  double windowed = 0.0;
  int64_t window = 1024;
  double block = 0.0;
  int64_t block_size = 64;
  double per_sample = 0.0;

  double SampleCost(int64_t length) const {
    double l = static_cast<double>(length);
    double c = per_sample + linear * l + quadratic * l * l;
    if (windowed != 0) c += windowed * l * static_cast<double>(length < window ? length : window);
    if (block != 0) {
      c += block * l * static_cast<double>(length < block_size ? length : block_size);
    }
    return c;
  }

  // Parses "linear", "quadratic", "windowed", "block" (that term alone with
  // weight 1), or a comma list "linear=1,quadratic=0.002,windowed=0.5,
  // window=512,block=1,block_size=64,per_sample=300" (unset weights 0; every weight finite and >= 0).
  static absl::StatusOr<CostModel> Parse(absl::string_view spec);
  // The comma-list form, which Parse accepts back.
  std::string ToString() const;
};

// One measurement for calibration: the time (seconds) one sample of
// sequence length `length` took, e.g. a timed batch divided by its size.
struct CostMeasurement {
  int64_t length = 0;
  double seconds = 0;
};

// One timed batch for calibration: its samples' lengths and the seconds
// the whole batch took.
struct BatchTime {
  std::vector<int64_t> lengths;
  double seconds = 0;
};

// The model predicting a batch's time as per_sample * samples + linear *
// sum(L) + quadratic * sum(L^2) closest to the measurements in relative
// error (each batch's residual divided by its time, so short batches count
// as much as long ones), with every weight >= 0 (a term whose best weight
// is negative is left out: the non-negative least squares solution, found
// by trying each subset of the three terms). Batches of mixed lengths fit
// the way BBS uses the model (a base batch's cost is the sum over its
// samples). Needs 3 or more distinct lengths among the samples and every
// batch non-empty with seconds > 0. Weights are in seconds.
absl::StatusOr<CostModel> FitCostModelToBatches(const std::vector<BatchTime>& batches);

// The same fit for per-sample measurements (each a batch of one sample).
absl::StatusOr<CostModel> FitCostModel(const std::vector<CostMeasurement>& measurements);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_COST_MODEL_H_
