// CUDA side of linear.h: every GEMM goes through cuBLASLt. FP8 operands are
// quantized by kernels/quant straight into the scale layouts cuBLASLt's
// Hopper block-scaling modes read (VEC128_32F for 1x128 blocks,
// BLK128x128_32F for 128x128 blocks), so no custom GEMM kernel is needed.

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/gemm_kernels.h"
#include "kernels/gemm/linear_internal.h"
#include "kernels/quant/checks.h"
#include "kernels/quant/cuda_status.h"
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

// D (column-major [m, n], ld m) = op(A) op(B) (+ D when beta = 1).
absl::Status LtMatmul(const LtOperand& a, const LtOperand& b, void* d, cudaDataType_t d_type,
                      int64_t m, int64_t n, int64_t k, float beta, cudaStream_t stream) {
  cublasLtHandle_t handle;
  RECFLEET_RETURN_IF_ERROR(Handle(&handle));
  Desc desc;
  RECFLEET_RETURN_IF_ERROR(
      LtStatus(cublasLtMatmulDescCreate(&desc.d, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  RECFLEET_RETURN_IF_ERROR(SetAttr(desc.d, CUBLASLT_MATMUL_DESC_TRANSA, a.op, "transa"));
  RECFLEET_RETURN_IF_ERROR(SetAttr(desc.d, CUBLASLT_MATMUL_DESC_TRANSB, b.op, "transb"));
  if (a.scale != nullptr) {
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a.scale_mode, "A scale mode"));
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b.scale_mode, "B scale mode"));
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(desc.d, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a.scale, "A scale pointer"));
    RECFLEET_RETURN_IF_ERROR(
        SetAttr(desc.d, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b.scale, "B scale pointer"));
  }
  Layout la, lb, ld;
  RECFLEET_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&la.l, a.type, a.rows, a.cols, a.ld), "layout A"));
  RECFLEET_RETURN_IF_ERROR(
      LtStatus(cublasLtMatrixLayoutCreate(&lb.l, b.type, b.rows, b.cols, b.ld), "layout B"));
  RECFLEET_RETURN_IF_ERROR(LtStatus(cublasLtMatrixLayoutCreate(&ld.l, d_type, m, n, m), "layout D"));
  StreamBuffer workspace(stream);
  RECFLEET_RETURN_IF_ERROR(workspace.Allocate(kWorkspaceBytes));
  Pref pref;
  RECFLEET_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&pref.p), "preference"));
  const size_t ws = kWorkspaceBytes;
  RECFLEET_RETURN_IF_ERROR(LtStatus(
      cublasLtMatmulPreferenceSetAttribute(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws)),
      "workspace preference"));
  cublasLtMatmulHeuristicResult_t heuristic;
  int found = 0;
  RECFLEET_RETURN_IF_ERROR(LtStatus(cublasLtMatmulAlgoGetHeuristic(handle, desc.d, la.l, lb.l, ld.l,
                                                                   ld.l, pref.p, 1, &heuristic,
                                                                   &found),
                                    "heuristic"));
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "cuBLASLt has no algorithm for this GEMM (m=", m, " n=", n, " k=", k, ")"));
  }
  const float alpha = 1.0f;
  return LtStatus(cublasLtMatmul(handle, desc.d, &alpha, a.data, la.l, b.data, lb.l, &beta, d, ld.l,
                                 d, ld.l, &heuristic.algo, workspace.get(), kWorkspaceBytes,
                                 stream),
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

// Quantizes a K-major FP8 operand [rows, k] (read from its stored form) with
// scales in cuBLASLt's layout for its block kind.
absl::Status QuantizeOperand(const Operand& op, int64_t rows, int64_t k, StreamBuffer* q,
                             StreamBuffer* scales, LtOperand* out, bool as_b, cudaStream_t s) {
  quant_cuda::QuantizeArgs a;
  a.x = op.t.data;
  a.x_type = ElemCode(op.t.dtype);
  a.rows = op.t.dim(0);
  a.cols = op.t.dim(1);
  a.transpose = op.transpose;
  a.format = 1;
  int64_t scale_count;
  if (op.block == ScaleBlock::k128x128) {
    // BLK128x128_32F: K blocks contiguous, leading dimension padded to 4.
    const int64_t kb = RoundUp4((k + 127) / 128);
    a.block_rows = 128;
    a.scale_stride_row = kb;
    a.scale_stride_col = 1;
    scale_count = kb * ((rows + 127) / 128);
  } else {
    // VEC128_32F: the outer (row) index contiguous, padded to 4.
    const int64_t rp = RoundUp4(rows);
    a.block_rows = 1;
    a.scale_stride_row = 1;
    a.scale_stride_col = rp;
    scale_count = rp * ((k + 127) / 128);
  }
  a.block_cols = 128;
  RECFLEET_RETURN_IF_ERROR(q->Allocate(rows * k));
  RECFLEET_RETURN_IF_ERROR(scales->Allocate(scale_count * sizeof(float)));
  // Padding scales are never read for real blocks; keep them finite.
  RECFLEET_RETURN_IF_ERROR(CudaStatus(
      cudaMemsetAsync(scales->get(), 0, scale_count * sizeof(float), s), "clear scales"));
  a.q = q->get<uint8_t>();
  a.scales = scales->get<float>();
  RECFLEET_RETURN_IF_ERROR(CudaStatus(quant_cuda::Quantize(a, s), "FP8 operand quantize"));
  *out = Describe(q->get(), DType::kFloat8E4M3, false, rows, k, as_b);
  out->scale = scales->get<float>();
  out->scale_mode = op.block == ScaleBlock::k128x128 ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                                     : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  return absl::OkStatus();
}

}  // namespace

