#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/attention/attention.h"
#include "kernels/embedding/embedding.h"
#include "kernels/gemm/linear.h"
#include "kernels/norm/norm.h"
#include "kernels/ops/adam.h"
#include "kernels/ops/bce.h"

namespace recfleet::engine {
namespace {

constexpr float kNormEps = 1e-6f;
constexpr float kAdagradEps = 1e-8f;
constexpr int kNumHeads = 2;  // CTR, CVR.

template <typename T>
constexpr DType kDType = std::is_same_v<T, double> ? DType::kFloat64 : DType::kFloat32;

// The CPU engine computes every GEMM at the storage precision.
const LinearRecipe& NativeRecipe() {
  static const LinearRecipe recipe{GemmPrecision::kNative, GemmPrecision::kNative,
                                   GemmPrecision::kNative};
  return recipe;
}

// Resizes a buffer, keeping a valid data pointer even when empty (the
// kernels reject null storage).
template <typename V>
void Resize(V& v, size_t n) {
  v.resize(n);
  if (v.capacity() == 0) v.reserve(1);
}

template <typename T>
TensorView View(const std::vector<T>& v, Shape shape) {
  return MakeView(const_cast<T*>(v.data()), kDType<T>, std::move(shape));
}

TensorView OffsetsView(const std::vector<int64_t>& offsets) {
  return MakeView(const_cast<int64_t*>(offsets.data()), DType::kInt64,
                  {static_cast<int64_t>(offsets.size())});
}

template <typename T>
void AddInto(std::vector<T>& acc, const std::vector<T>& x) {
  for (size_t i = 0; i < acc.size(); ++i) acc[i] += x[i];
}

std::vector<int64_t> UniformOffsets(int64_t batch, int64_t per_sample) {
  std::vector<int64_t> off(batch + 1);
  for (int64_t b = 0; b <= batch; ++b) off[b] = b * per_sample;
  return off;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

double InitialTableValue(const GemLiteConfig& config, int table, int64_t row, int64_t col) {
  // Box-Muller on two uniforms hashed from (seed, table, row, col): a
  // counter-based draw, so any rank can produce any element on its own.
  const uint64_t key = SplitMix64(SplitMix64(SplitMix64(config.seed ^ (0x7461626cull << 32 | static_cast<uint64_t>(table))) ^
                                             static_cast<uint64_t>(row)) ^
                                  static_cast<uint64_t>(col));
  const uint64_t k2 = SplitMix64(key);
  const double u1 = (static_cast<double>(key >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(k2 >> 11) * 0x1.0p-53;           // [0, 1)
  return config.embedding_init_std * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

template <typename T>
struct GemLite<T>::Impl {
  struct Param {
    std::string name;
    Tensor value, grad, m, v;
  };
  struct Linear {
    int w = -1;
    int b = -1;  // -1: no bias.
    int64_t in = 0, out = 0;
  };
  struct TableState {
    Tensor value, momentum;
    // Rows touched by the last backward and their summed-per-use gradients.
    std::vector<int64_t> grad_ids;
    std::vector<T> grad_rows;
  };
  struct SeqLayer {
    int norm = -1;
    Linear q, k, v, o;
  };
  struct Attn {  // One attention call's saved tensors.
    std::vector<T> q, k, v, out, lse;
  };
  struct SeqActs {
    std::vector<T> h, a, rstd;
    Attn attn;
  };
  struct Expert {
    Linear l1, l2;
  };
  struct ExpertActs {
    std::vector<T> h1, a1, h2, a2;
  };
  struct Tower {
    Linear l1, l2;
  };
  struct TowerActs {
    std::vector<T> t, a, logit;
  };

  GemLiteConfig config;
  FeatureSchema schema;
  TableStorage storage = TableStorage::kInternal;
  int64_t num_tokens = 0;  // F: one per id-list feature (+1 for numeric features).
  int64_t interaction_dim = 0;
  std::vector<Param> params;
  absl::flat_hash_map<std::string, int> param_index;
  std::vector<TableState> tables;
  Linear dense_proj;
  std::vector<SeqLayer> layers;
  int final_norm = -1;
  Linear cross_q, cross_k, cross_v, cross_o;
  int pma_queries = -1;
  Linear pma_k, pma_v, pma_o;
  std::vector<Linear> dcn;
  Linear gate;
  std::vector<Expert> experts;
  Tower towers[kNumHeads];
  int64_t adam_step = 0;

  // Activations of the last forward.
  int64_t batch = 0;
  int64_t total_len = 0;
  std::vector<int64_t> hist_off, token_off, pma_off;
  std::vector<std::vector<T>> pooled;
  std::vector<T> dense_in, dense_tok, x_tokens;
  std::vector<SeqActs> seq;
  std::vector<T> h_last, hn, hn_rstd;
  Attn cross, pma;
  std::vector<T> cross_out, pma_out;
  std::vector<std::vector<T>> dcn_x;  // dcn_x[0] = x0, dcn_x[c + 1] = output of layer c.
  std::vector<std::vector<T>> dcn_u;
  std::vector<T> gate_logits, gate_prob, mix;
  std::vector<ExpertActs> expert_acts;
  TowerActs tower_acts[kNumHeads];
  double fwd_linear_flops = 0;
  double fwd_attention_flops = 0;
  // External tables: the pooled rows of the current forward, and the
  // gradients of the last backward w.r.t. them.
  absl::Span<const TensorView> ext_pooled;
  std::vector<std::vector<T>> ext_grads;

  std::mt19937_64 rng;

  // ---- construction -------------------------------------------------------

  int AddParam(const std::string& name, Shape shape, double stddev, double constant = 0) {
    Param p;
    p.name = name;
    p.value = Tensor::HostZeros(kDType<T>, shape);
    p.grad = Tensor::HostZeros(kDType<T>, shape);
    p.m = Tensor::HostZeros(kDType<T>, shape);
    p.v = Tensor::HostZeros(kDType<T>, shape);
    std::normal_distribution<double> normal(0.0, stddev);
    T* v = p.value.template data<T>();
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      v[i] = static_cast<T>(stddev > 0 ? normal(rng) : constant);
    }
    param_index[name] = static_cast<int>(params.size());
    params.push_back(std::move(p));
    return static_cast<int>(params.size()) - 1;
  }

  Linear AddLinear(const std::string& name, int64_t in, int64_t out, bool bias) {
    Linear l;
    l.in = in;
    l.out = out;
    l.w = AddParam(name + ".w", {out, in}, 1.0 / std::sqrt(static_cast<double>(in)));
    if (bias) l.b = AddParam(name + ".b", {out}, 0.0);
    return l;
  }

  void Build() {
    rng.seed(config.seed);
    const int64_t d = config.dim;
    for (const FeatureSchema::Table& t : schema.tables) {
      if (storage == TableStorage::kExternal) break;
      const int index = static_cast<int>(tables.size());
      TableState s;
      s.value = Tensor::HostZeros(kDType<T>, {t.rows, d});
      s.momentum = Tensor::HostZeros(kDType<T>, {t.rows});
      T* v = s.value.template data<T>();
      for (int64_t r = 0; r < t.rows; ++r) {
        for (int64_t c = 0; c < d; ++c) v[r * d + c] = static_cast<T>(InitialTableValue(config, index, r, c));
      }
      tables.push_back(std::move(s));
    }
    num_tokens = static_cast<int64_t>(schema.id_lists.size()) + (schema.num_dense > 0 ? 1 : 0);
    if (schema.num_dense > 0) dense_proj = AddLinear("dense_proj", schema.num_dense, d, true);
    for (int l = 0; l < config.seq_layers; ++l) {
      const std::string n = absl::StrCat("seq", l);
      SeqLayer s;
      s.norm = AddParam(n + ".norm", {d}, 0.0, 1.0);
      s.q = AddLinear(n + ".q", d, d, false);
      s.k = AddLinear(n + ".k", d, d, false);
      s.v = AddLinear(n + ".v", d, d, false);
      s.o = AddLinear(n + ".o", d, d, true);
      layers.push_back(s);
    }
    final_norm = AddParam("seq.final_norm", {d}, 0.0, 1.0);
    if (config.cross_attention) {
      cross_q = AddLinear("cross.q", d, d, false);
      cross_k = AddLinear("cross.k", d, d, false);
      cross_v = AddLinear("cross.v", d, d, false);
      cross_o = AddLinear("cross.o", d, d, true);
    }
    if (config.pma_queries > 0) {
      pma_queries = AddParam("pma.queries", {config.pma_queries, d}, 1.0);
      pma_k = AddLinear("pma.k", d, d, false);
      pma_v = AddLinear("pma.v", d, d, false);
      pma_o = AddLinear("pma.o", d, d, true);
    }
    interaction_dim = (num_tokens + config.pma_queries) * d;
    for (int c = 0; c < config.dcn_layers; ++c) {
      dcn.push_back(AddLinear(absl::StrCat("dcn", c), interaction_dim, interaction_dim, true));
    }
    gate = AddLinear("moe.gate", interaction_dim, config.num_experts, true);
    for (int e = 0; e < config.num_experts; ++e) {
      const std::string n = absl::StrCat("moe.expert", e);
      experts.push_back({AddLinear(n + ".l1", interaction_dim, config.expert_hidden, true),
                         AddLinear(n + ".l2", config.expert_hidden, config.expert_out, true)});
    }
    const char* names[kNumHeads] = {"ctr", "cvr"};
    for (int h = 0; h < kNumHeads; ++h) {
      towers[h] = {AddLinear(absl::StrCat(names[h], ".l1"), config.expert_out, config.tower_hidden, true),
                   AddLinear(absl::StrCat(names[h], ".l2"), config.tower_hidden, 1, true)};
    }
  }

  TensorView PV(int p) { return params[p].value.view(); }
  TensorView PG(int p) { return params[p].grad.view(); }

  // ---- layer helpers --------------------------------------------------------

  // A batch whose histories are all empty has zero-row layers; the kernels
  // reject empty matrices, and there is nothing to compute.
  absl::Status LinF(const Linear& l, const std::vector<T>& x, int64_t rows, std::vector<T>& y) {
    Resize(y, rows * l.out);
    if (rows == 0) return absl::OkStatus();
    fwd_linear_flops += 2.0 * rows * l.in * l.out;
    return LinearForward(View(x, {rows, l.in}), PV(l.w), l.b >= 0 ? PV(l.b) : TensorView(),
                         View(y, {rows, l.out}), NativeRecipe());
  }

  // Accumulates the weight gradients; dx (when given) is overwritten or,
  // with add_dx, added to.
  absl::Status LinB(const Linear& l, const std::vector<T>& x, const std::vector<T>& dy,
                    int64_t rows, std::vector<T>* dx, bool add_dx) {
    if (rows == 0) {
      if (dx != nullptr && !add_dx) Resize(*dx, 0);
      return absl::OkStatus();
    }
    RECFLEET_RETURN_IF_ERROR(LinearBackwardWeight(View(dy, {rows, l.out}), View(x, {rows, l.in}),
                                                  PG(l.w), l.b >= 0 ? PG(l.b) : TensorView(),
                                                  /*accumulate=*/true, NativeRecipe()));
    if (dx == nullptr) return absl::OkStatus();
    if (!add_dx) {
      Resize(*dx, rows * l.in);
      return LinearBackwardInput(View(dy, {rows, l.out}), PV(l.w), View(*dx, {rows, l.in}),
                                 NativeRecipe());
    }
    std::vector<T> tmp;
    Resize(tmp, rows * l.in);
    RECFLEET_RETURN_IF_ERROR(LinearBackwardInput(View(dy, {rows, l.out}), PV(l.w),
                                                 View(tmp, {rows, l.in}), NativeRecipe()));
    AddInto(*dx, tmp);
    return absl::OkStatus();
  }

  attention::AttentionOptions SeqOptions() const {
    attention::AttentionOptions o;
    o.activation = config.seq_activation;
    o.mask = config.seq_mask;
    o.window = config.seq_window;
    o.rope = config.rope;
    o.qk_norm = config.qk_norm;
    return o;
  }
  // Cross-attention and PMA: softmax over the whole history, no positions.
  static attention::AttentionOptions PoolOptions() { return attention::AttentionOptions(); }

  attention::AttentionInputs AttnInputs(const Attn& a, const std::vector<int64_t>& q_off,
                                        const std::vector<int64_t>& k_off) const {
    const int64_t h = config.heads, dh = config.dim / config.heads;
    attention::AttentionInputs in;
    in.q.values = View(a.q, {q_off.back(), h, dh});
    in.q.offsets = OffsetsView(q_off);
    in.k.values = View(a.k, {k_off.back(), h, dh});
    in.k.offsets = OffsetsView(k_off);
    in.v = View(a.v, {k_off.back(), h, dh});
    return in;
  }

  absl::Status AttnF(Attn& a, const std::vector<int64_t>& q_off, const std::vector<int64_t>& k_off,
                     const attention::AttentionOptions& o) {
    const int64_t h = config.heads, dh = config.dim / config.heads;
    const attention::AttentionInputs in = AttnInputs(a, q_off, k_off);
    Resize(a.out, q_off.back() * config.dim);
    if (q_off.back() == 0) return absl::OkStatus();
    TensorView lse;
    if (o.activation == attention::Activation::kSoftmax) {
      Resize(a.lse, q_off.back() * h);
      lse = View(a.lse, {q_off.back(), h});
    }
    fwd_attention_flops += attention::AttentionForwardFlops(in.q, in.k, h, dh, o);
    return attention::AttentionForward(in, o, View(a.out, {q_off.back(), h, dh}), lse);
  }

  absl::Status AttnB(const Attn& a, const std::vector<int64_t>& q_off,
                     const std::vector<int64_t>& k_off, const attention::AttentionOptions& o,
                     const std::vector<T>& d_out, std::vector<T>& dq, std::vector<T>& dk,
                     std::vector<T>& dv) {
    const int64_t h = config.heads, dh = config.dim / config.heads;
    const attention::AttentionInputs in = AttnInputs(a, q_off, k_off);
    Resize(dq, a.q.size());
    Resize(dk, a.k.size());
    Resize(dv, a.v.size());
    if (q_off.back() == 0) return absl::OkStatus();
    attention::AttentionGrads g;
    g.dq = View(dq, {q_off.back(), h, dh});
    g.dk = View(dk, {k_off.back(), h, dh});
    g.dv = View(dv, {k_off.back(), h, dh});
    const TensorView lse = o.activation == attention::Activation::kSoftmax
                               ? View(a.lse, {q_off.back(), h})
                               : TensorView();
    return attention::AttentionBackward(in, o, View(a.out, {q_off.back(), h, dh}), lse,
                                        View(d_out, {q_off.back(), h, dh}), g);
  }

  // RMSNorm over the history tokens (y, rstd resized; no-op without tokens).
  absl::Status NormF(int gamma, const std::vector<T>& x, std::vector<T>& y, std::vector<T>& rstd) {
    const int64_t d = config.dim;
    Resize(y, total_len * d);
    Resize(rstd, total_len);
    if (total_len == 0) return absl::OkStatus();
    return RmsNormForward(View(x, {total_len, d}), PV(gamma), kNormEps, View(y, {total_len, d}),
                          View(rstd, {total_len}));
  }
  // dx is overwritten; gamma's gradient accumulates.
  absl::Status NormB(int gamma, const std::vector<T>& dy, const std::vector<T>& x,
                     const std::vector<T>& rstd, std::vector<T>& dx) {
    const int64_t d = config.dim;
    Resize(dx, total_len * d);
    if (total_len == 0) return absl::OkStatus();
    std::vector<T> dgamma(d);
    RECFLEET_RETURN_IF_ERROR(RmsNormBackward(View(dy, {total_len, d}), View(x, {total_len, d}),
                                             PV(gamma), View(rstd, {total_len}),
                                             View(dx, {total_len, d}), View(dgamma, {d})));
    AddToGrad(params[gamma].grad, dgamma);
    return absl::OkStatus();
  }

  absl::Status Act(const std::vector<T>& x, std::vector<T>& y) {
    Resize(y, x.size());
    const Shape s = {static_cast<int64_t>(x.size())};
    return ActivationForward(config.mlp_activation, View(x, s), View(y, s));
  }
  absl::Status ActB(const std::vector<T>& x, std::vector<T>& dy_to_dx) {
    const Shape s = {static_cast<int64_t>(x.size())};
    return ActivationBackward(config.mlp_activation, View(x, s), View(dy_to_dx, s),
                              View(dy_to_dx, s));
  }

  // ---- forward ---------------------------------------------------------------

  absl::Status CheckBatch(const Batch& b) const {
    if (b.size < 1) return absl::InvalidArgumentError("batch is empty");
    if (b.id_lists.size() != schema.id_lists.size()) {
      return absl::InvalidArgumentError(absl::StrCat("batch has ", b.id_lists.size(),
                                                     " id-list features, schema has ",
                                                     schema.id_lists.size()));
    }
    if (b.sequence.size() != schema.sequence_fields.size() || b.sequence.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("batch has ", b.sequence.size(),
                                                     " sequence fields, schema has ",
                                                     schema.sequence_fields.size(), " (>= 1)"));
    }
    auto check_list = [&](const IdList& l, const std::string& what) -> absl::Status {
      if (static_cast<int64_t>(l.offsets.size()) != b.size + 1 || l.offsets.front() != 0 ||
          l.offsets.back() != static_cast<int64_t>(l.ids.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, ".offsets must have batch size + 1 = ", b.size + 1,
            " entries from 0 to the id count ", l.ids.size()));
      }
      return absl::OkStatus();
    };
    for (size_t f = 0; f < b.id_lists.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(check_list(b.id_lists[f], schema.id_lists[f].name));
    }
    for (size_t f = 0; f < b.sequence.size(); ++f) {
      RECFLEET_RETURN_IF_ERROR(check_list(b.sequence[f], schema.sequence_fields[f].name));
      if (b.sequence[f].offsets != b.sequence[0].offsets) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence field ", schema.sequence_fields[f].name, " has offsets unlike field ",
            schema.sequence_fields[0].name, "; all fields of an event share them"));
      }
    }
    if (static_cast<int64_t>(b.dense.size()) != b.size * schema.num_dense) {
      return absl::InvalidArgumentError(absl::StrCat("batch.dense has ", b.dense.size(),
                                                     " values, expected size x num_dense = ",
                                                     b.size * schema.num_dense));
    }
    for (const std::vector<float>* labels : {&b.ctr_labels, &b.cvr_labels}) {
      if (!labels->empty() && static_cast<int64_t>(labels->size()) != b.size) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch labels have ", labels->size(), " entries, expected ", b.size));
      }
    }
    return absl::OkStatus();
  }

  // Where each feature's bags sit in its table's lookups (TableLookupsOf).
  struct BagLayout {
    std::vector<int64_t> feature_base;   // Per id-list feature.
    std::vector<int64_t> sequence_base;  // Per sequence field.
    std::vector<int64_t> bags;           // Per table.
  };
  BagLayout Bags(int64_t batch_size, int64_t tokens) const {
    BagLayout l;
    l.bags.assign(schema.tables.size(), 0);
    for (const auto& f : schema.id_lists) {
      l.feature_base.push_back(l.bags[f.table]);
      l.bags[f.table] += batch_size;
    }
    for (const auto& f : schema.sequence_fields) {
      l.sequence_base.push_back(l.bags[f.table]);
      l.bags[f.table] += tokens;
    }
    return l;
  }

  absl::Status CheckPooled(const Batch& b, absl::Span<const TensorView> pooled_in) const {
    if (storage != TableStorage::kExternal) {
      return absl::FailedPreconditionError("pooled rows given to a model that holds its own tables");
    }
    if (pooled_in.size() != schema.tables.size()) {
      return absl::InvalidArgumentError(absl::StrCat("pooled: ", pooled_in.size(), " tensors for ",
                                                     schema.tables.size(), " tables"));
    }
    const BagLayout l = Bags(b.size, b.sequence.empty() ? 0 : b.sequence[0].offsets.back());
    for (size_t t = 0; t < pooled_in.size(); ++t) {
      const TensorView& v = pooled_in[t];
      if (v.dtype != kDType<T> || v.device != Device::kCpu || v.shape.size() != 2 ||
          v.shape[0] != l.bags[t] || v.shape[1] != config.dim || (v.data == nullptr && l.bags[t] > 0)) {
        return absl::InvalidArgumentError(absl::StrCat("pooled[", t, "] (table ", schema.tables[t].name,
                                                       ") must be CPU [", l.bags[t], ", ", config.dim,
                                                       "] of the model's dtype"));
      }
    }
    return absl::OkStatus();
  }

  // Row `bag` of pooled[t].
  const T* PooledRow(int table, int64_t bag) const {
    return static_cast<const T*>(ext_pooled[table].data) + bag * config.dim;
  }

  absl::Status Forward(const Batch& b, absl::Span<const TensorView> pooled_in = {}) {
    RECFLEET_RETURN_IF_ERROR(CheckBatch(b));
    if (storage == TableStorage::kExternal || !pooled_in.empty()) {
      RECFLEET_RETURN_IF_ERROR(CheckPooled(b, pooled_in));
    }
    ext_pooled = pooled_in;
    fwd_linear_flops = 0;
    fwd_attention_flops = 0;
    const int64_t d = config.dim, B = b.size, F = num_tokens;
    batch = B;
    hist_off = b.sequence[0].offsets;
    total_len = hist_off.back();
    token_off = UniformOffsets(B, F);
    pma_off = UniformOffsets(B, config.pma_queries);

    // Sparse part: pooled id lists -> one token each.
    const BagLayout bags = Bags(B, total_len);
    pooled.resize(schema.id_lists.size());
    Resize(x_tokens, B * F * d);
    for (size_t f = 0; f < schema.id_lists.size(); ++f) {
      const FeatureSchema::IdListFeature& feat = schema.id_lists[f];
      Resize(pooled[f], B * d);
      if (storage == TableStorage::kExternal) {
        const std::vector<int64_t>& off = b.id_lists[f].offsets;
        for (int64_t s = 0; s < B; ++s) {
          const int64_t n = off[s + 1] - off[s];
          const T scale = feat.pooling == Pooling::kMean && n > 0 ? T(1) / T(n) : T(1);
          const T* row = PooledRow(feat.table, bags.feature_base[f] + s);
          for (int64_t c = 0; c < d; ++c) pooled[f][s * d + c] = row[c] * scale;
        }
      } else {
        JaggedView ids{MakeView(const_cast<int64_t*>(b.id_lists[f].ids.data()), DType::kInt64,
                                {static_cast<int64_t>(b.id_lists[f].ids.size())}),
                       OffsetsView(b.id_lists[f].offsets)};
        RECFLEET_RETURN_IF_ERROR(EmbeddingBagForward(tables[feat.table].value.view(), ids,
                                                     feat.pooling, View(pooled[f], {B, d})));
      }
      for (int64_t s = 0; s < B; ++s) {
        std::copy_n(&pooled[f][s * d], d, &x_tokens[(s * F + f) * d]);
      }
    }
    if (schema.num_dense > 0) {
      Resize(dense_in, B * schema.num_dense);
      std::copy(b.dense.begin(), b.dense.end(), dense_in.begin());
      RECFLEET_RETURN_IF_ERROR(LinF(dense_proj, dense_in, B, dense_tok));
      for (int64_t s = 0; s < B; ++s) {
        std::copy_n(&dense_tok[s * d], d, &x_tokens[(s * F + F - 1) * d]);
      }
    }

    // Sequence events -> tokens: the sum of their fields' embeddings.
    std::vector<T> h;
    Resize(h, total_len * d);
    std::vector<T> field;
    Resize(field, total_len * d);
    for (size_t f = 0; f < schema.sequence_fields.size() && total_len > 0; ++f) {
      const IdList& l = b.sequence[f];
      const int table = schema.sequence_fields[f].table;
      if (storage == TableStorage::kExternal) {
        std::copy_n(PooledRow(table, bags.sequence_base[f]), total_len * d, field.begin());
      } else {
        RECFLEET_RETURN_IF_ERROR(EmbeddingSequenceForward(
            tables[table].value.view(),
            MakeView(const_cast<int64_t*>(l.ids.data()), DType::kInt64, {total_len}),
            View(field, {total_len, d})));
      }
      AddInto(h, field);
    }

    // Sequence branch: pre-norm self-attention blocks with residuals.
    seq.resize(layers.size());
    const attention::AttentionOptions so = SeqOptions();
    for (size_t l = 0; l < layers.size(); ++l) {
      SeqActs& s = seq[l];
      s.h = h;
      Resize(s.a, total_len * d);
      Resize(s.rstd, total_len);
      RECFLEET_RETURN_IF_ERROR(NormF(layers[l].norm, s.h, s.a, s.rstd));
      RECFLEET_RETURN_IF_ERROR(LinF(layers[l].q, s.a, total_len, s.attn.q));
      RECFLEET_RETURN_IF_ERROR(LinF(layers[l].k, s.a, total_len, s.attn.k));
      RECFLEET_RETURN_IF_ERROR(LinF(layers[l].v, s.a, total_len, s.attn.v));
      RECFLEET_RETURN_IF_ERROR(AttnF(s.attn, hist_off, hist_off, so));
      std::vector<T> proj;
      RECFLEET_RETURN_IF_ERROR(LinF(layers[l].o, s.attn.out, total_len, proj));
      AddInto(h, proj);
    }
    h_last = std::move(h);
    Resize(hn, total_len * d);
    Resize(hn_rstd, total_len);
    RECFLEET_RETURN_IF_ERROR(NormF(final_norm, h_last, hn, hn_rstd));

    // Cross branch: tokens attend to the history (residual), PMA pools it.
    cross_out = x_tokens;
    if (config.cross_attention) {
      RECFLEET_RETURN_IF_ERROR(LinF(cross_q, x_tokens, B * F, cross.q));
      RECFLEET_RETURN_IF_ERROR(LinF(cross_k, hn, total_len, cross.k));
      RECFLEET_RETURN_IF_ERROR(LinF(cross_v, hn, total_len, cross.v));
      RECFLEET_RETURN_IF_ERROR(AttnF(cross, token_off, hist_off, PoolOptions()));
      std::vector<T> proj;
      RECFLEET_RETURN_IF_ERROR(LinF(cross_o, cross.out, B * F, proj));
      AddInto(cross_out, proj);
    }
    const int64_t P = config.pma_queries;
    if (P > 0) {
      Resize(pma.q, B * P * d);
      const T* queries = params[pma_queries].value.template data<T>();
      for (int64_t s = 0; s < B; ++s) std::copy_n(queries, P * d, &pma.q[s * P * d]);
      RECFLEET_RETURN_IF_ERROR(LinF(pma_k, hn, total_len, pma.k));
      RECFLEET_RETURN_IF_ERROR(LinF(pma_v, hn, total_len, pma.v));
      RECFLEET_RETURN_IF_ERROR(AttnF(pma, pma_off, hist_off, PoolOptions()));
      RECFLEET_RETURN_IF_ERROR(LinF(pma_o, pma.out, B * P, pma_out));
    }

    // Dense interaction: x0 = [cross tokens, PMA tokens] per sample.
    const int64_t D = interaction_dim;
    dcn_x.resize(dcn.size() + 1);
    dcn_u.resize(dcn.size());
    std::vector<T>& x0 = dcn_x[0];
    Resize(x0, B * D);
    for (int64_t s = 0; s < B; ++s) {
      std::copy_n(&cross_out[s * F * d], F * d, &x0[s * D]);
      if (P > 0) std::copy_n(&pma_out[s * P * d], P * d, &x0[s * D + F * d]);
    }
    for (size_t c = 0; c < dcn.size(); ++c) {
      RECFLEET_RETURN_IF_ERROR(LinF(dcn[c], dcn_x[c], B, dcn_u[c]));
      std::vector<T>& next = dcn_x[c + 1];
      Resize(next, B * D);
      for (int64_t i = 0; i < B * D; ++i) next[i] = x0[i] * dcn_u[c][i] + dcn_x[c][i];
    }
    const std::vector<T>& z = dcn_x.back();

    // Mixture of experts with a softmax gate.
    const int64_t E = config.num_experts, O = config.expert_out;
    RECFLEET_RETURN_IF_ERROR(LinF(gate, z, B, gate_logits));
    Resize(gate_prob, B * E);
    for (int64_t s = 0; s < B; ++s) {
      const T* g = &gate_logits[s * E];
      const T mx = *std::max_element(g, g + E);
      T sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += gate_prob[s * E + e] = std::exp(g[e] - mx);
      for (int64_t e = 0; e < E; ++e) gate_prob[s * E + e] /= sum;
    }
    expert_acts.resize(E);
    mix.assign(B * O, T(0));
    for (int64_t e = 0; e < E; ++e) {
      ExpertActs& ea = expert_acts[e];
      RECFLEET_RETURN_IF_ERROR(LinF(experts[e].l1, z, B, ea.h1));
      RECFLEET_RETURN_IF_ERROR(Act(ea.h1, ea.a1));
      RECFLEET_RETURN_IF_ERROR(LinF(experts[e].l2, ea.a1, B, ea.h2));
      RECFLEET_RETURN_IF_ERROR(Act(ea.h2, ea.a2));
      for (int64_t s = 0; s < B; ++s) {
        for (int64_t j = 0; j < O; ++j) mix[s * O + j] += gate_prob[s * E + e] * ea.a2[s * O + j];
      }
    }

    // CTR and CVR towers.
    for (int k = 0; k < kNumHeads; ++k) {
      TowerActs& ta = tower_acts[k];
      RECFLEET_RETURN_IF_ERROR(LinF(towers[k].l1, mix, B, ta.t));
      RECFLEET_RETURN_IF_ERROR(Act(ta.t, ta.a));
      RECFLEET_RETURN_IF_ERROR(LinF(towers[k].l2, ta.a, B, ta.logit));
    }
    return absl::OkStatus();
  }

  const std::vector<float>& Labels(const Batch& b, int head) const {
    return head == 0 ? b.ctr_labels : b.cvr_labels;
  }

  // Mean BCE of `head` and, when dlogit is given, its gradient w.r.t. the logits.
  absl::StatusOr<double> HeadLoss(const Batch& b, int head, std::vector<T>* dlogit) {
    const std::vector<float>& labels = Labels(b, head);
    const int64_t B = b.size;
    std::vector<T> y(labels.begin(), labels.end()), loss;
    Resize(loss, B);
    const TensorView z = View(tower_acts[head].logit, {B});
    RECFLEET_RETURN_IF_ERROR(BceWithLogitsForward(z, View(y, {B}), View(loss, {B})));
    double total = 0;
    for (T l : loss) total += l;
    if (dlogit != nullptr) {
      std::vector<T> scale(B, T(1) / static_cast<T>(B));
      Resize(*dlogit, B);
      RECFLEET_RETURN_IF_ERROR(
          BceWithLogitsBackward(z, View(y, {B}), View(scale, {B}), View(*dlogit, {B})));
    }
    return total / static_cast<double>(B);
  }

  // ---- backward --------------------------------------------------------------

  absl::Status Backward(const Batch& b, const std::vector<T> dlogits[kNumHeads],
                        const bool has_head[kNumHeads]) {
    for (Param& p : params) RECFLEET_RETURN_IF_ERROR(p.grad.SetZero());
    const int64_t d = config.dim, B = b.size, F = num_tokens, D = interaction_dim;
    const int64_t E = config.num_experts, O = config.expert_out, P = config.pma_queries;

    std::vector<T> dmix(B * O, T(0));
    for (int k = 0; k < kNumHeads; ++k) {
      if (!has_head[k]) continue;
      TowerActs& ta = tower_acts[k];
      std::vector<T> da;
      RECFLEET_RETURN_IF_ERROR(LinB(towers[k].l2, ta.a, dlogits[k], B, &da, false));
      RECFLEET_RETURN_IF_ERROR(ActB(ta.t, da));
      RECFLEET_RETURN_IF_ERROR(LinB(towers[k].l1, mix, da, B, &dmix, true));
    }

    // Mixture of experts.
    std::vector<T> dz(B * D, T(0));
    std::vector<T> dgate(B * E, T(0));
    for (int64_t e = 0; e < E; ++e) {
      ExpertActs& ea = expert_acts[e];
      std::vector<T> da2(B * O);
      for (int64_t s = 0; s < B; ++s) {
        T dot = 0;
        for (int64_t j = 0; j < O; ++j) {
          da2[s * O + j] = gate_prob[s * E + e] * dmix[s * O + j];
          dot += dmix[s * O + j] * ea.a2[s * O + j];
        }
        dgate[s * E + e] = dot;
      }
      RECFLEET_RETURN_IF_ERROR(ActB(ea.h2, da2));
      std::vector<T> da1;
      RECFLEET_RETURN_IF_ERROR(LinB(experts[e].l2, ea.a1, da2, B, &da1, false));
      RECFLEET_RETURN_IF_ERROR(ActB(ea.h1, da1));
      RECFLEET_RETURN_IF_ERROR(LinB(experts[e].l1, dcn_x.back(), da1, B, &dz, true));
    }
    std::vector<T> dgate_logits(B * E);
    for (int64_t s = 0; s < B; ++s) {
      T mean = 0;
      for (int64_t e = 0; e < E; ++e) mean += gate_prob[s * E + e] * dgate[s * E + e];
      for (int64_t e = 0; e < E; ++e) {
        dgate_logits[s * E + e] = gate_prob[s * E + e] * (dgate[s * E + e] - mean);
      }
    }
    RECFLEET_RETURN_IF_ERROR(LinB(gate, dcn_x.back(), dgate_logits, B, &dz, true));

    // DCN cross layers: x_{c+1} = x0 * u_c + x_c, u_c = W x_c + b.
    const std::vector<T>& x0 = dcn_x[0];
    std::vector<T> dx0(B * D, T(0));
    std::vector<T> dx = std::move(dz);
    for (int c = static_cast<int>(dcn.size()) - 1; c >= 0; --c) {
      std::vector<T> du(B * D);
      for (int64_t i = 0; i < B * D; ++i) {
        du[i] = dx[i] * x0[i];
        dx0[i] += dx[i] * dcn_u[c][i];
      }
      RECFLEET_RETURN_IF_ERROR(LinB(dcn[c], dcn_x[c], du, B, &dx, true));
    }
    AddInto(dx0, dx);

    // Split x0 back into cross tokens and PMA tokens.
    std::vector<T> dcross(B * F * d), dpma(B * P * d);
    for (int64_t s = 0; s < B; ++s) {
      std::copy_n(&dx0[s * D], F * d, &dcross[s * F * d]);
      if (P > 0) std::copy_n(&dx0[s * D + F * d], P * d, &dpma[s * P * d]);
    }

    std::vector<T> dhn(total_len * d, T(0));
    std::vector<T> dq, dk, dv;
    if (P > 0) {
      std::vector<T> dout;
      RECFLEET_RETURN_IF_ERROR(LinB(pma_o, pma.out, dpma, B * P, &dout, false));
      RECFLEET_RETURN_IF_ERROR(AttnB(pma, pma_off, hist_off, PoolOptions(), dout, dq, dk, dv));
      T* dqueries = params[pma_queries].grad.template data<T>();
      for (int64_t s = 0; s < B; ++s) {
        for (int64_t i = 0; i < P * d; ++i) dqueries[i] += dq[s * P * d + i];
      }
      RECFLEET_RETURN_IF_ERROR(LinB(pma_k, hn, dk, total_len, &dhn, true));
      RECFLEET_RETURN_IF_ERROR(LinB(pma_v, hn, dv, total_len, &dhn, true));
    }
    std::vector<T> dtokens = dcross;  // Residual path.
    if (config.cross_attention) {
      std::vector<T> dout;
      RECFLEET_RETURN_IF_ERROR(LinB(cross_o, cross.out, dcross, B * F, &dout, false));
      RECFLEET_RETURN_IF_ERROR(AttnB(cross, token_off, hist_off, PoolOptions(), dout, dq, dk, dv));
      RECFLEET_RETURN_IF_ERROR(LinB(cross_q, x_tokens, dq, B * F, &dtokens, true));
      RECFLEET_RETURN_IF_ERROR(LinB(cross_k, hn, dk, total_len, &dhn, true));
      RECFLEET_RETURN_IF_ERROR(LinB(cross_v, hn, dv, total_len, &dhn, true));
    }

    // Sequence branch, last layer first.
    std::vector<T> dh;
    RECFLEET_RETURN_IF_ERROR(NormB(final_norm, dhn, h_last, hn_rstd, dh));
    const attention::AttentionOptions so = SeqOptions();
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      SeqActs& s = seq[l];
      std::vector<T> dout, da;
      RECFLEET_RETURN_IF_ERROR(LinB(layers[l].o, s.attn.out, dh, total_len, &dout, false));
      RECFLEET_RETURN_IF_ERROR(AttnB(s.attn, hist_off, hist_off, so, dout, dq, dk, dv));
      RECFLEET_RETURN_IF_ERROR(LinB(layers[l].q, s.a, dq, total_len, &da, false));
      RECFLEET_RETURN_IF_ERROR(LinB(layers[l].k, s.a, dk, total_len, &da, true));
      RECFLEET_RETURN_IF_ERROR(LinB(layers[l].v, s.a, dv, total_len, &da, true));
      std::vector<T> dnorm_in;
      RECFLEET_RETURN_IF_ERROR(NormB(layers[l].norm, da, s.h, s.rstd, dnorm_in));
      AddInto(dh, dnorm_in);
    }

    // Tokens: numeric-feature projection and the pooled id lists.
    if (schema.num_dense > 0) {
      std::vector<T> ddense(B * d);
      for (int64_t s = 0; s < B; ++s) std::copy_n(&dtokens[(s * F + F - 1) * d], d, &ddense[s * d]);
      RECFLEET_RETURN_IF_ERROR(LinB(dense_proj, dense_in, ddense, B, nullptr, false));
    }
    CollectTableGradients(b, dtokens, dh);
    return absl::OkStatus();
  }

  void AddToGrad(Tensor& acc, const std::vector<T>& x) {
    T* a = acc.template data<T>();
    for (size_t i = 0; i < x.size(); ++i) a[i] += x[i];
  }

  // Expands the gradients of pooled and per-token lookups into one (id,
  // gradient row) list per table: a pooled id's row is its bag's gradient
  // (divided by the bag size for mean pooling).
  void CollectTableGradients(const Batch& b, const std::vector<T>& dtokens,
                             const std::vector<T>& dh) {
    const int64_t d = config.dim, F = num_tokens;
    if (storage == TableStorage::kExternal) {
      CollectPooledGradients(b, dtokens, dh);
      return;
    }
    for (TableState& t : tables) {
      t.grad_ids.clear();
      t.grad_rows.clear();
    }
    for (size_t f = 0; f < schema.id_lists.size(); ++f) {
      TableState& t = tables[schema.id_lists[f].table];
      const IdList& l = b.id_lists[f];
      for (int64_t s = 0; s < b.size; ++s) {
        const int64_t n = l.offsets[s + 1] - l.offsets[s];
        const T scale = schema.id_lists[f].pooling == Pooling::kMean && n > 0 ? T(1) / T(n) : T(1);
        for (int64_t i = l.offsets[s]; i < l.offsets[s + 1]; ++i) {
          t.grad_ids.push_back(l.ids[i]);
          const T* g = &dtokens[(s * F + f) * d];
          for (int64_t c = 0; c < d; ++c) t.grad_rows.push_back(g[c] * scale);
        }
      }
    }
    for (size_t f = 0; f < schema.sequence_fields.size(); ++f) {
      TableState& t = tables[schema.sequence_fields[f].table];
      const IdList& l = b.sequence[f];
      t.grad_ids.insert(t.grad_ids.end(), l.ids.begin(), l.ids.end());
      t.grad_rows.insert(t.grad_rows.end(), dh.begin(), dh.begin() + total_len * d);
    }
  }

  // External tables: one gradient row per looked-up bag, in TableLookupsOf
  // order (a mean-pooled bag's row sum was scaled by 1 / length forward, so
  // its gradient is too).
  void CollectPooledGradients(const Batch& b, const std::vector<T>& dtokens, const std::vector<T>& dh) {
    const int64_t d = config.dim, F = num_tokens;
    const BagLayout bags = Bags(b.size, total_len);
    ext_grads.resize(schema.tables.size());
    for (size_t t = 0; t < schema.tables.size(); ++t) Resize(ext_grads[t], bags.bags[t] * d);
    for (size_t f = 0; f < schema.id_lists.size(); ++f) {
      const int table = schema.id_lists[f].table;
      const std::vector<int64_t>& off = b.id_lists[f].offsets;
      for (int64_t s = 0; s < b.size; ++s) {
        const int64_t n = off[s + 1] - off[s];
        const T scale = schema.id_lists[f].pooling == Pooling::kMean && n > 0 ? T(1) / T(n) : T(1);
        const T* g = &dtokens[(s * F + f) * d];
        T* out = &ext_grads[table][(bags.feature_base[f] + s) * d];
        for (int64_t c = 0; c < d; ++c) out[c] = g[c] * scale;
      }
    }
    for (size_t f = 0; f < schema.sequence_fields.size(); ++f) {
      const int table = schema.sequence_fields[f].table;
      std::copy_n(dh.begin(), total_len * d, ext_grads[table].begin() + bags.sequence_base[f] * d);
    }
  }

  absl::Status AdagradStep(TableState& t, const TensorView& table, const TensorView& momentum,
                           float lr) {
    if (t.grad_ids.empty()) return absl::OkStatus();
    const int64_t n = static_cast<int64_t>(t.grad_ids.size());
    RowwiseAdagradConfig cfg;
    cfg.learning_rate = lr;
    cfg.eps = kAdagradEps;
    return EmbeddingSequenceBackwardAdagrad(View(t.grad_rows, {n, config.dim}),
                                            MakeView(t.grad_ids.data(), DType::kInt64, {n}), cfg,
                                            table, momentum);
  }

  absl::Status Update() {
    ++adam_step;
    AdamConfig adam;
    adam.lr = config.learning_rate;
    adam.weight_decay = config.weight_decay;
    for (Param& p : params) {
      RECFLEET_RETURN_IF_ERROR(
          AdamStep(adam, adam_step, p.value.view(), p.grad.view(), p.m.view(), p.v.view()));
    }
    for (TableState& t : tables) {
      RECFLEET_RETURN_IF_ERROR(AdagradStep(t, t.value.view(), t.momentum.view(),
                                           static_cast<float>(config.adagrad_learning_rate)));
    }
    return absl::OkStatus();
  }
};

