#include "worker/job_model.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace recfleet::worker {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " ", problem));
}

absl::StatusOr<attention::Mask> MaskOf(const v1::AttentionSpec& a) {
  switch (a.kind()) {
    case v1::AttentionSpec::KIND_UNSPECIFIED:
    case v1::AttentionSpec::FULL:
      return attention::Mask::kNone;
    case v1::AttentionSpec::SLIDING_WINDOW:
      return attention::Mask::kSlidingWindow;
    case v1::AttentionSpec::BLOCK:
      return attention::Mask::kBlock;
    default:
      return Bad("model.sequence.attention.kind", absl::StrCat("must be FULL, SLIDING_WINDOW or BLOCK, got ", a.kind()));
  }
}

attention::Activation AttentionActivationOf(const v1::AttentionSpec& a) {
  switch (a.activation()) {
    case v1::AttentionSpec::GELU:
      return attention::Activation::kGelu;
    case v1::AttentionSpec::SILU:
      return attention::Activation::kSilu;
    default:
      return attention::Activation::kSoftmax;
  }
}

absl::StatusOr<Activation> MlpActivationOf(const std::string& name, absl::string_view field) {
  if (name.empty() || name == "relu") return Activation::kRelu;
  if (name == "gelu") return Activation::kGelu;
  if (name == "silu") return Activation::kSilu;
  return Bad(field, absl::StrCat("must be relu, gelu or silu, got '", name, "'"));
}

}  // namespace

