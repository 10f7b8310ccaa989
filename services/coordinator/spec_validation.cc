#include "services/coordinator/spec_validation.h"

#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace recfleet::coordinator {
namespace {

using ::recfleet::v1::AttentionSpec;
using ::recfleet::v1::DenseModule;
using ::recfleet::v1::Feature;
using ::recfleet::v1::Head;
using ::recfleet::v1::JobSpec;

std::string Quote(const std::string& s) { return absl::StrCat("\"", s, "\""); }

// Collects violations; each helper checks one rule on one field.
class Checker {
 public:
  void Add(const std::string& path, const std::string& rule, const std::string& got) {
    errors_.emplace_back(path, absl::StrCat(rule, ", got ", got));
  }
  template <typename T>
  void Positive(const std::string& path, T v) {
    if (!(v > 0)) Add(path, "must be > 0", absl::StrCat(v));
  }
  template <typename T>
  void NonNegative(const std::string& path, T v) {
    if (!(v >= 0)) Add(path, "must be >= 0", absl::StrCat(v));
  }
  void FiniteNonNegative(const std::string& path, double v) {
    if (!std::isfinite(v) || v < 0) Add(path, "must be a finite number >= 0", absl::StrCat(v));
  }
  void FinitePositive(const std::string& path, double v) {
    if (!std::isfinite(v) || v <= 0) Add(path, "must be a finite number > 0", absl::StrCat(v));
  }
  void Required(const std::string& path, const std::string& v, const std::string& form) {
    if (v.empty()) Add(path, absl::StrCat("is required (", form, ")"), "\"\"");
  }
  template <typename C>
  void PositiveList(const std::string& path, const C& list, bool need_one) {
    if (need_one && list.empty()) Add(path, "must list at least one width", "none");
    for (int i = 0; i < list.size(); ++i) Positive(absl::StrCat(path, "[", i, "]"), list[i]);
  }
  std::vector<FieldViolation> Take() { return std::move(errors_); }

