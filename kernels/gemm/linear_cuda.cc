// CUDA side of linear.h: every GEMM goes through cuBLASLt. FP8 operands are
// quantized by kernels/quant straight into the scale layouts cuBLASLt's
// Hopper block-scaling modes read (VEC128_32F for 1x128 blocks,
// BLK128x128_32F for 128x128 blocks), so no custom GEMM kernel is needed.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/base/cuda_status.h"
#include "kernels/gemm/gemm_kernels.h"
#include "kernels/gemm/linear_internal.h"
#include "kernels/quant/quantize.h"
#include "kernels/quant/quantize_kernels.h"

namespace recfleet::linear_internal {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

absl::Status LtStatus(cublasStatus_t st, absl::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, " failed: ", cublasLtGetStatusName(st),
                                          " (", cublasLtGetStatusString(st), ")"));
}

// One cuBLASLt handle per thread and device (handles are cheap to keep and
// bound to the device current at creation).
absl::Status Handle(cublasLtHandle_t* out) {
  thread_local int device = -1;
  thread_local cublasLtHandle_t handle = nullptr;
  int current = 0;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&current), "cudaGetDevice"));
  if (handle == nullptr || device != current) {
    if (handle != nullptr) cublasLtDestroy(handle);
    handle = nullptr;
    RECFLEET_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&handle), "create"));
    device = current;
  }
  *out = handle;
  return absl::OkStatus();
}

// Stream-ordered temporary device memory.
class StreamBuffer {
 public:
  explicit StreamBuffer(cudaStream_t s) : stream_(s) {}
  ~StreamBuffer() {
    if (ptr_ != nullptr) cudaFreeAsync(ptr_, stream_);
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  absl::Status Allocate(size_t bytes) {
    return CudaStatus(cudaMallocAsync(&ptr_, bytes == 0 ? 1 : bytes, stream_), "cudaMallocAsync");
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

// RAII owners of cuBLASLt descriptors.
struct Desc {
  cublasLtMatmulDesc_t d = nullptr;
  ~Desc() {
    if (d) cublasLtMatmulDescDestroy(d);
  }
};
struct Layout {
  cublasLtMatrixLayout_t l = nullptr;
  ~Layout() {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
};
struct Pref {
  cublasLtMatmulPreference_t p = nullptr;
  ~Pref() {
    if (p) cublasLtMatmulPreferenceDestroy(p);
  }
};

// A column-major operand as cuBLASLt sees it.
struct LtOperand {
  const void* data;
  cudaDataType_t type;
  cublasOperation_t op;
  int64_t rows, cols, ld;  // of the stored column-major matrix
  const float* scale = nullptr;
  cublasLtMatmulMatrixScale_t scale_mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
};

template <typename T>
absl::Status SetAttr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v,
                     absl::string_view what) {
  return LtStatus(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)), what);
}

// Picks the algorithm of one GEMM shape: with `time_candidates`, the
// heuristic's candidates (up to kCandidates, each within the workspace) are
// timed on `stream` writing a scratch output, and the fastest is kept (the
// heuristic ranks them by a model, not by a measurement). Without it, or
// under stream capture (no synchronization allowed), the first answer is
// taken.
absl::Status ChooseAlgo(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                        cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                        cublasLtMatrixLayout_t ld, const void* a, const void* b,
                        cudaDataType_t d_type, int64_t m, int64_t n, cudaStream_t stream,
                        bool time_candidates, cublasLtMatmulAlgo_t* out) {
  constexpr int kCandidates = 8, kReps = 3;
  Pref pref;
  RECFLEET_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref.p), "preference"));
  const size_t ws = kWorkspaceBytes;
  RECFLEET_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws)),
      "workspace preference"));
  cublasLtMatmulHeuristicResult_t found[kCandidates];
  int count = 0;
  RECFLEET_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref.p, kCandidates, found,
                                     &count),
      "heuristic"));
  if (count == 0) {
    return absl::UnimplementedError(
        absl::StrCat("cuBLASLt has no algorithm for this GEMM (m=", m, " n=", n, ")"));
  }
  *out = found[0].algo;
  if (!time_candidates) return absl::OkStatus();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RECFLEET_RETURN_IF_ERROR(
      CudaStatus(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  if (count == 1 || capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
  const size_t d_bytes = static_cast<size_t>(m) * n * (d_type == CUDA_R_32F ? 4 : 2);
  StreamBuffer scratch(stream), workspace(stream);
  RECFLEET_RETURN_IF_ERROR(scratch.Allocate(d_bytes));
  RECFLEET_RETURN_IF_ERROR(workspace.Allocate(kWorkspaceBytes));
  RECFLEET_RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(scratch.get(), 0, d_bytes, stream), "clear scratch"));
  cudaEvent_t start, stop;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return absl::InternalError("cudaEventCreate failed");
  }
  const float alpha = 1.0f, beta = 0.0f;
  float best = -1.0f;
  for (int i = 0; i < count; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS || found[i].workspaceSize > kWorkspaceBytes) {
      continue;
    }
    auto run = [&] {
      return cublasLtMatmul(handle, desc, &alpha, a, la, b, lb, &beta, scratch.get(), ld,
                            scratch.get(), ld, &found[i].algo, workspace.get(), kWorkspaceBytes,
                            stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // warm-up; a failing candidate is skipped
    cudaEventRecord(start, stream);
    bool ok = true;
    for (int r = 0; r < kReps && ok; ++r) ok = run() == CUBLAS_STATUS_SUCCESS;
    cudaEventRecord(stop, stream);
    float ms = 0.0f;
    if (!ok || cudaEventSynchronize(stop) != cudaSuccess ||
        cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
      continue;
    }
    if (best < 0.0f || ms < best) {
      best = ms;
      *out = found[i].algo;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return CudaStatus(cudaGetLastError(), "GEMM algorithm timing");
}

// A GEMM shape's cuBLASLt objects, made once: the descriptor (its pointer
// attributes, which change per call, are set per call), the three layouts
// and the chosen algorithm. Creating and destroying them, and querying the
// heuristic, cost the host several microseconds per GEMM, and a step of a
// hundred GEMMs on small matrices is paced by its host.
struct LtPlan {
  Desc desc;
  Layout la, lb, ld;
  cublasLtMatmulAlgo_t algo;
};

// The workspace of every GEMM on `stream` (and this thread's device): one
// allocation kept for the process, instead of one stream-ordered
// allocation per call. GEMMs on one stream run one after another, so they
// can share it.
absl::Status Workspace(cudaStream_t stream, void** out) {
  int device = 0;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  thread_local absl::flat_hash_map<std::pair<int, cudaStream_t>, void*> workspaces;
  void*& ws = workspaces[{device, stream}];
  if (ws == nullptr) {
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ws, kWorkspaceBytes), "GEMM workspace"));
  }
  *out = ws;
  return absl::OkStatus();
}

