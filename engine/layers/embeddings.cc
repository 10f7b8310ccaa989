#include "engine/layers/embeddings.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <future>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/base/cuda_status.h"
#include "engine/layers/ops.h"
#include "kernels/embedding/embedding.h"
#include "common/status_macros.h"

namespace recfleet::engine {
namespace layers {
namespace {

// Every table's row count, the bound DeduplicateTables uses.
std::vector<int64_t> RowCounts(const FeatureSchema& schema) {
  std::vector<int64_t> rows;
  for (const FeatureSchema::Table& t : schema.tables) rows.push_back(t.rows);
  return rows;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::StatusOr<Tensor> HostTensor(DType dtype, Shape shape) { return Tensor::Empty(dtype, std::move(shape)); }

// a followed by b (equal trailing dimensions, host memory).
absl::StatusOr<Tensor> Concat(const Tensor& a, const Tensor& b) {
  Shape shape = a.shape();
  shape[0] += b.dim(0);
  absl::StatusOr<Tensor> out = HostTensor(a.dtype(), shape);
  if (!out.ok()) return out.status();
  std::copy_n(static_cast<const char*>(a.view().data), a.nbytes(), static_cast<char*>(out->view().data));
  std::copy_n(static_cast<const char*>(b.view().data), b.nbytes(),
              static_cast<char*>(out->view().data) + a.nbytes());
  return out;
}

template <typename T>
void TableGradientFromStep(const Tensor& before, const Tensor& after, const Tensor& momentum,
                           Tensor& grad) {
  const int64_t rows = before.dim(0), d = before.dim(1);
  const T* b = before.data<T>();
  const T* a = after.data<T>();
  const T* mom = momentum.data<T>();
  T* g = grad.data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T denom = std::sqrt(mom[r]) + static_cast<T>(SparseEmbeddings::kAdagradEpsilon);
    for (int64_t c = 0; c < d; ++c) g[r * d + c] = -(a[r * d + c] - b[r * d + c]) * denom;
  }
}

}  // namespace

double InitialTableValue(uint64_t seed, double stddev, int table, int64_t row, int64_t col) {
  // Box-Muller on two uniforms hashed from (seed, table, row, col): a
  // counter-based draw, so any rank can produce any element on its own.
  const uint64_t key = SplitMix64(SplitMix64(SplitMix64(seed ^ (0x7461626cull << 32 | static_cast<uint64_t>(table))) ^
                                             static_cast<uint64_t>(row)) ^
                                  static_cast<uint64_t>(col));
  const uint64_t k2 = SplitMix64(key);
  const double u1 = (static_cast<double>(key >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(k2 >> 11) * 0x1.0p-53;           // [0, 1)
  return stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

SparseEmbeddings::SparseEmbeddings(const LayerContext& ctx, const FeatureSchema& schema,
                                   int64_t dim, TableStorage storage, uint64_t seed,
                                   double init_stddev)
    : ctx_(ctx), schema_(schema), dim_(dim), storage_(storage) {
  if (storage == TableStorage::kExternal) return;
  for (const FeatureSchema::Table& t : schema.tables) {
    const int index = static_cast<int>(tables_.size());
    Table s;
    s.value = Tensor::HostZeros(ctx.dtype, {t.rows, dim});
    s.momentum = Tensor::HostZeros(ctx.dtype, {t.rows});
    s.grad_ids = Tensor::HostZeros(DType::kInt64, {0});
    s.grad_rows = Tensor::HostZeros(ctx.dtype, {0, dim});
    // Counter-based values: rows fill in parallel (a billion-parameter
    // table takes a minute on one core), identically whatever the split.
    auto fill = [&, index](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < dim; ++c) {
          const double v = InitialTableValue(seed, init_stddev, index, r, c);
          if (ctx.dtype == DType::kFloat64) {
            s.value.data<double>()[r * dim + c] = v;
          } else {
            s.value.data<float>()[r * dim + c] = static_cast<float>(v);
          }
        }
      }
    };
    const int64_t threads = std::min<int64_t>(
        std::max(1u, std::thread::hardware_concurrency()), std::max<int64_t>(1, t.rows * dim >> 20));
    std::vector<std::thread> workers;
    for (int64_t w = 1; w < threads; ++w) {
      workers.emplace_back(fill, t.rows * w / threads, t.rows * (w + 1) / threads);
    }
    fill(0, t.rows / threads);
    for (std::thread& w : workers) w.join();
    if (ctx.allocator->device() != Device::kCpu) {
      absl::StatusOr<Tensor> value = s.value.CopyTo(ctx.allocator);
      absl::StatusOr<Tensor> momentum = Tensor::Zeros(ctx.dtype, {t.rows}, ctx.allocator);
      absl::StatusOr<Tensor> ids = Tensor::Empty(DType::kInt64, {0}, ctx.allocator);
      absl::StatusOr<Tensor> rows = Tensor::Empty(ctx.dtype, {0, dim}, ctx.allocator);
      if (!value.ok() || !momentum.ok() || !ids.ok() || !rows.ok()) std::abort();
      s.value = *std::move(value);
      s.momentum = *std::move(momentum);
      s.grad_ids = *std::move(ids);
      s.grad_rows = *std::move(rows);
    }
    tables_.push_back(std::move(s));
  }
}

SparseEmbeddings::~SparseEmbeddings() {
  // The task in flight may be writing a staging buffer.
  if (prepared_.valid()) prepared_.wait();
  for (IdStaging& st : staging_) {
    if (st.copied != nullptr) {
      cudaEventSynchronize(static_cast<cudaEvent_t>(st.copied));
      cudaEventDestroy(static_cast<cudaEvent_t>(st.copied));
    }
    if (st.pinned != nullptr) cudaFreeHost(st.pinned);
  }
}

SparseEmbeddings::BagLayout SparseEmbeddings::Bags(int64_t batch_size, int64_t tokens) const {
  BagLayout l;
  l.bags.assign(schema_.tables.size(), 0);
  for (const auto& f : schema_.id_lists) {
    l.feature_base.push_back(l.bags[f.table]);
    l.bags[f.table] += batch_size;
  }
  for (const auto& f : schema_.sequence_fields) {
    l.sequence_base.push_back(l.bags[f.table]);
    l.bags[f.table] += tokens;
  }
  return l;
}

std::vector<TableLookups> SparseEmbeddings::Lookups(const Batch& batch) const {
  const int64_t tokens = batch.sequence[0].offsets.back();
  std::vector<TableLookups> out(schema_.tables.size());
  for (TableLookups& l : out) l.offsets.push_back(0);
  for (size_t f = 0; f < schema_.id_lists.size(); ++f) {
    TableLookups& l = out[schema_.id_lists[f].table];
    const IdList& list = batch.id_lists[f];
    const int64_t base = static_cast<int64_t>(l.ids.size());
    l.ids.insert(l.ids.end(), list.ids.begin(), list.ids.end());
    for (int64_t s = 1; s <= batch.size; ++s) l.offsets.push_back(base + list.offsets[s]);
  }
  for (size_t f = 0; f < schema_.sequence_fields.size(); ++f) {
    TableLookups& l = out[schema_.sequence_fields[f].table];
    const IdList& list = batch.sequence[f];
    l.ids.insert(l.ids.end(), list.ids.begin(), list.ids.begin() + tokens);
    for (int64_t i = 0; i < tokens; ++i) l.offsets.push_back(l.offsets.back() + 1);
  }
  return out;
}

absl::Status SparseEmbeddings::CheckPooled(const Batch& batch,
                                           absl::Span<const TensorView> pooled) const {
  if (storage_ != TableStorage::kExternal) {
    return absl::FailedPreconditionError("pooled rows given to a model that holds its own tables");
  }
  if (pooled.size() != schema_.tables.size()) {
    return absl::InvalidArgumentError(absl::StrCat("pooled: ", pooled.size(), " tensors for ",
                                                   schema_.tables.size(), " tables"));
  }
  const BagLayout l = Bags(batch.size, batch.sequence.empty() ? 0 : batch.sequence[0].offsets.back());
  for (size_t t = 0; t < pooled.size(); ++t) {
    const TensorView& v = pooled[t];
    if (v.dtype != ctx_.dtype || v.device != ctx_.allocator->device() || v.shape.size() != 2 ||
        v.shape[0] != l.bags[t] || v.shape[1] != dim_ || (v.data == nullptr && l.bags[t] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pooled[", t, "] (table ", schema_.tables[t].name, ") must be [", l.bags[t], ", ", dim_,
          "] of the model's dtype on the model's device (",
          ctx_.allocator->device() == Device::kCpu ? "cpu" : "cuda", ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::Forward(const StagedBatch& staged,
                                       absl::Span<const TensorView> pooled,
                                       std::vector<Tensor>* features, Tensor* history) {
  const ScopedPhase phase(ctx_.phases, Phase::kEmbedding);
  const Batch& batch = *staged.batch();
  const int64_t B = batch.size, L = batch.sequence[0].offsets.back();
  const BagLayout bags = Bags(B, L);
  features->resize(schema_.id_lists.size());
  for (size_t f = 0; f < schema_.id_lists.size(); ++f) {
    const FeatureSchema::IdListFeature& feat = schema_.id_lists[f];
    const JaggedView ids = staged.id_list(f);
    Tensor& out = (*features)[f];
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {B, dim_}, &out));
    if (storage_ == TableStorage::kExternal) {
      const int64_t base = bags.feature_base[f];
      RECFLEET_RETURN_IF_ERROR(ops::ScaleBags(RowSlice(pooled[feat.table], base, base + B),
                                              ids.offsets, feat.pooling, out.view()));
    } else {
      RECFLEET_RETURN_IF_ERROR(
          EmbeddingBagForward(tables_[feat.table].value.view(), ids, feat.pooling, out.view()));
    }
  }
  // Sequence events -> tokens: the sum of their fields' embeddings. The
  // first field is looked up into the tokens directly, later ones into a
  // scratch that is added (the same sums as adding every field to zeros,
  // two passes over [L, dim] fewer).
  const size_t fields = schema_.sequence_fields.size();
  if (fields == 0) return AllocateZeros(ctx_, {L, dim_}, history);
  RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {L, dim_}, history));
  if (fields > 1) RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {L, dim_}, &field_));
  for (size_t f = 0; f < fields && L > 0; ++f) {
    const int table = schema_.sequence_fields[f].table;
    TensorView field = f == 0 ? history->view() : field_.view();
    if (storage_ == TableStorage::kExternal) {
      const TensorView rows =
          RowSlice(pooled[table], bags.sequence_base[f], bags.sequence_base[f] + L);
      if (f == 0) {
        RECFLEET_RETURN_IF_ERROR(ops::Copy(rows, field));
        continue;
      }
      field = rows;
    } else {
      RECFLEET_RETURN_IF_ERROR(
          EmbeddingSequenceForward(tables_[table].value.view(), staged.sequence_ids(f), field));
    }
    if (f > 0) RECFLEET_RETURN_IF_ERROR(ops::Add(history->view(), field, history->view()));
  }
  // The scratch is step-sized and dead now: back to the pool on a device.
  if (ctx_.allocator->device() == Device::kCuda) field_ = Tensor();
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::Backward(const StagedBatch& staged,
                                        absl::Span<const TensorView> dfeatures,
                                        const TensorView& dhistory) {
  const ScopedPhase phase(ctx_.phases, Phase::kEmbedding);
  if (storage_ == TableStorage::kExternal) {
    return CollectPooledGradients(staged, dfeatures, dhistory);
  }
  return CollectTableGradients(staged, dfeatures, dhistory);
}

// One gradient row per use of a row: a pooled id's row is its bag's
// gradient (divided by the bag size for mean pooling), a history token's
// row its token's gradient.
absl::Status SparseEmbeddings::CollectTableGradients(const StagedBatch& staged,
                                                     absl::Span<const TensorView> dfeatures,
                                                     const TensorView& dhistory) {
  const Batch& batch = *staged.batch();
  const int64_t L = batch.sequence[0].offsets.back();
  std::vector<int64_t> uses(tables_.size(), 0);
  for (size_t f = 0; f < schema_.id_lists.size(); ++f) {
    uses[schema_.id_lists[f].table] += static_cast<int64_t>(batch.id_lists[f].ids.size());
  }
  for (const auto& f : schema_.sequence_fields) uses[f.table] += L;
  for (size_t t = 0; t < tables_.size(); ++t) {
    Tensor& ids = tables_[t].grad_ids;
    if (ids.empty() || ids.numel() != uses[t] || ids.device() != ctx_.allocator->device()) {
      absl::StatusOr<Tensor> fresh = Tensor::Empty(DType::kInt64, {uses[t]}, ctx_.allocator);
      if (!fresh.ok()) return fresh.status();
      ids = *std::move(fresh);
    }
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {uses[t], dim_}, &tables_[t].grad_rows));
  }
  std::vector<int64_t> filled(tables_.size(), 0);
  for (size_t f = 0; f < schema_.id_lists.size(); ++f) {
    const int t = schema_.id_lists[f].table;
    const JaggedView list = staged.id_list(f);
    const int64_t n = list.values.numel();
    RECFLEET_RETURN_IF_ERROR(
        ops::CopyIndices(list.values, RowSlice(tables_[t].grad_ids.view(), filled[t], filled[t] + n)));
    RECFLEET_RETURN_IF_ERROR(ops::ExpandBags(dfeatures[f], list.offsets, schema_.id_lists[f].pooling,
                                             RowSlice(tables_[t].grad_rows.view(), filled[t], filled[t] + n)));
    filled[t] += n;
  }
  for (size_t f = 0; f < schema_.sequence_fields.size() && L > 0; ++f) {
    const int t = schema_.sequence_fields[f].table;
    RECFLEET_RETURN_IF_ERROR(ops::CopyIndices(
        staged.sequence_ids(f), RowSlice(tables_[t].grad_ids.view(), filled[t], filled[t] + L)));
    RECFLEET_RETURN_IF_ERROR(
        ops::Copy(dhistory, RowSlice(tables_[t].grad_rows.view(), filled[t], filled[t] + L)));
    filled[t] += L;
  }
  if (ctx_.allocator->device() == Device::kCuda) return ReduceDuplicates(staged);
  return absl::OkStatus();
}

DeduplicatedIds Deduplicate(absl::Span<const int64_t> uses, int64_t rows) {
  DeduplicatedIds d;
  d.slots.reserve(uses.size());
  if (rows > 0 && rows <= static_cast<int64_t>(uses.size())) {
    // Clearing `rows` entries costs no more than the hashing it replaces.
    std::vector<int64_t> slot_of(rows, -1);
    bool in_range = true;
    for (int64_t id : uses) {
      if (id < 0 || id >= rows) {
        in_range = false;
        break;
      }
      int64_t& slot = slot_of[id];
      if (slot < 0) {
        slot = static_cast<int64_t>(d.unique.size());
        d.unique.push_back(id);
      }
      d.slots.push_back(slot);
    }
    if (in_range) return d;
    d.unique.clear();
    d.slots.clear();
  }
  absl::flat_hash_map<int64_t, int64_t> index;
  index.reserve(rows > 0 ? std::min<int64_t>(rows, uses.size()) : uses.size());
  for (int64_t id : uses) {
    auto [it, fresh] = index.try_emplace(id, static_cast<int64_t>(d.unique.size()));
    if (fresh) d.unique.push_back(id);
    d.slots.push_back(it->second);
  }
  return d;
}

std::vector<DeduplicatedIds> DeduplicateTables(const std::vector<std::vector<int64_t>>& uses,
                                               absl::Span<const int64_t> rows) {
  // Below this many uses a thread's start costs more than the hashing.
  constexpr size_t kOwnThread = 8192;
  std::vector<DeduplicatedIds> out(uses.size());
  std::vector<std::thread> threads;
  auto rows_of = [&rows](size_t t) { return t < rows.size() ? rows[t] : int64_t{0}; };
  for (size_t t = 0; t < uses.size(); ++t) {
    if (uses[t].size() >= kOwnThread) {
      threads.emplace_back(
          [&uses, &out, t, r = rows_of(t)] { out[t] = Deduplicate(uses[t], r); });
    }
  }
  for (size_t t = 0; t < uses.size(); ++t) {
    if (uses[t].size() < kOwnThread) out[t] = Deduplicate(uses[t], rows_of(t));
  }
  for (std::thread& th : threads) th.join();
  return out;
}

void TableUses(const FeatureSchema& schema, const Batch& batch,
               std::vector<std::vector<int64_t>>* uses) {
  const int64_t L = batch.sequence.empty() ? 0 : batch.sequence[0].offsets.back();
  uses->resize(schema.tables.size());
  for (std::vector<int64_t>& u : *uses) u.clear();
  for (size_t f = 0; f < schema.id_lists.size(); ++f) {
    std::vector<int64_t>& u = (*uses)[schema.id_lists[f].table];
    u.insert(u.end(), batch.id_lists[f].ids.begin(), batch.id_lists[f].ids.end());
  }
  for (size_t f = 0; f < schema.sequence_fields.size(); ++f) {
    std::vector<int64_t>& u = (*uses)[schema.sequence_fields[f].table];
    u.insert(u.end(), batch.sequence[f].ids.begin(), batch.sequence[f].ids.begin() + L);
  }
}

absl::Status SparseEmbeddings::EnsureStagingEvents() {
  for (IdStaging& st : staging_) {
    if (st.copied != nullptr) continue;
    cudaEvent_t e;
    RECFLEET_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "gradient ids event"));
    st.copied = e;
  }
  return absl::OkStatus();
}