template <typename T>
GemLite<T>::GemLite(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

template <typename T>
GemLite<T>::~GemLite() = default;

template <typename T>
absl::StatusOr<std::unique_ptr<GemLite<T>>> GemLite<T>::Create(const GemLiteConfig& config,
                                                               const FeatureSchema& schema,
                                                               TableStorage storage) {
  RECFLEET_RETURN_IF_ERROR(config.Validate());
  if (schema.sequence_fields.empty()) {
    return absl::InvalidArgumentError("schema needs at least one sequence field (the history)");
  }
  for (const FeatureSchema::Table& t : schema.tables) {
    if (t.rows < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t.name, " must have >= 1 rows, got ", t.rows));
    }
  }
  auto check_table = [&](int table, const std::string& feature) -> absl::Status {
    if (table < 0 || table >= static_cast<int>(schema.tables.size())) {
      return absl::InvalidArgumentError(absl::StrCat("feature ", feature, " names table ", table,
                                                     " of ", schema.tables.size()));
    }
    return absl::OkStatus();
  };
  for (const auto& f : schema.id_lists) RECFLEET_RETURN_IF_ERROR(check_table(f.table, f.name));
  for (const auto& f : schema.sequence_fields) RECFLEET_RETURN_IF_ERROR(check_table(f.table, f.name));
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->schema = schema;
  impl->storage = storage;
  impl->Build();
  return std::unique_ptr<GemLite<T>>(new GemLite<T>(std::move(impl)));
}

