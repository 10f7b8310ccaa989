#include "engine/job_model.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "data/cost_model.h"

namespace recfleet::engine {
namespace {

// Collects what a spec asks that is not built, each with its field path.
class Problems {
 public:
  void Unsupported(const std::string& field, const std::string& why) {
    list_.push_back(absl::StrCat("spec.", field, ": not supported yet (", why, ")"));
  }
  void Bad(const std::string& field, const std::string& why) { list_.push_back(absl::StrCat("spec.", field, " ", why)); }
  bool empty() const { return list_.empty(); }
  absl::Status ToStatus() const {
    return list_.empty() ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrJoin(list_, "; "));
  }

 private:
  std::vector<std::string> list_;
};

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

void SequenceAttention(const v1::AttentionSpec& a, GemLiteConfig& c, Problems& p) {
  const std::string f = "model.sequence.attention";
  switch (a.kind()) {
    case v1::AttentionSpec::SLIDING_WINDOW:
      c.seq_mask = attention::Mask::kSlidingWindow;
      c.seq_window = a.window();
      break;
    case v1::AttentionSpec::BLOCK:
      c.seq_mask = attention::Mask::kBlock;
      break;
    default:
      c.seq_mask = attention::Mask::kNone;
  }
  c.seq_activation = AttentionActivationOf(a);
  c.rope = a.rope();
  c.qk_norm = a.qk_norm();
  if (a.bias()) p.Unsupported(f + ".bias", "GEM-lite has no learned attention bias; leave it false");
}

// GEM-lite's cross-attention and PMA are plain softmax attention with the
// sequence branch's head count; anything else would be dropped.
void CrossBranch(const v1::ModelSpec& m, GemLiteConfig& c, Problems& p) {
  if (!m.has_cross()) {
    c.cross_attention = false;
    c.pma_queries = 0;
    return;
  }
  const v1::CrossBranch& x = m.cross();
  if (x.num_cross_layers() > 1) {
    p.Unsupported("model.cross.num_cross_layers", absl::StrCat("GEM-lite builds 0 or 1 cross-attention layer, got ",
                                                              x.num_cross_layers()));
  }
  c.cross_attention = x.num_cross_layers() >= 1;
  c.pma_queries = x.pma_queries();
  if ((c.cross_attention || c.pma_queries > 0) && x.num_heads() != c.heads) {
    p.Unsupported("model.cross.num_heads", absl::StrCat("cross-attention and PMA use the sequence branch's ", c.heads,
                                                         " heads, got ", x.num_heads()));
  }
  const v1::AttentionSpec& a = x.attention();
  if (a.activation() != v1::AttentionSpec::ACTIVATION_UNSPECIFIED && a.activation() != v1::AttentionSpec::SOFTMAX) {
    p.Unsupported("model.cross.attention.activation", "cross-attention and PMA are softmax attention");
  }
  if (a.rope()) p.Unsupported("model.cross.attention.rope", "no rotary embedding across two sequences");
  if (a.qk_norm()) p.Unsupported("model.cross.attention.qk_norm", "cross-attention has no QK-norm");
  if (a.bias()) p.Unsupported("model.cross.attention.bias", "GEM-lite has no learned attention bias");
}

// model.precision.fp8_attention -> c.fp8.attention, after the sequence and
// cross branches are known: each named block must exist and take the FP8
// attention kernel (head dim 128, softmax, no block mask).
void Fp8Attention(const v1::ModelSpec& m, GemLiteConfig& c, Problems& p) {
  const v1::PrecisionRecipe& r = m.precision();
  const std::vector<std::string>& known = Fp8AttentionNames();
  const int64_t head_dim = c.heads > 0 ? c.dim / c.heads : 0;
  for (int i = 0; i < r.fp8_attention_size(); ++i) {
    const std::string& name = r.fp8_attention(i);
    const std::string field = absl::StrCat("model.precision.fp8_attention[", i, "]");
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      p.Bad(field, absl::StrCat("names no attention block: '", name, "'; one of ", absl::StrJoin(known, ", ")));
    } else if (c.fp8.HoldsAttention(name)) {
      p.Bad(field, absl::StrCat("'", name, "' is named twice"));
    } else if (name == "sequence" && c.seq_layers == 0) {
      p.Bad(field, "names 'sequence' but the model has no self-attention block (model.sequence.num_layers = 0)");
    } else if (name == "cross" && !c.cross_attention) {
      p.Bad(field, "names 'cross' but the model has no cross-attention (model.cross.num_cross_layers = 0)");
    } else if (name == "pma" && c.pma_queries == 0) {
      p.Bad(field, "names 'pma' but the model has no PMA (model.cross.pma_queries = 0)");
    } else if (head_dim != 128) {
      p.Unsupported(field, absl::StrCat("the FP8 attention kernel takes head dim 128 only; this model's is ",
                                        head_dim, " (model.dim / num_heads)"));
    } else if (name == "sequence" && c.seq_activation != attention::Activation::kSoftmax) {
      p.Unsupported(field, "the FP8 attention kernel is softmax attention; model.sequence.attention.activation "
                           "is not SOFTMAX");
    } else if (name == "sequence" && c.seq_mask == attention::Mask::kBlock) {
      p.Unsupported(field, "the FP8 attention kernel has no BLOCK mask (model.sequence.attention.kind)");
    } else {
      c.fp8.attention.push_back(name);
    }
  }
}

