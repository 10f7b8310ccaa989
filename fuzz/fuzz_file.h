#ifndef RECFLEET_FUZZ_FUZZ_FILE_H_
#define RECFLEET_FUZZ_FUZZ_FILE_H_

// The parsers under fuzzing read files by path, so each input is written to
// a scratch file of this process first.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace recfleet::fuzz {

// $TMPDIR (or /tmp)/recfleet-fuzz-<pid><suffix>, holding exactly `data`.
inline std::string WriteScratchFile(const uint8_t* data, size_t size, const std::string& suffix) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/recfleet-fuzz-" +
                     std::to_string(getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();  // The harness itself is broken.
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

}  // namespace recfleet::fuzz

#endif  // RECFLEET_FUZZ_FUZZ_FILE_H_