int SparseEmbeddings::FreeStaging() const {
  for (int i = 0; i < 3; ++i) {
    if (i != last_copied_ && i != pending_staging_) return i;
  }
  return 0;  // unreachable: two indices exclude at most two of three
}

SparseEmbeddings::PackedIds SparseEmbeddings::PackIds(std::vector<DeduplicatedIds> dedup,
                                                      int index) {
  PackedIds p;
  p.staging = index;
  for (const DeduplicatedIds& d : dedup) {
    p.unique.push_back(static_cast<int64_t>(d.unique.size()));
    p.uses.push_back(static_cast<int64_t>(d.slots.size()));
    p.total_ids += p.unique.back() + p.uses.back();
    p.total_rows += p.unique.back();
  }
  IdStaging& st = staging_[index];
  const size_t bytes = static_cast<size_t>(p.total_ids) * sizeof(int64_t);
  // The buffer is refilled only after its last copy is done.
  if (st.copy_recorded) {
    p.status = CudaStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(st.copied)), "gradient ids");
    if (!p.status.ok()) return p;
    st.copy_recorded = false;
  }
  if (bytes > st.bytes) {
    if (st.pinned != nullptr) cudaFreeHost(st.pinned);
    st.pinned = nullptr;
    st.bytes = 0;
    p.status = CudaStatus(cudaMallocHost(&st.pinned, bytes * 2), "pinned ids");
    if (!p.status.ok()) return p;
    st.bytes = bytes * 2;
  }
  int64_t* host = static_cast<int64_t*>(st.pinned);
  for (const DeduplicatedIds& d : dedup) {
    host = std::copy(d.unique.begin(), d.unique.end(), host);
    host = std::copy(d.slots.begin(), d.slots.end(), host);
  }
  return p;
}

