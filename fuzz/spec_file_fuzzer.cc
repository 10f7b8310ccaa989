// The JobSpec file parser (YAML and JSON) on arbitrary text: a spec or a
// status naming the file and field, never a crash.

#include <cstddef>
#include <cstdint>
#include <string>

#include "cli/jobs/spec_file.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // The first byte picks the extension, which picks the parser; ".spec"
  // leaves it to the content.
  static const char* const kExtensions[] = {".yaml", ".json", ".spec"};
  const std::string path =
      recfleet::fuzz::WriteScratchFile(data + 1, size - 1, kExtensions[data[0] % 3]);
  (void)recfleet::cli::LoadJobSpec(path);
  return 0;
}