// model.precision -> c.fp8, after the dense modules and features are known
// (a recipe naming a module the model lacks is an error, not a no-op).
void Precision(const v1::ModelSpec& m, const FeatureSchema& schema, GemLiteConfig& c, JobModel& out, Problems& p) {
  const v1::PrecisionRecipe& r = m.precision();
  const std::string f = "model.precision";
  const std::vector<std::string>& known = Fp8ModuleNames();
  for (int i = 0; i < r.fp8_modules_size(); ++i) {
    const std::string& name = r.fp8_modules(i);
    const std::string field = absl::StrCat(f, ".fp8_modules[", i, "]");
    const auto clash = std::find_if(c.fp8.modules.begin(), c.fp8.modules.end(), [&](const std::string& seen) {
      return seen == name || absl::StartsWith(seen, name + ".") || absl::StartsWith(name, seen + ".");
    });
    if (name == "sequence" || name == "cross" || name == "pma") {
      p.Unsupported(field, absl::StrCat("FP8 inside the attention blocks ('", name, "'); FP8 modules are ",
                                        absl::StrJoin(known, ", ")));
    } else if (std::find(known.begin(), known.end(), name) == known.end()) {
      p.Bad(field, absl::StrCat("names no module: '", name, "'; one of ", absl::StrJoin(known, ", ")));
    } else if (clash != c.fp8.modules.end()) {
      p.Bad(field, absl::StrCat("'", name, "' repeats or overlaps '", *clash, "'"));
    } else if (name == "dcn" && c.dcn_layers == 0) {
      p.Bad(field, "names 'dcn' but spec.model.dense has no DCN module");
    } else if (name == "dense_proj" && schema.num_dense == 0) {
      p.Bad(field, "names 'dense_proj' but the model has no NUMERIC feature to project");
    } else {
      c.fp8.modules.push_back(name);
    }
  }
  if (r.scale_granularity() == v1::PrecisionRecipe::MX_32X32) {
    p.Unsupported(f + ".scale_granularity",
                  "32x32 E8M0 blocks in the linear layers (block-scaled GEMMs with 32-element power-of-two scales are a "
                  "tensor-core feature of compute capability 10; on Hopper cuBLASLt scales FP8 per 1x128 and 128x128 "
                  "fp32 blocks); use BLOCK_1X128_128X128 (1x128 activations, 128x128 weights)");
  }
  Fp8Attention(m, c, p);
  if (r.attention_backward() == v1::PrecisionRecipe::ATTENTION_BACKWARD_FP8) {
    if (r.fp8_attention_size() == 0) {
      p.Bad(f + ".attention_backward", "is FP8 but fp8_attention names no block; name the blocks whose attention "
                                       "runs FP8 (forward and backward)");
    }
    c.fp8.attention_backward = true;
  }
  const bool tuned = r.scale_granularity() != v1::PrecisionRecipe::SCALE_GRANULARITY_UNSPECIFIED ||
                     r.weight_gradient() != v1::PrecisionRecipe::WEIGHT_GRADIENT_UNSPECIFIED ||
                     r.all_gather() != v1::PrecisionRecipe::ALL_GATHER_UNSPECIFIED;
  if (tuned && r.fp8_modules_size() == 0) {
    p.Bad(f + ".fp8_modules",
          "is empty, so scale_granularity, weight_gradient and all_gather apply to nothing; name modules");
  }
  if (r.has_quality_gate() && r.fp8_modules_size() == 0 && r.fp8_attention_size() == 0 &&
      !m.activation_memory().fp8_saved()) {
    p.Bad(f + ".quality_gate",
          "has no low precision to check: fp8_modules and fp8_attention are both empty and "
          "model.activation_memory.fp8_saved is off");
  }
  c.fp8.wgrad_hadamard_stochastic = r.weight_gradient() == v1::PrecisionRecipe::FP8_HADAMARD_STOCHASTIC;
  c.fp8.fp8_weight_gradients = r.weight_gradient() == v1::PrecisionRecipe::FP8 || c.fp8.wgrad_hadamard_stochastic;
  c.fp8.fp8_all_gather = r.all_gather() == v1::PrecisionRecipe::ALL_GATHER_FP8;
  const v1::PrecisionQualityGate& gate = r.quality_gate();
  const std::string g = f + ".quality_gate";
  if (r.has_quality_gate() && !(gate.max_relative_ne_increase() > 0 && std::isfinite(gate.max_relative_ne_increase()))) {
    p.Bad(g + ".max_relative_ne_increase",
          absl::StrCat("must be > 0 (e.g. 0.001 for 0.1%), got ", gate.max_relative_ne_increase()));
  }
  if (r.has_quality_gate() && out.ctr_label.empty()) {
    p.Bad(g, "compares the CTR head's eval NE, and spec.model.heads has no CTR head");
  }
  if (gate.shadow_steps() < 0) p.Bad(g + ".shadow_steps", absl::StrCat("must be >= 0, got ", gate.shadow_steps()));
  if (gate.eval_samples() < 0) p.Bad(g + ".eval_samples", absl::StrCat("must be >= 0, got ", gate.eval_samples()));
  out.quality_gate.max_relative_ne_increase = std::max(0.0, gate.max_relative_ne_increase());
  if (gate.shadow_steps() > 0) out.quality_gate.shadow_steps = gate.shadow_steps();
  if (gate.eval_samples() > 0) out.quality_gate.eval_samples = gate.eval_samples();
  if (gate.runs() < 0 || gate.runs() > 16) {
    p.Bad(g + ".runs", absl::StrCat("must be in 0..16 (0 = 1), got ", gate.runs()));
  }
  out.quality_gate.runs = std::clamp(gate.runs(), 1, 16);
}