// D (column-major [m, n], ld m) = op(A) op(B) (+ D when beta = 1).
// With `bias` (of D's type, length m), the epilogue adds bias[row] to every
// column of D in the same pass; NotFound when cuBLASLt has no such algorithm
// for the shape (the caller then adds the bias itself). `jagged`: a shape
// padded from a jagged one, which takes the heuristic's first choice like
// the jagged shapes themselves (see time_candidates below).
absl::Status LtMatmul(const LtOperand& a, const LtOperand& b, void* d, cudaDataType_t d_type,
                      int64_t m, int64_t n, int64_t k, float beta, cudaStream_t stream,
                      const void* bias = nullptr, bool jagged = false) {
  cublasLtHandle_t handle;
  RECFLEET_RETURN_IF_ERROR(Handle(&handle));
  const std::string key = absl::StrCat(
      m, ",", n, ",", k, ",", a.type, ",", b.type, ",", d_type, ",", a.op, ",", b.op, ",",
      a.rows, ",", a.cols, ",", a.ld, ",", b.rows, ",", b.cols, ",", b.ld, ",",
      a.scale != nullptr ? static_cast<int>(a.scale_mode) : -1, ",",
      a.scale != nullptr ? static_cast<int>(b.scale_mode) : -1, ",", beta != 0.0f, ",",
      bias != nullptr);
  thread_local absl::flat_hash_map<std::string, std::unique_ptr<LtPlan>> plans;
  thread_local int plans_device = -1;
  int device = 0;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  if (device != plans_device) {
    plans.clear();
    plans_device = device;
  }
  auto it = plans.find(key);
  if (it == plans.end()) {
    auto plan = std::make_unique<LtPlan>();
    RECFLEET_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescCreate(&plan->desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
    RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_TRANSA, a.op, "transa"));
    RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_TRANSB, b.op, "transb"));
    if (a.scale != nullptr) {
      RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                       a.scale_mode, "A scale mode"));
      RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                       b.scale_mode, "B scale mode"));
    }
    if (bias != nullptr) {
      RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                       CUBLASLT_EPILOGUE_BIAS, "bias epilogue"));
    }
    RECFLEET_RETURN_IF_ERROR(LtStatus(
        cublasLtMatrixLayoutCreate(&plan->la.l, a.type, a.rows, a.cols, a.ld), "layout A"));
    RECFLEET_RETURN_IF_ERROR(LtStatus(
        cublasLtMatrixLayoutCreate(&plan->lb.l, b.type, b.rows, b.cols, b.ld), "layout B"));
    RECFLEET_RETURN_IF_ERROR(
        LtStatus(cublasLtMatrixLayoutCreate(&plan->ld.l, d_type, m, n, m), "layout D"));
    // The pointers the algorithm choice may run with.
    if (a.scale != nullptr) {
      RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale,
                                       "A scale pointer"));
      RECFLEET_RETURN_IF_ERROR(SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.scale,
                                       "B scale pointer"));
    }
    if (bias != nullptr) {
      RECFLEET_RETURN_IF_ERROR(
          SetAttr(plan->desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias pointer"));
    }
    // Time the candidates only for shapes that recur: every dimension a
    // multiple of 128 (dense towers, experts, FSDP shards, benchmarks).
    // Jagged token counts change with every batch, as M or N of a forward or
    // input gradient and as K of a weight gradient (x^T dy over the tokens),
    // and timing each new one would stall the stream (an event wait) once
    // per such GEMM per step; they take the heuristic's first choice.
    const bool time_candidates = !jagged && m % 128 == 0 && n % 128 == 0 && k % 128 == 0;
    const absl::Status chosen = ChooseAlgo(handle, plan->desc.d, plan->la.l, plan->lb.l,
                                           plan->ld.l, a.data, b.data, d_type, m, n, stream,
                                           time_candidates, &plan->algo);
    if (absl::IsUnimplemented(chosen) && bias != nullptr) {
      return absl::NotFoundError(absl::StrCat(
          "cuBLASLt has no bias-epilogue algorithm for this GEMM (m=", m, " n=", n, " k=", k, ")"));
    }
    RECFLEET_RETURN_IF_ERROR(chosen);
    // Bounded: a long run of jagged shapes must not grow the cache forever.
    if (plans.size() >= 4096) plans.clear();
    it = plans.emplace(key, std::move(plan)).first;
  }
  LtPlan& plan = *it->second;
  if (a.scale != nullptr) {
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(plan.desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale, "A scale pointer"));
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(plan.desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.scale, "B scale pointer"));
  }
  if (bias != nullptr) {
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(plan.desc.d, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, "bias pointer"));
  }
  void* workspace = nullptr;
  RECFLEET_RETURN_IF_ERROR(Workspace(stream, &workspace));
  const float alpha = 1.0f;
  return LtStatus(cublasLtMatmul(handle, plan.desc.d, &alpha, a.data, plan.la.l, b.data,
                                 plan.lb.l, &beta, d, plan.ld.l, d, plan.ld.l, &plan.algo,
                                 workspace, kWorkspaceBytes, stream),
                  "matmul");
}

