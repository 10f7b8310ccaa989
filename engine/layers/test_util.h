#ifndef RECFLEET_ENGINE_LAYERS_TEST_UTIL_H_
#define RECFLEET_ENGINE_LAYERS_TEST_UTIL_H_

// Helpers for the layer tests: float64 host tensors with random or given
// values, and a central-difference check of analytic gradients.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/layers/layer.h"
#include "engine/layers/parameters.h"
#include "engine/tensor.h"

namespace recfleet::engine::layers {

// A float64 context over `registry` (no FLOP counting).
LayerContext Fp64Context(ParameterRegistry* registry);

// Host fp64 tensors.
Tensor RandomTensor(Shape shape, uint64_t seed, double scale = 1.0);
Tensor TensorOf(Shape shape, const std::vector<double>& values);
std::vector<double> Values(const TensorView& t);

// sum_i a[i] * b[i] of two fp64 views.
double Dot(const TensorView& a, const TensorView& b);

// Checks every element of `analytic` against the central difference of
// `loss` (a function of the current values of `x`) w.r.t. the element of x.
void ExpectGradient(const std::function<double()>& loss, const TensorView& x,
                    const TensorView& analytic, const std::string& what);
// The same for every parameter of `registry` (analytic: Parameter::grad).
void ExpectParameterGradients(const std::function<double()>& loss,
                              const ParameterRegistry& registry);

}  // namespace recfleet::engine::layers

#endif  // RECFLEET_ENGINE_LAYERS_TEST_UTIL_H_