// model.activation_memory -> out.activation_memory, after the sequence
// branch is known.
void ActivationMemory(const v1::ModelSpec& m, const GemLiteConfig& c, JobModel& out, Problems& p) {
  const v1::ActivationMemory& am = m.activation_memory();
  const std::string f = "model.activation_memory";
  for (int i = 0; i < am.recompute_size(); ++i) {
    const std::string& name = am.recompute(i);
    const std::string field = absl::StrCat(f, ".recompute[", i, "]");
    const std::vector<std::pair<std::string, layers::BlockCheckpoint>> levels = {
        {"sequence", layers::BlockCheckpoint::kBlock},
        {"sequence.attention", layers::BlockCheckpoint::kBlock},
        {"sequence.projections", layers::BlockCheckpoint::kProjections},
        {"sequence.norm", layers::BlockCheckpoint::kNorm}};
    auto level = std::find_if(levels.begin(), levels.end(),
                              [&](const auto& l) { return l.first == name; });
    if (level != levels.end()) {
      if (out.activation_memory.recompute_sequence) {
        p.Bad(field, absl::StrCat("repeats a sequence region ('", name, "'): name one level"));
      } else if (!m.has_sequence() || c.seq_layers == 0) {
        p.Bad(field, absl::StrCat("names '", name, "' but spec.model has no sequence branch"));
      }
      out.activation_memory.recompute_sequence = true;
      out.activation_memory.level = level->second;
    } else if (name == "cross" || name == "pma" || name == "dcn" || name == "moe" || name == "towers") {
      p.Unsupported(field, absl::StrCat("recomputing '", name,
                                        "'; the engine recomputes only 'sequence' (the self-attention blocks)"));
    } else {
      p.Bad(field, absl::StrCat("names no region: '", name,
                                "'; the recomputable regions are 'sequence', 'sequence.attention', "
                                "'sequence.projections' and 'sequence.norm'"));
    }
  }
  if (am.budget_bytes() < 0) {
    p.Bad(f + ".budget_bytes", absl::StrCat("must be > 0 bytes (0: no budget), got ", am.budget_bytes()));
  } else if (am.budget_bytes() > 0 && am.recompute_size() > 0) {
    p.Bad(f + ".budget_bytes", "and recompute are exclusive: give the regions or a budget for the planner");
  } else if (am.budget_bytes() > 0 && (!m.has_sequence() || c.seq_layers == 0)) {
    p.Bad(f + ".budget_bytes", "has nothing to recompute: spec.model has no sequence branch");
  }
  if (am.fp8_saved() && am.recompute_size() == 0 && am.budget_bytes() <= 0) {
    // It applies to blocks that recompute: alone it would change nothing.
    p.Bad(f + ".fp8_saved", "needs recompute or budget_bytes: it keeps the recomputing blocks' saved tensors in FP8");
  }
  out.activation_memory.budget_bytes = std::max<int64_t>(0, am.budget_bytes());
  out.activation_memory.fp8_saved = am.fp8_saved();
}

