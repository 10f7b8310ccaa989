#ifndef RECFLEET_DATA_SCHEMA_H_
#define RECFLEET_DATA_SCHEMA_H_

// The schema of a recfleet dataset: its features (name, element type,
// scalar or jagged, and which embedding table the feature's ids index) plus
// free-form string metadata (vocabulary sizes, how the file was made, a
// synthetic generator's planted model). Stored, checksummed, in the header
// of every dataset file (see data/FORMAT.md). Plain value type.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace recfleet::data {

enum class DType : uint8_t { kInt64 = 1, kFloat32 = 2 };
enum class Layout : uint8_t { kScalar = 1, kJagged = 2 };

absl::string_view DTypeName(DType t);
absl::string_view LayoutName(Layout l);

struct FeatureSpec {
  std::string name;  // Unique within the schema, non-empty.
  DType dtype = DType::kInt64;
  Layout layout = Layout::kScalar;
  // Embedding table the ids of this feature index ("" for dense features,
  // labels and bookkeeping columns such as sample_id). Several features may
  // share a table (a history of items and the candidate item).
  std::string table;
};

struct Schema {
  std::vector<FeatureSpec> features;
  std::map<std::string, std::string> metadata;

  // Index of the feature called `name`, or -1.
  int Find(absl::string_view name) const;
  // Like Find, but an error naming the missing feature and its required
  // form if it is absent or has another dtype/layout.
  absl::StatusOr<int> Require(absl::string_view name, DType dtype, Layout layout) const;

  // Names unique and non-empty, types known, at most 65535 bytes per name.
  absl::Status Validate() const;

  // Little-endian binary form stored in the file header (data/FORMAT.md).
  std::string Serialize() const;
  static absl::StatusOr<Schema> Parse(absl::string_view bytes);

  // One line per feature, for `recfleet data info`.
  std::string DebugString() const;
};

bool operator==(const FeatureSpec& a, const FeatureSpec& b);
bool operator==(const Schema& a, const Schema& b);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_SCHEMA_H_
