#include "data/dataset_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "data/crc32c.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the dataset format is little-endian; add byte swapping for this host");

namespace recfleet::data {
namespace {

constexpr char kFileMagic[8] = {'R', 'F', 'D', 'S', 'E', 'T', 0, 1};  // Version 1.
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

// Encodes `b` as a block payload: per column, offsets (jagged) then values.
void EncodePayload(const Batch& b, std::string* out) {
  out->clear();
  const Schema& s = b.schema();
  for (size_t c = 0; c < s.features.size(); ++c) {
    const Column& col = b.column(c);
    if (s.features[c].layout == Layout::kJagged) {
      out->append(reinterpret_cast<const char*>(col.offsets.data()), col.offsets.size() * 8);
    }
    if (s.features[c].dtype == DType::kInt64) {
      out->append(reinterpret_cast<const char*>(col.i64.data()), col.i64.size() * 8);
    } else {
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
// with well-formed offsets. `expected_rows` < 0 means "not known".
absl::Status LocateBlock(const std::string& path, int64_t index, uint64_t offset,
                         const uint8_t* data, uint64_t size, int64_t expected_rows,
                         const Schema& schema, Located* out) {
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
  uint64_t pos = 0;
  auto take = [&](uint64_t n, const char* what, const std::string& name) -> absl::Status {
    if (n > payload_len - pos) {
      return Corrupt(path, index, offset + kBlockHeaderSize + pos,
                     absl::StrCat("feature '", name, "': ", what, " needs ", n,
                                  " bytes, payload has ", payload_len - pos, " left"));
    }
    return absl::OkStatus();
  };
  for (size_t c = 0; c < schema.features.size(); ++c) {
    const FeatureSpec& f = schema.features[c];
    if (f.layout == Layout::kJagged) {
      uint64_t n = (static_cast<uint64_t>(rows) + 1) * 8;
      if (auto st = take(n, "offsets", f.name); !st.ok()) return st;
      const uint8_t* o = p + pos;
      if (Load<uint64_t>(o) != 0) {
        return Corrupt(path, index, offset + kBlockHeaderSize + pos,
                       absl::StrCat("feature '", f.name, "': first offset is not 0"));
      }
      for (uint32_t r = 0; r < rows; ++r) {
        if (Load<uint64_t>(o + 8 * (r + 1)) < Load<uint64_t>(o + 8 * r)) {
          return Corrupt(path, index, offset + kBlockHeaderSize + pos + 8 * (r + 1),
                         absl::StrCat("feature '", f.name, "': offsets decrease at row ", r));
        }
      }
      out->offsets[c] = o;
      pos += n;
      out->num_values[c] = Load<uint64_t>(o + 8 * static_cast<uint64_t>(rows));
      if (out->num_values[c] > payload_len) {
        return Corrupt(path, index, offset + kBlockHeaderSize + pos,
                       absl::StrCat("feature '", f.name, "': ", out->num_values[c],
                                    " values exceed the payload"));
      }
    }
    uint64_t n = out->num_values[c] * ElemSize(f.dtype);
    if (auto st = take(n, "values", f.name); !st.ok()) return st;
    out->values[c] = p + pos;
    pos += n;
  }
  if (pos != payload_len) {
    return Corrupt(path, index, offset + kBlockHeaderSize + pos,
                   absl::StrCat(payload_len - pos, " unexpected bytes after the last column"));
  }
  return absl::OkStatus();
}

// Verifies a block and copies its columns into `out`.
absl::Status DecodeBlock(const std::string& path, int64_t index, uint64_t offset,
                         const uint8_t* data, uint64_t size, int64_t expected_rows, Batch* out) {
  Located at;
  const Schema& s = out->schema();
  if (auto st = LocateBlock(path, index, offset, data, size, expected_rows, s, &at); !st.ok()) {
    return st;
  }
  out->Clear();
  for (size_t c = 0; c < s.features.size(); ++c) {
    Column& col = out->mutable_column(c);
    if (at.offsets[c] != nullptr) {
      col.offsets.resize(at.rows + 1);
      std::memcpy(col.offsets.data(), at.offsets[c], (at.rows + 1) * 8);
    }
    // Emptied by Clear() above; an empty vector's data() may be null,
    // which memcpy must not get even for 0 bytes.
    if (at.num_values[c] == 0) continue;
    if (s.features[c].dtype == DType::kInt64) {
      col.i64.resize(at.num_values[c]);
      std::memcpy(col.i64.data(), at.values[c], at.num_values[c] * 8);
    } else {
      col.f32.resize(at.num_values[c]);
      std::memcpy(col.f32.data(), at.values[c], at.num_values[c] * 4);
    }
  }
  out->set_num_rows(at.rows);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Schema>> ParseHeaderSchema(const std::string& path,
                                                                const uint8_t* data,
                                                                size_t schema_len) {
  uint32_t stored = Load<uint32_t>(data + kFileHeaderFixed + schema_len);
  if (Crc32c(data + 8, 4 + schema_len) != stored) {
    return Corrupt(path, -1, 8, "file header (schema) checksum mismatch");
  }
  auto schema = Schema::Parse(
      absl::string_view(reinterpret_cast<const char*>(data + kFileHeaderFixed), schema_len));
  if (!schema.ok()) return Corrupt(path, -1, kFileHeaderFixed, schema.status().message());
  return std::make_shared<const Schema>(*std::move(schema));
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
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  std::unique_ptr<DatasetWriter> w(
      new DatasetWriter(path, f, std::make_shared<const Schema>(schema), options));
  std::string header(kFileMagic, 8);
  std::string body = schema.Serialize();
  std::string len_and_schema;
  Put<uint32_t>(&len_and_schema, static_cast<uint32_t>(body.size()));
  len_and_schema += body;
  header += len_and_schema;
  Put<uint32_t>(&header, Crc32c(len_and_schema.data(), len_and_schema.size()));
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
  EncodePayload(pending_, &scratch_);
  std::string header;
  Put<uint32_t>(&header, kBlockMagic);
  Put<uint32_t>(&header, static_cast<uint32_t>(pending_.num_rows()));
  Put<uint64_t>(&header, scratch_.size());
  Put<uint32_t>(&header, Crc32c(scratch_.data(), scratch_.size()));
  Put<uint32_t>(&header, Crc32c(header.data(), header.size()));
  index_.emplace_back(offset_, static_cast<uint32_t>(pending_.num_rows()));
  rows_written_ += pending_.num_rows();
  pending_.Clear();
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
  if (std::memcmp(fixed, kFileMagic, 8) != 0) {
    return Corrupt(path, -1, 0, "not a recfleet dataset file (bad magic or version)");
  }
  uint32_t schema_len = Load<uint32_t>(fixed + 8);
  if (schema_len > r->size_) return Corrupt(path, -1, 8, "schema length exceeds the file size");
  std::vector<uint8_t> header(kFileHeaderFixed + schema_len + 4);
  std::memcpy(header.data(), fixed, kFileHeaderFixed);
  if (auto s = r->ReadAt(schema_len + 4, header.data() + kFileHeaderFixed, -1, "schema header");
      !s.ok()) {
    return s;
  }
  auto schema = ParseHeaderSchema(path, header.data(), schema_len);
  if (!schema.ok()) return schema.status();
  r->schema_ = *std::move(schema);
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
  if (auto s = DecodeBlock(path_, index, start, buffer_.data(), buffer_.size(), -1, block);
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
  if (std::memcmp(fixed, kFileMagic, 8) != 0) {
    return Corrupt(path, -1, 0, "not a recfleet dataset file (bad magic or version)");
  }
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
  auto schema = ParseHeaderSchema(path, header.data(), schema_len);
  if (!schema.ok()) return schema.status();
  f->schema_ = *std::move(schema);

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
  return DecodeBlock(path_, b, ref.offset, buf.data(), buf.size(), ref.rows, out);
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
  if (auto s =
          LocateBlock(path_, b, ref.offset, out->buffer_.get(), ref.size, ref.rows, *schema_, &at);
      !s.ok()) {
    return s;
  }
  out->schema_ = schema_;
  out->rows_ = at.rows;
  out->offsets_ = std::move(at.offsets);
  out->values_ = std::move(at.values);
  return absl::OkStatus();
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