absl::StatusOr<JobModel> JobModelFromSpec(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  JobModel out;
  engine::GemLiteConfig& c = out.config;
  std::map<std::string, int> table_index;
  if (m.tables_size() == 0) return Bad("model.tables", "must list at least one table");
  for (int i = 0; i < m.tables_size(); ++i) {
    const v1::EmbeddingTable& t = m.tables(i);
    if (t.rows() < 1) return Bad(absl::StrCat("model.tables[", i, "].rows"), absl::StrCat("must be > 0, got ", t.rows()));
    if (t.dim() != m.tables(0).dim()) {
      return Bad(absl::StrCat("model.tables[", i, "].dim"),
                 absl::StrCat("must equal tables[0].dim (", m.tables(0).dim(),
                              "): GEM-lite uses one embedding width, got ", t.dim()));
    }
    table_index[t.name()] = i;
    out.schema.tables.push_back({t.name(), t.rows()});
  }
  c.dim = m.tables(0).dim();
  for (int i = 0; i < m.features_size(); ++i) {
    const v1::Feature& f = m.features(i);
    const std::string field = absl::StrCat("model.features[", i, "]");
    if (f.kind() == v1::Feature::NUMERIC) {
      if (f.width() < 1) return Bad(field + ".width", absl::StrCat("must be > 0 for NUMERIC, got ", f.width()));
      out.numeric_columns.push_back({f.name(), f.width()});
      out.schema.num_dense += f.width();
      continue;
    }
    auto it = table_index.find(f.table());
    if (it == table_index.end()) {
      return Bad(field + ".table", absl::StrCat("must name one of spec.model.tables, got '", f.table(), "'"));
    }
    switch (f.kind()) {
      case v1::Feature::ID_LIST:
      case v1::Feature::CANDIDATE:
        out.schema.id_lists.push_back(
            {f.name(), it->second, f.pooling() == v1::MEAN ? Pooling::kMean : Pooling::kSum});
        out.id_list_columns.push_back(f.name());
        break;
      case v1::Feature::SEQUENCE:
        if (!out.sequence_max_length.empty() && f.max_length() != out.sequence_max_length[0]) {
          return Bad(field + ".max_length",
                     absl::StrCat("must equal the first SEQUENCE feature's (", out.sequence_max_length[0],
                                  "): the fields of one event share its length, got ", f.max_length()));
        }
        out.schema.sequence_fields.push_back({f.name(), it->second});
        out.sequence_columns.push_back(f.name());
        out.sequence_max_length.push_back(f.max_length());
        break;
      default:
        return Bad(field + ".kind", "must be NUMERIC, ID_LIST, SEQUENCE or CANDIDATE");
    }
  }
  if (out.sequence_columns.empty()) {
    return Bad("model.features", "must include a SEQUENCE feature (GEM-lite's history)");
  }

  if (m.has_sequence()) {
    const v1::SequenceBranch& s = m.sequence();
    c.seq_layers = s.num_layers();
    if (s.model_dim() != 0 && s.model_dim() != c.dim) {
      return Bad("model.sequence.model_dim",
                 absl::StrCat("must equal the table dim ", c.dim, " (GEM-lite has one width), got ", s.model_dim()));
    }
    if (s.num_heads() > 0) c.heads = s.num_heads();
    absl::StatusOr<attention::Mask> mask = MaskOf(s.attention());
    if (!mask.ok()) return mask.status();
    c.seq_mask = *mask;
    if (s.attention().window() > 0) c.seq_window = s.attention().window();
    c.seq_activation = AttentionActivationOf(s.attention());
    c.rope = s.attention().rope();
    c.qk_norm = s.attention().qk_norm();
  } else {
    c.seq_layers = 0;
  }
  c.cross_attention = m.has_cross() && m.cross().num_cross_layers() > 0;
  c.pma_queries = m.has_cross() ? m.cross().pma_queries() : 0;
  // GEM-lite's dense part is DCN layers, then a gated mixture of expert
  // MLPs: a MoE module sizes the experts; without one, the first MLP module
  // becomes a single expert.
  c.dcn_layers = 0;
  bool have_moe = false, have_mlp = false;
  for (int i = 0; i < m.dense_size(); ++i) {
    const v1::DenseModule& d = m.dense(i);
    const std::string field = absl::StrCat("model.dense[", i, "]");
    if (d.has_dcn()) {
      c.dcn_layers += d.dcn().num_layers();
    } else if (d.has_moe() && !have_moe) {
      const auto& dims = d.moe().expert_hidden_dims();
      if (dims.empty()) return Bad(field + ".moe.expert_hidden_dims", "must list at least one width");
      have_moe = true;
      c.num_experts = d.moe().num_experts();
      c.expert_hidden = dims[0];
      c.expert_out = dims[dims.size() - 1];
    } else if (d.has_mlp() && !have_mlp) {
      const auto& dims = d.mlp().hidden_dims();
      if (dims.empty()) return Bad(field + ".mlp.hidden_dims", "must list at least one width");
      have_mlp = true;
      absl::StatusOr<Activation> act = MlpActivationOf(d.mlp().activation(), field + ".mlp.activation");
      if (!act.ok()) return act.status();
      c.mlp_activation = *act;
      if (!have_moe) {
        c.num_experts = 1;
        c.expert_hidden = dims[0];
        c.expert_out = dims[dims.size() - 1];
      }
    }
  }
  for (int i = 0; i < m.heads_size(); ++i) {
    const v1::Head& h = m.heads(i);
    const std::string field = absl::StrCat("model.heads[", i, "]");
    if (h.label().empty()) return Bad(field + ".label", "must name the dataset's label column");
    if (h.hidden_dims_size() > 0) c.tower_hidden = h.hidden_dims(0);
    if (h.kind() == v1::Head::CTR) {
      out.ctr_label = h.label();
    } else if (h.kind() == v1::Head::CVR) {
      out.cvr_label = h.label();
    } else {
      return Bad(field + ".kind", "must be CTR or CVR");
    }
  }
  if (out.ctr_label.empty() && out.cvr_label.empty()) return Bad("model.heads", "must have a CTR or CVR head");
  const v1::TrainingSpec& t = spec.training();
  if (t.dense_learning_rate() > 0) c.learning_rate = t.dense_learning_rate();
  if (t.sparse_learning_rate() > 0) c.adagrad_learning_rate = t.sparse_learning_rate();
  c.seed = t.seed();
  if (absl::Status s = c.Validate(); !s.ok()) return Bad("model", std::string(s.message()));
  return out;
}

