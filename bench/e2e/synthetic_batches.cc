#include "bench/e2e/synthetic_batches.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/layers/embeddings.h"
#include "engine/layers/linear.h"
#include "kernels/attention/attention.h"
#include "kernels/ops/activation.h"
#include "kernels/ops/adam.h"
#include "services/dataloader/job_loader.h"

namespace recfleet::bench {

const char* MaskName(attention::Mask mask) {
  switch (mask) {
    case attention::Mask::kCausal:
      return "causal";
    case attention::Mask::kSlidingWindow:
      return "sliding_window";
    case attention::Mask::kBlock:
      return "block";
    default:
      return "full";
  }
}

const char* AttentionActivationName(attention::Activation activation) {
  switch (activation) {
    case attention::Activation::kGelu:
      return "gelu";
    case attention::Activation::kSilu:
      return "silu";
    default:
      return "softmax";
  }
}

absl::StatusOr<SyntheticBatches> SyntheticBatches::Create(const v1::JobSpec& spec, uint64_t seed) {
  absl::StatusOr<engine::JobModel> model = engine::BuildJobModel(spec);
  if (!model.ok()) return model.status();
  const std::string& location = spec.data().dataset();
  if (!absl::StartsWith(location, "synthetic://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.dataset must be a synthetic://NAME?lengths=...&zipf=... URI (it sets the history lengths and id "
        "skew of the generated batches), got '", location, "'"));
  }
  absl::StatusOr<data::SynthOptions> synth = dataloader::ParseSyntheticDataset(location);
  if (!synth.ok()) return synth.status();

  SyntheticBatches b;
  b.model_ = *std::move(model);
  b.lengths_ = synth->lengths;
  const int cap = b.model_.sequence_max_length.empty() ? 0 : b.model_.sequence_max_length[0];
  if (cap > 0) {
    b.lengths_.max = std::min<int64_t>(b.lengths_.max, cap);
    b.lengths_.min = std::min(b.lengths_.min, b.lengths_.max);
  }
  for (const std::string& column : b.model_.id_list_columns) {
    bool candidate = false;
    for (const v1::Feature& f : spec.model().features()) {
      if (f.name() == column) candidate = f.kind() == v1::Feature::CANDIDATE;
    }
    b.single_id_.push_back(candidate);
  }
  for (const engine::FeatureSchema::Table& t : b.model_.schema.tables) {
    b.tables_.push_back(std::make_shared<const data::ZipfSampler>(static_cast<uint64_t>(t.rows), synth->zipf));
  }
  b.rng_.seed(seed);
  return b;
}

int64_t SyntheticBatches::Id(int table) { return static_cast<int64_t>(tables_[table]->Sample(rng_)) - 1; }

engine::Batch SyntheticBatches::Next(int64_t size) {
  const engine::FeatureSchema& schema = model_.schema;
  engine::Batch b;
  b.size = size;
  b.id_lists.resize(schema.id_lists.size());
  b.sequence.resize(schema.sequence_fields.size());
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> list_length(1, kMaxIdListLength);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<int64_t> ids;
  for (int64_t s = 0; s < size; ++s) {
    for (size_t f = 0; f < schema.id_lists.size(); ++f) {
      ids.resize(single_id_[f] ? 1 : list_length(rng_));
      for (int64_t& id : ids) id = Id(schema.id_lists[f].table);
      b.id_lists[f].Append(ids);
    }
    ids.resize(lengths_.Sample(rng_));
    for (size_t f = 0; f < schema.sequence_fields.size(); ++f) {
      for (int64_t& id : ids) id = Id(schema.sequence_fields[f].table);
      b.sequence[f].Append(ids);
    }
    const size_t first_dense = b.dense.size();
    for (int k = 0; k < schema.num_dense; ++k) b.dense.push_back(normal(rng_));
    const double x = schema.num_dense > 0 ? b.dense[first_dense] : 0.0;
    const bool click = uniform(rng_) < 1.0 / (1.0 + std::exp(1.5 - x));
    if (!model_.ctr_label.empty()) b.ctr_labels.push_back(click ? 1.0f : 0.0f);
    if (!model_.cvr_label.empty()) b.cvr_labels.push_back(click && uniform(rng_) < 0.3 ? 1.0f : 0.0f);
  }
  return b;
}