cudaDataType_t CudaType(DType t) {
  switch (t) {
    case DType::kBFloat16: return CUDA_R_16BF;
    case DType::kFloat8E4M3: return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2: return CUDA_R_8F_E5M2;
    default: return CUDA_R_32F;
  }
}

int ElemCode(DType t) { return t == DType::kBFloat16 ? 1 : 0; }

int64_t RoundUp4(int64_t v) { return (v + 3) / 4 * 4; }

// The logical K-major operand [rows, k] of `op` and how cuBLASLt reads the
// stored matrix: non-transposed storage [rows, k] row-major is column-major
// [k, rows] read with op T; transposed storage [k, rows] is column-major
// [rows, k] read with op N. `as_b` flips the roles (the product's B side
// wants the opposite op).
LtOperand Describe(const void* data, DType dtype, bool transposed, int64_t rows, int64_t k,
                   bool as_b) {
  LtOperand o;
  o.data = data;
  o.type = CudaType(dtype);
  const bool op_t = transposed ? as_b : !as_b;
  o.op = op_t ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (!transposed) {
    o.rows = k, o.cols = rows, o.ld = k;
  } else {
    o.rows = rows, o.cols = k, o.ld = rows;
  }
  return o;
}

// Converts an fp32 operand to bf16 in a temporary (same layout).
absl::Status ToBf16(const TensorView& t, StreamBuffer* tmp, const void** data, DType* dtype,
                    cudaStream_t s) {
  if (t.dtype == DType::kBFloat16) {
    *data = t.data;
    *dtype = DType::kBFloat16;
    return absl::OkStatus();
  }
  RECFLEET_RETURN_IF_ERROR(tmp->Allocate(t.numel() * 2));
  RECFLEET_RETURN_IF_ERROR(CudaStatus(gemm_cuda::CastToBf16(t.as<float>(), tmp->get(), t.numel(), s),
                                      "cast to bf16"));
  *data = tmp->get();
  *dtype = DType::kBFloat16;
  return absl::OkStatus();
}

