#ifndef RECFLEET_ENGINE_LAYERS_EMBEDDINGS_H_
#define RECFLEET_ENGINE_LAYERS_EMBEDDINGS_H_

// The sparse part of GEM-lite (DESIGN section 2): the schema's embedding
// tables, one pooled token per id-list feature and one token per history
// event (the sum of its fields' embeddings), and the tables' rowwise-Adagrad
// step. Tables live inside (TableStorage::kInternal: lookups, gradients and
// updates here) or with the caller (kExternal: the caller looks up the bags
// of Lookups() and passes their row sums; PooledGradients() is what it
// applies). Batches are assumed to match the schema (the model checks them).
// Not thread-safe.

#include <cstdint>
#include <future>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/batch.h"
#include "engine/layers/layer.h"
#include "engine/layers/staged_batch.h"
#include "engine/tensor.h"

namespace recfleet::engine {

// Where the embedding tables live.
enum class TableStorage {
  kInternal,  // In the model: lookups and rowwise-Adagrad updates inside.
  // Outside (e.g. sharded over ranks, worker/dist): the caller looks up the
  // bags TableLookupsOf names, passes their row sums to ForwardBackward /
  // Predict, and applies PooledGradients to its tables itself. The model
  // holds no table memory and ApplyUpdates steps the dense parameters only.
  kExternal,
};

// One table's lookups for a batch: a jagged list of bags of row ids.
struct TableLookups {
  std::vector<int64_t> ids;
  std::vector<int64_t> offsets;  // Bags + 1 entries, from 0 to ids.size().
};

namespace layers {

// One table's uses in a batch, deduplicated: the distinct ids in first-use
// order, and per use the index of its id among them.
struct DeduplicatedIds {
  std::vector<int64_t> unique;
  std::vector<int64_t> slots;
};
// `rows` (0: unknown) is the table's row count, a bound on the distinct ids:
// a table with no more rows than uses (a history's action table: 16 rows,
// tens of thousands of uses) is indexed by id in an array instead of a hash
// map, and the hash map of a larger one is sized once. The result does not
// depend on `rows`, also for ids outside [0, rows).
DeduplicatedIds Deduplicate(absl::Span<const int64_t> uses, int64_t rows = 0);
// Deduplicate of every table's uses (`rows`: every table's row count, or
// empty); tables with many uses (a history's item table: tens of thousands
// of ids per batch) each on a thread of their own, so the slowest table,
// not the sum, is the wait.
std::vector<DeduplicatedIds> DeduplicateTables(const std::vector<std::vector<int64_t>>& uses,
                                               absl::Span<const int64_t> rows = {});
// Per table of `schema`, its uses in `batch` in the order of its gradient
// rows: the table's id-list features (schema order), then its sequence
// fields (the batch must match the schema). Overwrites `*uses`, keeping its
// vectors' capacity (a step's copy of every id then reuses the last step's
// memory instead of faulting in fresh pages).
void TableUses(const FeatureSchema& schema, const Batch& batch,
               std::vector<std::vector<int64_t>>* uses);

// The initial value of element (row, col) of table `table`: a N(0, stddev^2)
// draw that depends only on (seed, table, row, col), so tables split over
// any number of ranks start exactly as one rank's would.
double InitialTableValue(uint64_t seed, double stddev, int table, int64_t row, int64_t col);

class SparseEmbeddings {
 public:
  // With internal storage, allocates the schema's tables [rows, dim]
  // (InitialTableValue(seed, init_stddev, ...), made on the host and copied
  // to ctx's device) and their momenta.
  SparseEmbeddings(const LayerContext& ctx, const FeatureSchema& schema, int64_t dim,
                   TableStorage storage, uint64_t seed, double init_stddev);
  ~SparseEmbeddings();
  SparseEmbeddings(const SparseEmbeddings&) = delete;
  SparseEmbeddings& operator=(const SparseEmbeddings&) = delete;

  // Per table of the schema, the bags `batch` looks up, in this order: for
  // every id-list feature on the table (schema order) one bag per sample,
  // then for every sequence field on it one single-id bag per history token.
  std::vector<TableLookups> Lookups(const Batch& batch) const;
  // External storage: InvalidArgument unless pooled[t] is a [bags of table
  // t, dim] tensor of the model's dtype on the model's device (a CUDA model
  // reads device rows: the caller's sharded tables live there); FailedPrecondition
  // with internal storage.
  absl::Status CheckPooled(const Batch& batch, absl::Span<const TensorView> pooled) const;

  // features: one [B, dim] token per id-list feature (sum or mean pooled);
  // history [L, dim]: per event the sum of its fields' embeddings. With
  // external storage `pooled` holds the row sums of Lookups' bags (checked
  // with CheckPooled).
  // `staged` holds the batch's arrays on the model's device.
  absl::Status Forward(const StagedBatch& staged, absl::Span<const TensorView> pooled,
                       std::vector<Tensor>* features, Tensor* history);
  // Given the gradients of Forward's outputs, keeps the per-row gradients
  // for ApplyUpdates (internal storage) or the gradients of the pooled row
  // sums for PooledGradients (external).
  absl::Status Backward(const StagedBatch& staged, absl::Span<const TensorView> dfeatures,
                        const TensorView& dhistory);
  // CUDA, internal storage (a no-op otherwise): starts deduplicating the
  // table ids of the batch just staged into `staged` on a worker thread,
  // for the Backward that trains this staging of it (the ids are copied
  // now, like the batch itself), so the hashing of every id of the step and
  // the packing of the results into pinned memory run beside the thread
  // that launches the GPU work instead of on it. A Backward on any other
  // staging deduplicates inline, as without it.
  void PrepareGradientIds(const StagedBatch& staged);
  // External storage, after Backward: [bags, dim] per table, in Lookups'
  // order. Valid until the next Backward.
  std::vector<TensorView> PooledGradients() const;

