#include "engine/layers/ops.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/layers/ops_cuda.h"
#include "engine/tensor.h"
#include "kernels/base/cuda_status.h"
#include "kernels/base/formats.h"

namespace recfleet::engine::ops {
namespace {

// The CUDA versions run on the engine's compute stream (engine/tensor.h's
// ComputeStream: the legacy default stream unless a region moved).
void* Stream() { return ComputeStream(); }

// Every operand: on the first one's device and of its dtype; fp32 or fp64
// on the host, fp32 on CUDA.
absl::Status CheckOperands(const char* op, std::initializer_list<std::pair<const char*, const TensorView*>> ts) {
  const DType dtype = ts.begin()->second->dtype;
  const Device device = ts.begin()->second->device;
  for (const auto& [what, t] : ts) {
    if (t->device != device) {
      return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": ", what, " is ",
                                                     t->DebugString(), ", expected device ",
                                                     DeviceName(device)));
    }
    if (t->device == Device::kCuda && t->dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat("ops::", op, ": ", what, " must be fp32 on cuda, got ", t->DebugString()));
    }
    if (t->dtype != DType::kFloat32 && t->dtype != DType::kFloat64) {
      return absl::InvalidArgumentError(
          absl::StrCat("ops::", op, ": ", what, " must be fp32 or fp64, got ", t->DebugString()));
    }
    if (t->dtype != dtype) {
      return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": ", what, " is ",
                                                     t->DebugString(), ", expected dtype ",
                                                     DTypeName(dtype)));
    }
    if (t->data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": ", what, " has no storage"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNumel(const char* op, const char* what, const TensorView& t, int64_t numel) {
  if (t.numel() != numel) {
    return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": ", what, " is ",
                                                   t.DebugString(), ", expected ", numel,
                                                   " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckMatrix(const char* op, const char* what, const TensorView& t, int64_t rows) {
  if (t.rank() != 2 || t.dim(0) != rows) {
    return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": ", what, " is ",
                                                   t.DebugString(), ", expected [", rows,
                                                   ", columns]"));
  }
  return absl::OkStatus();
}

// Offsets live with the values: host offsets are checked in full, device
// offsets (CUDA) for dtype and length only (reading them would synchronize).
absl::Status CheckOffsets(const char* op, const TensorView& offsets, int64_t bags, int64_t ids,
                          Device device) {
  if (offsets.dtype != DType::kInt64 || offsets.device != device ||
      offsets.numel() != bags + 1) {
    return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": offsets is ",
                                                   offsets.DebugString(), ", expected int64[",
                                                   bags + 1, "] on ", DeviceName(device)));
  }
  if (device == Device::kCuda) return absl::OkStatus();
  const int64_t* o = offsets.as<int64_t>();
  for (int64_t b = 0; b < bags; ++b) {
    if (o[b + 1] < o[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("ops::", op, ": offsets decrease at ", b + 1));
    }
  }
  if (o[0] != 0 || (ids >= 0 && o[bags] != ids)) {
    return absl::InvalidArgumentError(absl::StrCat("ops::", op, ": offsets must run from 0 to ",
                                                   ids, ", got ", o[0], "..", o[bags]));
  }
  return absl::OkStatus();
}

absl::Status Cuda(cudaError_t err, const char* op) {
  return CudaStatus(err, absl::StrCat("ops::", op));
}

float* F(const TensorView& t) { return t.as<float>(); }

