#include "engine/test_data.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cstdlib>

namespace recfleet::engine {
namespace {

bool IsDir(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string SharedDataDir(const std::string& anchor) {
  if (const char* env = std::getenv("RECFLEET_DATA_DIR"); env != nullptr && *env != '\0') {
    return IsDir(env) ? std::string(env) : "";
  }
  char resolved[PATH_MAX];
  if (realpath(anchor.c_str(), resolved) == nullptr) return "";
  // resolved = <root>/<anchor>: drop one path component per component of
  // the anchor, then step to the root's parent.
  std::string path(resolved);
  const int components = 1 + static_cast<int>(std::count(anchor.begin(), anchor.end(), '/'));
  for (int i = 0; i <= components; ++i) path = path.substr(0, path.find_last_of('/'));
  const std::string candidate = path + "/shared/data";
  return IsDir(candidate) ? candidate : "";
}

}  // namespace recfleet::engine