void DenseModules(const v1::ModelSpec& m, GemLiteConfig& c, Problems& p) {
  c.dcn_layers = 0;
  bool have_expert = false;
  for (int i = 0; i < m.dense_size(); ++i) {
    const v1::DenseModule& d = m.dense(i);
    const std::string f = absl::StrCat("model.dense[", i, "]");
    if (have_expert) {
      p.Unsupported(f, "GEM-lite's dense part is [dcn], then one moe or mlp; nothing after it");
      continue;
    }
    if (d.has_dcn()) {
      if (c.dcn_layers > 0) {
        p.Unsupported(f + ".dcn", "one DCN module (put all cross layers in its num_layers)");
        continue;
      }
      c.dcn_layers = d.dcn().num_layers();
      if (d.dcn().low_rank() != 0) p.Unsupported(f + ".dcn.low_rank", "low-rank DCN; leave it 0 (full rank)");
      continue;
    }
    const google::protobuf::RepeatedField<int32_t>* dims = nullptr;
    if (d.has_moe()) {
      const v1::MoeSpec& moe = d.moe();
      if (moe.top_k() != moe.num_experts()) {
        p.Unsupported(f + ".moe.top_k", absl::StrCat("sparse top-k routing; GEM-lite gates every expert: set top_k to "
                                                     "num_experts = ", moe.num_experts()));
      }
      c.num_experts = moe.num_experts();
      dims = &moe.expert_hidden_dims();
    } else if (d.has_mlp()) {
      c.num_experts = 1;
      dims = &d.mlp().hidden_dims();
      const std::string& a = d.mlp().activation();
      c.mlp_activation = a == "gelu" ? Activation::kGelu : a == "silu" ? Activation::kSilu : Activation::kRelu;
    } else {
      continue;  // Structural validation reports a module that sets nothing.
    }
    have_expert = true;
    const std::string dims_field = f + (d.has_moe() ? ".moe.expert_hidden_dims" : ".mlp.hidden_dims");
    if (dims->size() != 2) {
      p.Unsupported(dims_field, absl::StrCat("GEM-lite's expert MLP has exactly two layers [hidden, out], got ",
                                             dims->size(), " widths"));
    } else {
      c.expert_hidden = dims->Get(0);
      c.expert_out = dims->Get(1);
    }
  }
  if (!have_expert) p.Unsupported("model.dense", "GEM-lite needs one moe or mlp module");
}