 private:
  std::vector<FieldViolation> errors_;
};

bool IsIdentifier(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

void CheckAttention(Checker& c, const std::string& p, const AttentionSpec& a, bool cross) {
  bool window = a.kind() == AttentionSpec::SLIDING_WINDOW;
  bool block = a.kind() == AttentionSpec::BLOCK;
  if (cross && (window || block)) {
    c.Add(p + ".kind", "must be FULL for cross-attention (Q and K/V are different sequences)",
          AttentionSpec::Kind_Name(a.kind()));
  }
  if (window) {
    c.Positive(p + ".window", a.window());
  } else if (a.window() != 0) {
    c.Add(p + ".window", "applies only to kind SLIDING_WINDOW (leave it 0)",
          absl::StrCat(a.window()));
  }
  if (block) {
    if (a.block_size() != 0 && a.block_size() != 64) {
      c.Add(p + ".block_size", "must be 64 (or 0 for 64)", absl::StrCat(a.block_size()));
    }
  } else if (a.block_size() != 0) {
    c.Add(p + ".block_size", "applies only to kind BLOCK (leave it 0)",
          absl::StrCat(a.block_size()));
  }
}

void CheckModel(Checker& c, const ::recfleet::v1::ModelSpec& m) {
  if (m.tables().empty()) c.Add("spec.model.tables", "must list at least one table", "none");
  std::set<std::string> tables;
  for (int i = 0; i < m.tables_size(); ++i) {
    const auto& t = m.tables(i);
    std::string p = absl::StrCat("spec.model.tables[", i, "]");
    if (!IsIdentifier(t.name())) {
      c.Add(p + ".name", "must be a non-empty name of [a-z0-9_]", Quote(t.name()));
    } else if (!tables.insert(t.name()).second) {
      c.Add(p + ".name", "must be unique among spec.model.tables", Quote(t.name()));
    }
    c.Positive(p + ".rows", t.rows());
    c.Positive(p + ".dim", t.dim());
    if (t.dim() > 0 && t.dim() % 4 != 0) {
      c.Add(p + ".dim", "must be a multiple of 4", absl::StrCat(t.dim()));
    }
    c.FiniteNonNegative(p + ".learning_rate", t.learning_rate());
  }

  if (m.features().empty()) c.Add("spec.model.features", "must list at least one feature", "none");
  std::set<std::string> features, sequence_features;
  for (int i = 0; i < m.features_size(); ++i) {
    const Feature& f = m.features(i);
    std::string p = absl::StrCat("spec.model.features[", i, "]");
    if (f.name().empty()) {
      c.Required(p + ".name", f.name(), "the dataset column name");
    } else if (!features.insert(f.name()).second) {
      c.Add(p + ".name", "must be unique among spec.model.features", Quote(f.name()));
    }
    if (f.kind() == Feature::KIND_UNSPECIFIED) {
      c.Add(p + ".kind", "must be one of NUMERIC, ID_LIST, SEQUENCE, CANDIDATE",
            "KIND_UNSPECIFIED");
      continue;
    }
    if (f.kind() == Feature::NUMERIC) {
      c.Positive(p + ".width", f.width());
      if (!f.table().empty()) {
        c.Add(p + ".table", "must be empty for a NUMERIC feature", Quote(f.table()));
      }
    } else {
      if (f.table().empty()) {
        c.Add(p + ".table", "must name an entry of spec.model.tables", "\"\"");
      } else if (!tables.count(f.table())) {
        c.Add(p + ".table", "must name an entry of spec.model.tables", Quote(f.table()));
      }
      if (f.width() != 0) {
        c.Add(p + ".width", "applies only to NUMERIC features (leave it 0)",
              absl::StrCat(f.width()));
      }
    }
    if (f.kind() == Feature::SEQUENCE) {
      c.Positive(p + ".max_length", f.max_length());
      sequence_features.insert(f.name());
    } else if (f.max_length() != 0) {
      c.Add(p + ".max_length", "applies only to SEQUENCE features (leave it 0)",
            absl::StrCat(f.max_length()));
    }
    if (f.kind() != Feature::ID_LIST && f.pooling() != ::recfleet::v1::POOLING_UNSPECIFIED) {
      c.Add(p + ".pooling", "applies only to ID_LIST features (leave it unset)",
            ::recfleet::v1::Pooling_Name(f.pooling()));
    }
  }

  if (m.has_sequence()) {
    const auto& s = m.sequence();
    if (s.features().empty()) {
      c.Add("spec.model.sequence.features", "must list at least one SEQUENCE feature", "none");
    }
    for (int i = 0; i < s.features_size(); ++i) {
      if (!sequence_features.count(s.features(i))) {
        c.Add(absl::StrCat("spec.model.sequence.features[", i, "]"),
              "must name a SEQUENCE feature of spec.model.features", Quote(s.features(i)));
      }
    }
    c.Positive("spec.model.sequence.num_layers", s.num_layers());
    c.Positive("spec.model.sequence.num_heads", s.num_heads());
    c.Positive("spec.model.sequence.model_dim", s.model_dim());
    if (s.num_heads() > 0 && s.model_dim() > 0 && s.model_dim() % s.num_heads() != 0) {
      c.Add("spec.model.sequence.model_dim",
            absl::StrCat("must be a multiple of num_heads (", s.num_heads(), ")"),
            absl::StrCat(s.model_dim()));
    }
    CheckAttention(c, "spec.model.sequence.attention", s.attention(), /*cross=*/false);
  } else if (!sequence_features.empty()) {
    c.Add("spec.model.sequence",
          "must be set when SEQUENCE features exist (they feed the sequence branch)", "unset");
  }

  if (m.has_cross()) {
    const auto& x = m.cross();
    c.NonNegative("spec.model.cross.num_cross_layers", x.num_cross_layers());
    c.NonNegative("spec.model.cross.pma_queries", x.pma_queries());
    if (x.num_cross_layers() > 0 || x.pma_queries() > 0) {
      c.Positive("spec.model.cross.num_heads", x.num_heads());
    }
    if (!m.has_sequence()) {
      c.Add("spec.model.cross", "needs spec.model.sequence (the history it attends to)",
            "no sequence branch");
    }
    CheckAttention(c, "spec.model.cross.attention", x.attention(), /*cross=*/true);
  }

  for (int i = 0; i < m.dense_size(); ++i) {
    const DenseModule& d = m.dense(i);
    std::string p = absl::StrCat("spec.model.dense[", i, "]");
    switch (d.module_case()) {
      case DenseModule::kMlp: {
        c.PositiveList(p + ".mlp.hidden_dims", d.mlp().hidden_dims(), true);
        const std::string& a = d.mlp().activation();
        if (!a.empty() && a != "relu" && a != "gelu" && a != "silu") {
          c.Add(p + ".mlp.activation", "must be one of relu, gelu, silu", Quote(a));
        }
        break;
      }
      case DenseModule::kDcn:
        c.Positive(p + ".dcn.num_layers", d.dcn().num_layers());
        c.NonNegative(p + ".dcn.low_rank", d.dcn().low_rank());
        break;
      case DenseModule::kMoe:
        if (d.moe().num_experts() < 2) {
          c.Add(p + ".moe.num_experts", "must be >= 2", absl::StrCat(d.moe().num_experts()));
        }
        if (d.moe().top_k() < 1 || d.moe().top_k() > std::max(d.moe().num_experts(), 1)) {
          c.Add(p + ".moe.top_k",
                absl::StrCat("must be in [1, num_experts=", d.moe().num_experts(), "]"),
                absl::StrCat(d.moe().top_k()));
        }
        c.PositiveList(p + ".moe.expert_hidden_dims", d.moe().expert_hidden_dims(), true);
        break;
      case DenseModule::MODULE_NOT_SET:
        c.Add(p, "must set exactly one of mlp, dcn, moe", "none");
        break;
    }
  }

  if (m.heads().empty()) c.Add("spec.model.heads", "must list at least one head (CTR or CVR)", "none");
  std::set<int> head_kinds;
  for (int i = 0; i < m.heads_size(); ++i) {
    const Head& h = m.heads(i);
    std::string p = absl::StrCat("spec.model.heads[", i, "]");
    if (h.kind() == Head::KIND_UNSPECIFIED) {
      c.Add(p + ".kind", "must be CTR or CVR", "KIND_UNSPECIFIED");
    } else if (!head_kinds.insert(h.kind()).second) {
      c.Add(p + ".kind", "must be unique among spec.model.heads", Head::Kind_Name(h.kind()));
    }
    c.Required(p + ".label", h.label(), "the dataset's label column");
    c.PositiveList(p + ".hidden_dims", h.hidden_dims(), false);
    c.FiniteNonNegative(p + ".loss_weight", h.loss_weight());
  }
}

void CheckData(Checker& c, const ::recfleet::v1::DataSpec& d) {
  c.Required("spec.data.dataset", d.dataset(), "a dataset directory or URI");
  c.Positive("spec.data.local_batch_size", d.local_batch_size());
  c.NonNegative("spec.data.eval_batch_size", d.eval_batch_size());
  c.NonNegative("spec.data.micro_batches", d.micro_batches());
  if (d.micro_batches() > 0 && d.local_batch_size() > 0 &&
      d.local_batch_size() % d.micro_batches() != 0) {
    c.Add("spec.data.micro_batches",
          absl::StrCat("must divide local_batch_size (", d.local_batch_size(), ")"),
          absl::StrCat(d.micro_batches()));
  }
  const auto& b = d.bbs();
  c.NonNegative("spec.data.bbs.base_batch_size", b.base_batch_size());
  c.NonNegative("spec.data.bbs.window", b.window());
  int base = b.base_batch_size() > 0 ? b.base_batch_size() : 128;
  if (b.enabled() && d.local_batch_size() > 0 && d.local_batch_size() % base != 0) {
    c.Add("spec.data.bbs.base_batch_size",
          absl::StrCat("must divide local_batch_size (", d.local_batch_size(), ")"),
          absl::StrCat(base));
  }
  const auto& w = b.cost_weights();
  std::string wp = "spec.data.bbs.cost_weights.";
  c.FiniteNonNegative(wp + "per_sample", w.per_sample());
  c.FiniteNonNegative(wp + "linear", w.linear());
  c.FiniteNonNegative(wp + "quadratic", w.quadratic());
  c.FiniteNonNegative(wp + "window", w.window());
  c.FiniteNonNegative(wp + "block", w.block());
  if (b.enabled() && !(w.per_sample() > 0 || w.linear() > 0 || w.quadratic() > 0 ||
                       w.window() > 0 || w.block() > 0)) {
    c.Add("spec.data.bbs.cost_weights", "must have at least one weight > 0 when BBS is enabled",
          "all 0");
  }
}

}  // namespace

int64_t WorldSize(const JobSpec& spec) {
  return static_cast<int64_t>(spec.resources().workers()) *
         std::max(spec.resources().gpus_per_worker(), 1);
}

std::vector<FieldViolation> SpecFieldViolations(const JobSpec& spec) {
  Checker c;
  const size_t bytes = spec.ByteSizeLong();
  if (bytes > static_cast<size_t>(kMaxSpecBytes)) {
    c.Add("spec", absl::StrCat("must serialize to at most ", kMaxSpecBytes, " bytes (256 KiB)"),
          absl::StrCat(bytes, " bytes"));
    return c.Take();
  }
  if (spec.display_name().size() > 128) {
    c.Add("spec.display_name", "must be at most 128 characters",
          absl::StrCat(spec.display_name().size(), " characters"));
  }
  CheckModel(c, spec.model());
  CheckData(c, spec.data());

  c.Positive("spec.resources.workers", spec.resources().workers());
  c.NonNegative("spec.resources.gpus_per_worker", spec.resources().gpus_per_worker());
  int64_t world = WorldSize(spec);
  const auto& par = spec.parallelism();
  auto divides_world = [&](const std::string& path, int32_t v) {
    c.NonNegative(path, v);
    if (v > 0 && world > 0 && world % v != 0) {
      c.Add(path, absl::StrCat("must divide the world size (", world, ")"), absl::StrCat(v));
    }
  };
  divides_world("spec.parallelism.fsdp_group_size", par.fsdp_group_size());
  divides_world("spec.parallelism.replicas", par.replicas());
  divides_world("spec.parallelism.table_sharding_group_size", par.table_sharding_group_size());
  if (par.fsdp_group_size() > 0 && par.replicas() > 0 && world > 0 &&
      static_cast<int64_t>(par.fsdp_group_size()) * par.replicas() != world) {
    c.Add("spec.parallelism",
          absl::StrCat("fsdp_group_size * replicas must equal the world size (", world, ")"),
          absl::StrCat(par.fsdp_group_size(), " * ", par.replicas()));
  }

  const auto& t = spec.training();
  c.Positive("spec.training.steps", t.steps());
  c.NonNegative("spec.training.eval_every", t.eval_every());
  c.NonNegative("spec.training.checkpoint_every", t.checkpoint_every());
  c.FinitePositive("spec.training.dense_learning_rate", t.dense_learning_rate());
  c.FinitePositive("spec.training.sparse_learning_rate", t.sparse_learning_rate());
  c.FiniteNonNegative("spec.training.dense_grad_clip_norm", t.dense_grad_clip_norm());
  c.NonNegative("spec.training.max_restarts", t.max_restarts());

  if (spec.labels_size() > kMaxLabels) {
    c.Add("spec.labels", absl::StrCat("must have at most ", kMaxLabels, " entries"),
          absl::StrCat(spec.labels_size()));
  }
  for (const auto& [key, value] : spec.labels()) {
    if (key.empty()) c.Add("spec.labels", "keys must be non-empty", "\"\"");
    if (key.size() > kMaxLabelKeyBytes) {
      c.Add("spec.labels", absl::StrCat("keys must be at most ", kMaxLabelKeyBytes, " bytes"),
            absl::StrCat(key.size(), " bytes (key \"", key.substr(0, 16), "...\")"));
    }
    if (value.size() > kMaxLabelValueBytes) {
      c.Add(absl::StrCat("spec.labels[\"", key.substr(0, kMaxLabelKeyBytes), "\"]"),
            absl::StrCat("must be at most ", kMaxLabelValueBytes, " bytes"),
            absl::StrCat(value.size(), " bytes"));
    }
  }
  return c.Take();
}

std::vector<std::string> SpecViolations(const JobSpec& spec) {
  std::vector<std::string> out;
  for (const auto& [field, description] : SpecFieldViolations(spec)) {
    out.push_back(absl::StrCat(field, " ", description));
  }
  return out;
}

absl::Status ValidateJobSpec(const JobSpec& spec) {
  const std::vector<FieldViolation> v = SpecFieldViolations(spec);
  if (v.empty()) return absl::OkStatus();
  return BadRequestError(absl::StrJoin(SpecViolations(spec), "; "), v);
}

}  // namespace recfleet::coordinator
