#include "data/cost_model.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recfleet::data {

absl::StatusOr<CostModel> CostModel::Parse(absl::string_view spec) {
  CostModel m;
  m.linear = 0;
  if (spec == "linear") {
    m.linear = 1;
    return m;
  }
  if (spec == "quadratic") {
    m.quadratic = 1;
    return m;
  }
  if (spec == "windowed") {
    m.windowed = 1;
    return m;
  }
  if (spec == "block") {
    m.block = 1;
    return m;
  }
  const std::string expected =
      "expected linear|quadratic|windowed|block or a list like "
      "linear=1,quadratic=0.002,windowed=0,window=1024,block=0,block_size=64,per_sample=0";
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    double v = 0;
    if (!absl::SimpleAtod(kv.second, &v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost spec '", spec, "': bad value in '", part, "'; ", expected));
    }
    const std::string& k = kv.first;
    if (k == "linear") {
      m.linear = v;
    } else if (k == "quadratic") {
      m.quadratic = v;
    } else if (k == "windowed") {
      m.windowed = v;
    } else if (k == "window" && v >= 1) {
      m.window = static_cast<int64_t>(v);
    } else if (k == "block") {
      m.block = v;
    } else if (k == "block_size" && v >= 1) {
      m.block_size = static_cast<int64_t>(v);
    } else if (k == "per_sample") {
      m.per_sample = v;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("cost spec '", spec, "': unknown term '", k, "'; ", expected));
    }
  }
  if (m.linear + m.quadratic + m.windowed + m.block + m.per_sample <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cost spec '", spec, "' gives every sample cost 0; ", expected));
  }
  return m;
}

std::string CostModel::ToString() const {
  return absl::StrCat("linear=", linear, ",quadratic=", quadratic, ",windowed=", windowed,
                      ",window=", window, ",block=", block, ",block_size=", block_size,
                      ",per_sample=", per_sample);
}

}  // namespace recfleet::data
