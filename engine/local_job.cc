#include "engine/local_job.h"

#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace recfleet::engine {
namespace {

// Reads typed scalars out of one YAML mapping, remembering which keys were
// consumed so the rest can be reported as unknown.
class Section {
 public:
  Section(const YAML::Node& node, std::string name) : node_(node), name_(std::move(name)) {}

  absl::Status Check() const {
    if (node_ && !node_.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(name_, " must be a mapping"));
    }
    return absl::OkStatus();
  }

  template <typename V>
  absl::Status Get(const std::string& key, V* out) {
    used_.insert(key);
    if (!node_ || !node_[key]) return absl::OkStatus();
    try {
      *out = node_[key].as<V>();
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ".", key, ": cannot read '", node_[key].Scalar(), "' as the expected ",
                       std::is_same_v<V, std::string> ? "string" : std::is_same_v<V, bool> ? "bool" : "number"));
    }
    return absl::OkStatus();
  }

  absl::Status Unknown() const {
    if (!node_) return absl::OkStatus();
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (used_.count(key) == 0) {
        return absl::InvalidArgumentError(absl::StrCat("unknown key ", name_, ".", key));
      }
    }
    return absl::OkStatus();
  }

 private:
  YAML::Node node_;
  std::string name_;
  std::set<std::string> used_;
};

absl::Status ParseDataset(const YAML::Node& node, DatasetSpec* d) {
  Section s(node, "dataset");
  RECFLEET_RETURN_IF_ERROR(s.Check());
  RECFLEET_RETURN_IF_ERROR(s.Get("format", &d->format));
  RECFLEET_RETURN_IF_ERROR(s.Get("path", &d->path));
  RECFLEET_RETURN_IF_ERROR(s.Get("positive_rating", &d->ctr.positive_rating));
  RECFLEET_RETURN_IF_ERROR(s.Get("eval_fraction", &d->ctr.eval_fraction));
  RECFLEET_RETURN_IF_ERROR(s.Get("max_history", &d->ctr.max_history));
  RECFLEET_RETURN_IF_ERROR(s.Get("synthetic_users", &d->synthetic.num_users));
  RECFLEET_RETURN_IF_ERROR(s.Get("synthetic_items", &d->synthetic.num_items));
  RECFLEET_RETURN_IF_ERROR(s.Get("synthetic_min_events", &d->synthetic.min_events));
  RECFLEET_RETURN_IF_ERROR(s.Get("synthetic_mean_extra_events", &d->synthetic.mean_extra_events));
  RECFLEET_RETURN_IF_ERROR(s.Get("synthetic_seed", &d->synthetic.seed));
  RECFLEET_RETURN_IF_ERROR(s.Unknown());
  if (d->format != "movielens" && d->format != "synthetic") {
    return absl::InvalidArgumentError(
        absl::StrCat("dataset.format must be movielens or synthetic, got '", d->format, "'"));
  }
  if (d->format == "movielens" && d->path.empty()) {
    return absl::InvalidArgumentError("dataset.path is required for format movielens");
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const YAML::Node& node, GemLiteConfig* m) {
  Section s(node, "model");
  RECFLEET_RETURN_IF_ERROR(s.Check());
  std::string mask = "full", seq_act = "softmax";
  std::string mlp_act(ActivationName(m->mlp_activation));
  RECFLEET_RETURN_IF_ERROR(s.Get("dim", &m->dim));
  RECFLEET_RETURN_IF_ERROR(s.Get("heads", &m->heads));
  RECFLEET_RETURN_IF_ERROR(s.Get("seq_layers", &m->seq_layers));
  RECFLEET_RETURN_IF_ERROR(s.Get("seq_mask", &mask));
  RECFLEET_RETURN_IF_ERROR(s.Get("seq_window", &m->seq_window));
  RECFLEET_RETURN_IF_ERROR(s.Get("seq_activation", &seq_act));
  RECFLEET_RETURN_IF_ERROR(s.Get("rope", &m->rope));
  RECFLEET_RETURN_IF_ERROR(s.Get("qk_norm", &m->qk_norm));
  RECFLEET_RETURN_IF_ERROR(s.Get("cross_attention", &m->cross_attention));
  RECFLEET_RETURN_IF_ERROR(s.Get("pma_queries", &m->pma_queries));
  RECFLEET_RETURN_IF_ERROR(s.Get("dcn_layers", &m->dcn_layers));
  RECFLEET_RETURN_IF_ERROR(s.Get("num_experts", &m->num_experts));
  RECFLEET_RETURN_IF_ERROR(s.Get("expert_hidden", &m->expert_hidden));
  RECFLEET_RETURN_IF_ERROR(s.Get("expert_out", &m->expert_out));
  RECFLEET_RETURN_IF_ERROR(s.Get("tower_hidden", &m->tower_hidden));
  RECFLEET_RETURN_IF_ERROR(s.Get("mlp_activation", &mlp_act));
  RECFLEET_RETURN_IF_ERROR(s.Get("learning_rate", &m->learning_rate));
  RECFLEET_RETURN_IF_ERROR(s.Get("weight_decay", &m->weight_decay));
  RECFLEET_RETURN_IF_ERROR(s.Get("adagrad_learning_rate", &m->adagrad_learning_rate));
  RECFLEET_RETURN_IF_ERROR(s.Get("embedding_init_std", &m->embedding_init_std));
  RECFLEET_RETURN_IF_ERROR(s.Get("seed", &m->seed));
  RECFLEET_RETURN_IF_ERROR(s.Unknown());
  absl::StatusOr<attention::Mask> parsed_mask = ParseMask(mask);
  if (!parsed_mask.ok()) return absl::InvalidArgumentError(absl::StrCat("model.seq_mask: ", parsed_mask.status().message()));
  m->seq_mask = *parsed_mask;
  absl::StatusOr<attention::Activation> parsed_act = ParseAttentionActivation(seq_act);
  if (!parsed_act.ok()) return absl::InvalidArgumentError(absl::StrCat("model.seq_activation: ", parsed_act.status().message()));
  m->seq_activation = *parsed_act;
  absl::StatusOr<Activation> parsed_mlp = ParseActivation(mlp_act);
  if (!parsed_mlp.ok()) return absl::InvalidArgumentError(absl::StrCat("model.mlp_activation: ", parsed_mlp.status().message()));
  m->mlp_activation = *parsed_mlp;
  return m->Validate();
}

absl::Status ParseTrain(const YAML::Node& node, TrainerOptions* t) {
  Section s(node, "train");
  RECFLEET_RETURN_IF_ERROR(s.Check());
  RECFLEET_RETURN_IF_ERROR(s.Get("batch_size", &t->batch_size));
  RECFLEET_RETURN_IF_ERROR(s.Get("epochs", &t->epochs));
  RECFLEET_RETURN_IF_ERROR(s.Get("max_steps", &t->max_steps));
  RECFLEET_RETURN_IF_ERROR(s.Get("time_budget_s", &t->time_budget_s));
  RECFLEET_RETURN_IF_ERROR(s.Get("log_every", &t->log_every));
  RECFLEET_RETURN_IF_ERROR(s.Get("seed", &t->seed));
  RECFLEET_RETURN_IF_ERROR(s.Get("eval_batch_size", &t->eval_batch_size));
  RECFLEET_RETURN_IF_ERROR(s.Get("threads", &t->threads));
  RECFLEET_RETURN_IF_ERROR(s.Unknown());
  if (t->batch_size < 1) return absl::InvalidArgumentError("train.batch_size must be >= 1");
  if (t->epochs < 1) return absl::InvalidArgumentError("train.epochs must be >= 1");
  if (t->threads < 1) return absl::InvalidArgumentError("train.threads must be >= 1");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LocalJob> ParseLocalJob(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("job YAML does not parse: ", e.what()));
  }
  LocalJob job;
  if (root.IsNull()) return job;
  if (!root.IsMap()) return absl::InvalidArgumentError("job YAML must be a mapping");
  for (const auto& kv : root) {
    const std::string key = kv.first.as<std::string>();
    if (key != "dataset" && key != "model" && key != "train") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown top-level key '", key, "' (expected dataset, model, train)"));
    }
  }
  RECFLEET_RETURN_IF_ERROR(ParseDataset(root["dataset"], &job.dataset));
  RECFLEET_RETURN_IF_ERROR(ParseModel(root["model"], &job.model));
  RECFLEET_RETURN_IF_ERROR(ParseTrain(root["train"], &job.train));
  return job;
}