void Heads(const v1::ModelSpec& m, JobModel& out, Problems& p) {
  int64_t tower = -1;
  for (int i = 0; i < m.heads_size(); ++i) {
    const v1::Head& h = m.heads(i);
    const std::string f = absl::StrCat("model.heads[", i, "]");
    if (h.kind() == v1::Head::CTR) out.ctr_label = h.label();
    if (h.kind() == v1::Head::CVR) out.cvr_label = h.label();
    if (h.hidden_dims_size() != 1) {
      p.Unsupported(f + ".hidden_dims", absl::StrCat("a tower of exactly one hidden layer, got ", h.hidden_dims_size()));
    } else if (tower >= 0 && h.hidden_dims(0) != tower) {
      p.Unsupported(f + ".hidden_dims", absl::StrCat("every tower has the first head's width ", tower));
    } else {
      tower = h.hidden_dims(0);
    }
    if (h.loss_weight() != 0 && h.loss_weight() != 1) {
      p.Unsupported(f + ".loss_weight", "heads' losses are summed with weight 1; leave it 0 or 1");
    }
  }
  if (tower > 0) out.config.tower_hidden = tower;
}

}  // namespace

absl::StatusOr<JobModel> BuildJobModel(const v1::JobSpec& spec) {
  const v1::ModelSpec& m = spec.model();
  JobModel out;
  GemLiteConfig& c = out.config;
  Problems p;
  std::map<std::string, int> table_index;
  if (m.tables_size() == 0) return absl::InvalidArgumentError("spec.model.tables must list at least one table");
  for (int i = 0; i < m.tables_size(); ++i) {
    const v1::EmbeddingTable& t = m.tables(i);
    const std::string f = absl::StrCat("model.tables[", i, "]");
    if (t.dim() != m.tables(0).dim()) {
      p.Unsupported(f + ".dim", absl::StrCat("GEM-lite uses one embedding width, tables[0].dim = ", m.tables(0).dim(),
                                             ", got ", t.dim()));
    }
    if (t.learning_rate() != 0) {
      p.Unsupported(f + ".learning_rate", "one sparse learning rate per job: set training.sparse_learning_rate");
    }
    table_index[t.name()] = i;
    out.schema.tables.push_back({t.name(), std::max<int64_t>(t.rows(), 1)});
  }
  c.dim = m.tables(0).dim();
  std::map<std::string, int> sequence_features;  // name -> index in spec.model.features
  for (int i = 0; i < m.features_size(); ++i) {
    const v1::Feature& f = m.features(i);
    const std::string field = absl::StrCat("model.features[", i, "]");
    if (f.kind() == v1::Feature::NUMERIC) {
      out.numeric_columns.push_back({f.name(), f.width()});
      out.schema.num_dense += f.width();
      continue;
    }
    auto it = table_index.find(f.table());
    if (it == table_index.end()) {
      p.Bad(field + ".table", absl::StrCat("must name one of spec.model.tables, got '", f.table(), "'"));
      continue;
    }
    switch (f.kind()) {
      case v1::Feature::ID_LIST:
      case v1::Feature::CANDIDATE:
        out.schema.id_lists.push_back(
            {f.name(), it->second, f.pooling() == v1::MEAN ? Pooling::kMean : Pooling::kSum});
        out.id_list_columns.push_back(f.name());
        break;
      case v1::Feature::SEQUENCE:
        sequence_features[f.name()] = i;
        break;
      default:
        p.Bad(field + ".kind", "must be NUMERIC, ID_LIST, SEQUENCE or CANDIDATE");
    }
  }
  if (!m.has_sequence()) {
    p.Unsupported("model.sequence", "GEM-lite needs a sequence branch over a SEQUENCE feature");
  } else {
    const v1::SequenceBranch& s = m.sequence();
    for (int i = 0; i < s.features_size(); ++i) {
      auto it = sequence_features.find(s.features(i));
      if (it == sequence_features.end()) continue;  // Structural validation names it.
      const v1::Feature& f = m.features(it->second);
      if (!out.sequence_max_length.empty() && f.max_length() != out.sequence_max_length[0]) {
        p.Unsupported(absl::StrCat("model.features[", it->second, "].max_length"),
                      absl::StrCat("the fields of one event share its length: every sequence feature needs the first's "
                                   "max_length ", out.sequence_max_length[0], ", got ", f.max_length()));
      }
      out.schema.sequence_fields.push_back({f.name(), table_index.at(f.table())});
      out.sequence_columns.push_back(f.name());
      out.sequence_max_length.push_back(f.max_length());
      sequence_features.erase(it);
    }
    if (out.sequence_columns.empty()) {
      p.Bad("model.sequence.features", "must name at least one SEQUENCE feature of spec.model.features");
    }
    c.seq_layers = s.num_layers();
    if (s.model_dim() != c.dim) {
      p.Unsupported("model.sequence.model_dim",
                    absl::StrCat("GEM-lite's tokens have the table width ", c.dim, ", got ", s.model_dim()));
    }
    if (s.num_heads() > 0) c.heads = s.num_heads();
    SequenceAttention(s.attention(), c, p);
  }
  for (const auto& [name, index] : sequence_features) {
    p.Unsupported(absl::StrCat("model.features[", index, "]"),
                  absl::StrCat("SEQUENCE feature '", name, "' is not in spec.model.sequence.features, so nothing reads it"));
  }
  CrossBranch(m, c, p);
  DenseModules(m, c, p);
  Heads(m, out, p);
  Precision(m, out.schema, c, out, p);
  ActivationMemory(m, c, out, p);
  const v1::TrainingSpec& t = spec.training();
  if (t.dense_learning_rate() > 0) c.learning_rate = t.dense_learning_rate();
  if (t.sparse_learning_rate() > 0) c.adagrad_learning_rate = t.sparse_learning_rate();
  c.dense_grad_clip_norm = t.dense_grad_clip_norm();
  c.seed = t.seed();
  if (!p.empty()) return p.ToStatus();
  if (absl::Status s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("spec.model: ", s.message()));
  }
  return out;
}

