#include "engine/layers/test_util.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace recfleet::engine::layers {

LayerContext Fp64Context(ParameterRegistry* registry) {
  LayerContext ctx;
  ctx.dtype = DType::kFloat64;
  ctx.parameters = registry;
  return ctx;
}

Tensor RandomTensor(Shape shape, uint64_t seed, double scale) {
  Tensor t = Tensor::HostZeros(DType::kFloat64, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = normal(rng);
  return t;
}

Tensor TensorOf(Shape shape, const std::vector<double>& values) {
  Tensor t = Tensor::HostZeros(DType::kFloat64, std::move(shape));
  EXPECT_EQ(t.numel(), static_cast<int64_t>(values.size()));
  std::copy_n(values.begin(), std::min<size_t>(values.size(), t.numel()), t.data<double>());
  return t;
}

std::vector<double> Values(const TensorView& t) {
  return std::vector<double>(t.as<double>(), t.as<double>() + t.numel());
}

double Dot(const TensorView& a, const TensorView& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double s = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) s += a.as<double>()[i] * b.as<double>()[i];
  return s;
}

void ExpectGradient(const std::function<double()>& loss, const TensorView& x,
                    const TensorView& analytic, const std::string& what) {
  ASSERT_EQ(x.numel(), analytic.numel()) << what;
  const double h = 1e-6;
  for (int64_t i = 0; i < x.numel(); ++i) {
    double* v = x.as<double>() + i;
    const double saved = *v;
    *v = saved + h;
    const double up = loss();
    *v = saved - h;
    const double down = loss();
    *v = saved;
    const double numeric = (up - down) / (2 * h);
    EXPECT_NEAR(analytic.as<double>()[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric)))
        << what << "[" << i << "]";
  }
}

void ExpectParameterGradients(const std::function<double()>& loss,
                              const ParameterRegistry& registry) {
  for (const Parameter* p : registry.all()) {
    ExpectGradient(loss, p->value.view(), p->grad.view(), p->name);
  }
}

}  // namespace recfleet::engine::layers
