#include "cli/jobs/spec_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace recfleet::cli {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

class YamlMapper {
 public:
  explicit YamlMapper(std::string file) : file_(std::move(file)) {}

  absl::Status Message(const YAML::Node& node, const std::string& path,
                       google::protobuf::Message* msg) {
    if (node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node, path, "expected a mapping of fields", Kind(node));
    const Descriptor* d = msg->GetDescriptor();
    for (const auto& kv : node) {
      const std::string name = kv.first.Scalar();
      const FieldDescriptor* f = d->FindFieldByName(name);
      if (f == nullptr) f = d->FindFieldByCamelcaseName(name);
      const std::string child = path.empty() ? name : absl::StrCat(path, ".", name);
      if (f == nullptr) {
        std::vector<std::string> known;
        for (int i = 0; i < d->field_count(); ++i) known.push_back(d->field(i)->name());
        return Error(kv.first, child,
                     absl::StrCat("unknown field; ", d->name(), " has ", absl::StrJoin(known, ", ")),
                     "");
      }
      if (absl::Status s = Field(kv.second, child, msg, f); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

 private:
  static std::string Kind(const YAML::Node& n) {
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    if (n.IsScalar()) return absl::StrCat("\"", n.Scalar(), "\"");
    return "nothing";
  }

  absl::Status Error(const YAML::Node& n, const std::string& path, const std::string& what,
                     const std::string& got) const {
    return absl::InvalidArgumentError(absl::StrCat(file_, ":", n.Mark().line + 1, ": ", path, ": ",
                                                   what, got.empty() ? "" : ", got ", got));
  }

  absl::Status Field(const YAML::Node& node, const std::string& path,
                     google::protobuf::Message* msg, const FieldDescriptor* f) {
    if (f->is_map()) {
      if (!node.IsMap()) return Error(node, path, "expected a mapping", Kind(node));
      const FieldDescriptor* key = f->message_type()->FindFieldByName("key");
      const FieldDescriptor* value = f->message_type()->FindFieldByName("value");
      for (const auto& kv : node) {
        google::protobuf::Message* entry = msg->GetReflection()->AddMessage(msg, f);
        std::string p = absl::StrCat(path, "[", kv.first.Scalar(), "]");
        if (absl::Status s = Scalar(kv.first, p, entry, key, false); !s.ok()) return s;
        if (absl::Status s = Value(kv.second, p, entry, value, false); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    if (f->is_repeated()) {
      if (!node.IsSequence()) return Error(node, path, "expected a list", Kind(node));
      for (size_t i = 0; i < node.size(); ++i) {
        std::string p = absl::StrCat(path, "[", i, "]");
        if (absl::Status s = Value(node[i], p, msg, f, true); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    return Value(node, path, msg, f, false);
  }

  absl::Status Value(const YAML::Node& node, const std::string& path,
                     google::protobuf::Message* msg, const FieldDescriptor* f, bool add) {
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      const Reflection* r = msg->GetReflection();
      return Message(node, path, add ? r->AddMessage(msg, f) : r->MutableMessage(msg, f));
    }
    return Scalar(node, path, msg, f, add);
  }

  absl::Status Scalar(const YAML::Node& node, const std::string& path,
                      google::protobuf::Message* msg, const FieldDescriptor* f, bool add) {
    if (!node.IsScalar()) {
      return Error(node, path, absl::StrCat("expected ", TypeName(f)), Kind(node));
    }
    const std::string v = node.Scalar();
    const Reflection* r = msg->GetReflection();
    auto bad = [&] { return Error(node, path, absl::StrCat("expected ", TypeName(f)), "\"" + v + "\""); };
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        int32_t x;
        if (!absl::SimpleAtoi(v, &x)) return bad();
        add ? r->AddInt32(msg, f, x) : r->SetInt32(msg, f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        int64_t x;
        if (!absl::SimpleAtoi(v, &x)) return bad();
        add ? r->AddInt64(msg, f, x) : r->SetInt64(msg, f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32: {
        uint32_t x;
        if (!absl::SimpleAtoi(v, &x)) return bad();
        add ? r->AddUInt32(msg, f, x) : r->SetUInt32(msg, f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t x;
        if (!absl::SimpleAtoi(v, &x)) return bad();
        add ? r->AddUInt64(msg, f, x) : r->SetUInt64(msg, f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double x;
        if (!absl::SimpleAtod(v, &x)) return bad();
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
          add ? r->AddFloat(msg, f, x) : r->SetFloat(msg, f, x);
        } else {
          add ? r->AddDouble(msg, f, x) : r->SetDouble(msg, f, x);
        }
        break;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        std::string lower = absl::AsciiStrToLower(v);
        if (lower != "true" && lower != "false") return bad();
        add ? r->AddBool(msg, f, lower == "true") : r->SetBool(msg, f, lower == "true");
        break;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor* e = f->enum_type()->FindValueByName(absl::AsciiStrToUpper(v));
        if (e == nullptr || e->number() == 0) {
          std::vector<std::string> names;
          for (int i = 1; i < f->enum_type()->value_count(); ++i) {
            names.push_back(f->enum_type()->value(i)->name());
          }
          return Error(node, path, absl::StrCat("expected one of ", absl::StrJoin(names, ", ")),
                       "\"" + v + "\"");
        }
        add ? r->AddEnum(msg, f, e) : r->SetEnum(msg, f, e);
        break;
      }
      case FieldDescriptor::CPPTYPE_STRING:
        add ? r->AddString(msg, f, v) : r->SetString(msg, f, v);
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return bad();
    }
    return absl::OkStatus();
  }

  static std::string TypeName(const FieldDescriptor* f) {
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64:
        return "an integer";
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64:
        return "a non-negative integer";
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT:
        return "a number";
      case FieldDescriptor::CPPTYPE_BOOL:
        return "true or false";
      case FieldDescriptor::CPPTYPE_ENUM:
        return "an enum name";
      case FieldDescriptor::CPPTYPE_STRING:
        return "a string";
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return "a mapping of fields";
    }
    return "a value";
  }

  const std::string file_;
};

}  // namespace

absl::Status YamlToMessage(const std::string& yaml, const std::string& file,
                           const std::string& root, google::protobuf::Message* message) {
  YAML::Node doc;
  try {
    // yaml-cpp reports syntax errors by exception; they stop here.
    doc = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  if (!doc.IsDefined() || doc.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": empty document; expected a ", root));
  }
  return YamlMapper(file).Message(doc, root, message);
}

absl::StatusOr<::recfleet::v1::JobSpec> LoadJobSpec(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  bool json = absl::EndsWith(path, ".json");
  if (!json && !absl::EndsWith(path, ".yaml") && !absl::EndsWith(path, ".yml")) {
    json = absl::StartsWith(absl::StripLeadingAsciiWhitespace(text), "{");
  }
  ::recfleet::v1::JobSpec spec;
  if (json) {
    google::protobuf::util::JsonParseOptions options;
    auto status = google::protobuf::util::JsonStringToMessage(text, &spec, options);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a JobSpec in JSON: ", std::string(status.message())));
    }
    return spec;
  }
  if (absl::Status s = YamlToMessage(text, path, "spec", &spec); !s.ok()) return s;
  return spec;
}

}  // namespace recfleet::cli