// Calls f(T{}) with T the C++ type of `dtype` (fp32 or fp64, already checked).
template <typename F>
absl::Status Dispatch(DType dtype, F&& f) {
  if (dtype == DType::kFloat64) {
    f(double{});
  } else {
    f(float{});
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Add(const TensorView& a, const TensorView& b, const TensorView& out) {
  const auto is16 = [](const TensorView& t) { return t.dtype == DType::kBFloat16; };
  if (is16(a) || is16(b) || is16(out)) {
    // The bf16 activation stream of the CUDA engine: each operand fp32 or
    // bf16, summed in fp32.
    for (const auto& [what, t] : {std::pair<const char*, const TensorView*>{"a", &a},
                                  {"b", &b}, {"out", &out}}) {
      if (t->device != Device::kCuda || t->data == nullptr ||
          (t->dtype != DType::kFloat32 && !is16(*t))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "ops::Add: bf16 operands are for CUDA tensors of fp32 or bf16; ", what, " is ",
            t->DebugString()));
      }
    }
    RECFLEET_RETURN_IF_ERROR(CheckNumel("Add", "b", b, a.numel()));
    RECFLEET_RETURN_IF_ERROR(CheckNumel("Add", "out", out, a.numel()));
    return Cuda(ops_cuda::AddMixed(a.data, is16(a), b.data, is16(b), out.data, is16(out),
                                   a.numel(), Stream()),
                "Add");
  }
  RECFLEET_RETURN_IF_ERROR(CheckOperands("Add", {{"a", &a}, {"b", &b}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("Add", "b", b, a.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("Add", "out", out, a.numel()));
  if (a.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(0, F(a), F(b), nullptr, 0, F(out), a.numel(), Stream()), "Add");
  }
  return Dispatch(a.dtype, [&](auto t) {
    using T = decltype(t);
    const T *x = a.as<T>(), *y = b.as<T>();
    T* o = out.as<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] + y[i];
  });
}

absl::Status Mul(const TensorView& a, const TensorView& b, const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("Mul", {{"a", &a}, {"b", &b}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("Mul", "b", b, a.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("Mul", "out", out, a.numel()));
  if (a.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(1, F(a), F(b), nullptr, 0, F(out), a.numel(), Stream()), "Mul");
  }
  return Dispatch(a.dtype, [&](auto t) {
    using T = decltype(t);
    const T *x = a.as<T>(), *y = b.as<T>();
    T* o = out.as<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] * y[i];
  });
}

absl::Status AddMul(const TensorView& a, const TensorView& b, const TensorView& acc) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("AddMul", {{"a", &a}, {"b", &b}, {"acc", &acc}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddMul", "b", b, a.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddMul", "acc", acc, a.numel()));
  if (a.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(2, F(a), F(b), nullptr, 0, F(acc), a.numel(), Stream()),
                "AddMul");
  }
  return Dispatch(a.dtype, [&](auto t) {
    using T = decltype(t);
    const T *x = a.as<T>(), *y = b.as<T>();
    T* o = acc.as<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] += x[i] * y[i];
  });
}

absl::Status MulAdd(const TensorView& a, const TensorView& b, const TensorView& c,
                    const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(
      CheckOperands("MulAdd", {{"a", &a}, {"b", &b}, {"c", &c}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("MulAdd", "b", b, a.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("MulAdd", "c", c, a.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("MulAdd", "out", out, a.numel()));
  if (a.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(3, F(a), F(b), F(c), 0, F(out), a.numel(), Stream()),
                "MulAdd");
  }
  return Dispatch(a.dtype, [&](auto t) {
    using T = decltype(t);
    const T *x = a.as<T>(), *y = b.as<T>(), *z = c.as<T>();
    T* o = out.as<T>();
    for (int64_t i = 0, n = a.numel(); i < n; ++i) o[i] = x[i] * y[i] + z[i];
  });
}

absl::Status Scale(const TensorView& x, double weight) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("Scale", {{"x", &x}}));
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(4, F(x), nullptr, nullptr, static_cast<float>(weight), F(x),
                                      x.numel(), Stream()),
                "Scale");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const T w = static_cast<T>(weight);
    T* v = x.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) v[i] *= w;
  });
}

