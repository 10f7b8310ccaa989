// A C ABI over the embedding, norm, quantization and linear kernels, so the
// benchmark script can drive them from Python (ctypes) on tensors that
// PyTorch allocated, in the same process and on the same stream as the
// PyTorch baselines. Every function returns 0 on success; on failure it
// returns the absl status code and rf_last_error() says why.
//
// dtype arguments are recfleet::DType values; device pointers; `stream` is
// a cudaStream_t (torch.cuda.current_stream().cuda_stream).

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/linear.h"
#include "kernels/norm/norm.h"
#include "kernels/quant/quantize.h"
#include "kernels/quant/quantize_kernels.h"
#include "kernels/tensor.h"

namespace {

thread_local std::string last_error;

int Report(const absl::Status& s) {
  if (s.ok()) return 0;
  last_error = std::string(s.message());
  return static_cast<int>(s.code());
}

recfleet::TensorView Cuda(void* p, int dtype, recfleet::Shape shape) {
  return recfleet::MakeView(p, static_cast<recfleet::DType>(dtype), std::move(shape),
                            recfleet::Device::kCuda);
}

// precisions: forward | dgrad << 4 | wgrad << 8 (recfleet::GemmPrecision
// values); flags: 1 = wgrad Hadamard, 2 = wgrad stochastic rounding.
recfleet::LinearRecipe Recipe(int precisions, int flags, uint64_t seed) {
  recfleet::LinearRecipe r;
  r.forward = static_cast<recfleet::GemmPrecision>(precisions & 15);
  r.dgrad = static_cast<recfleet::GemmPrecision>((precisions >> 4) & 15);
  r.wgrad = static_cast<recfleet::GemmPrecision>((precisions >> 8) & 15);
  r.wgrad_hadamard = (flags & 1) != 0;
  r.wgrad_stochastic = (flags & 2) != 0;
  r.seed = seed;
  return r;
}

}  // namespace