// Device memory kept by a LinearContext; grows on demand.
class GrowBuffer {
 public:
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // Contents are lost when it grows (cudaFree waits for work using it).
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc"));
    capacity_ = bytes;
    return absl::OkStatus();
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// cuBLASLt's scale layout for a K-major FP8 operand [rows, k].
struct ScaleLayout {
  int64_t stride_row, stride_col, count, used;
};

ScaleLayout LayoutFor(ScaleBlock block, int64_t rows, int64_t k) {
  const int64_t kb = (k + 127) / 128;
  if (block == ScaleBlock::k128x128) {
    // BLK128x128_32F: K blocks contiguous, leading dimension padded to 4.
    const int64_t rb = (rows + 127) / 128;
    return {RoundUp4(kb), 1, RoundUp4(kb) * rb, kb * rb};
  }
  // VEC128_32F: the outer (row) index contiguous, padded to 4.
  return {1, RoundUp4(rows), RoundUp4(rows) * kb, rows * kb};
}

// Where one FP8 operand goes.
struct Fp8Dest {
  uint8_t* q;
  float* scales;
};

quant_cuda::QuantizeTarget TargetFor(const Operand& op, int64_t rows, int64_t k, Fp8Dest d) {
  const ScaleLayout l = LayoutFor(op.block, rows, k);
  quant_cuda::QuantizeTarget t;
  t.q = d.q;
  t.scales = d.scales;
  t.scale_stride_row = l.stride_row;
  t.scale_stride_col = l.stride_col;
  t.stochastic = op.rounding == Rounding::kStochastic;
  t.seed = op.seed;
  return t;
}

// One pass over the stored matrix t [R, C]: the FP8 form of t (as `direct`
// quantizes it) into `d`, and/or of t^T (as `transposed` does) into `dt`.
absl::Status QuantizePass(const TensorView& t, const Operand* direct, Fp8Dest d,
                          const Operand* transposed, Fp8Dest dt, cudaStream_t s,
                          void* bf16_copy = nullptr) {
  const Operand& any = direct != nullptr ? *direct : *transposed;
  const int64_t r = t.dim(0), c = t.dim(1);
  quant_cuda::QuantizeArgs a;
  a.x = t.data;
  a.x_type = ElemCode(t.dtype);
  a.rows = r;
  a.cols = c;
  a.block_rows = any.block == ScaleBlock::k128x128 ? 128 : 1;
  a.block_cols = 128;
  a.format = 1;
  a.bf16_copy = bf16_copy;
  if (direct != nullptr) a.direct = TargetFor(*direct, r, c, d);
  if (transposed != nullptr) {
    a.transposed = TargetFor(*transposed, c, r, dt);
    a.hadamard_transposed = transposed->hadamard;
    a.hadamard_seed = transposed->hadamard_seed;
  }
  // Padding scales (BLK128x128 leading dimension) are never read for real
  // blocks; keep them finite.
  auto clear_padding = [s](const Operand* op, Fp8Dest dest, int64_t rows, int64_t k) {
    if (op == nullptr) return absl::OkStatus();
    const ScaleLayout l = LayoutFor(op->block, rows, k);
    if (l.count == l.used) return absl::OkStatus();
    return CudaStatus(cudaMemsetAsync(dest.scales, 0, l.count * sizeof(float), s), "clear scales");
  };
  RECFLEET_RETURN_IF_ERROR(clear_padding(direct, d, r, c));
  RECFLEET_RETURN_IF_ERROR(clear_padding(transposed, dt, c, r));
  // Where the pass cannot write the bf16 copy, a cast after it does.
  const bool cast_after = bf16_copy != nullptr && !quant_cuda::WritesBf16Copy(a);
  if (cast_after) a.bf16_copy = nullptr;
  RECFLEET_RETURN_IF_ERROR(CudaStatus(quant_cuda::Quantize(a, s), "FP8 operand quantize"));
  if (!cast_after) return absl::OkStatus();
  return CudaStatus(gemm_cuda::CastToBf16(t.as<float>(), bf16_copy, t.numel(), s), "cast to bf16");
}

// Temporary FP8 storage of a K-major operand [rows, k].
struct TempFp8 {
  explicit TempFp8(cudaStream_t s) : q(s), scales(s) {}
  absl::Status Allocate(ScaleBlock block, int64_t rows, int64_t k) {
    RECFLEET_RETURN_IF_ERROR(q.Allocate(rows * k));
    return scales.Allocate(LayoutFor(block, rows, k).count * sizeof(float));
  }
  Fp8Dest dest() const { return {q.get<uint8_t>(), scales.get<float>()}; }
  StreamBuffer q, scales;
};

// A stream-ordered copy of the row-major matrix t [rows, cols] with zero
// rows appended up to `padded_rows`, in `tmp`; *out views it.
absl::Status PadRows(const TensorView& t, int64_t padded_rows, StreamBuffer* tmp, TensorView* out,
                     cudaStream_t s) {
  const size_t row_bytes = t.dim(1) * DTypeSize(t.dtype);
  const size_t stored = t.dim(0) * row_bytes, padded = padded_rows * row_bytes;
  RECFLEET_RETURN_IF_ERROR(tmp->Allocate(padded));
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(tmp->get(), t.data, stored, cudaMemcpyDeviceToDevice, s), "copy rows"));
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(tmp->get<char>() + stored, 0, padded - stored, s), "clear padding rows"));
  *out = MakeView(tmp->get(), t.dtype, {padded_rows, t.dim(1)}, Device::kCuda);
  return absl::OkStatus();
}