absl::StatusOr<BatchConverter> BatchConverter::Create(const JobModel& model, const data::Schema& dataset) {
  BatchConverter conv;
  auto missing = [&](const std::string& name, absl::string_view form) {
    return absl::FailedPreconditionError(absl::StrCat("the dataset has no column '", name, "' as ", form,
                                                      " (the job spec's model reads it); dataset columns:\n",
                                                      dataset.DebugString()));
  };
  auto bind_ids = [&](const std::string& name, int table, int max_length) -> absl::StatusOr<IdColumn> {
    const int c = dataset.Find(name);
    if (c < 0 || dataset.features[c].dtype != data::DType::kInt64) {
      return missing(name, "int64 ids (scalar or jagged)");
    }
    return IdColumn{c, dataset.features[c].layout == data::Layout::kJagged, model.schema.tables[table].rows,
                    max_length};
  };
  for (size_t i = 0; i < model.id_list_columns.size(); ++i) {
    absl::StatusOr<IdColumn> col = bind_ids(model.id_list_columns[i], model.schema.id_lists[i].table, 0);
    if (!col.ok()) return col.status();
    conv.id_lists_.push_back(*col);
  }
  for (size_t i = 0; i < model.sequence_columns.size(); ++i) {
    absl::StatusOr<IdColumn> col =
        bind_ids(model.sequence_columns[i], model.schema.sequence_fields[i].table, model.sequence_max_length[i]);
    if (!col.ok()) return col.status();
    if (!col->jagged) return missing(model.sequence_columns[i], "a jagged int64 event sequence");
    conv.sequence_.push_back(*col);
  }
  for (const auto& [name, width] : model.numeric_columns) {
    const data::Layout layout = width == 1 ? data::Layout::kScalar : data::Layout::kJagged;
    absl::StatusOr<int> c = dataset.Require(name, data::DType::kFloat32, layout);
    if (!c.ok()) return absl::FailedPreconditionError(c.status().message());
    conv.numeric_.push_back({*c, width});
    conv.num_dense_ += width;
  }
  auto bind_label = [&](const std::string& name, int* out) -> absl::Status {
    if (name.empty()) return absl::OkStatus();
    const int c = dataset.Find(name);
    if (c < 0 || dataset.features[c].layout != data::Layout::kScalar) return missing(name, "a scalar label");
    *out = c;
    return absl::OkStatus();
  };
  if (absl::Status s = bind_label(model.ctr_label, &conv.ctr_label_); !s.ok()) return s;
  if (absl::Status s = bind_label(model.cvr_label, &conv.cvr_label_); !s.ok()) return s;
  const int sid = dataset.Find("sample_id");
  if (sid >= 0 && dataset.features[sid].dtype == data::DType::kInt64 &&
      dataset.features[sid].layout == data::Layout::kScalar) {
    conv.sample_id_ = sid;
  }
  return conv;
}

engine::Batch BatchConverter::Convert(const data::Batch& source, absl::Span<const int64_t> rows) const {
  engine::Batch b;
  b.size = static_cast<int64_t>(rows.size());
  auto label = [&](int c, int64_t row) {
    const data::FeatureSpec& f = source.schema().features[c];
    return f.dtype == data::DType::kFloat32 ? source.Float(c, row) : static_cast<float>(source.Int64(c, row));
  };
  std::vector<int64_t> ids;
  auto gather = [&](const IdColumn& col, int64_t row) {
    ids.clear();
    if (!col.jagged) {
      ids.push_back(source.Int64(col.column, row));
    } else {
      const size_t n = source.RowLength(col.column, row);
      const size_t keep = col.max_length > 0 ? std::min<size_t>(n, col.max_length) : n;
      const int64_t* v = source.JaggedInt64(col.column, row) + (n - keep);
      ids.assign(v, v + keep);
    }
    for (int64_t& id : ids) id = ((id % col.rows) + col.rows) % col.rows;
  };
  b.id_lists.resize(id_lists_.size());
  b.sequence.resize(sequence_.size());
  b.dense.reserve(rows.size() * num_dense_);
  for (int64_t row : rows) {
    for (size_t i = 0; i < id_lists_.size(); ++i) {
      gather(id_lists_[i], row);
      b.id_lists[i].Append(ids);
    }
    for (size_t i = 0; i < sequence_.size(); ++i) {
      gather(sequence_[i], row);
      b.sequence[i].Append(ids);
    }
    for (const NumericColumn& n : numeric_) {
      if (n.width == 1) {
        b.dense.push_back(source.Float(n.column, row));
      } else {
        const float* v = source.JaggedFloat(n.column, row);
        const size_t len = source.RowLength(n.column, row);
        for (int k = 0; k < n.width; ++k) b.dense.push_back(k < static_cast<int>(len) ? v[k] : 0.0f);
      }
    }
    if (ctr_label_ >= 0) b.ctr_labels.push_back(label(ctr_label_, row));
    if (cvr_label_ >= 0) b.cvr_labels.push_back(label(cvr_label_, row));
  }
  return b;
}

engine::Batch BatchConverter::ConvertAll(const data::Batch& source) const {
  std::vector<int64_t> rows(source.num_rows());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  return Convert(source, rows);
}

int64_t BatchConverter::SampleId(const data::Batch& source, int64_t row) const {
  return sample_id_ >= 0 ? source.Int64(sample_id_, row) : -1;
}

}  // namespace recfleet::worker