void SparseEmbeddings::PrepareGradientIds(const StagedBatch& staged) {
  if (ctx_.allocator->device() != Device::kCuda || storage_ != TableStorage::kInternal ||
      staged.batch() == nullptr) {
    return;
  }
  // At most one in flight: the last one's task may still read
  // prepared_uses_ and fill its staging buffer (then unused: it was for a
  // batch no Backward trained).
  if (prepared_.valid()) prepared_.wait();
  pending_staging_ = -1;
  prepared_for_ = nullptr;
  int device = 0;
  // Without events or a device the Backward deduplicates inline and
  // reports the error.
  if (!EnsureStagingEvents().ok() || cudaGetDevice(&device) != cudaSuccess) return;
  prepared_for_ = &staged;
  prepared_generation_ = staged.generation();
  TableUses(schema_, *staged.batch(), &prepared_uses_);
  if (table_rows_.empty()) table_rows_ = RowCounts(schema_);
  const int index = FreeStaging();
  pending_staging_ = index;
  prepared_ = std::async(std::launch::async, [this, index, device] {
    // The stepping thread's device, for the pinned allocation.
    if (cudaSetDevice(device) != cudaSuccess) {
      PackedIds failed;
      failed.status = absl::InternalError("gradient ids: cudaSetDevice failed on the worker thread");
      return failed;
    }
    return PackIds(DeduplicateTables(prepared_uses_, table_rows_), index);
  });
}