absl::Status AddScaled(const TensorView& x, double weight, const TensorView& acc) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("AddScaled", {{"x", &x}, {"acc", &acc}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddScaled", "acc", acc, x.numel()));
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(5, F(x), nullptr, nullptr, static_cast<float>(weight),
                                      F(acc), x.numel(), Stream()),
                "AddScaled");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const T w = static_cast<T>(weight);
    const T* v = x.as<T>();
    T* o = acc.as<T>();
    for (int64_t i = 0, n = x.numel(); i < n; ++i) o[i] += w * v[i];
  });
}

absl::Status Copy(const TensorView& src, const TensorView& dst) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("Copy", {{"src", &src}, {"dst", &dst}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("Copy", "dst", dst, src.numel()));
  if (src.device == Device::kCuda) {
    if (src.numel() == 0 || src.data == dst.data) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice,
                                static_cast<cudaStream_t>(Stream())),
                "Copy");
  }
  return Dispatch(src.dtype, [&](auto t) {
    using T = decltype(t);
    std::copy_n(src.as<T>(), src.numel(), dst.as<T>());
  });
}

absl::Status Zero(const TensorView& x) {
  if (x.device == Device::kCuda && x.dtype == DType::kBFloat16) {
    // bf16 activations (engine/layers/attention.h's bf16 flow): zero bits.
    if (x.numel() == 0) return absl::OkStatus();
    return Cuda(cudaMemsetAsync(x.data, 0, x.nbytes(), static_cast<cudaStream_t>(Stream())), "Zero");
  }
  RECFLEET_RETURN_IF_ERROR(CheckOperands("Zero", {{"x", &x}}));
  if (x.device == Device::kCuda) {
    if (x.numel() == 0) return absl::OkStatus();
    return Cuda(cudaMemsetAsync(x.data, 0, x.nbytes(), static_cast<cudaStream_t>(Stream())), "Zero");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    std::fill_n(x.as<T>(), x.numel(), T(0));
  });
}

absl::Status FillMeanWeights(const TensorView& x) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("FillMeanWeights", {{"x", &x}}));
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::Elementwise(6, nullptr, nullptr, nullptr,
                                      1.0f / static_cast<float>(x.numel()), F(x), x.numel(),
                                      Stream()),
                "FillMeanWeights");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    std::fill_n(x.as<T>(), x.numel(), T(1) / static_cast<T>(x.numel()));
  });
}

absl::Status ScatterColumns(const TensorView& src, int64_t col, const TensorView& dst) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("ScatterColumns", {{"src", &src}, {"dst", &dst}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ScatterColumns", "src", src, src.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ScatterColumns", "dst", dst, src.dim(0)));
  const int64_t rows = src.dim(0), w = src.dim(1), W = dst.dim(1);
  if (col < 0 || col + w > W) {
    return absl::InvalidArgumentError(absl::StrCat("ops::ScatterColumns: columns [", col, ", ",
                                                   col + w, ") do not fit dst ", dst.DebugString()));
  }
  if (src.device == Device::kCuda) {
    if (rows * w == 0) return absl::OkStatus();
    return Cuda(cudaMemcpy2DAsync(F(dst) + col, W * sizeof(float), F(src), w * sizeof(float),
                                  w * sizeof(float), rows, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(Stream())),
                "ScatterColumns");
  }
  return Dispatch(src.dtype, [&](auto t) {
    using T = decltype(t);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src.as<T>() + r * w, w, dst.as<T>() + r * W + col);
  });
}