const char* const kSequenceCheckpointRegions[3] = {"sequence.norm", "sequence.projections",
                                                   "sequence.attention"};

absl::StatusOr<std::vector<layers::BlockCheckpoint>> AttentionCheckpointModes(const JobModel& model,
                                                                             const v1::Plan* plan) {
  const int blocks = model.config.seq_layers;
  std::vector<layers::BlockCheckpoint> modes(blocks, layers::BlockCheckpoint::kNone);
  if (model.activation_memory.recompute_sequence) {
    modes.assign(blocks, model.activation_memory.level);
    return modes;
  }
  bool chosen = false;
  if (plan != nullptr) {
    for (const v1::RegionCheckpointPlan& region : plan->checkpoint()) {
      for (int level = 0; level < 3; ++level) {
        if (region.region() != kSequenceCheckpointRegions[level]) continue;
        chosen = true;
        if (region.recomputed_units() < 0 || region.recomputed_units() > blocks) {
          return absl::InvalidArgumentError(absl::StrCat(
              "plan.checkpoint '", region.region(), "': ", region.recomputed_units(),
              " blocks recomputed of a model with ", blocks));
        }
        // kNorm, kProjections, kBlock: the first units blocks at least here.
        const auto mode = static_cast<layers::BlockCheckpoint>(level + 1);
        for (int l = 0; l < region.recomputed_units(); ++l) modes[l] = std::max(modes[l], mode);
      }
    }
  }
  if (!chosen && model.activation_memory.budget_bytes > 0) {
    return absl::FailedPreconditionError(
        "spec.model.activation_memory.budget_bytes needs the planner's choice of blocks, and there is no plan "
        "with the sequence checkpoint regions");
  }
  return modes;
}

