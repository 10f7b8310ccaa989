#include "services/coordinator/list_filter.h"

#include <cctype>

#include "absl/strings/str_cat.h"

namespace recfleet::coordinator {
namespace {

bool KeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' || c == '/';
}
bool BareValueChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<std::map<std::string, std::string>> Parse() {
    std::map<std::string, std::string> out;
    SkipSpace();
    if (AtEnd()) return out;
    while (true) {
      if (!Consume("labels.")) return Expected("labels.KEY");
      std::string key;
      while (!AtEnd() && KeyChar(Peek())) key.push_back(text_[pos_++]);
      if (key.empty()) return Expected("a label key after \"labels.\"");
      SkipSpace();
      if (!Consume("=")) return Expected(absl::StrCat("'=' after labels.", key));
      SkipSpace();
      absl::StatusOr<std::string> value = Value(key);
      if (!value.ok()) return value.status();
      if (auto [it, fresh] = out.emplace(key, *value); !fresh && it->second != *value) {
        return absl::InvalidArgumentError(absl::StrCat(
            "filter: labels.", key, " is required to equal both \"", it->second, "\" and \"",
            *value, "\"; no job can match"));
      }
      SkipSpace();
      if (AtEnd()) return out;
      if (!Consume("AND")) return Expected("AND or the end of the filter");
      if (!AtEnd() && !std::isspace(static_cast<unsigned char>(Peek()))) {
        return Expected("a space after AND");
      }
      SkipSpace();
    }
  }

 private:
  absl::StatusOr<std::string> Value(const std::string& key) {
    std::string v;
    if (!AtEnd() && Peek() == '"') {
      ++pos_;
      while (!AtEnd() && Peek() != '"') {
        char c = text_[pos_++];
        if (c == '\\') {
          if (AtEnd()) break;
          c = text_[pos_++];
          if (c != '"' && c != '\\') return Expected("\\\" or \\\\ after a backslash");
        }
        v.push_back(c);
      }
      if (AtEnd()) return Expected(absl::StrCat("the closing '\"' of labels.", key, "'s value"));
      ++pos_;
      return v;
    }
    while (!AtEnd() && BareValueChar(Peek())) v.push_back(text_[pos_++]);
    if (v.empty()) {
      return Expected(absl::StrCat("a value for labels.", key,
                                   " (quote it unless it is [A-Za-z0-9._-]+)"));
    }
    return v;
  }

  absl::Status Expected(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "filter: expected ", what, " at column ", pos_ + 1, ", got ",
        AtEnd() ? std::string("the end") : absl::StrCat("\"", text_.substr(pos_, 20), "\""),
        " (supported: labels.KEY = \"VALUE\" terms joined by AND)"));
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }
  void SkipSpace() {
    while (!AtEnd() && std::isspace(static_cast<unsigned char>(Peek()))) ++pos_;
  }
  bool Consume(absl::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ParseLabelFilter(absl::string_view filter) {
  return Parser(filter).Parse();
}

}  // namespace recfleet::coordinator