absl::StatusOr<LocalJob> LoadLocalJob(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open job file ", path));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<LocalJob> job = ParseLocalJob(text.str());
  if (!job.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", job.status().message()));
  std::string& data = job->dataset.path;
  const size_t slash = path.find_last_of('/');
  if (!data.empty() && data[0] != '/' && !std::ifstream(data).good() && slash != std::string::npos) {
    const std::string beside = path.substr(0, slash + 1) + data;
    if (std::ifstream(beside).good()) data = beside;
  }
  return job;
}

absl::StatusOr<LocalRunResult> RunLocalJob(const LocalJob& job, const Trainer::Logger& log) {
  auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  MovieLensData raw;
  if (job.dataset.format == "synthetic") {
    raw = SyntheticMovieLens(job.dataset.synthetic);
  } else {
    absl::StatusOr<MovieLensData> read = ReadMovieLens(job.dataset.path);
    if (!read.ok()) return read.status();
    raw = *std::move(read);
  }
  const size_t events = raw.ratings.size();
  absl::StatusOr<MovieLensCtr> data = MovieLensCtr::Create(std::move(raw), job.dataset.ctr);
  if (!data.ok()) return data.status();
  LocalRunResult result;
  result.train_samples = data->num_train();
  result.eval_samples = data->num_eval();
  absl::StatusOr<BaselineAucs> baselines = data->Baselines();
  if (!baselines.ok()) return baselines.status();
  result.baselines = *baselines;
  say(absl::StrFormat(
      "dataset %s: %d events -> %d train / %d eval samples (label rating >= %g, last %g of each "
      "user's events held out), train positive rate %.4f",
      job.dataset.format == "synthetic" ? "synthetic" : job.dataset.path, events,
      result.train_samples, result.eval_samples, job.dataset.ctr.positive_rating,
      job.dataset.ctr.eval_fraction, data->train_positive_rate()));
  say(absl::StrFormat("baseline eval AUC: item popularity %.4f | user rate + item rate %.4f",
                      baselines->item_popularity, baselines->user_item_rate));

  auto model = GemLite<float>::Create(job.model, data->schema());
  if (!model.ok()) return model.status();
  result.dense_parameters = (*model)->num_dense_parameters();
  result.table_parameters = (*model)->num_table_parameters();
  say(absl::StrFormat("GEM-lite: %d dense parameters, %d embedding parameters in %d tables",
                      result.dense_parameters, result.table_parameters,
                      static_cast<int>(data->schema().tables.size())));
  Trainer trainer(model->get(), &*data, job.train, log);
  absl::StatusOr<TrainReport> report = trainer.Run();
  if (!report.ok()) return report.status();
  result.report = *std::move(report);
  return result;
}

}  // namespace recfleet::engine