std::string JobModel::DebugString() const {
  std::string s = absl::StrCat("dim=", config.dim, " heads=", config.heads, " seq_layers=", config.seq_layers,
                               " seq_mask=", static_cast<int>(config.seq_mask), " seq_window=", config.seq_window,
                               " seq_activation=", static_cast<int>(config.seq_activation), " rope=", config.rope,
                               " qk_norm=", config.qk_norm, " cross=", config.cross_attention,
                               " pma=", config.pma_queries, " dcn=", config.dcn_layers,
                               " experts=", config.num_experts, " expert=", config.expert_hidden, "x",
                               config.expert_out, " tower=", config.tower_hidden,
                               " mlp_activation=", static_cast<int>(config.mlp_activation),
                               " lr=", config.learning_rate, " wd=", config.weight_decay,
                               " clip=", config.dense_grad_clip_norm,
                               " adagrad_lr=", config.adagrad_learning_rate, " seed=", config.seed,
                               " fp8=", absl::StrJoin(config.fp8.modules, ","),
                               " fp8_wgrad=", config.fp8.fp8_weight_gradients,
                               " wgrad_hadamard_sr=", config.fp8.wgrad_hadamard_stochastic,
                               " fp8_all_gather=", config.fp8.fp8_all_gather,
                               " fp8_attention=", absl::StrJoin(config.fp8.attention, ","),
                               " fp8_attention_bwd=", config.fp8.attention_backward,
                               " ne_gate=", quality_gate.max_relative_ne_increase, "/", quality_gate.shadow_steps, "/",
                               quality_gate.eval_samples, "/x", quality_gate.runs,
                               " recompute_sequence=",
                               layers::BlockCheckpointName(activation_memory.level), " activation_budget_bytes=",
                               activation_memory.budget_bytes, " fp8_saved=", activation_memory.fp8_saved, "\n");
  for (const auto& t : schema.tables) absl::StrAppend(&s, "table ", t.name, " rows=", t.rows, "\n");
  for (size_t i = 0; i < schema.id_lists.size(); ++i) {
    const auto& f = schema.id_lists[i];
    absl::StrAppend(&s, "id_list ", f.name, " column=", id_list_columns[i], " table=", f.table,
                    " pooling=", static_cast<int>(f.pooling), "\n");
  }
  for (size_t i = 0; i < schema.sequence_fields.size(); ++i) {
    const auto& f = schema.sequence_fields[i];
    absl::StrAppend(&s, "sequence ", f.name, " column=", sequence_columns[i], " table=", f.table,
                    " max_length=", sequence_max_length[i], "\n");
  }
  for (const auto& [name, width] : numeric_columns) absl::StrAppend(&s, "numeric ", name, " width=", width, "\n");
  absl::StrAppend(&s, "ctr_label=", ctr_label, " cvr_label=", cvr_label, "\n");
  return s;
}

absl::StatusOr<v1::DataConfig> BuildDataConfig(const v1::JobSpec& spec, const std::string& job, int world_size) {
  const v1::DataSpec& d = spec.data();
  Problems p;
  v1::DataConfig c;
  c.set_job(job);
  c.set_dataset(d.dataset());
  c.set_num_ranks(world_size);
  c.set_local_batch_size(d.local_batch_size());
  const int base = d.bbs().base_batch_size() > 0 ? d.bbs().base_batch_size() : 128;
  // A local batch smaller than a base batch is one base batch of its size.
  c.set_base_batch_size(std::min(base, std::max(d.local_batch_size(), 1)));
  if (d.micro_batches() > 1) {
    p.Unsupported("data.micro_batches", "gradient accumulation; each step trains its local batch at once, leave it 0 or 1");
  }
  c.set_micro_batches(1);
  const int per_step = d.local_batch_size() / std::max(c.base_batch_size(), 1);
  if (d.bbs().window() != 0 && d.bbs().window() != per_step) {
    p.Unsupported("data.bbs.window",
                  absl::StrCat("BBS balances one step's base batches (local_batch_size / base_batch_size = ", per_step,
                               "); leave it 0 or set ", per_step));
  }
  c.set_policy(d.bbs().enabled() ? "recfleet" : "naive");
  // The cost model prices sample lengths; with every weight 0 it counts
  // history tokens (linear = 1), which is what BBS-off gap reports use.
  const v1::BbsCostWeights& w = d.bbs().cost_weights();
  data::CostModel cost;
  cost.per_sample = w.per_sample();
  cost.linear = w.linear();
  cost.quadratic = w.quadratic();
  cost.windowed = w.window();
  cost.block = w.block();
  if (spec.model().sequence().attention().kind() == v1::AttentionSpec::SLIDING_WINDOW &&
      spec.model().sequence().attention().window() > 0) {
    cost.window = spec.model().sequence().attention().window();
  }
  if (cost.per_sample == 0 && cost.linear == 0 && cost.quadratic == 0 && cost.windowed == 0 && cost.block == 0) {
    cost.linear = 1;
  }
  c.set_cost_model(cost.ToString());
  c.set_seed(spec.training().seed());
  if (!p.empty()) return p.ToStatus();
  return c;
}