LtOperand Fp8Lt(Fp8Dest d, ScaleBlock block, int64_t rows, int64_t k, bool as_b) {
  LtOperand o = Describe(d.q, DType::kFloat8E4M3, false, rows, k, as_b);
  o.scale = d.scales;
  o.scale_mode = block == ScaleBlock::k128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                               : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  return o;
}

}  // namespace

// A cached FP8 operand and what it was made from.
struct Fp8Slot {
  GrowBuffer q, scales;
  bool valid = false;
  const void* src = nullptr;
  int64_t src_rows = 0, src_cols = 0;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;
  bool hadamard = false;
  uint64_t hadamard_seed = 0;

  absl::Status Reserve(ScaleBlock block, int64_t rows, int64_t k) {
    RECFLEET_RETURN_IF_ERROR(q.Reserve(rows * k));
    return scales.Reserve(LayoutFor(block, rows, k).count * sizeof(float));
  }
  Fp8Dest dest() const { return {q.get<uint8_t>(), scales.get<float>()}; }
  void Record(const Operand& op) {
    valid = true;
    src = op.t.data;
    src_rows = op.t.dim(0);
    src_cols = op.t.dim(1);
    rounding = op.rounding;
    seed = op.seed;
    hadamard = op.hadamard;
    hadamard_seed = op.hadamard_seed;
  }
  bool Holds(const Operand& op) const {
    return valid && src == op.t.data && src_rows == op.t.dim(0) && src_cols == op.t.dim(1) &&
           rounding == op.rounding && seed == op.seed && hadamard == op.hadamard &&
           hadamard_seed == op.hadamard_seed;
  }
};

// A bf16 copy of an fp32 activation, written by the FP8 GEMM's quantize
// pass that reads it anyway, for a bf16 wgrad of the same layer; used once.
struct Bf16Slot {
  GrowBuffer data;
  bool valid = false;
  const void* src = nullptr;
  int64_t rows = 0, cols = 0;

  // Reserves room for t's copy and records t as its source.
  absl::Status Take(const TensorView& t) {
    valid = false;
    RECFLEET_RETURN_IF_ERROR(data.Reserve(t.numel() * 2));
    valid = true;
    src = t.data;
    rows = t.dim(0);
    cols = t.dim(1);
    return absl::OkStatus();
  }
  // If it holds t's copy: points *p at it, uses it up and returns true.
  bool Use(const TensorView& t, const void** p, DType* type) {
    if (!valid || t.dtype != DType::kFloat32 || src != t.data || rows != t.dim(0) ||
        cols != t.dim(1)) {
      return false;
    }
    valid = false;
    *p = data.get<void>();
    *type = DType::kBFloat16;
    return true;
  }
};

}  // namespace recfleet::linear_internal