template <typename T>
absl::StatusOr<StepResult> GemLite<T>::ForwardBackward(const Batch& batch) {
  return ForwardBackward(batch, {});
}

template <typename T>
absl::StatusOr<StepResult> GemLite<T>::ForwardBackward(const Batch& batch,
                                                       absl::Span<const TensorView> pooled) {
  Impl& m = *impl_;
  RECFLEET_RETURN_IF_ERROR(m.Forward(batch, pooled));
  StepResult r;
  std::vector<T> dlogits[kNumHeads];
  bool has_head[kNumHeads];
  for (int k = 0; k < kNumHeads; ++k) {
    has_head[k] = !m.Labels(batch, k).empty();
    if (!has_head[k]) continue;
    absl::StatusOr<double> loss = m.HeadLoss(batch, k, &dlogits[k]);
    if (!loss.ok()) return loss.status();
    (k == 0 ? r.ctr_loss : r.cvr_loss) = *loss;
  }
  if (!has_head[0] && !has_head[1]) {
    return absl::InvalidArgumentError("batch has neither CTR nor CVR labels");
  }
  RECFLEET_RETURN_IF_ERROR(m.Backward(batch, dlogits, has_head));
  r.flops = 3.0 * m.fwd_linear_flops + 3.5 * m.fwd_attention_flops;
  return r;
}