absl::Status SparseEmbeddings::ReduceDuplicates(const StagedBatch& staged) {
  RECFLEET_RETURN_IF_ERROR(EnsureStagingEvents());
  PackedIds packed;
  if (prepared_.valid() && prepared_for_ == &staged &&
      prepared_generation_ == staged.generation()) {
    packed = prepared_.get();
    pending_staging_ = -1;
  } else {
    // Not prefetched: a copy of its own (a task in flight for another
    // batch may still read prepared_uses_), packed into a buffer that task
    // does not fill.
    std::vector<std::vector<int64_t>> uses;
    TableUses(schema_, *staged.batch(), &uses);
    packed = PackIds(DeduplicateTables(uses, RowCounts(schema_)), FreeStaging());
  }
  prepared_for_ = nullptr;
  RECFLEET_RETURN_IF_ERROR(packed.status);
  if (packed.uses.size() != tables_.size()) {
    return absl::InternalError(absl::StrCat("gradient ids of ", packed.uses.size(), " tables for ",
                                            tables_.size()));
  }
  for (size_t k = 0; k < tables_.size(); ++k) {
    const int64_t n = tables_[k].grad_ids.numel();
    if (packed.uses[k] != n) {
      return absl::InternalError(absl::StrCat("table ", k, ": ", packed.uses[k],
                                              " deduplicated uses for ", n, " gradient rows"));
    }
  }
  const int64_t total_ids = packed.total_ids, total_rows = packed.total_rows;
  const size_t bytes = total_ids * sizeof(int64_t);
  IdStaging& st = staging_[packed.staging];
  if (ids_.empty() || ids_.numel() != total_ids || ids_.device() != Device::kCuda) {
    absl::StatusOr<Tensor> fresh = Tensor::Empty(DType::kInt64, {total_ids}, ctx_.allocator);
    if (!fresh.ok()) return fresh.status();
    ids_ = *std::move(fresh);
  }
  if (bytes > 0) {
    RECFLEET_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(ids_.view().data, st.pinned, bytes,
                                                        cudaMemcpyHostToDevice, nullptr),
                                        "gradient ids"));
  }
  RECFLEET_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(st.copied), nullptr), "gradient ids"));
  st.copy_recorded = true;
  last_copied_ = packed.staging;
  RECFLEET_RETURN_IF_ERROR(AllocateZeros(ctx_, {total_rows, dim_}, &reduced_));
  int64_t id_at = 0, row_at = 0;
  for (size_t k = 0; k < tables_.size(); ++k) {
    Table& t = tables_[k];
    const int64_t n = t.grad_ids.numel();
    const int64_t u = packed.unique[k];
    t.unique_ids = RowSlice(ids_.view(), id_at, id_at + u);
    t.slots = RowSlice(ids_.view(), id_at + u, id_at + u + n);
    t.reduced_rows = RowSlice(reduced_.view(), row_at, row_at + u);
    id_at += u + n;
    row_at += u;
    if (n > 0) {
      RECFLEET_RETURN_IF_ERROR(ops::ScatterAddRows(t.grad_rows.view(), t.slots, t.reduced_rows));
    }
    // Only the reduced rows are read from here on (the Adagrad step, the
    // dense table gradient): the per-use rows, one per history token, go
    // back to the pool (stream-ordered) instead of staying beside the next
    // step's activations.
    absl::StatusOr<Tensor> none = Tensor::Empty(ctx_.dtype, {0, dim_}, ctx_.allocator);
    if (!none.ok()) return none.status();
    t.grad_rows = *std::move(none);
  }
  return absl::OkStatus();
}

