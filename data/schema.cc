#include "data/schema.h"

#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"

namespace recfleet::data {
namespace {

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

// Bounds-checked cursor over the serialized schema.
class Cursor {
 public:
  explicit Cursor(absl::string_view b) : b_(b) {}
  template <typename T>
  bool Get(T* v) {
    if (b_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool GetString(size_t n, std::string* s) {
    if (b_.size() - pos_ < n) return false;
    s->assign(b_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t pos() const { return pos_; }
  bool done() const { return pos_ == b_.size(); }

 private:
  absl::string_view b_;
  size_t pos_ = 0;
};

}  // namespace

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kInt64:
      return "int64";
    case DType::kFloat32:
      return "float32";
  }
  return "unknown";
}

absl::string_view LayoutName(Layout l) {
  switch (l) {
    case Layout::kScalar:
      return "scalar";
    case Layout::kJagged:
      return "jagged";
  }
  return "unknown";
}

int Schema::Find(absl::string_view name) const {
  for (size_t i = 0; i < features.size(); ++i) {
    if (features[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<int> Schema::Require(absl::string_view name, DType dtype, Layout layout) const {
  int i = Find(name);
  if (i < 0) {
    return absl::NotFoundError(absl::StrCat("dataset has no feature '", name, "' (expected a ",
                                            LayoutName(layout), " ", DTypeName(dtype), " column)"));
  }
  const FeatureSpec& f = features[i];
  if (f.dtype != dtype || f.layout != layout) {
    return absl::InvalidArgumentError(absl::StrCat("feature '", name, "' is ", LayoutName(f.layout),
                                                   " ", DTypeName(f.dtype), "; expected ",
                                                   LayoutName(layout), " ", DTypeName(dtype)));
  }
  return i;
}

absl::Status Schema::Validate() const {
  std::set<std::string> seen;
  for (size_t i = 0; i < features.size(); ++i) {
    const FeatureSpec& f = features[i];
    if (f.name.empty() || f.name.size() > 65535 || f.table.size() > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature #", i, ": name must be 1..65535 bytes and table <= 65535 bytes"));
    }
    if (!seen.insert(f.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("feature name '", f.name, "' repeats"));
    }
    if ((f.dtype != DType::kInt64 && f.dtype != DType::kFloat32) ||
        (f.layout != Layout::kScalar && f.layout != Layout::kJagged)) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature '", f.name, "': unknown dtype or layout"));
    }
  }
  return absl::OkStatus();
}

std::string Schema::Serialize() const {
  std::string out;
  Put<uint32_t>(&out, static_cast<uint32_t>(features.size()));
  for (const FeatureSpec& f : features) {
    Put<uint8_t>(&out, static_cast<uint8_t>(f.dtype));
    Put<uint8_t>(&out, static_cast<uint8_t>(f.layout));
    Put<uint16_t>(&out, static_cast<uint16_t>(f.name.size()));
    out += f.name;
    Put<uint16_t>(&out, static_cast<uint16_t>(f.table.size()));
    out += f.table;
  }
  Put<uint32_t>(&out, static_cast<uint32_t>(metadata.size()));
  for (const auto& [k, v] : metadata) {
    Put<uint32_t>(&out, static_cast<uint32_t>(k.size()));
    out += k;
    Put<uint32_t>(&out, static_cast<uint32_t>(v.size()));
    out += v;
  }
  return out;
}

absl::StatusOr<Schema> Schema::Parse(absl::string_view bytes) {
  Cursor c(bytes);
  Schema s;
  auto bad = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat("schema: ", what, " at schema byte ", c.pos(), " of ", bytes.size()));
  };
  uint32_t n = 0;
  if (!c.Get(&n)) return bad("missing feature count");
  if (n > bytes.size()) return bad("feature count larger than the schema");
  for (uint32_t i = 0; i < n; ++i) {
    FeatureSpec f;
    uint8_t dtype = 0, layout = 0;
    uint16_t len = 0;
    if (!c.Get(&dtype) || !c.Get(&layout)) return bad("truncated feature type");
    f.dtype = static_cast<DType>(dtype);
    f.layout = static_cast<Layout>(layout);
    if (!c.Get(&len) || !c.GetString(len, &f.name)) return bad("truncated feature name");
    if (!c.Get(&len) || !c.GetString(len, &f.table)) return bad("truncated table name");
    s.features.push_back(std::move(f));
  }
  uint32_t m = 0;
  if (!c.Get(&m)) return bad("missing metadata count");
  for (uint32_t i = 0; i < m; ++i) {
    uint32_t len = 0;
    std::string k, v;
    if (!c.Get(&len) || !c.GetString(len, &k)) return bad("truncated metadata key");
    if (!c.Get(&len) || !c.GetString(len, &v)) return bad("truncated metadata value");
    s.metadata[k] = v;
  }
  if (!c.done()) return bad("trailing bytes");
  if (absl::Status st = s.Validate(); !st.ok()) {
    return absl::DataLossError(absl::StrCat("schema: ", st.message()));
  }
  return s;
}

std::string Schema::DebugString() const {
  std::string out;
  for (const FeatureSpec& f : features) {
    absl::StrAppend(&out, f.name, "\t", LayoutName(f.layout), "\t", DTypeName(f.dtype), "\t",
                    f.table.empty() ? "-" : f.table, "\n");
  }
  for (const auto& [k, v] : metadata) absl::StrAppend(&out, "# ", k, " = ", v, "\n");
  return out;
}

bool operator==(const FeatureSpec& a, const FeatureSpec& b) {
  return a.name == b.name && a.dtype == b.dtype && a.layout == b.layout && a.table == b.table;
}

bool operator==(const Schema& a, const Schema& b) {
  return a.features == b.features && a.metadata == b.metadata;
}

}  // namespace recfleet::data
