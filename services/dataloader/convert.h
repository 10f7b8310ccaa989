#ifndef RECFLEET_SERVICES_DATALOADER_CONVERT_H_
#define RECFLEET_SERVICES_DATALOADER_CONVERT_H_

// Conversions between the data library's types and the dataloader protos.
// Pure functions; a received batch is validated before use, so a malformed
// message gives an error, never out-of-bounds reads.

#include <memory>

#include "absl/status/statusor.h"
#include "data/loader.h"
#include "data/schema.h"
#include "recfleet/v1/dataloader.pb.h"

namespace recfleet::dataloader {

void SchemaToProto(const data::Schema& schema, recfleet::v1::LoaderInfo* info);
absl::StatusOr<data::Schema> SchemaFromProto(const recfleet::v1::LoaderInfo& info);

// Fills `out` with rank batch `rb` of a step whose gaps are given.
void RankBatchToProto(const data::RankBatch& rb, double step_gap, double step_naive_gap,
                      recfleet::v1::RankBatch* out);

// Decodes `in` (whose columns follow `schema`) into `out`.
absl::Status RankBatchFromProto(const recfleet::v1::RankBatch& in,
                                const std::shared_ptr<const data::Schema>& schema,
                                data::RankBatch* out);

}  // namespace recfleet::dataloader

#endif  // RECFLEET_SERVICES_DATALOADER_CONVERT_H_
