#include "kernels/tensor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kBFloat16:
    case DType::kFloat16:
      return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat64: return "fp64";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat16: return "fp16";
    case DType::kFloat8E4M3: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

absl::string_view DeviceName(Device device) {
  return device == Device::kCpu ? "cpu" : "cuda";
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::DebugString() const {
  return absl::StrCat(DTypeName(dtype), "[", absl::StrJoin(shape, ", "), "] on ",
                      DeviceName(device));
}

TensorView MakeView(void* data, DType dtype, Shape shape, Device device) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = device;
  v.shape = std::move(shape);
  return v;
}

int64_t JaggedView::offset(int64_t b) const {
  return offsets.dtype == DType::kInt32 ? offsets.as<const int32_t>()[b]
                                        : offsets.as<const int64_t>()[b];
}

absl::Status CheckDType(const TensorView& t, absl::string_view what,
                        std::initializer_list<DType> allowed) {
  for (DType d : allowed) {
    if (t.dtype == d) return absl::OkStatus();
  }
  std::string names;
  for (DType d : allowed) absl::StrAppend(&names, names.empty() ? "" : " or ", DTypeName(d));
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be ", names, ", got ", t.DebugString()));
}

absl::Status CheckRank(const TensorView& t, absl::string_view what, int64_t rank) {
  if (t.rank() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must have rank ", rank, ", got ", t.DebugString()));
}

absl::Status CheckDim(const TensorView& t, absl::string_view what, int64_t axis,
                      int64_t expected) {
  if (axis < t.rank() && t.dim(axis) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " dimension ", axis, " must be ", expected, ", got ", t.DebugString()));
}

absl::Status CheckDevice(const TensorView& t, absl::string_view what, Device device) {
  if (t.device == device) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " must be on ", DeviceName(device), ", got ", t.DebugString()));
}

absl::Status CheckJagged(const JaggedView& j, absl::string_view what) {
  const std::string off = absl::StrCat(what, ".offsets");
  if (auto s = CheckDType(j.offsets, off, {DType::kInt32, DType::kInt64}); !s.ok()) return s;
  if (auto s = CheckRank(j.offsets, off, 1); !s.ok()) return s;
  if (auto s = CheckDevice(j.offsets, off, Device::kCpu); !s.ok()) return s;
  if (j.offsets.numel() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(off, " must hold batch_size + 1 >= 1 entries, got 0"));
  }
  if (j.values.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ".values must have rank >= 1, got ", j.values.DebugString()));
  }
  if (j.offset(0) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(off, "[0] must be 0, got ", j.offset(0)));
  }
  for (int64_t b = 0; b < j.batch_size(); ++b) {
    if (j.offset(b + 1) < j.offset(b)) {
      return absl::InvalidArgumentError(absl::StrCat(
          off, " must be non-decreasing, but offsets[", b + 1, "] = ", j.offset(b + 1),
          " < offsets[", b, "] = ", j.offset(b)));
    }
  }
  if (j.offset(j.batch_size()) != j.total_length()) {
    return absl::InvalidArgumentError(absl::StrCat(
        off, "[", j.batch_size(), "] must equal ", what, ".values.dim(0) = ",
        j.total_length(), ", got ", j.offset(j.batch_size())));
  }
  return absl::OkStatus();
}

}  // namespace recfleet