absl::Status GatherColumns(const TensorView& src, int64_t col, const TensorView& dst) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("GatherColumns", {{"src", &src}, {"dst", &dst}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("GatherColumns", "src", src, src.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("GatherColumns", "dst", dst, src.dim(0)));
  const int64_t rows = src.dim(0), W = src.dim(1), w = dst.dim(1);
  if (col < 0 || col + w > W) {
    return absl::InvalidArgumentError(absl::StrCat("ops::GatherColumns: columns [", col, ", ",
                                                   col + w, ") do not fit src ", src.DebugString()));
  }
  if (src.device == Device::kCuda) {
    if (rows * w == 0) return absl::OkStatus();
    return Cuda(cudaMemcpy2DAsync(F(dst), w * sizeof(float), F(src) + col, W * sizeof(float),
                                  w * sizeof(float), rows, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(Stream())),
                "GatherColumns");
  }
  return Dispatch(src.dtype, [&](auto t) {
    using T = decltype(t);
    for (int64_t r = 0; r < rows; ++r) std::copy_n(src.as<T>() + r * W + col, w, dst.as<T>() + r * w);
  });
}

absl::Status RepeatRows(const TensorView& x, int64_t times, const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("RepeatRows", {{"x", &x}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("RepeatRows", "out", out, times * x.numel()));
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::RepeatRows(F(x), x.numel(), times, F(out), Stream()), "RepeatRows");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t n = x.numel();
    for (int64_t s = 0; s < times; ++s) std::copy_n(x.as<T>(), n, out.as<T>() + s * n);
  });
}

absl::Status AccumulateRepeats(const TensorView& dy, const TensorView& dx) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("AccumulateRepeats", {{"dy", &dy}, {"dx", &dx}}));
  const int64_t n = dx.numel();
  if (n == 0 ? dy.numel() != 0 : dy.numel() % n != 0) {
    return absl::InvalidArgumentError(absl::StrCat("ops::AccumulateRepeats: dy ", dy.DebugString(),
                                                   " is not whole repeats of dx ", dx.DebugString()));
  }
  if (dx.device == Device::kCuda) {
    return Cuda(ops_cuda::AccumulateRepeats(F(dy), n, n == 0 ? 0 : dy.numel() / n, F(dx), Stream()),
                "AccumulateRepeats");
  }
  return Dispatch(dx.dtype, [&](auto t) {
    using T = decltype(t);
    const T* g = dy.as<T>();
    T* o = dx.as<T>();
    for (int64_t s = 0, times = n == 0 ? 0 : dy.numel() / n; s < times; ++s) {
      for (int64_t i = 0; i < n; ++i) o[i] += g[s * n + i];
    }
  });
}

absl::Status SoftmaxRows(const TensorView& x, const TensorView& y) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("SoftmaxRows", {{"x", &x}, {"y", &y}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("SoftmaxRows", "x", x, x.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("SoftmaxRows", "y", y, x.numel()));
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::SoftmaxRows(F(x), F(y), x.dim(0), x.dim(1), Stream()), "SoftmaxRows");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t rows = x.dim(0), cols = x.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      const T* g = x.as<T>() + r * cols;
      T* p = y.as<T>() + r * cols;
      const T mx = *std::max_element(g, g + cols);
      T sum = 0;
      for (int64_t e = 0; e < cols; ++e) sum += p[e] = std::exp(g[e] - mx);
      for (int64_t e = 0; e < cols; ++e) p[e] /= sum;
    }
  });
}

