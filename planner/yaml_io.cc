#include "planner/yaml_io.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace recfleet::planner {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// Reads one YAML mapping, remembering the keys it consumed so leftovers can
// be reported. yaml-cpp throws; every call here is inside the try block of
// the public entry points.
class Reader {
 public:
  Reader(const YAML::Node& node, std::string path, const std::string& source)
      : node_(node), path_(std::move(path)), source_(source) {}

  absl::Status CheckMap() const {
    if (node_.IsMap()) return absl::OkStatus();
    return Error(path_, "a mapping of keys to values");
  }
  bool Has(const char* key) {
    seen_.insert(key);
    return node_[key].IsDefined() && !node_[key].IsNull();
  }
  YAML::Node Child(const char* key) {
    seen_.insert(key);
    return node_[key];
  }
  std::string ChildPath(const char* key) const { return Join(key); }

  absl::Status Number(const char* key, double* out, bool required = false) {
    if (!Has(key)) {
      return required ? Error(Join(key), "a number (required)") : absl::OkStatus();
    }
    const YAML::Node& v = node_[key];
    double d;
    if (!v.IsScalar() || !YAML::convert<double>::decode(v, d) || !std::isfinite(d)) {
      return Error(Join(key), "a number");
    }
    *out = d;
    return absl::OkStatus();
  }
  template <typename Int>
  absl::Status Integer(const char* key, Int* out, bool required = false) {
    double d = static_cast<double>(*out);
    if (auto s = Number(key, &d, required); !s.ok()) return s;
    if (d != std::floor(d) || std::fabs(d) > 9.0e18) return Error(Join(key), "a whole number");
    *out = static_cast<Int>(d);
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out, bool required = false) {
    if (!Has(key)) return required ? Error(Join(key), "a string (required)") : absl::OkStatus();
    if (!node_[key].IsScalar()) return Error(Join(key), "a string");
    *out = node_[key].as<std::string>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) {
    if (!Has(key)) return absl::OkStatus();
    bool b;
    if (!node_[key].IsScalar() || !YAML::convert<bool>::decode(node_[key], b)) {
      return Error(Join(key), "true or false");
    }
    *out = b;
    return absl::OkStatus();
  }
  // Maps a name (e.g. a dtype) to a value.
  template <typename T>
  absl::Status Enum(const char* key, const std::vector<std::pair<std::string, T>>& names, T* out) {
    std::string name;
    if (auto s = String(key, &name); !s.ok() || name.empty()) return s;
    std::vector<std::string> allowed;
    for (const auto& [n, v] : names) {
      if (n == name) {
        *out = v;
        return absl::OkStatus();
      }
      allowed.push_back(n);
    }
    return Error(Join(key), absl::StrCat("one of ", absl::StrJoin(allowed, ", ")));
  }
  // Fails on keys nothing asked for.
  absl::Status NoUnknownKeys() const {
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!seen_.count(key)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source_, ": unknown key '", Join(key), "'"));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Error(const std::string& path, const std::string& expected) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": '", path.empty() ? "<top level>" : path, "' must be ", expected));
  }

 private:
  std::string Join(const std::string& key) const {
    return path_.empty() ? key : absl::StrCat(path_, ".", key);
  }
  YAML::Node node_;
  std::string path_;
  const std::string& source_;
  std::set<std::string> seen_;
};

