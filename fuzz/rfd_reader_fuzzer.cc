// The .rfd reader on arbitrary bytes: every path (streaming reader, indexed
// file, decoded and in-place blocks) must return well-formed rows or a
// status, never crash, hang or read out of bounds.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "data/dataset_file.h"
#include "fuzz/fuzz_file.h"

namespace {

// A block the reader accepted must hold what its schema promises.
void CheckWellFormed(const recfleet::data::Batch& b, const char* what) {
  if (absl::Status s = b.Validate(); !s.ok()) {
    std::fprintf(stderr, "%s accepted a malformed block: %s\n", what, s.ToString().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace recfleet::data;
  const std::string path = recfleet::fuzz::WriteScratchFile(data, size, ".rfd");
  if (auto reader = DatasetReader::Open(path); reader.ok()) {
    Batch block;
    while (true) {
      absl::StatusOr<bool> more = (*reader)->Next(&block);
      if (!more.ok() || !*more) break;
      CheckWellFormed(block, "DatasetReader::Next");
    }
  }
  if (auto file = DatasetFile::Open(path); file.ok()) {
    Batch block;
    BlockView view;
    for (size_t b = 0; b < (*file)->num_blocks(); ++b) {
      if ((*file)->ReadBlock(b, &block).ok()) CheckWellFormed(block, "DatasetFile::ReadBlock");
      if ((*file)->ReadBlockView(b, &view).ok()) {
        // Copying every row out reads every offset and value in place.
        Batch rows((*file)->schema());
        for (size_t r = 0; r < view.num_rows(); ++r) rows.AppendRow(view, r);
        CheckWellFormed(rows, "DatasetFile::ReadBlockView");
      }
    }
  }
  std::remove(path.c_str());
  return 0;
}