absl::Status CheckBuildable(const v1::JobSpec& spec) {
  std::vector<std::string> problems;
  auto add = [&](const absl::Status& s) {
    if (!s.ok()) problems.emplace_back(s.message());
  };
  add(BuildJobModel(spec).status());
  add(BuildDataConfig(spec, "", 1).status());
  // A GPU worker (recfleet-worker --device cuda, one per GPU of its host)
  // trains one rank on one GPU; several GPU workers train one job together
  // over NCCL.
  if (spec.resources().gpus_per_worker() > 1) {
    problems.push_back(
        "spec.resources.gpus_per_worker: not supported yet above 1 (a GPU worker trains one rank on one GPU, and "
        "recfleet-worker --device cuda starts one worker per GPU of its host: set 1 and resources.workers to the "
        "number of GPUs, or 0 for CPU workers. `recfleet plan --what-if` plans larger GPU jobs)");
  }
  const v1::PrecisionRecipe& precision = spec.model().precision();
  if (spec.resources().gpus_per_worker() == 0) {
    if (precision.fp8_modules_size() > 0 && precision.all_gather() != v1::PrecisionRecipe::ALL_GATHER_FP8) {
      problems.push_back(
          "spec.model.precision.fp8_modules: FP8 GEMMs need a GPU job (resources.gpus_per_worker = 1); CPU workers "
          "compute in fp32, so leave fp8_modules empty, or set all_gather: ALL_GATHER_FP8 to carry those modules' "
          "weights as FP8 in the FSDP all-gather");
    }
    if (precision.fp8_attention_size() > 0) {
      problems.push_back(
          "spec.model.precision.fp8_attention: the FP8 attention kernel needs a GPU job (resources.gpus_per_worker "
          "= 1); CPU workers compute attention in fp32, so leave fp8_attention empty");
    }
    if (precision.has_quality_gate()) {
      problems.push_back(
          "spec.model.precision.quality_gate: needs a GPU job (the shadow run compares the recipe's FP8 GEMMs with "
          "bf16 on the job's GPU; a CPU job's only FP8 is its all-gather)");
    }
  }
  if (precision.has_quality_gate() && spec.resources().workers() > 1) {
    problems.push_back(
        "spec.model.precision.quality_gate: the shadow run trains on the job's one GPU rank; a job of several "
        "workers cannot run it yet: set resources.workers to 1 or drop the gate");
  }
  if (spec.parallelism().expert_parallel()) {
    problems.push_back(
        "spec.parallelism.expert_parallel: not supported yet (the planner decides expert parallelism per module and "
        "the workers replicate experts; leave it false)");
  }
  return problems.empty() ? absl::OkStatus() : absl::InvalidArgumentError(absl::StrJoin(problems, "; "));
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

Batch BatchConverter::Convert(const data::Batch& source, absl::Span<const int64_t> rows) const {
  Batch b;
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

Batch BatchConverter::ConvertAll(const data::Batch& source) const {
  std::vector<int64_t> rows(source.num_rows());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<int64_t>(i);
  return Convert(source, rows);
}

int64_t BatchConverter::SampleId(const data::Batch& source, int64_t row) const {
  return sample_id_ >= 0 ? source.Int64(sample_id_, row) : -1;
}

}  // namespace recfleet::engine
