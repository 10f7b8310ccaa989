#include "services/dataloader/convert.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace recfleet::dataloader {

void SchemaToProto(const data::Schema& schema, recfleet::v1::LoaderInfo* info) {
  for (const data::FeatureSpec& f : schema.features) {
    auto* p = info->add_features();
    p->set_name(f.name);
    p->set_dtype(f.dtype == data::DType::kInt64 ? recfleet::v1::FEATURE_DTYPE_INT64
                                                : recfleet::v1::FEATURE_DTYPE_FLOAT32);
    p->set_layout(f.layout == data::Layout::kScalar ? recfleet::v1::FEATURE_LAYOUT_SCALAR
                                                    : recfleet::v1::FEATURE_LAYOUT_JAGGED);
    p->set_table(f.table);
  }
  for (const auto& [k, v] : schema.metadata) (*info->mutable_metadata())[k] = v;
}

absl::StatusOr<data::Schema> SchemaFromProto(const recfleet::v1::LoaderInfo& info) {
  data::Schema s;
  for (const auto& p : info.features()) {
    data::FeatureSpec f;
    f.name = p.name();
    f.table = p.table();
    if (p.dtype() == recfleet::v1::FEATURE_DTYPE_INT64) {
      f.dtype = data::DType::kInt64;
    } else if (p.dtype() == recfleet::v1::FEATURE_DTYPE_FLOAT32) {
      f.dtype = data::DType::kFloat32;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("feature '", p.name(), "': unknown dtype"));
    }
    if (p.layout() == recfleet::v1::FEATURE_LAYOUT_SCALAR) {
      f.layout = data::Layout::kScalar;
    } else if (p.layout() == recfleet::v1::FEATURE_LAYOUT_JAGGED) {
      f.layout = data::Layout::kJagged;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("feature '", p.name(), "': unknown layout"));
    }
    s.features.push_back(std::move(f));
  }
  for (const auto& [k, v] : info.metadata()) s.metadata[k] = v;
  if (auto st = s.Validate(); !st.ok()) return st;
  return s;
}

void RankBatchToProto(const data::RankBatch& rb, double step_gap, double step_naive_gap,
                      recfleet::v1::RankBatch* out) {
  out->set_epoch(rb.epoch);
  out->set_step(rb.step);
  out->set_rank(rb.rank);
  out->set_num_samples(static_cast<int64_t>(rb.samples.num_rows()));
  for (uint32_t o : rb.base_batch_offsets) out->add_base_batch_offsets(o);
  out->set_cost(rb.cost);
  out->set_step_gap(step_gap);
  out->set_step_naive_gap(step_naive_gap);
  const data::Schema& s = rb.samples.schema();
  for (size_t c = 0; c < s.features.size(); ++c) {
    const data::Column& col = rb.samples.column(c);
    auto* p = out->add_columns();
    p->set_name(s.features[c].name);
    if (s.features[c].dtype == data::DType::kInt64) {
      p->set_values(col.i64.data(), col.i64.size() * 8);
    } else {
      p->set_values(col.f32.data(), col.f32.size() * 4);
    }
    if (s.features[c].layout == data::Layout::kJagged) {
      p->set_offsets(col.offsets.data(), col.offsets.size() * 8);
    }
  }
}

absl::Status RankBatchFromProto(const recfleet::v1::RankBatch& in,
                                const std::shared_ptr<const data::Schema>& schema,
                                data::RankBatch* out) {
  if (in.num_samples() < 0 || in.columns_size() != static_cast<int>(schema->features.size())) {
    return absl::DataLossError(absl::StrCat("rank batch (step ", in.step(),
                                            "): ", in.columns_size(), " columns, schema has ",
                                            schema->features.size()));
  }
  out->epoch = in.epoch();
  out->step = in.step();
  out->rank = in.rank();
  out->cost = in.cost();
  out->base_batch_offsets.assign(in.base_batch_offsets().begin(), in.base_batch_offsets().end());
  out->samples = data::Batch(schema);
  const size_t rows = static_cast<size_t>(in.num_samples());
  for (size_t c = 0; c < schema->features.size(); ++c) {
    const data::FeatureSpec& f = schema->features[c];
    const auto& p = in.columns(static_cast<int>(c));
    data::Column& col = out->samples.mutable_column(static_cast<int>(c));
    const size_t elem = f.dtype == data::DType::kInt64 ? 8 : 4;
    if (p.name() != f.name || p.values().size() % elem != 0) {
      return absl::DataLossError(absl::StrCat("rank batch column ", c, " ('", p.name(),
                                              "'): expected feature '", f.name, "' of ", elem,
                                              "-byte values"));
    }
    const size_t n = p.values().size() / elem;
    if (f.dtype == data::DType::kInt64) {
      col.i64.resize(n);
      std::memcpy(col.i64.data(), p.values().data(), p.values().size());
    } else {
      col.f32.resize(n);
      std::memcpy(col.f32.data(), p.values().data(), p.values().size());
    }
    if (f.layout == data::Layout::kJagged) {
      if (p.offsets().size() != (rows + 1) * 8) {
        return absl::DataLossError(absl::StrCat("rank batch feature '", f.name,
                                                "': ", p.offsets().size() / 8, " offsets for ",
                                                rows, " samples"));
      }
      col.offsets.resize(rows + 1);
      std::memcpy(col.offsets.data(), p.offsets().data(), p.offsets().size());
    }
  }
  out->samples.set_num_rows(rows);
  if (auto st = out->samples.Validate(); !st.ok()) {
    return absl::DataLossError(absl::StrCat("rank batch (step ", in.step(), "): ", st.message()));
  }
  if (out->base_batch_offsets.empty() || out->base_batch_offsets.front() != 0 ||
      out->base_batch_offsets.back() != rows) {
    return absl::DataLossError(absl::StrCat("rank batch (step ", in.step(),
                                            "): base batch offsets do not frame the samples"));
  }
  return absl::OkStatus();
}

}  // namespace recfleet::dataloader
