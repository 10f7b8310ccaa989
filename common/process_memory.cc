#include "common/process_memory.h"

#include <malloc.h>

#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace recfleet {
namespace {

// A "Key:   123 kB" line of /proc/self/status, in bytes.
absl::StatusOr<int64_t> StatusBytes(absl::string_view key) {
  std::ifstream in("/proc/self/status");
  if (!in) return absl::UnavailableError("cannot read /proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, key) || !absl::ConsumePrefix(&rest, ":")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    if (!absl::ConsumeSuffix(&rest, "kB")) break;
    int64_t kib = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) break;
    return kib * 1024;
  }
  return absl::UnavailableError(absl::StrCat("/proc/self/status has no '", key, ": N kB' line"));
}

}  // namespace

absl::StatusOr<int64_t> ResidentBytes() { return StatusBytes("VmRSS"); }

absl::StatusOr<int64_t> PeakResidentBytes() { return StatusBytes("VmHWM"); }

absl::Status ResetPeakResident() {
  malloc_trim(0);
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  if (!out) {
    return absl::FailedPreconditionError("cannot reset the peak resident memory (/proc/self/clear_refs)");
  }
  return absl::OkStatus();
}

}  // namespace recfleet