absl::Status ReadLink(Reader& parent, const char* key, const std::string& source, LinkSpec* link) {
  if (!parent.Has(key)) return absl::OkStatus();
  Reader r(parent.Child(key), parent.ChildPath(key), source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  double gbps = 0, us = 0;
  RECFLEET_RETURN_IF_ERROR(r.Number("bandwidth_gbps", &gbps, true));
  RECFLEET_RETURN_IF_ERROR(r.Number("latency_us", &us));
  RECFLEET_RETURN_IF_ERROR(r.NoUnknownKeys());
  link->bandwidth_bytes_per_s = gbps * 1e9;
  link->latency_s = us * 1e-6;
  return absl::OkStatus();
}

absl::StatusOr<Topology> TopologyFrom(const YAML::Node& root, const std::string& source) {
  Topology t;
  Reader r(root, "", source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  RECFLEET_RETURN_IF_ERROR(r.String("name", &t.name));
  RECFLEET_RETURN_IF_ERROR(r.Integer("nodes", &t.num_nodes, true));
  RECFLEET_RETURN_IF_ERROR(r.Integer("gpus_per_node", &t.gpus_per_node, true));
  RECFLEET_RETURN_IF_ERROR(r.Integer("nodes_per_nvlink_domain", &t.nodes_per_nvlink_domain));
  t.nodes_per_zone = t.num_nodes;
  RECFLEET_RETURN_IF_ERROR(r.Integer("nodes_per_zone", &t.nodes_per_zone));
  RECFLEET_RETURN_IF_ERROR(r.Number("cpu_cores_per_node", &t.cpu_cores_per_node));
  if (!r.Has("gpu")) return r.Error("gpu", "a mapping with hbm_gib, peak_tflops, hbm_bandwidth_gbps");
  Reader gpu(r.Child("gpu"), "gpu", source);
  RECFLEET_RETURN_IF_ERROR(gpu.CheckMap());
  double hbm = 0, tflops = 0, hbm_bw = 0;
  RECFLEET_RETURN_IF_ERROR(gpu.Number("hbm_gib", &hbm, true));
  RECFLEET_RETURN_IF_ERROR(gpu.Number("peak_tflops", &tflops, true));
  RECFLEET_RETURN_IF_ERROR(gpu.Number("hbm_bandwidth_gbps", &hbm_bw, true));
  RECFLEET_RETURN_IF_ERROR(gpu.NoUnknownKeys());
  t.hbm_bytes_per_gpu = hbm * kGiB;
  t.peak_flops_per_gpu = tflops * 1e12;
  t.hbm_bandwidth_bytes_per_s = hbm_bw * 1e9;
  if (r.Has("links")) {
    Reader links(r.Child("links"), "links", source);
    RECFLEET_RETURN_IF_ERROR(links.CheckMap());
    RECFLEET_RETURN_IF_ERROR(ReadLink(links, "nvlink", source, &t.links[kNvlink]));
    RECFLEET_RETURN_IF_ERROR(ReadLink(links, "zone", source, &t.links[kZone]));
    RECFLEET_RETURN_IF_ERROR(ReadLink(links, "cross_zone", source, &t.links[kCrossZone]));
    RECFLEET_RETURN_IF_ERROR(links.NoUnknownKeys());
  }
  RECFLEET_RETURN_IF_ERROR(r.NoUnknownKeys());
  if (auto s = ValidateTopology(t); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return t;
}

const std::vector<std::pair<std::string, int>> kFloatBytes = {
    {"fp32", 4}, {"bf16", 2}, {"fp16", 2}, {"fp8", 1}};

absl::Status ReadModule(const YAML::Node& node, const std::string& path, const std::string& source,
                        DenseModule* m) {
  Reader r(node, path, source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  RECFLEET_RETURN_IF_ERROR(r.String("name", &m->name, true));
  RECFLEET_RETURN_IF_ERROR(r.String("region", &m->region));
  RECFLEET_RETURN_IF_ERROR(r.Enum<OpKind>("op",
                                 {{"gemm", OpKind::kGemm},
                                  {"attention", OpKind::kAttention},
                                  {"elementwise", OpKind::kElementwise}},
                                 &m->op));
  RECFLEET_RETURN_IF_ERROR(r.Integer("params", &m->params, true));
  RECFLEET_RETURN_IF_ERROR(r.Integer("experts", &m->num_experts));
  RECFLEET_RETURN_IF_ERROR(r.Number("flops_per_sample", &m->flops_per_sample));
  RECFLEET_RETURN_IF_ERROR(r.Number("flops_per_token", &m->flops_per_token));
  RECFLEET_RETURN_IF_ERROR(r.Number("flops_per_token_sq", &m->flops_per_token_sq));
  RECFLEET_RETURN_IF_ERROR(
      r.Number("activation_bytes_per_sample", &m->activation_bytes_per_sample));
  RECFLEET_RETURN_IF_ERROR(r.Number("activation_bytes_per_token", &m->activation_bytes_per_token));
  RECFLEET_RETURN_IF_ERROR(r.Number("io_bytes_per_sample", &m->io_bytes_per_sample));
  return r.NoUnknownKeys();
}

// A table entry may carry `count: N` to stand for N tables named
// <name>_0 .. <name>_{N-1} (generated feature families).
absl::Status ReadTables(const YAML::Node& node, const std::string& path, const std::string& source,
                        std::vector<Table>* tables) {
  Reader r(node, path, source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  Table t;
  int count = 1;
  RECFLEET_RETURN_IF_ERROR(r.String("name", &t.name, true));
  RECFLEET_RETURN_IF_ERROR(r.Integer("rows", &t.rows, true));
  RECFLEET_RETURN_IF_ERROR(r.Integer("dim", &t.dim, true));
  RECFLEET_RETURN_IF_ERROR(r.Number("pooling_factor", &t.pooling_factor));
  RECFLEET_RETURN_IF_ERROR(r.Number("access_frequency", &t.access_frequency));
  RECFLEET_RETURN_IF_ERROR(r.Bool("pooled", &t.pooled));
  RECFLEET_RETURN_IF_ERROR(r.Integer("count", &count));
  RECFLEET_RETURN_IF_ERROR(r.NoUnknownKeys());
  if (count < 1) return r.Error(path + ".count", "a whole number >= 1");
  if (count == 1) {
    tables->push_back(t);
    return absl::OkStatus();
  }
  for (int i = 0; i < count; ++i) {
    tables->push_back(t);
    tables->back().name = absl::StrCat(t.name, "_", i);
  }
  return absl::OkStatus();
}

absl::Status ReadModel(Reader& parent, const std::string& source, Model* model) {
  if (!parent.Has("model")) return parent.Error("model", "a mapping (required)");
  Reader r(parent.Child("model"), "model", source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  RECFLEET_RETURN_IF_ERROR(r.String("name", &model->name));
  auto list = [&](const char* key, auto&& each) -> absl::Status {
    if (!r.Has(key)) return absl::OkStatus();
    YAML::Node seq = r.Child(key);
    if (!seq.IsSequence()) return r.Error(r.ChildPath(key), "a list");
    for (size_t i = 0; i < seq.size(); ++i) {
      RECFLEET_RETURN_IF_ERROR(each(seq[i], absl::StrCat(r.ChildPath(key), "[", i, "]")));
    }
    return absl::OkStatus();
  };
  RECFLEET_RETURN_IF_ERROR(list("dense", [&](const YAML::Node& n, const std::string& path) {
    model->modules.emplace_back();
    return ReadModule(n, path, source, &model->modules.back());
  }));
  RECFLEET_RETURN_IF_ERROR(list("tables", [&](const YAML::Node& n, const std::string& path) {
    return ReadTables(n, path, source, &model->tables);
  }));
  RECFLEET_RETURN_IF_ERROR(
      list("sequence_lengths", [&](const YAML::Node& n, const std::string& path) {
        Reader b(n, path, source);
        RECFLEET_RETURN_IF_ERROR(b.CheckMap());
        SeqLengthBucket bucket;
        RECFLEET_RETURN_IF_ERROR(b.Number("length", &bucket.length, true));
        RECFLEET_RETURN_IF_ERROR(b.Number("fraction", &bucket.fraction, true));
        RECFLEET_RETURN_IF_ERROR(b.NoUnknownKeys());
        model->sequence_lengths.push_back(bucket);
        return absl::OkStatus();
      }));
  return r.NoUnknownKeys();
}

absl::StatusOr<PlanRequest> JobFrom(const YAML::Node& root, const std::string& source) {
  PlanRequest req;
  Reader r(root, "", source);
  RECFLEET_RETURN_IF_ERROR(r.CheckMap());
  std::string name;
  RECFLEET_RETURN_IF_ERROR(r.String("name", &name));
  if (!r.Has("batch")) return r.Error("batch", "a mapping with 'local' (samples per GPU)");
  {
    Reader b(r.Child("batch"), "batch", source);
    RECFLEET_RETURN_IF_ERROR(b.CheckMap());
    RECFLEET_RETURN_IF_ERROR(b.Integer("local", &req.local_batch, true));
    RECFLEET_RETURN_IF_ERROR(b.NoUnknownKeys());
  }
  RECFLEET_RETURN_IF_ERROR(ReadModel(r, source, &req.model));
  if (req.model.name.empty()) req.model.name = name;
  if (r.Has("precision")) {
    Reader p(r.Child("precision"), "precision", source);
    PrecisionRecipe& pr = req.precision;
    RECFLEET_RETURN_IF_ERROR(p.CheckMap());
    RECFLEET_RETURN_IF_ERROR(p.Enum("weights", kFloatBytes, &pr.weight_gather_bytes));
    RECFLEET_RETURN_IF_ERROR(p.Enum("gradients", kFloatBytes, &pr.gradient_reduce_bytes));
    RECFLEET_RETURN_IF_ERROR(p.Enum("embedding", kFloatBytes, &pr.embedding_bytes));
    RECFLEET_RETURN_IF_ERROR(p.Enum("embedding_comm", kFloatBytes, &pr.embedding_comm_bytes));
    RECFLEET_RETURN_IF_ERROR(p.Enum<bool>("kept_activations", {{"bf16", false}, {"fp8", true}},
                                 &pr.fp8_kept_activations));
    RECFLEET_RETURN_IF_ERROR(p.Number("fp8_speedup", &pr.fp8_speedup));
    if (p.Has("fp8_modules")) {
      YAML::Node seq = p.Child("fp8_modules");
      if (!seq.IsSequence()) return p.Error("precision.fp8_modules", "a list of module names");
      for (const auto& n : seq) pr.fp8_modules.insert(n.as<std::string>());
    }
    RECFLEET_RETURN_IF_ERROR(p.NoUnknownKeys());
  }
  if (r.Has("efficiency")) {
    Reader e(r.Child("efficiency"), "efficiency", source);
    RECFLEET_RETURN_IF_ERROR(e.CheckMap());
    RECFLEET_RETURN_IF_ERROR(e.Number("gemm", &req.efficiency.gemm));
    RECFLEET_RETURN_IF_ERROR(e.Number("attention", &req.efficiency.attention));
    RECFLEET_RETURN_IF_ERROR(e.Number("elementwise", &req.efficiency.elementwise));
    RECFLEET_RETURN_IF_ERROR(e.Number("embedding", &req.efficiency.embedding));
    RECFLEET_RETURN_IF_ERROR(e.NoUnknownKeys());
  }
  if (r.Has("planner")) {
    Reader o(r.Child("planner"), "planner", source);
    RECFLEET_RETURN_IF_ERROR(o.CheckMap());
    RECFLEET_RETURN_IF_ERROR(o.Number("hbm_reserve", &req.options.hbm_reserve_fraction));
    RECFLEET_RETURN_IF_ERROR(o.Bool("allow_cross_zone_non_gradient",
                           &req.options.allow_cross_zone_non_gradient));
    RECFLEET_RETURN_IF_ERROR(
        o.Integer("embedding_sync_interval", &req.options.embedding_sync_interval));
    RECFLEET_RETURN_IF_ERROR(o.Integer("min_column_shard_dim", &req.options.min_column_shard_dim));
    RECFLEET_RETURN_IF_ERROR(
        o.Integer("max_model_parallel_group", &req.options.max_model_parallel_group));
    RECFLEET_RETURN_IF_ERROR(o.Bool("overlap_collectives", &req.options.overlap_collectives));
    RECFLEET_RETURN_IF_ERROR(o.NoUnknownKeys());
  }
  if (r.Has("parallelism")) {
    Reader h(r.Child("parallelism"), "parallelism", source);
    RECFLEET_RETURN_IF_ERROR(h.CheckMap());
    RECFLEET_RETURN_IF_ERROR(h.Integer("fsdp_group_size", &req.hints.fsdp_group_size));
    RECFLEET_RETURN_IF_ERROR(h.Integer("replicas", &req.hints.replicas));
    RECFLEET_RETURN_IF_ERROR(
        h.Integer("table_sharding_group_size", &req.hints.table_sharding_group_size));
    RECFLEET_RETURN_IF_ERROR(h.NoUnknownKeys());
  }
  RECFLEET_RETURN_IF_ERROR(r.NoUnknownKeys());
  if (auto s = ValidateRequest(req); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return req;
}

template <typename T>
absl::StatusOr<T> ParseWith(const std::string& text, const std::string& source,
                            absl::StatusOr<T> (*from)(const YAML::Node&, const std::string&)) {
  try {
    return from(YAML::Load(text), source);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": line ", e.mark.line + 1, ", column ",
                                                   e.mark.column + 1, ": ", e.msg));
  }
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<Topology> ParseTopologyYaml(const std::string& text, const std::string& source) {
  return ParseWith<Topology>(text, source, &TopologyFrom);
}

absl::StatusOr<PlanRequest> ParseJobYaml(const std::string& text, const std::string& source) {
  return ParseWith<PlanRequest>(text, source, &JobFrom);
}

absl::StatusOr<Topology> LoadTopologyYaml(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseTopologyYaml(*text, path);
}

absl::StatusOr<PlanRequest> LoadJobYaml(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseJobYaml(*text, path);
}

}  // namespace recfleet::planner
