#include "services/common/exposition.h"

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace recfleet::metrics {
namespace {

bool NameChar(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
         (!first && c >= '0' && c <= '9');
}

// The family a sample belongs to: histogram samples carry suffixes.
std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      std::string base = name.substr(0, name.size() - s.size());
      if (types.count(base)) return base;
    }
  }
  return "";
}

bool ParseValue(const std::string& s, double* v) {
  if (s == "+Inf") {
    *v = std::numeric_limits<double>::infinity();
  } else if (s == "-Inf") {
    *v = -std::numeric_limits<double>::infinity();
  } else if (absl::EqualsIgnoreCase(s, "NaN")) {  // prometheus-cpp writes "Nan".
    *v = std::nan("");
  } else {
    return absl::SimpleAtod(s, v);
  }
  return true;
}

}  // namespace

absl::StatusOr<Exposition> ParseExposition(const std::string& text) {
  Exposition out;
  if (!text.empty() && text.back() != '\n') {
    return absl::InvalidArgumentError("exposition must end with a newline");
  }
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  for (size_t n = 0; n + 1 < lines.size(); ++n) {
    const std::string& line = lines[n];
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", n + 1, ": ", why, ": '", line, "'"));
    };
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (parts.size() >= 3 && parts[1] == "TYPE") {
        if (parts.size() != 4) return bad("TYPE needs a name and a type");
        if (out.types.count(parts[2])) return bad("second TYPE for " + parts[2]);
        out.types[parts[2]] = parts[3];
      } else if (parts.size() >= 3 && parts[1] == "HELP") {
        std::string h = parts.size() == 4 ? parts[3] : "";
        std::string unescaped;
        for (size_t i = 0; i < h.size(); ++i) {
          if (h[i] == '\\' && i + 1 < h.size()) {
            unescaped.push_back(h[i + 1] == 'n' ? '\n' : h[i + 1]);
            ++i;
          } else {
            unescaped.push_back(h[i]);
          }
        }
        out.help[parts[2]] = unescaped;
      }
      continue;
    }
    size_t i = 0;
    while (i < line.size() && NameChar(line[i], i == 0)) ++i;
    if (i == 0) return bad("sample does not start with a metric name");
    std::string name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        size_t start = i;
        while (i < line.size() && NameChar(line[i], i == start) && line[i] != ':') ++i;
        if (i == start || i + 1 >= line.size() || line[i] != '=' || line[i + 1] != '"') {
          return bad("label must be name=\"value\"");
        }
        i += 2;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\') {
            if (i + 1 >= line.size() || (line[i + 1] != '\\' && line[i + 1] != '"' &&
                                         line[i + 1] != 'n')) {
              return bad("bad escape in label value");
            }
            ++i;
          }
          ++i;
        }
        if (i >= line.size()) return bad("unterminated label value");
        ++i;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return bad("unterminated label set");
      ++i;
    }
    std::string key = line.substr(0, i);
    if (i >= line.size() || line[i] != ' ') return bad("expected a space before the value");
    std::vector<std::string> rest = absl::StrSplit(line.substr(i + 1), ' ');
    double value;
    if (rest.empty() || rest.size() > 2 || !ParseValue(rest[0], &value)) {
      return bad("value must be a float (optionally followed by a timestamp)");
    }
    if (FamilyOf(name, out.types).empty()) return bad("sample of " + name + " before its TYPE");
    if (out.samples.count(key)) return bad("duplicate series " + key);
    out.samples[key] = value;
  }
  return out;
}

}  // namespace recfleet::metrics