absl::Status SoftmaxRowsBackward(const TensorView& y, const TensorView& dy, const TensorView& dx) {
  RECFLEET_RETURN_IF_ERROR(
      CheckOperands("SoftmaxRowsBackward", {{"y", &y}, {"dy", &dy}, {"dx", &dx}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("SoftmaxRowsBackward", "y", y, y.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("SoftmaxRowsBackward", "dy", dy, y.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("SoftmaxRowsBackward", "dx", dx, y.numel()));
  if (y.device == Device::kCuda) {
    return Cuda(ops_cuda::SoftmaxRowsBackward(F(y), F(dy), F(dx), y.dim(0), y.dim(1), Stream()),
                "SoftmaxRowsBackward");
  }
  return Dispatch(y.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t rows = y.dim(0), cols = y.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      const T* p = y.as<T>() + r * cols;
      const T* g = dy.as<T>() + r * cols;
      T* o = dx.as<T>() + r * cols;
      T mean = 0;
      for (int64_t e = 0; e < cols; ++e) mean += p[e] * g[e];
      for (int64_t e = 0; e < cols; ++e) o[e] = p[e] * (g[e] - mean);
    }
  });
}

absl::Status AddGated(const TensorView& gate, int64_t column, const TensorView& x,
                      const TensorView& acc) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("AddGated", {{"gate", &gate}, {"x", &x}, {"acc", &acc}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("AddGated", "gate", gate, gate.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("AddGated", "x", x, gate.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddGated", "acc", acc, x.numel()));
  if (column < 0 || column >= gate.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("ops::AddGated: column ", column,
                                                   " outside gate ", gate.DebugString()));
  }
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::AddGated(F(gate), gate.dim(1), column, F(x), x.dim(0), x.dim(1), F(acc),
                                   Stream()),
                "AddGated");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t rows = x.dim(0), n = x.dim(1), E = gate.dim(1);
    const T *g = gate.as<T>(), *v = x.as<T>();
    T* o = acc.as<T>();
    for (int64_t s = 0; s < rows; ++s) {
      for (int64_t j = 0; j < n; ++j) o[s * n + j] += g[s * E + column] * v[s * n + j];
    }
  });
}

absl::Status AddGatedBackward(const TensorView& gate, int64_t column, const TensorView& x,
                              const TensorView& dacc, const TensorView& dx,
                              const TensorView& dgate) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands(
      "AddGatedBackward",
      {{"gate", &gate}, {"x", &x}, {"dacc", &dacc}, {"dx", &dx}, {"dgate", &dgate}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("AddGatedBackward", "gate", gate, gate.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("AddGatedBackward", "x", x, gate.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddGatedBackward", "dacc", dacc, x.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddGatedBackward", "dx", dx, x.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("AddGatedBackward", "dgate", dgate, gate.numel()));
  if (column < 0 || column >= gate.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("ops::AddGatedBackward: column ", column,
                                                   " outside gate ", gate.DebugString()));
  }
  if (x.device == Device::kCuda) {
    return Cuda(ops_cuda::AddGatedBackward(F(gate), gate.dim(1), column, F(x), F(dacc), x.dim(0),
                                           x.dim(1), F(dx), F(dgate), Stream()),
                "AddGatedBackward");
  }
  return Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t rows = x.dim(0), n = x.dim(1), E = gate.dim(1);
    const T *g = gate.as<T>(), *v = x.as<T>(), *d = dacc.as<T>();
    T *o = dx.as<T>(), *dg = dgate.as<T>();
    for (int64_t s = 0; s < rows; ++s) {
      T dot = 0;
      for (int64_t j = 0; j < n; ++j) {
        o[s * n + j] = g[s * E + column] * d[s * n + j];
        dot += d[s * n + j] * v[s * n + j];
      }
      dg[s * E + column] = dot;
    }
  });
}

