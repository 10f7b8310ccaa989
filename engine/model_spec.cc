#include "engine/model_spec.h"

#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace recfleet::engine {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

absl::Status Unsupported(const std::string& field, const std::string& what) {
  return absl::UnimplementedError(absl::StrCat(field, ": ", what, " is not built by GEM-lite yet"));
}

absl::Status Attention(const v1::AttentionSpec& a, const std::string& field, GemLiteConfig* c) {
  switch (a.kind()) {
    case v1::AttentionSpec::KIND_UNSPECIFIED:
    case v1::AttentionSpec::FULL:
      c->seq_mask = attention::Mask::kNone;
      break;
    case v1::AttentionSpec::SLIDING_WINDOW:
      if (a.window() <= 0) return Bad(field + ".window", "must be > 0 for SLIDING_WINDOW");
      c->seq_mask = attention::Mask::kSlidingWindow;
      c->seq_window = a.window();
      break;
    case v1::AttentionSpec::BLOCK:
      if (a.block_size() != 0 && a.block_size() != attention::kAttentionBlockSize) {
        return Unsupported(field + ".block_size", absl::StrCat("block size ", a.block_size()));
      }
      c->seq_mask = attention::Mask::kBlock;
      break;
    default:
      return Bad(field + ".kind", "is not a known kind");
  }
  switch (a.activation()) {
    case v1::AttentionSpec::ACTIVATION_UNSPECIFIED:
    case v1::AttentionSpec::SOFTMAX:
      c->seq_activation = attention::Activation::kSoftmax;
      break;
    case v1::AttentionSpec::GELU:
      c->seq_activation = attention::Activation::kGelu;
      break;
    case v1::AttentionSpec::SILU:
      c->seq_activation = attention::Activation::kSilu;
      break;
    default:
      return Bad(field + ".activation", "is not a known activation");
  }
  if (a.bias()) return Unsupported(field + ".bias", "a learned attention bias");
  c->rope = a.rope();
  c->qk_norm = a.qk_norm();
  return absl::OkStatus();
}

}  // namespace

