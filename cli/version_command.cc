// `recfleet version`: the release and how this binary was built.

#include <cstdio>
#include <string>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/str_cat.h"
#include "cli/command.h"
#include "google/protobuf/stubs/common.h"
#include "grpcpp/grpcpp.h"

namespace recfleet::cli {
namespace {

// The release; python/pyproject.toml carries the same number.
constexpr char kVersion[] = "0.1.0";

std::string Compiler() {
#if defined(__clang__)
  return absl::StrCat("clang ", __clang_major__, ".", __clang_minor__, ".", __clang_patchlevel__);
#elif defined(__GNUC__)
  return absl::StrCat("gcc ", __GNUC__, ".", __GNUC_MINOR__, ".", __GNUC_PATCHLEVEL__);
#else
  return "unknown compiler";
#endif
}

int Version(const std::vector<std::string>& args) {
  if (!args.empty()) {
    std::fprintf(stderr, "recfleet version: takes no arguments, got '%s'\n", args[0].c_str());
    return kExitUsage;
  }
#if defined(NDEBUG)
  const char* mode = "optimized";
#else
  const char* mode = "debug (assertions on)";
#endif
  std::printf("recfleet %s\n", kVersion);
  std::printf("built with: %s, C++ %ld, %s\n", Compiler().c_str(), __cplusplus, mode);
  std::printf("libraries:  gRPC %s, protobuf %s, abseil LTS %d\n", grpc::Version().c_str(),
              google::protobuf::internal::VersionString(GOOGLE_PROTOBUF_VERSION).c_str(),
              ABSL_LTS_RELEASE_VERSION);
  return kExitOk;
}

RECFLEET_REGISTER_COMMAND({
    "version",
    "Print recfleet's version and how this binary was built",
    "usage: recfleet version\n\nPrints the release, the compiler and build mode, and the versions of\n"
    "gRPC, protobuf and abseil this binary runs with (gRPC's is read at run time).",
    Version,
});

}  // namespace
}  // namespace recfleet::cli