extern "C" {

const char* rf_last_error() { return last_error.c_str(); }

int rf_embedding_bag_forward(void* table, int table_dtype, int64_t rows, int64_t dim, void* ids,
                             int ids_dtype, int64_t num_ids, void* offsets, int offsets_dtype,
                             int64_t bags, int mean, void* out, int out_dtype, void* stream) {
  recfleet::JaggedView j{Cuda(ids, ids_dtype, {num_ids}), Cuda(offsets, offsets_dtype, {bags + 1})};
  return Report(recfleet::EmbeddingBagForward(
      Cuda(table, table_dtype, {rows, dim}), j,
      mean ? recfleet::Pooling::kMean : recfleet::Pooling::kSum,
      Cuda(out, out_dtype, {bags, dim}), stream));
}

int rf_embedding_bag_backward_adagrad(void* grad, int grad_dtype, void* ids, int ids_dtype,
                                      int64_t num_ids, void* offsets, int offsets_dtype,
                                      int64_t bags, int mean, float lr, float eps, void* table,
                                      int table_dtype, int64_t rows, int64_t dim, void* momentum,
                                      void* stream) {
  recfleet::JaggedView j{Cuda(ids, ids_dtype, {num_ids}), Cuda(offsets, offsets_dtype, {bags + 1})};
  return Report(recfleet::EmbeddingBagBackwardAdagrad(
      Cuda(grad, grad_dtype, {bags, dim}), j,
      mean ? recfleet::Pooling::kMean : recfleet::Pooling::kSum, {lr, eps},
      Cuda(table, table_dtype, {rows, dim}),
      Cuda(momentum, static_cast<int>(recfleet::DType::kFloat32), {rows}), stream));
}

// block: 0 = 1x128, 1 = 128x128, 2 = 32x32. scales: fp32 of
// QuantScaleShape(q rows, q cols, block).
int rf_quantize(void* x, int x_dtype, int64_t rows, int64_t cols, int block, int transpose,
                int stochastic, uint64_t seed, void* q, void* scales, void* stream) {
  recfleet::QuantizeConfig cfg;
  cfg.block = static_cast<recfleet::ScaleBlock>(block);
  cfg.rounding = stochastic ? recfleet::Rounding::kStochastic : recfleet::Rounding::kNearest;
  cfg.seed = seed;
  const int64_t qr = transpose ? cols : rows, qc = transpose ? rows : cols;
  return Report(recfleet::Quantize(
      Cuda(x, x_dtype, {rows, cols}), cfg, transpose != 0,
      Cuda(q, static_cast<int>(recfleet::DType::kFloat8E4M3), {qr, qc}),
      Cuda(scales, static_cast<int>(recfleet::DType::kFloat32),
           recfleet::QuantScaleShape(qr, qc, cfg.block)),
      stream));
}

// One pass over bf16/fp32 x [rows, cols] writing quantize(x) to q/scales
// and/or quantize(x^T) to qt/scales_t (null q or qt: not written), fp32
// scales row-major. block as for rf_quantize; stochastic_t and hadamard
// (1x128 only) apply to the transposed output.
int rf_quantize_pass(void* x, int x_dtype, int64_t rows, int64_t cols, int block, void* q,
                     void* scales, void* qt, void* scales_t, int stochastic_t, int hadamard,
                     uint64_t seed, void* stream) {
  const auto b = static_cast<recfleet::ScaleBlock>(block);
  recfleet::quant_cuda::QuantizeArgs a;
  a.x = x;
  a.x_type = x_dtype == static_cast<int>(recfleet::DType::kBFloat16) ? 1 : 0;
  a.rows = rows;
  a.cols = cols;
  a.block_rows = b == recfleet::ScaleBlock::k1x128 ? 1 : (b == recfleet::ScaleBlock::k32x32 ? 32 : 128);
  a.block_cols = b == recfleet::ScaleBlock::k32x32 ? 32 : 128;
  a.pow2 = b == recfleet::ScaleBlock::k32x32;
  a.direct.q = static_cast<uint8_t*>(q);
  a.direct.scales = static_cast<float*>(scales);
  a.direct.scale_stride_row = recfleet::QuantScaleShape(rows, cols, b)[1];
  a.transposed.q = static_cast<uint8_t*>(qt);
  a.transposed.scales = static_cast<float*>(scales_t);
  a.transposed.scale_stride_row = recfleet::QuantScaleShape(cols, rows, b)[1];
  a.transposed.stochastic = stochastic_t != 0;
  a.transposed.seed = seed;
  a.hadamard_transposed = hadamard != 0;
  a.hadamard_seed = seed;
  const cudaError_t err = recfleet::quant_cuda::Quantize(a, stream);
  if (err == cudaSuccess) return 0;
  last_error = cudaGetErrorString(err);
  return static_cast<int>(absl::StatusCode::kInternal);
}

int rf_rmsnorm_forward_fp8(void* x, int x_dtype, int64_t rows, int64_t dim, void* gamma,
                           float eps, void* y, void* y_scales, void* rstd, void* stream) {
  return Report(recfleet::RmsNormForwardFp8(
      Cuda(x, x_dtype, {rows, dim}), Cuda(gamma, static_cast<int>(recfleet::DType::kFloat32), {dim}),
      eps, Cuda(y, static_cast<int>(recfleet::DType::kFloat8E4M3), {rows, dim}),
      Cuda(y_scales, static_cast<int>(recfleet::DType::kFloat32), {rows, (dim + 127) / 128}),
      Cuda(rstd, static_cast<int>(recfleet::DType::kFloat32), {rows}), stream));
}

void* rf_linear_context_new() { return new recfleet::LinearContext(); }
void rf_linear_context_free(void* ctx) { delete static_cast<recfleet::LinearContext*>(ctx); }
void rf_linear_context_invalidate_weight(void* ctx) {
  static_cast<recfleet::LinearContext*>(ctx)->InvalidateWeight();
}

// precisions/flags: see Recipe above. ctx: from rf_linear_context_new, or null.
int rf_linear_forward(void* x, void* w, int dtype, int64_t m, int64_t k, int64_t n, void* y,
                      int precisions, int flags, uint64_t seed, void* ctx, void* stream) {
  return Report(recfleet::LinearForward(Cuda(x, dtype, {m, k}), Cuda(w, dtype, {n, k}),
                                        recfleet::TensorView(), Cuda(y, dtype, {m, n}),
                                        Recipe(precisions, flags, seed), stream,
                                        static_cast<recfleet::LinearContext*>(ctx)));
}

int rf_linear_backward_input(void* dy, void* w, int dtype, int64_t m, int64_t k, int64_t n,
                             void* dx, int precisions, int flags, uint64_t seed, void* ctx,
                             void* stream) {
  return Report(recfleet::LinearBackwardInput(Cuda(dy, dtype, {m, n}), Cuda(w, dtype, {n, k}),
                                              Cuda(dx, dtype, {m, k}),
                                              Recipe(precisions, flags, seed), stream,
                                              static_cast<recfleet::LinearContext*>(ctx)));
}

int rf_linear_backward_weight(void* dy, void* x, int dtype, int64_t m, int64_t k, int64_t n,
                              void* dw, int precisions, int flags, uint64_t seed, void* ctx,
                              void* stream) {
  return Report(recfleet::LinearBackwardWeight(
      Cuda(dy, dtype, {m, n}), Cuda(x, dtype, {m, k}), Cuda(dw, dtype, {n, k}),
      recfleet::TensorView(), false, Recipe(precisions, flags, seed), stream,
      static_cast<recfleet::LinearContext*>(ctx)));
}

}  // extern "C"