absl::Status GemmCuda(const Operand& a, const Operand& b, GemmPrecision precision,
                      const TensorView& bias, bool accumulate, const TensorView& c, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int64_t m = a.transpose ? a.t.dim(1) : a.t.dim(0);
  const int64_t k = a.transpose ? a.t.dim(0) : a.t.dim(1);
  const int64_t n = b.transpose ? b.t.dim(1) : b.t.dim(0);
  // cuBLASLt is column-major: the row-major [m, n] product is the
  // column-major [n, m] product B A^T, so our B is its A and vice versa.
  StreamBuffer tmp_a(s), tmp_b(s), scale_a(s), scale_b(s);
  LtOperand lt_a, lt_b;
  if (precision == GemmPrecision::kFp8Block) {
    if (k % 16 != 0 || n % 16 != 0 || m % 16 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FP8 block GEMMs on CUDA need m, n and k divisible by 16, got m=", m, " n=", n, " k=", k));
    }
    RECFLEET_RETURN_IF_ERROR(QuantizeOperand(b, n, k, &tmp_b, &scale_b, &lt_a, false, s));
    RECFLEET_RETURN_IF_ERROR(QuantizeOperand(a, m, k, &tmp_a, &scale_a, &lt_b, true, s));
  } else {
    const void* pa = a.t.data;
    const void* pb = b.t.data;
    DType ta = a.t.dtype, tb = b.t.dtype;
    if (precision == GemmPrecision::kBf16) {
      RECFLEET_RETURN_IF_ERROR(ToBf16(a.t, &tmp_a, &pa, &ta, s));
      RECFLEET_RETURN_IF_ERROR(ToBf16(b.t, &tmp_b, &pb, &tb, s));
    } else if (ta != tb || (ta == DType::kFloat32 && c.dtype != DType::kFloat32)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "native-precision CUDA GEMMs need operands of one dtype (and an fp32 output for fp32 "
          "operands), got ", DTypeName(ta), " x ", DTypeName(tb), " -> ", DTypeName(c.dtype),
          "; use the bf16 or fp8_block precision"));
    }
    lt_a = Describe(pb, tb, b.transpose, n, k, false);
    lt_b = Describe(pa, ta, a.transpose, m, k, true);
  }
  RECFLEET_RETURN_IF_ERROR(
      LtMatmul(lt_a, lt_b, c.data, CudaType(c.dtype), n, m, k, accumulate ? 1.0f : 0.0f, s));
  if (bias.data == nullptr) return absl::OkStatus();
  return CudaStatus(gemm_cuda::AddBias(c.data, ElemCode(c.dtype), bias.data, ElemCode(bias.dtype), m,
                                       n, stream),
                    "bias add");
}

absl::Status BiasGradCuda(const TensorView& dy, bool accumulate, const TensorView& dbias,
                          void* stream) {
  return CudaStatus(gemm_cuda::ColumnSums(dy.data, ElemCode(dy.dtype), dy.dim(0), dy.dim(1),
                                          accumulate, dbias.data, ElemCode(dbias.dtype), stream),
                    "bias gradient");
}

}  // namespace recfleet::linear_internal
