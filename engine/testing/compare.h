#ifndef RECFLEET_ENGINE_TESTING_COMPARE_H_
#define RECFLEET_ENGINE_TESTING_COMPARE_H_

// Comparisons the distributed-training tests make between a model trained
// on several ranks and the same model trained on one.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"

namespace recfleet {
namespace engine {

// max |a - b| / max |b| over n elements (0 when both are all zero): one
// element far off fails it even when the rest agree.
inline double MaxRelativeError(const float* a, const float* b, int64_t n) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    norm = std::max(norm, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(norm, 1e-30);
}

// The model's dense parameters, flat, in DenseParameterNames order.
inline std::vector<float> FlatDenseParameters(GemLite<float>& model) {
  std::vector<float> dense;
  for (const std::string& name : model.DenseParameterNames()) {
    const TensorView v = model.DenseParameter(name);
    dense.insert(dense.end(), v.as<float>(), v.as<float>() + v.numel());
  }
  return dense;
}

}  // namespace engine
}  // namespace recfleet

#endif  // RECFLEET_ENGINE_TESTING_COMPARE_H_
