#include "data/dataset_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "data/crc32c.h"
#include "data/int_codec.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the dataset format is little-endian; add byte swapping for this host");

namespace recfleet::data {
namespace {

// "RFDSET" 0x00, then the format version (1 or 2).
constexpr char kFileMagic[7] = {'R', 'F', 'D', 'S', 'E', 'T', 0};
constexpr uint8_t kRawArray = 0;    // Version 2 array codings.
constexpr uint8_t kDeltaVarint = 1;
constexpr char kTailMagic[8] = {'R', 'F', 'D', 'S', 'E', 'N', 'D', '1'};
constexpr uint32_t kBlockMagic = 0x4B424652;   // "RFBK"
constexpr uint32_t kFooterMagic = 0x54464652;  // "RFFT"
constexpr size_t kBlockHeaderSize = 24;        // magic, rows, payload_len, payload crc, header crc
constexpr size_t kFooterFixedSize = 16;        // magic, num_blocks, num_rows
constexpr size_t kFooterEntrySize = 12;        // offset u64, rows u32
constexpr size_t kTailSize = 16;               // footer offset u64, tail magic
constexpr size_t kFileHeaderFixed = 12;        // magic, schema length

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

absl::Status Corrupt(const std::string& path, int64_t block, uint64_t offset,
                     absl::string_view what) {
  if (block < 0) {
    return absl::DataLossError(absl::StrCat(path, ": at byte offset ", offset, ": ", what));
  }
  return absl::DataLossError(
      absl::StrCat(path, ": block ", block, " at byte offset ", offset, ": ", what));
}

size_t ElemSize(DType t) { return t == DType::kInt64 ? 8 : 4; }

// Appends an int64 array: version 1 raw; version 2 a coding byte, then raw
// values or (u64 byte length, delta+varint bytes), whichever is smaller.
void PutInt64Array(const int64_t* v, size_t n, int version, std::string* out) {
  if (version >= 2) {
    // Encoded in place, once; rolled back to raw when that is not smaller.
    const size_t start = out->size();
    out->push_back(static_cast<char>(kDeltaVarint));
    Put<uint64_t>(out, 0);
    AppendDeltaVarint(v, n, out);
    const uint64_t coded = out->size() - start - 9;
    if (coded + 8 < n * 8) {
      std::memcpy(&(*out)[start + 1], &coded, sizeof(coded));
      return;
    }
    out->resize(start);
    out->push_back(static_cast<char>(kRawArray));
  }
  out->append(reinterpret_cast<const char*>(v), n * 8);
}

// Encodes `b` as a block payload: per column, offsets (jagged) then values.
void EncodePayload(const Batch& b, int version, std::string* out) {
  out->clear();
  const Schema& s = b.schema();
  for (size_t c = 0; c < s.features.size(); ++c) {
    const Column& col = b.column(c);
    if (s.features[c].layout == Layout::kJagged) {
      PutInt64Array(reinterpret_cast<const int64_t*>(col.offsets.data()), col.offsets.size(),
                    version, out);
    }
    if (s.features[c].dtype == DType::kInt64) {
      PutInt64Array(col.i64.data(), col.i64.size(), version, out);
    } else {
      if (version >= 2) out->push_back(static_cast<char>(kRawArray));
      out->append(reinterpret_cast<const char*>(col.f32.data()), col.f32.size() * 4);
    }
  }
}

// Where a verified block's columns lie inside its payload.
struct Located {
  uint32_t rows = 0;
  std::vector<const uint8_t*> offsets;  // Jagged columns; null for scalars.
  std::vector<const uint8_t*> values;
  std::vector<uint64_t> num_values;
};

// Verifies a block (header + payload, `size` bytes at file offset `offset`):
// checksums, then that the columns of `schema` exactly fill the payload
// with well-formed offsets, and that every history reference lies inside
// the sequence store (`refs`, may be null). Coded arrays are decoded into
// `decoded`. `expected_rows` < 0 means "not known".
absl::Status LocateBlock(const std::string& path, int64_t index, uint64_t offset,
                         const uint8_t* data, uint64_t size, int64_t expected_rows, int version,
                         const Schema& schema, const SequenceRefs* refs,
                         PodVector<uint8_t>* decoded, Located* out) {
  if (size < kBlockHeaderSize) return Corrupt(path, index, offset, "block shorter than its header");
  if (Load<uint32_t>(data) != kBlockMagic) return Corrupt(path, index, offset, "bad block magic");
  uint32_t header_crc = Load<uint32_t>(data + 20);
  if (Crc32c(data, 20) != header_crc) {
    return Corrupt(path, index, offset, "block header checksum mismatch");
  }
  uint32_t rows = Load<uint32_t>(data + 4);
  uint64_t payload_len = Load<uint64_t>(data + 8);
  uint32_t payload_crc = Load<uint32_t>(data + 16);
  if (expected_rows >= 0 && rows != static_cast<uint64_t>(expected_rows)) {
    return Corrupt(path, index, offset,
                   absl::StrCat("block has ", rows, " rows, footer index says ", expected_rows));
  }
  if (payload_len != size - kBlockHeaderSize) {
    return Corrupt(path, index, offset,
                   absl::StrCat("payload length ", payload_len, " disagrees with the block extent ",
                                size - kBlockHeaderSize));
  }
  const uint8_t* p = data + kBlockHeaderSize;
  uint32_t crc = Crc32c(p, payload_len);
  if (crc != payload_crc) {
    return Corrupt(path, index, offset + kBlockHeaderSize,
                   absl::StrCat("payload checksum mismatch (stored 0x",
                                absl::Hex(payload_crc, absl::kZeroPad8), ", computed 0x",
                                absl::Hex(crc, absl::kZeroPad8), ")"));
  }
  out->rows = rows;
  out->offsets.assign(schema.features.size(), nullptr);
  out->values.assign(schema.features.size(), nullptr);
  out->num_values.assign(schema.features.size(), rows);
  decoded->clear();
  // Arrays decoded into `decoded`: (where the pointer goes, its position).
  // The pointers are set once `decoded` stops growing.
  std::vector<std::pair<const uint8_t**, size_t>> in_decoded;
  uint64_t pos = 0;
  auto here = [&]() { return offset + kBlockHeaderSize + pos; };
  auto take = [&](uint64_t n, const char* what, const std::string& name) -> absl::Status {
    if (n > payload_len - pos) {
      return Corrupt(path, index, here(),
                     absl::StrCat("feature '", name, "': ", what, " needs ", n,
                                  " bytes, payload has ", payload_len - pos, " left"));
    }
    return absl::OkStatus();
  };
  // One array of `count` elements: *at points at them (in place or decoded).
  auto array = [&](uint64_t count, size_t elem, const char* what, const std::string& name,
                   const uint8_t** at) -> absl::Status {
    uint8_t coding = kRawArray;
    if (version >= 2) {
      RECFLEET_RETURN_IF_ERROR(take(1, what, name));
      coding = p[pos++];
    }
    if (coding == kRawArray) {
      RECFLEET_RETURN_IF_ERROR(take(count * elem, what, name));
      *at = p + pos;
      pos += count * elem;
      return absl::OkStatus();
    }
    if (coding != kDeltaVarint || elem != 8) {
      return Corrupt(path, index, here() - 1,
                     absl::StrCat("feature '", name, "': ", what, ": unknown coding ", coding));
    }
    RECFLEET_RETURN_IF_ERROR(take(8, what, name));
    const uint64_t len = Load<uint64_t>(p + pos);
    pos += 8;
    RECFLEET_RETURN_IF_ERROR(take(len, what, name));
    // A varint is at least one byte: this bounds the allocation below.
    if (count > len) {
      return Corrupt(path, index, here(),
                     absl::StrCat("feature '", name, "': ", what, ": ", count,
                                  " values cannot fit in ", len, " coded bytes"));
    }
    const size_t start = decoded->size();
    decoded->resize(start + count * 8);
    if (!DecodeDeltaVarint(p + pos, len, count,
                           reinterpret_cast<int64_t*>(decoded->data() + start))) {
      return Corrupt(path, index, here(),
                     absl::StrCat("feature '", name, "': ", what, ": bad delta+varint coding"));
    }
    *at = decoded->data() + start;
    in_decoded.emplace_back(at, start);
    pos += len;
    return absl::OkStatus();
  };
  for (size_t c = 0; c < schema.features.size(); ++c) {
    const FeatureSpec& f = schema.features[c];
    if (f.layout == Layout::kJagged) {
      const uint64_t at_offsets = here();
      RECFLEET_RETURN_IF_ERROR(
          array(static_cast<uint64_t>(rows) + 1, 8, "offsets", f.name, &out->offsets[c]));
      const uint8_t* o = out->offsets[c];
      if (Load<uint64_t>(o) != 0) {
        return Corrupt(path, index, at_offsets,
                       absl::StrCat("feature '", f.name, "': first offset is not 0"));
      }
      for (uint32_t r = 0; r < rows; ++r) {
        if (Load<uint64_t>(o + 8 * (r + 1)) < Load<uint64_t>(o + 8 * r)) {
          return Corrupt(path, index, at_offsets,
                         absl::StrCat("feature '", f.name, "': offsets decrease at row ", r));
        }
      }
      out->num_values[c] = Load<uint64_t>(o + 8 * static_cast<uint64_t>(rows));
      if (out->num_values[c] > payload_len) {
        return Corrupt(path, index, here(),
                       absl::StrCat("feature '", f.name, "': ", out->num_values[c],
                                    " values exceed the payload"));
      }
    }
    RECFLEET_RETURN_IF_ERROR(
        array(out->num_values[c], ElemSize(f.dtype), "values", f.name, &out->values[c]));
  }
  if (pos != payload_len) {
    return Corrupt(path, index, here(),
                   absl::StrCat(payload_len - pos, " unexpected bytes after the last column"));
  }
  for (auto [at, start] : in_decoded) *at = decoded->data() + start;
  if (refs != nullptr) {
    const uint8_t* seq = out->values[refs->seq_column()];
    const uint8_t* end = out->values[refs->end_column()];
    const uint8_t* len = out->values[refs->len_column()];
    for (uint32_t r = 0; r < rows; ++r) {
      int64_t s = Load<int64_t>(seq + 8 * r), e = Load<int64_t>(end + 8 * r),
              n = Load<int64_t>(len + 8 * r);
      if (!refs->Valid(s, e, n)) {
        return Corrupt(path, index, offset,
                       absl::StrCat("row ", r, ": history reference (sequence ", s, ", end ", e,
                                    ", length ", n, ") lies outside the sequence file"));
      }
    }
  }
  return absl::OkStatus();
}

// Verifies a block and copies its columns into `out` (whose schema is the
// stored one, plus the referenced features when `refs` is set).
absl::Status DecodeBlock(const std::string& path, int64_t index, uint64_t offset,
                         const uint8_t* data, uint64_t size, int64_t expected_rows, int version,
                         const Schema& stored, const SequenceRefs* refs, Batch* out) {
  Located at;
  thread_local PodVector<uint8_t> decoded;
  RECFLEET_RETURN_IF_ERROR(LocateBlock(path, index, offset, data, size, expected_rows, version,
                                       stored, refs, &decoded, &at));
  out->Clear();
  for (size_t c = 0; c < stored.features.size(); ++c) {
    Column& col = out->mutable_column(c);
    if (at.offsets[c] != nullptr) {
      col.offsets.resize(at.rows + 1);
      std::memcpy(col.offsets.data(), at.offsets[c], (at.rows + 1) * 8);
    }
    // Emptied by Clear() above; an empty vector's data() may be null,
    // which memcpy must not get even for 0 bytes.
    if (at.num_values[c] == 0) continue;
    if (stored.features[c].dtype == DType::kInt64) {
      col.i64.resize(at.num_values[c]);
      std::memcpy(col.i64.data(), at.values[c], at.num_values[c] * 8);
    } else {
      col.f32.resize(at.num_values[c]);
      std::memcpy(col.f32.data(), at.values[c], at.num_values[c] * 4);
    }
  }
  if (refs != nullptr) {
    auto scalar = [&](int c, uint32_t r) { return Load<int64_t>(at.values[c] + 8 * r); };
    for (size_t d = 0; d < refs->derived().size(); ++d) {
      Column& col = out->mutable_column(stored.features.size() + d);
      const int anchor = refs->derived()[d].anchor;
      for (uint32_t r = 0; r < at.rows; ++r) {
        refs->Append(d, scalar(refs->seq_column(), r), scalar(refs->end_column(), r),
                     scalar(refs->len_column(), r), anchor >= 0 ? scalar(anchor, r) : 0, &col);
      }
    }
  }
  out->set_num_rows(at.rows);
  return absl::OkStatus();
}

// The format version in a file's first 8 bytes, or 0 if they are not a
// recfleet dataset magic of a version this reader knows.
int MagicVersion(const uint8_t* magic) {
  if (std::memcmp(magic, kFileMagic, 7) != 0) return 0;
  return magic[7] == 1 || magic[7] == 2 ? magic[7] : 0;
}

absl::Status BadMagic(const std::string& path, const uint8_t* magic) {
  if (std::memcmp(magic, kFileMagic, 7) == 0) {
    return Corrupt(path, -1, 7,
                   absl::StrCat("dataset format version ", magic[7],
                                " is newer than this reader (versions 1 and 2): upgrade recfleet, "
                                "or re-ingest with this version"));
  }
  return Corrupt(path, -1, 0, "not a recfleet dataset file (bad magic)");
}

// Version 2's header checksum covers the magic too, so a flipped version
// byte cannot make a reader take a file for the other version.
absl::StatusOr<std::shared_ptr<const Schema>> ParseHeaderSchema(const std::string& path,
                                                                const uint8_t* data,
                                                                size_t schema_len, int version) {
  uint32_t stored = Load<uint32_t>(data + kFileHeaderFixed + schema_len);
  const size_t from = version >= 2 ? 0 : 8;
  if (Crc32c(data + from, kFileHeaderFixed - from + schema_len) != stored) {
    return Corrupt(path, -1, 8, "file header (schema) checksum mismatch");
  }
  auto schema = Schema::Parse(
      absl::string_view(reinterpret_cast<const char*>(data + kFileHeaderFixed), schema_len));
  if (!schema.ok()) return Corrupt(path, -1, kFileHeaderFixed, schema.status().message());
  return std::make_shared<const Schema>(*std::move(schema));
}

// The schema readers present, and the references behind it (null when the
// file stores its histories inline).
absl::Status ResolveLogical(const std::string& path, const std::shared_ptr<const Schema>& stored,
                            std::shared_ptr<const SequenceRefs>* refs,
                            std::shared_ptr<const Schema>* logical) {
  Schema full;
  auto resolved = SequenceRefs::Resolve(path, *stored, &full);
  if (!resolved.ok()) return resolved.status();
  *refs = *std::move(resolved);
  *logical = *refs == nullptr ? stored : std::make_shared<const Schema>(std::move(full));
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------- writer

DatasetWriter::DatasetWriter(std::string path, std::FILE* f, std::shared_ptr<const Schema> schema,
                             WriterOptions options)
    : path_(std::move(path)),
      file_(f),
      schema_(std::move(schema)),
      options_(options),
      pending_(schema_) {}

DatasetWriter::~DatasetWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(const std::string& path,
                                                                     const Schema& schema,
                                                                     WriterOptions options) {
  if (auto st = schema.Validate(); !st.ok()) return st;
  if (options.max_rows_per_block == 0 || options.max_rows_per_block > (1u << 31)) {
    return absl::InvalidArgumentError("max_rows_per_block must be in 1..2^31");
  }
  if (options.format_version != 1 && options.format_version != 2) {
    return absl::InvalidArgumentError("format_version must be 1 or 2");
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  std::unique_ptr<DatasetWriter> w(
      new DatasetWriter(path, f, std::make_shared<const Schema>(schema), options));
  std::string header(kFileMagic, 7);
  header.push_back(static_cast<char>(options.format_version));
  std::string body = schema.Serialize();
  std::string len_and_schema;
  Put<uint32_t>(&len_and_schema, static_cast<uint32_t>(body.size()));
  len_and_schema += body;
  header += len_and_schema;
  Put<uint32_t>(&header, options.format_version >= 2
                             ? Crc32c(header.data(), header.size())
                             : Crc32c(len_and_schema.data(), len_and_schema.size()));
  if (auto st = w->WriteBytes(header.data(), header.size()); !st.ok()) return st;
  return w;
}

absl::Status DatasetWriter::WriteBytes(const void* p, size_t n) {
  if (n > 0 && std::fwrite(p, 1, n, file_) != n) {
    return absl::UnavailableError(
        absl::StrCat(path_, ": write failed at byte offset ", offset_, ": ", std::strerror(errno)));
  }
  offset_ += n;
  return absl::OkStatus();
}

absl::Status DatasetWriter::Write(const Batch& rows) {
  if (file_ == nullptr) return absl::FailedPreconditionError(path_ + ": writer is closed");
  if (!(rows.schema() == *schema_)) {
    return absl::InvalidArgumentError(path_ + ": rows have a different schema than the file");
  }
  // A caller that hands over whole blocks (ingest does) has them encoded
  // directly, without copying every row into `pending_` first.
  if (pending_.num_rows() == 0 && rows.num_rows() <= options_.max_rows_per_block &&
      rows.ByteSize() < options_.max_block_bytes) {
    if (rows.num_rows() == options_.max_rows_per_block) return WriteBlock(rows);
    for (size_t r = 0; r < rows.num_rows(); ++r) pending_.AppendRow(rows, r);
    return absl::OkStatus();
  }
  for (size_t r = 0; r < rows.num_rows(); ++r) {
    pending_.AppendRow(rows, r);
    if (pending_.num_rows() >= options_.max_rows_per_block ||
        pending_.ByteSize() >= options_.max_block_bytes) {
      if (auto st = FlushBlock(); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status DatasetWriter::FlushBlock() {
  if (pending_.num_rows() == 0) return absl::OkStatus();
  absl::Status st = WriteBlock(pending_);
  pending_.Clear();
  return st;
}

absl::Status DatasetWriter::WriteBlock(const Batch& rows) {
  EncodePayload(rows, options_.format_version, &scratch_);
  std::string header;
  Put<uint32_t>(&header, kBlockMagic);
  Put<uint32_t>(&header, static_cast<uint32_t>(rows.num_rows()));
  Put<uint64_t>(&header, scratch_.size());
  Put<uint32_t>(&header, Crc32c(scratch_.data(), scratch_.size()));
  Put<uint32_t>(&header, Crc32c(header.data(), header.size()));
  index_.emplace_back(offset_, static_cast<uint32_t>(rows.num_rows()));
  rows_written_ += rows.num_rows();
  if (auto st = WriteBytes(header.data(), header.size()); !st.ok()) return st;
  return WriteBytes(scratch_.data(), scratch_.size());
}

absl::Status DatasetWriter::Close() {
  if (file_ == nullptr) return absl::FailedPreconditionError(path_ + ": writer is closed");
  if (auto st = FlushBlock(); !st.ok()) return st;
  uint64_t footer_offset = offset_;
  std::string footer;
  Put<uint32_t>(&footer, kFooterMagic);
  Put<uint32_t>(&footer, static_cast<uint32_t>(index_.size()));
  Put<uint64_t>(&footer, rows_written_);
  for (const auto& [off, rows] : index_) {
    Put<uint64_t>(&footer, off);
    Put<uint32_t>(&footer, rows);
  }
  Put<uint32_t>(&footer, Crc32c(footer.data(), footer.size()));
  Put<uint64_t>(&footer, footer_offset);
  footer.append(kTailMagic, 8);
  if (auto st = WriteBytes(footer.data(), footer.size()); !st.ok()) return st;
  int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat(path_, ": close failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- streaming reader

DatasetReader::DatasetReader(std::string path, std::FILE* f, uint64_t size)
    : path_(std::move(path)), file_(f), size_(size) {}

DatasetReader::~DatasetReader() { std::fclose(file_); }

absl::Status DatasetReader::ReadAt(uint64_t n, void* out, int64_t block, const char* what) {
  if (n > size_ - pos_) {
    return Corrupt(path_, block, pos_,
                   absl::StrCat("file is truncated: ", what, " needs ", n, " bytes, ", size_ - pos_,
                                " remain of ", size_));
  }
  if (n > 0 && std::fread(out, 1, n, file_) != n) {
    return absl::UnavailableError(
        absl::StrCat(path_, ": read failed at byte offset ", pos_, ": ", std::strerror(errno)));
  }
  pos_ += n;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DatasetReader>> DatasetReader::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) {
    std::fclose(f);
    return absl::UnavailableError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  std::unique_ptr<DatasetReader> r(new DatasetReader(path, f, st.st_size));
  uint8_t fixed[kFileHeaderFixed];
  if (auto s = r->ReadAt(kFileHeaderFixed, fixed, -1, "file header"); !s.ok()) return s;
  r->version_ = MagicVersion(fixed);
  if (r->version_ == 0) return BadMagic(path, fixed);
  uint32_t schema_len = Load<uint32_t>(fixed + 8);
  if (schema_len > r->size_) return Corrupt(path, -1, 8, "schema length exceeds the file size");
  std::vector<uint8_t> header(kFileHeaderFixed + schema_len + 4);
  std::memcpy(header.data(), fixed, kFileHeaderFixed);
  if (auto s = r->ReadAt(schema_len + 4, header.data() + kFileHeaderFixed, -1, "schema header");
      !s.ok()) {
    return s;
  }
  auto schema = ParseHeaderSchema(path, header.data(), schema_len, r->version_);
  if (!schema.ok()) return schema.status();
  r->stored_ = *std::move(schema);
  RECFLEET_RETURN_IF_ERROR(ResolveLogical(path, r->stored_, &r->refs_, &r->schema_));
  return r;
}

absl::StatusOr<bool> DatasetReader::Next(Batch* block) {
  if (done_) return false;
  int64_t index = static_cast<int64_t>(seen_.size());
  uint64_t start = pos_;
  buffer_.resize(kBlockHeaderSize);
  if (auto s = ReadAt(4, buffer_.data(), index, "a block or the footer"); !s.ok()) return s;
  uint32_t magic = Load<uint32_t>(buffer_.data());
  if (magic == kFooterMagic) {
    // Footer: fixed part, entries, crc, then the tail. It must describe
    // exactly the blocks read, and end the file.
    uint8_t fixed[kFooterFixedSize];
    std::memcpy(fixed, buffer_.data(), 4);
    if (auto s = ReadAt(kFooterFixedSize - 4, fixed + 4, -1, "footer"); !s.ok()) return s;
    uint32_t n = Load<uint32_t>(fixed + 4);
    uint64_t rows = Load<uint64_t>(fixed + 8);
    if (n != seen_.size()) {
      return Corrupt(path_, -1, start,
                     absl::StrCat("footer lists ", n, " blocks, file has ", seen_.size()));
    }
    std::vector<uint8_t> rest(n * kFooterEntrySize + 4 + kTailSize);
    if (auto s = ReadAt(rest.size(), rest.data(), -1, "footer"); !s.ok()) return s;
    uint32_t crc = Crc32c(Crc32c(fixed, kFooterFixedSize), rest.data(), n * kFooterEntrySize);
    if (crc != Load<uint32_t>(rest.data() + n * kFooterEntrySize)) {
      return Corrupt(path_, -1, start, "footer checksum mismatch");
    }
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; ++i) {
      uint64_t off = Load<uint64_t>(rest.data() + i * kFooterEntrySize);
      uint32_t r = Load<uint32_t>(rest.data() + i * kFooterEntrySize + 8);
      if (off != seen_[i].first || r != seen_[i].second) {
        return Corrupt(path_, i, seen_[i].first, "footer index disagrees with the block");
      }
      total += r;
    }
    const uint8_t* tail = rest.data() + n * kFooterEntrySize + 4;
    if (total != rows || Load<uint64_t>(tail) != start ||
        std::memcmp(tail + 8, kTailMagic, 8) != 0) {
      return Corrupt(path_, -1, pos_ - kTailSize,
                     "bad file tail (row count, footer offset or magic)");
    }
    if (pos_ != size_) {
      return Corrupt(path_, -1, pos_,
                     absl::StrCat(size_ - pos_, " unexpected bytes after the end"));
    }
    done_ = true;
    return false;
  }
  if (auto s = ReadAt(kBlockHeaderSize - 4, buffer_.data() + 4, index, "block header"); !s.ok()) {
    return s;
  }
  // The payload length is trusted only after the header checksum matches.
  if (magic != kBlockMagic) return Corrupt(path_, index, start, "bad block magic");
  if (Crc32c(buffer_.data(), 20) != Load<uint32_t>(buffer_.data() + 20)) {
    return Corrupt(path_, index, start, "block header checksum mismatch");
  }
  uint64_t payload_len = Load<uint64_t>(buffer_.data() + 8);
  if (payload_len > size_ - pos_) {
    return Corrupt(path_, index, start,
                   absl::StrCat("file is truncated: block payload needs ", payload_len, " bytes, ",
                                size_ - pos_, " remain"));
  }
  buffer_.resize(kBlockHeaderSize + payload_len);
  if (auto s = ReadAt(payload_len, buffer_.data() + kBlockHeaderSize, index, "block payload");
      !s.ok()) {
    return s;
  }
  if (block->schema_ptr() != schema_) {
    *block = Batch(schema_);
  }
  if (auto s = DecodeBlock(path_, index, start, buffer_.data(), buffer_.size(), -1, version_,
                           *stored_, refs_.get(), block);
      !s.ok()) {
    return s;
  }
  seen_.emplace_back(start, static_cast<uint32_t>(block->num_rows()));
  return true;
}

// ---------------------------------------------------------------- random access

DatasetFile::~DatasetFile() { close(fd_); }

namespace {

absl::Status PreadFully(int fd, const std::string& path, uint64_t offset, uint64_t n, void* out) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    ssize_t got = pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": read of ", n, " bytes at byte offset ", offset,
                       " failed: ", got == 0 ? "end of file" : std::strerror(errno)));
    }
    p += got;
    offset += got;
    n -= got;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DatasetFile>> DatasetFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  std::unique_ptr<DatasetFile> f(new DatasetFile(path, fd));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  uint64_t size = st.st_size;
  constexpr uint64_t kMinSize = kFileHeaderFixed + 4 + kFooterFixedSize + 4 + kTailSize;
  if (size < kMinSize) {
    return Corrupt(path, -1, size,
                   absl::StrCat("file is truncated: ", size, " bytes, a dataset file has at least ",
                                kMinSize));
  }
  uint8_t fixed[kFileHeaderFixed];
  if (auto s = PreadFully(fd, path, 0, kFileHeaderFixed, fixed); !s.ok()) return s;
  f->version_ = MagicVersion(fixed);
  if (f->version_ == 0) return BadMagic(path, fixed);
  uint8_t tail[kTailSize];
  if (auto s = PreadFully(fd, path, size - kTailSize, kTailSize, tail); !s.ok()) return s;
  if (std::memcmp(tail + 8, kTailMagic, 8) != 0) {
    return Corrupt(path, -1, size - 8, "file is truncated or its tail is corrupt (bad end magic)");
  }
  uint64_t footer_offset = Load<uint64_t>(tail);
  uint32_t schema_len = Load<uint32_t>(fixed + 8);
  uint64_t header_end = kFileHeaderFixed + static_cast<uint64_t>(schema_len) + 4;
  if (header_end > size - kTailSize || footer_offset < header_end ||
      footer_offset > size - kTailSize - kFooterFixedSize - 4) {
    return Corrupt(path, -1, size - kTailSize,
                   absl::StrCat("footer offset ", footer_offset, " or schema length ", schema_len,
                                " out of range for a file of ", size, " bytes"));
  }
  std::vector<uint8_t> header(header_end);
  if (auto s = PreadFully(fd, path, 0, header_end, header.data()); !s.ok()) return s;
  auto schema = ParseHeaderSchema(path, header.data(), schema_len, f->version_);
  if (!schema.ok()) return schema.status();
  f->stored_ = *std::move(schema);

  std::vector<uint8_t> footer(size - kTailSize - footer_offset);
  if (auto s = PreadFully(fd, path, footer_offset, footer.size(), footer.data()); !s.ok()) return s;
  uint32_t n = Load<uint32_t>(footer.data() + 4);
  if (Load<uint32_t>(footer.data()) != kFooterMagic ||
      footer.size() != kFooterFixedSize + static_cast<uint64_t>(n) * kFooterEntrySize + 4) {
    return Corrupt(path, -1, footer_offset, "bad footer magic or size");
  }
  if (Crc32c(footer.data(), footer.size() - 4) !=
      Load<uint32_t>(footer.data() + footer.size() - 4)) {
    return Corrupt(path, -1, footer_offset, "footer checksum mismatch");
  }
  uint64_t rows = Load<uint64_t>(footer.data() + 8);
  uint64_t expect = header_end;
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = footer.data() + kFooterFixedSize + i * kFooterEntrySize;
    BlockRef ref{Load<uint64_t>(e), 0, Load<uint32_t>(e + 8)};
    if (ref.offset != expect) {
      return Corrupt(path, i, ref.offset, "footer index: block does not follow the previous one");
    }
    uint64_t next = i + 1 < n ? Load<uint64_t>(e + kFooterEntrySize) : footer_offset;
    if (next < ref.offset + kBlockHeaderSize || next > footer_offset) {
      return Corrupt(path, i, ref.offset, "footer index: block extent out of range");
    }
    ref.size = next - ref.offset;
    expect = next;
    f->num_rows_ += ref.rows;
    f->blocks_.push_back(ref);
  }
  if (expect != footer_offset || f->num_rows_ != rows) {
    return Corrupt(path, -1, footer_offset, "footer index does not cover the file");
  }
  RECFLEET_RETURN_IF_ERROR(ResolveLogical(path, f->stored_, &f->refs_, &f->schema_));
  return f;
}

absl::Status DatasetFile::ReadBlock(size_t b, Batch* out) const {
  if (b >= blocks_.size()) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": block ", b, " requested, file has ", blocks_.size()));
  }
  const BlockRef& ref = blocks_[b];
  // One read buffer per thread, reused: blocks are megabytes, and fresh
  // allocations would fault their pages in on every read.
  thread_local PodVector<uint8_t> buf;
  buf.resize(ref.size);
  if (auto s = PreadFully(fd_, path_, ref.offset, ref.size, buf.data()); !s.ok()) return s;
  if (out->schema_ptr() != schema_) {
    *out = Batch(schema_);
  }
  return DecodeBlock(path_, b, ref.offset, buf.data(), buf.size(), ref.rows, version_, *stored_,
                     refs_.get(), out);
}

absl::Status DatasetFile::ReadBlockView(size_t b, BlockView* out) const {
  if (b >= blocks_.size()) {
    return absl::OutOfRangeError(
        absl::StrCat(path_, ": block ", b, " requested, file has ", blocks_.size()));
  }
  const BlockRef& ref = blocks_[b];
  if (out->capacity_ < ref.size) {
    out->buffer_.reset(new uint8_t[ref.size]);
    out->capacity_ = ref.size;
  }
  if (auto s = PreadFully(fd_, path_, ref.offset, ref.size, out->buffer_.get()); !s.ok()) {
    return s;
  }
  Located at;
  RECFLEET_RETURN_IF_ERROR(LocateBlock(path_, b, ref.offset, out->buffer_.get(), ref.size,
                                       ref.rows, version_, *stored_, refs_.get(), &out->decoded_,
                                       &at));
  out->schema_ = schema_;
  out->refs_ = refs_;
  out->len_col_ = refs_ != nullptr ? refs_->len_column() : -1;
  out->rows_ = at.rows;
  out->offsets_ = std::move(at.offsets);
  out->values_ = std::move(at.values);
  return absl::OkStatus();
}

void BlockView::AppendReferenced(int c, size_t r, Column* out) const {
  const size_t d = c - values_.size();
  const int anchor = refs_->derived()[d].anchor;
  refs_->Append(d, Scalar(refs_->seq_column(), r), Scalar(refs_->end_column(), r),
                Scalar(refs_->len_column(), r), anchor >= 0 ? Scalar(anchor, r) : 0, out);
}

namespace {

constexpr size_t kMaxSampledBlocks = 16;

// The middle block of each of min(blocks, kMaxSampledBlocks) equal runs.
std::vector<size_t> SampledBlocks(size_t blocks) {
  const size_t n = std::min(blocks, kMaxSampledBlocks);
  std::vector<size_t> out;
  for (size_t i = 0; i < n; ++i) out.push_back((2 * i + 1) * blocks / (2 * n));
  return out;
}

}  // namespace

absl::StatusOr<double> EstimateDecodedBytes(const std::string& path) {
  absl::StatusOr<std::unique_ptr<DatasetFile>> file = DatasetFile::Open(path);
  if (!file.ok()) return file.status();
  double bytes = 0, rows = 0;
  Batch block;
  for (size_t b : SampledBlocks((*file)->num_blocks())) {
    RECFLEET_RETURN_IF_ERROR((*file)->ReadBlock(b, &block));
    bytes += static_cast<double>(block.ByteSize());
    rows += static_cast<double>(block.num_rows());
  }
  return rows > 0 ? bytes / rows * static_cast<double>((*file)->num_rows()) : 0.0;
}

absl::StatusOr<std::vector<int64_t>> SampleRowLengths(const std::string& path, const std::string& feature,
                                                      size_t max_rows) {
  absl::StatusOr<std::unique_ptr<DatasetFile>> file = DatasetFile::Open(path);
  if (!file.ok()) return file.status();
  const DatasetFile& f = **file;
  const int c = f.schema()->Find(feature);
  if (c < 0 || f.schema()->features[c].layout != Layout::kJagged) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no jagged feature '", feature, "'"));
  }
  const std::vector<size_t> blocks = SampledBlocks(f.num_blocks());
  std::vector<int64_t> lengths;
  if (blocks.empty() || max_rows == 0) return lengths;
  const size_t per_block = (max_rows + blocks.size() - 1) / blocks.size();
  BlockView view;
  for (size_t b : blocks) {
    if (lengths.size() >= max_rows) break;
    RECFLEET_RETURN_IF_ERROR(f.ReadBlockView(b, &view));
    const size_t rows = view.num_rows();
    const size_t take = std::min({per_block, rows, max_rows - lengths.size()});
    for (size_t k = 0; k < take; ++k) {
      lengths.push_back(static_cast<int64_t>(view.RowLength(c, k * rows / take)));
    }
  }
  return lengths;
}

absl::StatusOr<Batch> ReadAll(const std::string& path) {
  auto reader = DatasetReader::Open(path);
  if (!reader.ok()) return reader.status();
  Batch all((*reader)->schema());
  Batch block((*reader)->schema());
  while (true) {
    auto more = (*reader)->Next(&block);
    if (!more.ok()) return more.status();
    if (!*more) break;
    for (size_t r = 0; r < block.num_rows(); ++r) all.AppendRow(block, r);
  }
  return all;
}

}  // namespace recfleet::data