  // One rowwise-Adagrad step per table on the summed gradients of the last
  // Backward (plus AddGradients'), one fused kernel call per table.
  absl::Status ApplyUpdates(float learning_rate);
  absl::Status ScaleGradients(double weight);
  // Appends other's row gradients times weight (Adagrad sums them per row).
  absl::Status AddGradients(const SparseEmbeddings& other, double weight);
  absl::Status CopyTablesFrom(const SparseEmbeddings& other);

  // Tables held here: the schema's with internal storage, none with external.
  int num_tables() const { return static_cast<int>(tables_.size()); }
  TensorView table(int t) const { return tables_[t].value.view(); }
  // Table t's rowwise-Adagrad accumulator, [rows].
  TensorView momentum(int t) const { return tables_[t].momentum.view(); }
  int64_t num_parameters() const;
  // The dense [rows, dim] gradient of table t, recovered through the same
  // Adagrad kernel the step uses (exact, slow: for small test tables; host
  // tables only).
  absl::StatusOr<Tensor> DenseTableGradient(int t) const;

  static constexpr float kAdagradEpsilon = 1e-8f;

 private:
  struct Table {
    Tensor value, momentum;
    // Rows touched by the last backward and their gradients, one row per use.
    Tensor grad_ids;  // int64 [n]
    Tensor grad_rows;  // [n, dim]
    // CUDA: the distinct ids of the last backward (deduplicated on the host
    // from the batch, in first-use order), each use's index among them, and
    // the summed gradient per distinct id, so that the Adagrad kernel sees
    // every id once however often a popular id recurs (one warp summing
    // thousands of occurrences of one id serially made the step
    // latency-bound). Views into the class's ids_ and reduced_.
    TensorView unique_ids;    // int64 [u]
    TensorView slots;         // int64 [n]
    TensorView reduced_rows;  // [u, dim]
  };
  // Where each feature's bags sit in its table's lookups.
  struct BagLayout {
    std::vector<int64_t> feature_base;   // Per id-list feature.
    std::vector<int64_t> sequence_base;  // Per sequence field.
    std::vector<int64_t> bags;           // Per table.
  };
  BagLayout Bags(int64_t batch_size, int64_t tokens) const;
  absl::Status AdagradStep(const Table& t, const TensorView& value, const TensorView& momentum,
                           float learning_rate) const;
  absl::Status CollectTableGradients(const StagedBatch& staged,
                                     absl::Span<const TensorView> dfeatures,
                                     const TensorView& dhistory);
  // CUDA: fills unique_ids, slots and reduced_rows of every table from the
  // batch's host ids and the per-use grad_rows.
  absl::Status ReduceDuplicates(const StagedBatch& staged);
  absl::Status CollectPooledGradients(const StagedBatch& staged,
                                      absl::Span<const TensorView> dfeatures,
                                      const TensorView& dhistory);

  LayerContext ctx_;
  FeatureSchema schema_;
  int64_t dim_;
  TableStorage storage_;
  std::vector<Table> tables_;
  // CUDA: every table's unique ids and slots back to back, packed in pinned
  // host memory and copied in one transfer per step, and every table's
  // reduced rows, cleared in one memset: one operation each per step
  // instead of one per table.
  Tensor ids_, reduced_;
  // A pinned buffer the packed ids are staged in, and the event of its last
  // copy (created on the stepping thread; waited for before a refill).
  struct IdStaging {
    void* pinned = nullptr;
    size_t bytes = 0;
    void* copied = nullptr;  // cudaEvent_t
    bool copy_recorded = false;
  };
  // The packed ids of one batch: where they sit and every table's counts.
  struct PackedIds {
    absl::Status status;
    int staging = -1;  // index into staging_
    std::vector<int64_t> unique, uses;  // per table
    int64_t total_ids = 0, total_rows = 0;
  };
  // Packs `dedup` into staging_[index] (waiting for its last copy, growing
  // it): on PrepareGradientIds' task, off the stepping thread, or inline.
  PackedIds PackIds(std::vector<DeduplicatedIds> dedup, int index);
  // A staging buffer neither the last copy nor the task in flight uses:
  // three of them, so one is always free and a refill waits at most for a
  // copy two steps old.
  int FreeStaging() const;
  absl::Status EnsureStagingEvents();
  IdStaging staging_[3];
  int last_copied_ = -1;
  int pending_staging_ = -1;  // prepared_'s, while it is in flight
  std::vector<Tensor> pooled_grads_;
  Tensor field_;
  // PrepareGradientIds' input, read by its task (declared before prepared_,
  // whose destructor waits for the task), and every table's row count.
  std::vector<std::vector<int64_t>> prepared_uses_;
  std::vector<int64_t> table_rows_;
  // PrepareGradientIds' work in flight (deduplication and packing), and the
  // staging it is for (object and generation).
  std::future<PackedIds> prepared_;
  const StagedBatch* prepared_for_ = nullptr;
  uint64_t prepared_generation_ = 0;
};

}  // namespace layers
}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_LAYERS_EMBEDDINGS_H_
