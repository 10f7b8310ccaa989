#include "worker/rank_model.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace recfleet::worker {

std::string ModelFingerprint(const engine::GemLite<float>& model, const engine::FeatureSchema& schema, int64_t dim) {
  std::string fingerprint;
  for (const std::string& name : model.DenseParameterNames()) {
    absl::StrAppend(&fingerprint, name, ":", model.DenseParameterView(name).numel(), ";");
  }
  for (const engine::FeatureSchema::Table& t : schema.tables) {
    absl::StrAppend(&fingerprint, "table.", t.name, ":", t.rows, "x", dim, ";");
  }
  return fingerprint;
}

absl::StatusOr<int64_t> CheckpointAdamStep(const CheckpointShard& shard, size_t index, const std::string& fingerprint) {
  auto fp = shard.find("fingerprint");
  if (fp == shard.end() || fp->second != fingerprint) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", index, " holds another model's parameters"));
  }
  int64_t step = 0;
  auto st = shard.find("adam_step");
  if (st == shard.end() || !absl::SimpleAtoi(st->second, &step)) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", index, " has no optimizer step count"));
  }
  return step;
}

}  // namespace recfleet::worker