absl::Status ScaleBags(const TensorView& sums, const TensorView& offsets, Pooling pooling,
                       const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("ScaleBags", {{"sums", &sums}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ScaleBags", "sums", sums, sums.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("ScaleBags", "out", out, sums.numel()));
  RECFLEET_RETURN_IF_ERROR(CheckOffsets("ScaleBags", offsets, sums.dim(0), -1, sums.device));
  if (sums.device == Device::kCuda) {
    return Cuda(ops_cuda::ScaleBags(F(sums), offsets.as<int64_t>(), sums.dim(0), sums.dim(1),
                                    pooling == Pooling::kMean, F(out), Stream()),
                "ScaleBags");
  }
  return Dispatch(sums.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t bags = sums.dim(0), d = sums.dim(1);
    const int64_t* off = offsets.as<int64_t>();
    for (int64_t s = 0; s < bags; ++s) {
      const int64_t n = off[s + 1] - off[s];
      const T scale = pooling == Pooling::kMean && n > 0 ? T(1) / T(n) : T(1);
      const T* row = sums.as<T>() + s * d;
      T* o = out.as<T>() + s * d;
      for (int64_t c = 0; c < d; ++c) o[c] = row[c] * scale;
    }
  });
}

absl::Status ExpandBags(const TensorView& dpooled, const TensorView& offsets, Pooling pooling,
                        const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("ExpandBags", {{"dpooled", &dpooled}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ExpandBags", "dpooled", dpooled, dpooled.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckOffsets("ExpandBags", offsets, dpooled.dim(0),
                                        out.rank() > 0 ? out.dim(0) : -1, dpooled.device));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ExpandBags", "out", out, out.dim(0)));
  if (out.dim(1) != dpooled.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("ops::ExpandBags: out ", out.DebugString(),
                                                   " must have dpooled's width ", dpooled.dim(1)));
  }
  if (dpooled.device == Device::kCuda) {
    return Cuda(ops_cuda::ExpandBags(F(dpooled), offsets.as<int64_t>(), dpooled.dim(0), out.dim(0),
                                     out.dim(1), pooling == Pooling::kMean, F(out), Stream()),
                "ExpandBags");
  }
  return Dispatch(dpooled.dtype, [&](auto t) {
    using T = decltype(t);
    const int64_t bags = dpooled.dim(0), d = dpooled.dim(1);
    const int64_t* off = offsets.as<int64_t>();
    for (int64_t s = 0; s < bags; ++s) {
      const int64_t n = off[s + 1] - off[s];
      const T scale = pooling == Pooling::kMean && n > 0 ? T(1) / T(n) : T(1);
      const T* g = dpooled.as<T>() + s * d;
      for (int64_t i = off[s]; i < off[s + 1]; ++i) {
        T* o = out.as<T>() + i * d;
        for (int64_t c = 0; c < d; ++c) o[c] = g[c] * scale;
      }
    }
  });
}

absl::Status ScatterAddRows(const TensorView& rows, const TensorView& slots, const TensorView& out) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("ScatterAddRows", {{"rows", &rows}, {"out", &out}}));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ScatterAddRows", "rows", rows, rows.dim(0)));
  RECFLEET_RETURN_IF_ERROR(CheckMatrix("ScatterAddRows", "out", out, out.dim(0)));
  if (slots.dtype != DType::kInt64 || slots.device != rows.device || slots.numel() != rows.dim(0) ||
      out.dim(1) != rows.dim(1)) {
    return absl::InvalidArgumentError(absl::StrCat("ops::ScatterAddRows: slots ", slots.DebugString(),
                                                   " must be int64[", rows.dim(0), "] beside rows ",
                                                   rows.DebugString(), " and out ", out.DebugString()));
  }
  const int64_t n = rows.dim(0), d = rows.dim(1);
  if (rows.device == Device::kCuda) {
    return Cuda(ops_cuda::ScatterAddRows(F(rows), slots.as<int64_t>(), n, d, out.dim(0), F(out),
                                         Stream()),
                "ScatterAddRows");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = slots.as<int64_t>()[i];
    if (s < 0 || s >= out.dim(0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ops::ScatterAddRows: slot ", s, " of row ", i, " outside out ", out.DebugString()));
    }
  }
  return Dispatch(rows.dtype, [&](auto t) {
    using T = decltype(t);
    for (int64_t i = 0; i < n; ++i) {
      const T* r = rows.as<T>() + i * d;
      T* o = out.as<T>() + slots.as<int64_t>()[i] * d;
      for (int64_t c = 0; c < d; ++c) o[c] += r[c];
    }
  });
}