// One gradient row per looked-up bag, in Lookups' order (a mean-pooled
// bag's row sum was scaled by 1 / length forward, so its gradient is too).
absl::Status SparseEmbeddings::CollectPooledGradients(const StagedBatch& staged,
                                                      absl::Span<const TensorView> dfeatures,
                                                      const TensorView& dhistory) {
  const Batch& batch = *staged.batch();
  const int64_t B = batch.size, L = batch.sequence[0].offsets.back();
  const BagLayout bags = Bags(B, L);
  pooled_grads_.resize(schema_.tables.size());
  for (size_t t = 0; t < schema_.tables.size(); ++t) {
    RECFLEET_RETURN_IF_ERROR(AllocateTensor(ctx_, {bags.bags[t], dim_}, &pooled_grads_[t]));
  }
  for (size_t f = 0; f < schema_.id_lists.size(); ++f) {
    const int t = schema_.id_lists[f].table;
    const int64_t base = bags.feature_base[f];
    RECFLEET_RETURN_IF_ERROR(ops::ScaleBags(dfeatures[f], staged.id_list(f).offsets,
                                            schema_.id_lists[f].pooling,
                                            RowSlice(pooled_grads_[t].view(), base, base + B)));
  }
  for (size_t f = 0; f < schema_.sequence_fields.size() && L > 0; ++f) {
    const int t = schema_.sequence_fields[f].table;
    const int64_t base = bags.sequence_base[f];
    RECFLEET_RETURN_IF_ERROR(ops::Copy(dhistory, RowSlice(pooled_grads_[t].view(), base, base + L)));
  }
  return absl::OkStatus();
}