namespace recfleet {

struct LinearContext::State {
  linear_internal::Fp8Slot w, wt;  // FP8 w [N, K] and w^T [K, N]
  linear_internal::Fp8Slot xt, dyt;  // kept for the next wgrad
  linear_internal::Bf16Slot xb, dyb;  // kept for the next bf16 wgrad
};

LinearContext::LinearContext() : state_(new State) {}
LinearContext::~LinearContext() { delete state_; }
void LinearContext::InvalidateWeight() { state_->w.valid = false; }

absl::Status LinearContext::SetWeight(const TensorView& w, const TensorView& codes,
                                      const TensorView& tile_scales, void* stream) {
  using linear_internal::LayoutFor;
  const auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("LinearContext::SetWeight: ", why, " (w ",
                                                   w.DebugString(), ", codes ",
                                                   codes.DebugString(), ", scales ",
                                                   tile_scales.DebugString(), ")"));
  };
  if (w.rank() != 2 || w.device != Device::kCuda) return fail("w must be a CUDA matrix");
  const int64_t n = w.dim(0), k = w.dim(1);
  if (codes.device != Device::kCuda || codes.numel() != n * k || codes.dtype != DType::kFloat8E4M3) {
    return fail("codes must be w's shape in E4M3 on CUDA");
  }
  const int64_t tiles = TileCount(n, k);
  if (tile_scales.device != Device::kCuda || tile_scales.dtype != DType::kFloat32 ||
      tile_scales.numel() != tiles) {
    return fail(absl::StrCat("tile_scales must be ", tiles, " fp32 on CUDA"));
  }
  State& st = *state_;
  st.w.valid = false;
  RECFLEET_RETURN_IF_ERROR(st.w.Reserve(ScaleBlock::k128x128, n, k));
  RECFLEET_RETURN_IF_ERROR(st.wt.Reserve(ScaleBlock::k128x128, k, n));
  const auto s = static_cast<cudaStream_t>(stream);
  const linear_internal::ScaleLayout lw = LayoutFor(ScaleBlock::k128x128, n, k);
  const linear_internal::ScaleLayout lt = LayoutFor(ScaleBlock::k128x128, k, n);
  // Padding scales are never read for real blocks; keep them finite, as
  // the quantize pass does.
  for (const auto& [slot, l] : {std::pair{&st.w, lw}, {&st.wt, lt}}) {
    if (l.count == l.used) continue;
    RECFLEET_RETURN_IF_ERROR(CudaStatus(
        cudaMemsetAsync(slot->scales.get<float>(), 0, l.count * sizeof(float), s), "clear scales"));
  }
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      gemm_cuda::Fp8WeightFromCodes(static_cast<const uint8_t*>(codes.data),
                                    static_cast<const float*>(tile_scales.data), n, k,
                                    st.w.q.get<uint8_t>(), st.w.scales.get<float>(), lw.stride_row,
                                    st.wt.q.get<uint8_t>(), st.wt.scales.get<float>(),
                                    lt.stride_row, stream),
      "FP8 weight from codes"));
  st.w.Record(linear_internal::Operand{w, false, ScaleBlock::k128x128});
  return absl::OkStatus();
}

}  // namespace recfleet