absl::Status FromModelSpec(const v1::ModelSpec& spec, const v1::TrainingSpec& training,
                           FeatureSchema* schema, GemLiteConfig* config) {
  *schema = FeatureSchema();
  GemLiteConfig c;
  if (!spec.has_sequence()) return Unsupported("model.sequence", "a model without a sequence branch");
  const v1::SequenceBranch& seq = spec.sequence();
  c.dim = seq.model_dim();
  c.heads = seq.num_heads();
  c.seq_layers = seq.num_layers();
  if (c.seq_layers <= 0) return Bad("model.sequence.num_layers", "must be > 0");
  RECFLEET_RETURN_IF_ERROR(Attention(seq.attention(), "model.sequence.attention", &c));

  absl::flat_hash_map<std::string, int> tables;
  for (int i = 0; i < spec.tables_size(); ++i) {
    const v1::EmbeddingTable& t = spec.tables(i);
    const std::string field = absl::StrCat("model.tables[", i, "]");
    if (t.rows() <= 0) return Bad(field + ".rows", "must be > 0");
    if (t.dim() != c.dim) {
      return Unsupported(field + ".dim", absl::StrCat("dim ", t.dim(), " unlike model.sequence.model_dim ",
                                                      c.dim, " (one token width)"));
    }
    if (t.learning_rate() != 0) return Unsupported(field + ".learning_rate", "a per-table learning rate");
    if (!tables.emplace(t.name(), i).second) return Bad(field + ".name", "is not unique");
    schema->tables.push_back({t.name(), t.rows()});
  }
  absl::flat_hash_map<std::string, int> sequence_features;
  for (int i = 0; i < spec.features_size(); ++i) {
    const v1::Feature& f = spec.features(i);
    const std::string field = absl::StrCat("model.features[", i, "]");
    int table = -1;
    if (f.kind() != v1::Feature::NUMERIC) {
      auto it = tables.find(f.table());
      if (it == tables.end()) return Bad(field + ".table", absl::StrCat("names no table: '", f.table(), "'"));
      table = it->second;
    }
    switch (f.kind()) {
      case v1::Feature::NUMERIC:
        if (f.width() <= 0) return Bad(field + ".width", "must be > 0");
        schema->num_dense += f.width();
        break;
      case v1::Feature::ID_LIST:
      case v1::Feature::CANDIDATE:
        schema->id_lists.push_back(
            {f.name(), table, f.pooling() == v1::MEAN ? Pooling::kMean : Pooling::kSum});
        break;
      case v1::Feature::SEQUENCE:
        sequence_features[f.name()] = table;
        break;
      default:
        return Bad(field + ".kind", "must be NUMERIC, ID_LIST, SEQUENCE or CANDIDATE");
    }
  }
  if (seq.features_size() == 0) return Bad("model.sequence.features", "must name at least one feature");
  for (int i = 0; i < seq.features_size(); ++i) {
    auto it = sequence_features.find(seq.features(i));
    if (it == sequence_features.end()) {
      return Bad(absl::StrCat("model.sequence.features[", i, "]"),
                 absl::StrCat("names no SEQUENCE feature: '", seq.features(i), "'"));
    }
    schema->sequence_fields.push_back({seq.features(i), it->second});
  }

  const v1::CrossBranch& cross = spec.cross();
  if (cross.num_cross_layers() > 1) {
    return Unsupported("model.cross.num_cross_layers", "more than one cross-attention layer");
  }
  c.cross_attention = cross.num_cross_layers() == 1;
  c.pma_queries = cross.pma_queries();
  if ((c.cross_attention || c.pma_queries > 0) && cross.num_heads() != c.heads) {
    return Unsupported("model.cross.num_heads", "a head count unlike model.sequence.num_heads");
  }
  const v1::AttentionSpec& ca = cross.attention();
  if ((ca.activation() != v1::AttentionSpec::ACTIVATION_UNSPECIFIED &&
       ca.activation() != v1::AttentionSpec::SOFTMAX) ||
      ca.qk_norm() || ca.bias() || ca.rope()) {
    return Unsupported("model.cross.attention", "anything but plain softmax cross-attention");
  }

  c.dcn_layers = 0;
  bool have_moe = false;
  for (int i = 0; i < spec.dense_size(); ++i) {
    const v1::DenseModule& m = spec.dense(i);
    const std::string field = absl::StrCat("model.dense[", i, "]");
    if (m.has_dcn()) {
      if (have_moe || c.dcn_layers > 0) return Unsupported(field, "a DCN module other than one before the MoE");
      if (m.dcn().num_layers() <= 0) return Bad(field + ".dcn.num_layers", "must be > 0");
      if (m.dcn().low_rank() != 0) return Unsupported(field + ".dcn.low_rank", "low-rank DCN");
      c.dcn_layers = m.dcn().num_layers();
    } else if (m.has_moe()) {
      if (have_moe) return Unsupported(field, "a second MoE module");
      const v1::MoeSpec& moe = m.moe();
      if (moe.num_experts() < 2) return Bad(field + ".moe.num_experts", "must be >= 2");
      if (moe.top_k() != 0 && moe.top_k() != moe.num_experts()) {
        return Unsupported(field + ".moe.top_k", "sparse top-k routing (GEM-lite gates all experts)");
      }
      if (moe.expert_hidden_dims_size() != 2) {
        return Unsupported(field + ".moe.expert_hidden_dims", "experts other than two layers");
      }
      c.num_experts = moe.num_experts();
      c.expert_hidden = moe.expert_hidden_dims(0);
      c.expert_out = moe.expert_hidden_dims(1);
      have_moe = true;
    } else if (m.has_mlp()) {
      return Unsupported(field + ".mlp", "a standalone MLP module");
    } else {
      return Bad(field, "sets no module");
    }
  }
  if (!have_moe) return Unsupported("model.dense", "a model without a mixture of experts");

  if (spec.heads_size() == 0) return Bad("model.heads", "must hold at least one head");
  int64_t tower = -1;
  for (int i = 0; i < spec.heads_size(); ++i) {
    const v1::Head& h = spec.heads(i);
    const std::string field = absl::StrCat("model.heads[", i, "]");
    if (h.kind() != v1::Head::CTR && h.kind() != v1::Head::CVR) return Bad(field + ".kind", "must be CTR or CVR");
    if (h.hidden_dims_size() != 1) return Unsupported(field + ".hidden_dims", "towers other than one hidden layer");
    if (tower >= 0 && h.hidden_dims(0) != tower) return Unsupported(field + ".hidden_dims", "towers of different widths");
    if (h.loss_weight() != 0 && h.loss_weight() != 1) return Unsupported(field + ".loss_weight", "a loss weight other than 1");
    tower = h.hidden_dims(0);
  }
  c.tower_hidden = tower;
  if (training.dense_learning_rate() > 0) c.learning_rate = training.dense_learning_rate();
  if (training.sparse_learning_rate() > 0) c.adagrad_learning_rate = training.sparse_learning_rate();
  c.seed = training.seed();
  RECFLEET_RETURN_IF_ERROR(c.Validate());
  *config = c;
  return absl::OkStatus();
}

}  // namespace recfleet::engine