template <typename T>
absl::Status GemLite<T>::ApplyUpdates() {
  return impl_->Update();
}

template <typename T>
absl::StatusOr<std::unique_ptr<GemLite<T>>> GemLite<T>::Clone() const {
  absl::StatusOr<std::unique_ptr<GemLite<T>>> copy = Create(impl_->config, impl_->schema, impl_->storage);
  if (!copy.ok()) return copy.status();
  RECFLEET_RETURN_IF_ERROR((*copy)->CopyParametersFrom(*this));
  return copy;
}

template <typename T>
void GemLite<T>::ScaleGradients(double weight) {
  const T w = static_cast<T>(weight);
  for (auto& p : impl_->params) {
    T* g = p.grad.template data<T>();
    for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= w;
  }
  for (auto& t : impl_->tables) {
    for (T& g : t.grad_rows) g *= w;
  }
}

template <typename T>
absl::Status GemLite<T>::AddGradients(const GemLite& replica, double weight) {
  const Impl& r = *replica.impl_;
  if (r.params.size() != impl_->params.size() || r.tables.size() != impl_->tables.size()) {
    return absl::InvalidArgumentError("AddGradients: replica has a different architecture");
  }
  const T w = static_cast<T>(weight);
  for (size_t k = 0; k < r.params.size(); ++k) {
    T* g = impl_->params[k].grad.template data<T>();
    const T* rg = r.params[k].grad.template data<T>();
    for (int64_t i = 0; i < r.params[k].grad.numel(); ++i) g[i] += w * rg[i];
  }
  for (size_t k = 0; k < r.tables.size(); ++k) {
    auto& t = impl_->tables[k];
    t.grad_ids.insert(t.grad_ids.end(), r.tables[k].grad_ids.begin(), r.tables[k].grad_ids.end());
    for (T g : r.tables[k].grad_rows) t.grad_rows.push_back(w * g);
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status GemLite<T>::CopyParametersFrom(const GemLite& primary) {
  const Impl& p = *primary.impl_;
  if (p.params.size() != impl_->params.size() || p.tables.size() != impl_->tables.size()) {
    return absl::InvalidArgumentError("CopyParametersFrom: different architecture");
  }
  for (size_t k = 0; k < p.params.size(); ++k) {
    std::copy_n(p.params[k].value.template data<T>(), p.params[k].value.numel(),
                impl_->params[k].value.template data<T>());
  }
  for (size_t k = 0; k < p.tables.size(); ++k) {
    std::copy_n(p.tables[k].value.template data<T>(), p.tables[k].value.numel(),
                impl_->tables[k].value.template data<T>());
  }
  return absl::OkStatus();
}

template <typename T>
absl::StatusOr<std::vector<TableLookups>> GemLite<T>::TableLookupsOf(const Batch& batch) const {
  const Impl& m = *impl_;
  RECFLEET_RETURN_IF_ERROR(m.CheckBatch(batch));
  const int64_t tokens = batch.sequence[0].offsets.back();
  std::vector<TableLookups> out(m.schema.tables.size());
  for (TableLookups& l : out) l.offsets.push_back(0);
  for (size_t f = 0; f < m.schema.id_lists.size(); ++f) {
    TableLookups& l = out[m.schema.id_lists[f].table];
    const IdList& list = batch.id_lists[f];
    const int64_t base = static_cast<int64_t>(l.ids.size());
    l.ids.insert(l.ids.end(), list.ids.begin(), list.ids.end());
    for (int64_t s = 1; s <= batch.size; ++s) l.offsets.push_back(base + list.offsets[s]);
  }
  for (size_t f = 0; f < m.schema.sequence_fields.size(); ++f) {
    TableLookups& l = out[m.schema.sequence_fields[f].table];
    const IdList& list = batch.sequence[f];
    l.ids.insert(l.ids.end(), list.ids.begin(), list.ids.begin() + tokens);
    for (int64_t i = 0; i < tokens; ++i) l.offsets.push_back(l.offsets.back() + 1);
  }
  return out;
}

template <typename T>
std::vector<TensorView> GemLite<T>::PooledGradients() {
  std::vector<TensorView> out;
  for (const std::vector<T>& g : impl_->ext_grads) {
    out.push_back(View(g, {static_cast<int64_t>(g.size()) / impl_->config.dim, impl_->config.dim}));
  }
  return out;
}

template <typename T>
absl::StatusOr<std::vector<double>> GemLite<T>::Predict(const Batch& batch, Head head,
                                                        absl::Span<const TensorView> pooled) {
  RECFLEET_RETURN_IF_ERROR(impl_->Forward(batch, pooled));
  const std::vector<T>& z = impl_->tower_acts[static_cast<int>(head)].logit;
  return std::vector<double>(z.begin(), z.begin() + batch.size);
}

template <typename T>
absl::StatusOr<std::vector<double>> GemLite<T>::Predict(const Batch& batch, Head head) {
  RECFLEET_RETURN_IF_ERROR(impl_->Forward(batch));
  const std::vector<T>& z = impl_->tower_acts[static_cast<int>(head)].logit;
  return std::vector<double>(z.begin(), z.begin() + batch.size);
}

template <typename T>
absl::StatusOr<double> GemLite<T>::Loss(const Batch& batch) {
  RECFLEET_RETURN_IF_ERROR(impl_->Forward(batch));
  double total = 0;
  for (int k = 0; k < kNumHeads; ++k) {
    if (impl_->Labels(batch, k).empty()) continue;
    absl::StatusOr<double> loss = impl_->HeadLoss(batch, k, nullptr);
    if (!loss.ok()) return loss.status();
    total += *loss;
  }
  return total;
}

template <typename T>
std::vector<std::string> GemLite<T>::DenseParameterNames() const {
  std::vector<std::string> names;
  for (const auto& p : impl_->params) names.push_back(p.name);
  return names;
}

template <typename T>
TensorView GemLite<T>::DenseParameter(const std::string& name) {
  auto it = impl_->param_index.find(name);
  return it == impl_->param_index.end() ? TensorView() : impl_->params[it->second].value.view();
}

template <typename T>
TensorView GemLite<T>::DenseGradient(const std::string& name) {
  auto it = impl_->param_index.find(name);
  return it == impl_->param_index.end() ? TensorView() : impl_->params[it->second].grad.view();
}

template <typename T>
int GemLite<T>::num_tables() const {
  return static_cast<int>(impl_->tables.size());
}

template <typename T>
TensorView GemLite<T>::Table(int table) {
  return impl_->tables[table].value.view();
}

// One rowwise-Adagrad step with learning rate 1 from zero momentum moves a
// touched row by -g / (sqrt(mean(g^2)) + eps) and leaves mean(g^2) in the
// momentum, so g = -delta * (sqrt(momentum) + eps) exactly recovers the
// summed gradient through the same kernel the training step uses.
template <typename T>
absl::StatusOr<Tensor> GemLite<T>::DenseTableGradient(int table) {
  typename Impl::TableState& t = impl_->tables[table];
  absl::StatusOr<Tensor> moved = t.value.Clone();
  if (!moved.ok()) return moved.status();
  Tensor momentum = Tensor::HostZeros(kDType<T>, {t.value.dim(0)});
  RECFLEET_RETURN_IF_ERROR(impl_->AdagradStep(t, moved->view(), momentum.view(), 1.0f));
  const int64_t rows = t.value.dim(0), d = t.value.dim(1);
  Tensor grad = Tensor::HostZeros(kDType<T>, {rows, d});
  const T* before = t.value.template data<T>();
  const T* after = moved->template data<T>();
  const T* mom = momentum.template data<T>();
  T* g = grad.template data<T>();
  for (int64_t r = 0; r < rows; ++r) {
    const T denom = std::sqrt(mom[r]) + static_cast<T>(kAdagradEps);
    for (int64_t c = 0; c < d; ++c) g[r * d + c] = -(after[r * d + c] - before[r * d + c]) * denom;
  }
  return grad;
}

template <typename T>
int64_t GemLite<T>::num_dense_parameters() const {
  int64_t n = 0;
  for (const auto& p : impl_->params) n += p.value.numel();
  return n;
}

template <typename T>
int64_t GemLite<T>::num_table_parameters() const {
  int64_t n = 0;
  for (const auto& t : impl_->tables) n += t.value.numel();
  return n;
}

template class GemLite<float>;
template class GemLite<double>;

}  // namespace recfleet::engine