namespace recfleet::linear_internal {

namespace {

// GemmCuda once a Hadamard wgrad's operands are whole 128-row groups;
// `padded`: they were padded from a jagged row count (so the GEMM keeps
// cuBLASLt's first choice of algorithm, as jagged shapes do).
absl::Status RunGemm(GemmRole role, const Operand& a, const Operand& b, GemmPrecision precision,
                     const TensorView& bias, bool accumulate, const TensorView& c,
                     const LinearRecipe& recipe, cudaStream_t s, LinearContext* context,
                     bool padded) {
  const int64_t m = a.transpose ? a.t.dim(1) : a.t.dim(0);
  const int64_t k = a.transpose ? a.t.dim(0) : a.t.dim(1);
  const int64_t n = b.transpose ? b.t.dim(1) : b.t.dim(0);
  // cuBLASLt is column-major: the row-major [m, n] product is the
  // column-major [n, m] product B A^T, so our B is its A and vice versa.
  StreamBuffer tmp_a(s), tmp_b(s);
  TempFp8 fp8_a(s), fp8_b(s);
  LtOperand lt_a, lt_b;
  if (context != nullptr && role == GemmRole::kForward) {
    // A new step (or an eval forward): no bf16 copy of an earlier x or dy
    // may pass for this step's (the pool reuses addresses).
    context->state()->xb.valid = false;
    context->state()->dyb.valid = false;
  }
  if (precision == GemmPrecision::kFp8Block) {
    if (k % 16 != 0 || n % 16 != 0 || m % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 block GEMMs on CUDA need m, n and k divisible by 16, got m=", m, " n=", n, " k=", k));
    }
    LinearContext::State* st = context != nullptr ? context->state() : nullptr;
    // B: the weight (forward, dgrad) or x^T (wgrad).
    if (st != nullptr && role != GemmRole::kWgrad) {
      if (!st->w.Holds(b)) {
        const Operand w_op{b.t, false, ScaleBlock::k128x128};
        const Operand wt_op{b.t, true, ScaleBlock::k128x128};
        const int64_t wr = b.t.dim(0), wc = b.t.dim(1);
        RECFLEET_RETURN_IF_ERROR(st->w.Reserve(ScaleBlock::k128x128, wr, wc));
        RECFLEET_RETURN_IF_ERROR(st->wt.Reserve(ScaleBlock::k128x128, wc, wr));
        RECFLEET_RETURN_IF_ERROR(QuantizePass(b.t, &w_op, st->w.dest(), &wt_op, st->wt.dest(), s));
        st->w.Record(w_op);
      }
      lt_a = Fp8Lt(role == GemmRole::kForward ? st->w.dest() : st->wt.dest(), b.block, n, k, false);
    } else if (st != nullptr && st->xt.Holds(b)) {
      lt_a = Fp8Lt(st->xt.dest(), b.block, n, k, false);
      st->xt.valid = false;
    } else {
      RECFLEET_RETURN_IF_ERROR(fp8_b.Allocate(b.block, n, k));
      RECFLEET_RETURN_IF_ERROR(QuantizePass(b.t, b.transpose ? nullptr : &b, fp8_b.dest(),
                                            b.transpose ? &b : nullptr, fp8_b.dest(), s));
      lt_a = Fp8Lt(fp8_b.dest(), b.block, n, k, false);
    }
    // A: x (forward), dy (dgrad) or dy^T (wgrad).
    if (role == GemmRole::kWgrad && st != nullptr && st->dyt.Holds(a)) {
      lt_b = Fp8Lt(st->dyt.dest(), a.block, m, k, true);
      st->dyt.valid = false;
    } else {
      RECFLEET_RETURN_IF_ERROR(fp8_a.Allocate(a.block, m, k));
      // Not for a Hadamard wgrad over a partial 128-row group: that wgrad
      // pads dy and x itself.
      const bool keep = st != nullptr && role != GemmRole::kWgrad &&
                        recipe.wgrad == GemmPrecision::kFp8Block &&
                        !(recipe.wgrad_hadamard && m % kHadamardRows != 0);
      // A bf16 wgrad reads x and dy in bf16: the pass that quantizes them
      // writes that copy too (one read of the fp32 activation instead of
      // two, and no cast launches).
      const bool keep_bf16 = st != nullptr && role != GemmRole::kWgrad &&
                             recipe.wgrad == GemmPrecision::kBf16 && !a.transpose &&
                             a.t.dtype == DType::kFloat32;
      if (keep_bf16) {
        Bf16Slot& slot = role == GemmRole::kForward ? st->xb : st->dyb;
        RECFLEET_RETURN_IF_ERROR(slot.Take(a.t));
        RECFLEET_RETURN_IF_ERROR(QuantizePass(a.t, &a, fp8_a.dest(), nullptr, fp8_a.dest(), s,
                                              slot.data.get<void>()));
      } else if (keep) {
        // Also the transposed operand of the coming wgrad, in the same pass.
        Fp8Slot& slot = role == GemmRole::kForward ? st->xt : st->dyt;
        const Operand kept = WgradOperand(a.t, role == GemmRole::kDgrad, recipe);
        RECFLEET_RETURN_IF_ERROR(slot.Reserve(kept.block, k, m));
        RECFLEET_RETURN_IF_ERROR(QuantizePass(a.t, &a, fp8_a.dest(), &kept, slot.dest(), s));
        slot.Record(kept);
      } else {
        RECFLEET_RETURN_IF_ERROR(QuantizePass(a.t, a.transpose ? nullptr : &a, fp8_a.dest(),
                                              a.transpose ? &a : nullptr, fp8_a.dest(), s));
      }
      lt_b = Fp8Lt(fp8_a.dest(), a.block, m, k, true);
    }
  } else {
    const void* pa = a.t.data;
    const void* pb = b.t.data;
    DType ta = a.t.dtype, tb = b.t.dtype;
    if (precision == GemmPrecision::kBf16) {
      // A wgrad of an FP8 layer: dy (A) and x (B) as its forward and dgrad
      // left them in bf16, else cast here.
      const bool wgrad = context != nullptr && role == GemmRole::kWgrad;
      if (!(wgrad && context->state()->dyb.Use(a.t, &pa, &ta))) {
        RECFLEET_RETURN_IF_ERROR(ToBf16(a.t, &tmp_a, &pa, &ta, s));
      }
      if (!(wgrad && context->state()->xb.Use(b.t, &pb, &tb))) {
        RECFLEET_RETURN_IF_ERROR(ToBf16(b.t, &tmp_b, &pb, &tb, s));
      }
    } else if (ta != tb || (ta == DType::kFloat32 && c.dtype != DType::kFloat32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "native-precision CUDA GEMMs need operands of one dtype (and an fp32 output for fp32 "
          "operands), got ", DTypeName(ta), " x ", DTypeName(tb), " -> ", DTypeName(c.dtype),
          "; use the bf16 or fp8_block precision"));
    }
    lt_a = Describe(pb, tb, b.transpose, n, k, false);
    lt_b = Describe(pa, ta, a.transpose, m, k, true);
  }
  // The bias rides in the GEMM's epilogue where cuBLASLt offers it (a bias of
  // the output's dtype, an overwritten output): one pass over y fewer.
  if (bias.data != nullptr && !accumulate && bias.dtype == c.dtype &&
      precision != GemmPrecision::kFp8Block) {
    const absl::Status fused =
        LtMatmul(lt_a, lt_b, c.data, CudaType(c.dtype), n, m, k, 0.0f, s, bias.data, padded);
    if (!absl::IsNotFound(fused)) return fused;
  }
  RECFLEET_RETURN_IF_ERROR(LtMatmul(lt_a, lt_b, c.data, CudaType(c.dtype), n, m, k,
                                    accumulate ? 1.0f : 0.0f, s, nullptr, padded));
  if (bias.data == nullptr) return absl::OkStatus();
  return CudaStatus(gemm_cuda::AddBias(c.data, ElemCode(c.dtype), bias.data, ElemCode(bias.dtype), m,
                                       n, s),
                    "bias add");
}

}  // namespace

