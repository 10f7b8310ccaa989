#ifndef RECFLEET_ENGINE_MODEL_SPEC_H_
#define RECFLEET_ENGINE_MODEL_SPEC_H_

// Adapter from the job spec (recfleet.v1.ModelSpec / TrainingSpec) to the
// engine's plain structs: the feature schema and the GEM-lite config. The
// spec can describe more than GEM-lite builds today; anything it cannot
// build is reported, never silently dropped.

#include "absl/status/status.h"
#include "engine/batch.h"
#include "engine/model_config.h"
#include "recfleet/v1/job.pb.h"

namespace recfleet::engine {

// Fills `schema` and `config` (learning rates and seed from `training`).
// InvalidArgument for an inconsistent spec and Unimplemented for a valid
// spec GEM-lite does not build (e.g. MLP dense modules, top-k routing,
// attention bias); both name the field path, e.g.
// "model.dense[1].moe.top_k".
absl::Status FromModelSpec(const v1::ModelSpec& spec, const v1::TrainingSpec& training,
                           FeatureSchema* schema, GemLiteConfig* config);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_MODEL_SPEC_H_