std::vector<TensorView> SparseEmbeddings::PooledGradients() const {
  std::vector<TensorView> out;
  for (const Tensor& g : pooled_grads_) out.push_back(g.view());
  return out;
}

absl::Status SparseEmbeddings::AdagradStep(const Table& t, const TensorView& value,
                                           const TensorView& momentum, float learning_rate) const {
  // On CUDA each distinct id once, with its summed gradient.
  const bool reduced = value.device == Device::kCuda;
  const TensorView ids = reduced ? t.unique_ids : t.grad_ids.view();
  const TensorView rows = reduced ? t.reduced_rows : t.grad_rows.view();
  if (ids.data == nullptr || ids.numel() == 0) return absl::OkStatus();
  RowwiseAdagradConfig config;
  config.learning_rate = learning_rate;
  config.eps = kAdagradEpsilon;
  return EmbeddingSequenceBackwardAdagrad(rows, ids, config, value, momentum);
}

absl::Status SparseEmbeddings::ApplyUpdates(float learning_rate) {
  const ScopedPhase phase(ctx_.phases, Phase::kEmbedding);
  for (Table& t : tables_) {
    RECFLEET_RETURN_IF_ERROR(AdagradStep(t, t.value.view(), t.momentum.view(), learning_rate));
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::ScaleGradients(double weight) {
  for (Table& t : tables_) {
    if (t.grad_rows.numel() > 0) RECFLEET_RETURN_IF_ERROR(ops::Scale(t.grad_rows.view(), weight));
    if (t.reduced_rows.data != nullptr && t.reduced_rows.numel() > 0) {
      RECFLEET_RETURN_IF_ERROR(ops::Scale(t.reduced_rows, weight));
    }
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::AddGradients(const SparseEmbeddings& other, double weight) {
  if (other.tables_.size() != tables_.size()) {
    return absl::InvalidArgumentError("AddGradients: replica has a different architecture");
  }
  if (ctx_.allocator->device() != Device::kCpu) {
    return absl::UnimplementedError("AddGradients: in-process replicas are host models only");
  }
  for (size_t k = 0; k < tables_.size(); ++k) {
    Table& t = tables_[k];
    const Table& o = other.tables_[k];
    const int64_t mine = t.grad_ids.numel(), theirs = o.grad_ids.numel();
    absl::StatusOr<Tensor> ids = Concat(t.grad_ids, o.grad_ids);
    if (!ids.ok()) return ids.status();
    absl::StatusOr<Tensor> rows = Concat(t.grad_rows, o.grad_rows);
    if (!rows.ok()) return rows.status();
    if (theirs > 0) {
      RECFLEET_RETURN_IF_ERROR(ops::Scale(RowSlice(rows->view(), mine, mine + theirs), weight));
    }
    t.grad_ids = *std::move(ids);
    t.grad_rows = *std::move(rows);
  }
  return absl::OkStatus();
}

absl::Status SparseEmbeddings::CopyTablesFrom(const SparseEmbeddings& other) {
  if (other.tables_.size() != tables_.size()) {
    return absl::InvalidArgumentError("CopyParametersFrom: different architecture");
  }
  for (size_t k = 0; k < tables_.size(); ++k) {
    RECFLEET_RETURN_IF_ERROR(ops::Copy(other.tables_[k].value.view(), tables_[k].value.view()));
  }
  return absl::OkStatus();
}

int64_t SparseEmbeddings::num_parameters() const {
  int64_t n = 0;
  for (const Table& t : tables_) n += t.value.numel();
  return n;
}

// One rowwise-Adagrad step with learning rate 1 from zero momentum moves a
// touched row by -g / (sqrt(mean(g^2)) + eps) and leaves mean(g^2) in the
// momentum, so g = -delta * (sqrt(momentum) + eps) exactly recovers the
// summed gradient through the same kernel the training step uses.
absl::StatusOr<Tensor> SparseEmbeddings::DenseTableGradient(int table) const {
  const Table& t = tables_[table];
  if (t.value.device() != Device::kCpu) {
    return absl::UnimplementedError("DenseTableGradient: host tables only");
  }
  absl::StatusOr<Tensor> moved = t.value.Clone();
  if (!moved.ok()) return moved.status();
  Tensor momentum = Tensor::HostZeros(ctx_.dtype, {t.value.dim(0)});
  RECFLEET_RETURN_IF_ERROR(AdagradStep(t, moved->view(), momentum.view(), 1.0f));
  Tensor grad = Tensor::HostZeros(ctx_.dtype, t.value.shape());
  if (ctx_.dtype == DType::kFloat64) {
    TableGradientFromStep<double>(t.value, *moved, momentum, grad);
  } else {
    TableGradientFromStep<float>(t.value, *moved, momentum, grad);
  }
  return grad;
}

}  // namespace layers
}  // namespace recfleet::engine