absl::Status GemmCuda(GemmRole role, const Operand& a, const Operand& b, GemmPrecision precision,
                      const TensorView& bias, bool accumulate, const TensorView& c,
                      const LinearRecipe& recipe, void* stream, LinearContext* context) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t k = a.transpose ? a.t.dim(0) : a.t.dim(1);
  if (precision != GemmPrecision::kFp8Block || role != GemmRole::kWgrad || !a.hadamard ||
      k % kHadamardRows == 0) {
    return RunGemm(role, a, b, precision, bias, accumulate, c, recipe, s, context, false);
  }
  // The quantize kernel transforms whole groups of rows only: the same GEMM
  // on dy and x padded with zero rows (no context: nothing was kept for a
  // partial group, see `keep` in RunGemm).
  StreamBuffer pad_a(s), pad_b(s);
  Operand padded_a = a, padded_b = b;
  RECFLEET_RETURN_IF_ERROR(PadRows(a.t, HadamardPaddedRows(k), &pad_a, &padded_a.t, s));
  RECFLEET_RETURN_IF_ERROR(PadRows(b.t, HadamardPaddedRows(k), &pad_b, &padded_b.t, s));
  return RunGemm(role, padded_a, padded_b, precision, bias, accumulate, c, recipe, s, nullptr, true);
}

absl::Status BiasGradCuda(const TensorView& dy, bool accumulate, const TensorView& dbias,
                          void* stream) {
  return CudaStatus(gemm_cuda::ColumnSums(dy.data, ElemCode(dy.dtype), dy.dim(0), dy.dim(1),
                                          accumulate, dbias.data, ElemCode(dbias.dtype), stream),
                    "bias gradient");
}

}  // namespace recfleet::linear_internal
