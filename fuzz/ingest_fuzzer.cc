// The ingest parsers on arbitrary text: delimited event logs (any
// delimiter, with or without a header) and per-user sequence files must be
// ingested or rejected with a status naming the line, never crash.

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "data/ingest.h"
#include "fuzz/fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using recfleet::data::IngestOptions;
  if (size < 1) return 0;
  // The first byte picks the input kind and options; the rest is the file.
  const uint8_t mode = data[0];
  IngestOptions o;
  o.input = (mode & 1) ? IngestOptions::Input::kSequences : IngestOptions::Input::kEvents;
  static const char* const kDelimiters[] = {"auto", "\t", ",", "::"};
  o.delimiter = kDelimiters[(mode >> 1) & 3];
  o.header = (mode & 8) ? IngestOptions::Header::kNo : IngestOptions::Header::kAuto;
  if (o.header == IngestOptions::Header::kNo) {
    o.user_column = "0";
    o.item_column = "1";
    o.time_column = (mode & 16) ? "" : "2";
    o.rating_column = (mode & 16) ? "" : "3";
  }
  o.split = (mode & 32) ? IngestOptions::Split::kUser : IngestOptions::Split::kTime;
  o.max_history = (mode & 64) ? 2 : 1024;
  o.rows_per_block = 7;
  o.path = recfleet::fuzz::WriteScratchFile(data + 1, size - 1, ".events");
  const std::string out = o.path + ".out";
  mkdir(out.c_str(), 0755);
  (void)recfleet::data::Ingest(o, out);
  return 0;
}
