#include "engine/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace recfleet::engine {
namespace {

absl::Status CheckLabels(absl::Span<const double> scores, absl::Span<const double> labels,
                         int64_t* positives) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("scores has ", scores.size(),
                                                   " entries but labels has ", labels.size()));
  }
  // A NaN cannot be ranked: it compares unequal to itself, which breaks the
  // sort's ordering and the tie groups (a diverged model's predictions).
  int64_t nans = 0;
  size_t first_nan = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isnan(scores[i]) && nans++ == 0) first_nan = i;
  }
  if (nans > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        nans, " of ", scores.size(), " scores are NaN (the first at index ", first_nan,
        "): the model's predictions diverged"));
  }
  *positives = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != 0.0 && labels[i] != 1.0) {
      return absl::InvalidArgumentError(
          absl::StrCat("labels[", i, "] must be 0 or 1, got ", labels[i]));
    }
    *positives += labels[i] == 1.0;
  }
  if (*positives == 0 || *positives == static_cast<int64_t>(labels.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AUC needs both classes; got ", *positives, " positives of ", labels.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<double> Auc(absl::Span<const double> scores, absl::Span<const double> labels) {
  int64_t positives = 0;
  if (absl::Status s = CheckLabels(scores, labels, &positives); !s.ok()) return s;
  const int64_t n = scores.size();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return scores[a] < scores[b]; });
  // Sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  for (int64_t i = 0; i < n;) {
    int64_t j = i;
    int64_t group_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) group_positives += labels[order[j++]] == 1.0;
    const double mid_rank = 0.5 * static_cast<double>(i + 1 + j);
    positive_rank_sum += mid_rank * static_cast<double>(group_positives);
    i = j;
  }
  const double p = static_cast<double>(positives);
  const double q = static_cast<double>(n - positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * q);
}

double LogLoss(double logit, double label) {
  return std::max(logit, 0.0) - logit * label + std::log1p(std::exp(-std::abs(logit)));
}

absl::StatusOr<BinaryMetrics> ComputeBinaryMetrics(absl::Span<const double> logits,
                                                   absl::Span<const double> labels) {
  BinaryMetrics m;
  absl::StatusOr<double> auc = Auc(logits, labels);
  if (!auc.ok()) return auc.status();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!std::isfinite(logits[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logits[", i, "] is ", logits[i], ": the model's predictions diverged"));
    }
  }
  m.auc = *auc;
  m.count = logits.size();
  double loss = 0, positives = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i], y = labels[i];
    loss += LogLoss(z, y);
    positives += y;
  }
  m.positive_rate = positives / m.count;
  m.log_loss = loss / m.count;
  const double p = m.positive_rate;
  m.normalized_entropy = m.log_loss / (-(p * std::log(p) + (1 - p) * std::log(1 - p)));
  return m;
}

absl::StatusOr<VectorAgreement> CompareVectors(absl::Span<const float> test,
                                               absl::Span<const float> ref) {
  if (test.size() != ref.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CompareVectors: test has ", test.size(),
                                                   " elements, ref ", ref.size()));
  }
  double dot = 0, tt = 0, rr = 0, dd = 0;
  for (size_t i = 0; i < test.size(); ++i) {
    const double t = test[i], r = ref[i];
    dot += t * r;
    tt += t * t;
    rr += r * r;
    dd += (t - r) * (t - r);
  }
  VectorAgreement a;
  a.test_norm = std::sqrt(tt);
  a.ref_norm = std::sqrt(rr);
  if (tt == 0 && rr == 0) return a;
  a.cosine = tt == 0 || rr == 0 ? 0 : dot / (a.test_norm * a.ref_norm);
  a.relative_error = rr == 0 ? std::numeric_limits<double>::infinity() : std::sqrt(dd / rr);
  return a;
}

}  // namespace recfleet::engine
