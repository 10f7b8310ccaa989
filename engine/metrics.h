#ifndef RECFLEET_ENGINE_METRICS_H_
#define RECFLEET_ENGINE_METRICS_H_

// Quality metrics of a binary head, computed exactly (no sampling, no
// histogram buckets): mean log loss, normalized entropy and ROC AUC; and how
// closely one vector follows another (a low-precision recipe's gradients
// against the base precision's).

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace recfleet::engine {

struct BinaryMetrics {
  int64_t count = 0;
  double positive_rate = 0;  // Mean label.
  double log_loss = 0;       // Mean binary cross-entropy of sigmoid(logit).
  // log_loss divided by the entropy of a constant predictor at the
  // positive rate: < 1 means better than predicting the base rate.
  double normalized_entropy = 0;
  double auc = 0;
};

// ROC AUC: the probability that a random positive scores above a random
// negative, ties counting one half (the midrank / Mann-Whitney form).
// Labels are 0 or 1. InvalidArgument when sizes differ, a label is not 0/1,
// one class is absent, or a score is NaN (it has no rank).
absl::StatusOr<double> Auc(absl::Span<const double> scores, absl::Span<const double> labels);

// Binary cross-entropy of sigmoid(logit) against a 0/1 label, computed
// without overflow for large |logit|: the per-sample log loss.
double LogLoss(double logit, double label);

// All of the above from logits and 0/1 labels. Same errors as Auc, and
// InvalidArgument for an infinite logit (no finite log loss).
absl::StatusOr<BinaryMetrics> ComputeBinaryMetrics(absl::Span<const double> logits,
                                                   absl::Span<const double> labels);

// How closely `test` follows `ref`, two vectors of one shape (e.g. a weight
// gradient of a low-precision recipe and of the base precision, taken from
// the same parameters and batch). Sums in double.
struct VectorAgreement {
  double cosine = 1;          // 1 when both are zero; 0 when exactly one is.
  double relative_error = 0;  // ||test - ref|| / ||ref||; +inf when only ref is zero.
  double test_norm = 0, ref_norm = 0;
};

// InvalidArgument when the sizes differ.
absl::StatusOr<VectorAgreement> CompareVectors(absl::Span<const float> test,
                                               absl::Span<const float> ref);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_METRICS_H_