namespace {

// The shortest decimal that reads back as exactly v.
std::string Num(double v) {
  for (int digits = 15;; ++digits) {
    std::string s = absl::StrFormat("%.*g", digits, v);
    if (digits == 17 || std::strtod(s.c_str(), nullptr) == v) return s;
  }
}
std::string Bool(bool v) { return v ? "true" : "false"; }
// Names in specs are [a-z0-9_]+ (spec validation); quotes and backslashes
// are escaped anyway so the output is always valid JSON.
std::string Str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

std::string ModelJson(const engine::JobModel& model) {
  const engine::GemLiteConfig& c = model.config;
  const engine::FeatureSchema& s = model.schema;
  const AdamConfig adam;
  std::vector<std::string> tables, id_lists, fields;
  for (const auto& t : s.tables) tables.push_back(absl::StrCat("{\"name\": ", Str(t.name), ", \"rows\": ", t.rows, "}"));
  for (const auto& f : s.id_lists) {
    id_lists.push_back(absl::StrCat("{\"name\": ", Str(f.name), ", \"table\": ", f.table, ", \"pooling\": \"",
                                    f.pooling == Pooling::kMean ? "mean" : "sum", "\"}"));
  }
  for (const auto& f : s.sequence_fields) {
    fields.push_back(absl::StrCat("{\"name\": ", Str(f.name), ", \"table\": ", f.table, "}"));
  }
  std::string j = "{\n  \"config\": {\n";
  absl::StrAppend(&j, "    \"dim\": ", c.dim, ", \"heads\": ", c.heads, ",\n");
  absl::StrAppend(&j, "    \"seq_layers\": ", c.seq_layers, ", \"seq_mask\": \"", MaskName(c.seq_mask),
                  "\", \"seq_window\": ", c.seq_window, ", \"seq_activation\": \"",
                  AttentionActivationName(c.seq_activation), "\",\n");
  absl::StrAppend(&j, "    \"rope\": ", Bool(c.rope), ", \"qk_norm\": ", Bool(c.qk_norm), ",\n");
  absl::StrAppend(&j, "    \"cross_attention\": ", Bool(c.cross_attention), ", \"pma_queries\": ", c.pma_queries,
                  ",\n");
  absl::StrAppend(&j, "    \"dcn_layers\": ", c.dcn_layers, ", \"num_experts\": ", c.num_experts,
                  ", \"expert_hidden\": ", c.expert_hidden, ", \"expert_out\": ", c.expert_out,
                  ", \"tower_hidden\": ", c.tower_hidden, ", \"mlp_activation\": \"",
                  ActivationName(c.mlp_activation), "\",\n");
  absl::StrAppend(&j, "    \"learning_rate\": ", Num(c.learning_rate), ", \"weight_decay\": ", Num(c.weight_decay),
                  ", \"dense_grad_clip_norm\": ", Num(c.dense_grad_clip_norm),
                  ", \"adagrad_learning_rate\": ", Num(c.adagrad_learning_rate),
                  ", \"embedding_init_std\": ", Num(c.embedding_init_std), ", \"seed\": ", c.seed, "\n  },\n");
  absl::StrAppend(&j, "  \"schema\": {\n    \"tables\": [", absl::StrJoin(tables, ", "), "],\n    \"id_lists\": [",
                  absl::StrJoin(id_lists, ", "), "],\n    \"sequence_fields\": [", absl::StrJoin(fields, ", "),
                  "],\n    \"num_dense\": ", s.num_dense, "\n  },\n");
  absl::StrAppend(&j, "  \"sequence_max_length\": ",
                  model.sequence_max_length.empty() ? 0 : model.sequence_max_length[0], ",\n");
  absl::StrAppend(&j, "  \"heads\": {\"ctr\": ", Bool(!model.ctr_label.empty()), ", \"cvr\": ",
                  Bool(!model.cvr_label.empty()), "},\n");
  absl::StrAppend(&j, "  \"constants\": {\"rms_norm_epsilon\": ", Num(engine::layers::RmsNorm::kEpsilon),
                  ", \"qk_norm_epsilon\": ", Num(attention::kQkNormEpsilon),
                  ", \"attention_block_size\": ", attention::kAttentionBlockSize,
                  ", \"rope_theta\": ", Num(attention::AttentionOptions().rope_theta),
                  ", \"adagrad_epsilon\": ", Num(engine::layers::SparseEmbeddings::kAdagradEpsilon),
                  ", \"adam_beta1\": ", Num(adam.beta1), ", \"adam_beta2\": ", Num(adam.beta2),
                  ", \"adam_epsilon\": ", Num(adam.eps), "}\n}\n");
  return j;
}

}  // namespace recfleet::bench
