#include "data/test_data_dir.h"

#include <cstdlib>
#include <filesystem>

namespace recfleet::data {

std::string RealDataDir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (const char* env = std::getenv("RECFLEET_DATA_DIR"); env != nullptr && *env != '\0') {
    return fs::is_directory(env, ec) ? std::string(env) : "";
  }
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "";
  fs::path build = fs::path(srcdir) / workspace / "data" / "BUILD";
  fs::path real = fs::canonical(build, ec);  // <checkout>/data/BUILD
  if (ec) return "";
  for (fs::path dir = real.parent_path().parent_path(); !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    fs::path candidate = dir / "shared" / "data";
    if (fs::is_directory(candidate, ec)) return candidate.string();
  }
  return "";
}

}  // namespace recfleet::data