absl::Status Convert(const TensorView& src, const TensorView& dst) {
  const bool down = src.dtype == DType::kFloat32 && dst.dtype == DType::kBFloat16;
  const bool up = src.dtype == DType::kBFloat16 && dst.dtype == DType::kFloat32;
  if ((!down && !up) || src.device != dst.device || src.numel() != dst.numel() ||
      (src.numel() > 0 && (src.data == nullptr || dst.data == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("ops::Convert: src ", src.DebugString(),
                                                   " and dst ", dst.DebugString(),
                                                   " must be fp32 and bf16 of one size and device"));
  }
  if (src.device == Device::kCuda) {
    return down ? Cuda(ops_cuda::ToBf16(F(src), dst.data, src.numel(), Stream()), "Convert")
                : Cuda(ops_cuda::FromBf16(src.data, F(dst), src.numel(), Stream()), "Convert");
  }
  for (int64_t i = 0; i < src.numel(); ++i) {
    if (down) {
      dst.as<uint16_t>()[i] = FloatToBFloat16(src.as<float>()[i]);
    } else {
      dst.as<float>()[i] = BFloat16ToFloat(src.as<uint16_t>()[i]);
    }
  }
  return absl::OkStatus();
}

absl::Status CopyIndices(const TensorView& src, const TensorView& dst) {
  if (src.dtype != DType::kInt64 || dst.dtype != DType::kInt64 || src.device != dst.device ||
      src.numel() != dst.numel() || (src.numel() > 0 && (src.data == nullptr || dst.data == nullptr))) {
    return absl::InvalidArgumentError(absl::StrCat("ops::CopyIndices: src ", src.DebugString(),
                                                   " and dst ", dst.DebugString(),
                                                   " must be int64 of one size and device"));
  }
  if (src.numel() == 0) return absl::OkStatus();
  if (src.device == Device::kCuda) {
    return Cuda(cudaMemcpyAsync(dst.data, src.data, src.nbytes(), cudaMemcpyDeviceToDevice,
                                static_cast<cudaStream_t>(Stream())),
                "CopyIndices");
  }
  std::copy_n(src.as<int64_t>(), src.numel(), dst.as<int64_t>());
  return absl::OkStatus();
}

absl::Status CopyFromHost(absl::Span<const float> src, const TensorView& dst) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("CopyFromHost", {{"dst", &dst}}));
  RECFLEET_RETURN_IF_ERROR(CheckNumel("CopyFromHost", "dst", dst, static_cast<int64_t>(src.size())));
  if (dst.device == Device::kCuda) {
    if (src.empty()) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(dst.data, src.data(), src.size() * sizeof(float),
                                cudaMemcpyHostToDevice, static_cast<cudaStream_t>(Stream())),
                "CopyFromHost");
  }
  return Dispatch(dst.dtype, [&](auto t) {
    using T = decltype(t);
    std::copy(src.begin(), src.end(), dst.as<T>());
  });
}

absl::StatusOr<std::vector<double>> CopyToHost(const TensorView& x) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("CopyToHost", {{"x", &x}}));
  std::vector<double> out(x.numel());
  if (x.device == Device::kCuda) {
    std::vector<float> host(x.numel());
    if (!host.empty()) {
      RECFLEET_RETURN_IF_ERROR(Cuda(cudaMemcpy(host.data(), x.data, x.nbytes(), cudaMemcpyDeviceToHost),
                                    "CopyToHost"));
    }
    std::copy(host.begin(), host.end(), out.begin());
    return out;
  }
  RECFLEET_RETURN_IF_ERROR(Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    std::copy_n(x.as<T>(), x.numel(), out.begin());
  }));
  return out;
}

absl::StatusOr<double> SumToHost(const TensorView& x) {
  RECFLEET_RETURN_IF_ERROR(CheckOperands("SumToHost", {{"x", &x}}));
  double total = 0;
  if (x.device == Device::kCuda) {
    absl::StatusOr<std::vector<double>> v = CopyToHost(x);
    if (!v.ok()) return v.status();
    for (double e : *v) total += e;
    return total;
  }
  RECFLEET_RETURN_IF_ERROR(Dispatch(x.dtype, [&](auto t) {
    using T = decltype(t);
    for (int64_t i = 0; i < x.numel(); ++i) total += x.as<T>()[i];
  }));
  return total;
}

}  // namespace recfleet::engine::ops
