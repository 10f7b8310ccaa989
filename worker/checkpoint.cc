#include "worker/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "data/crc32c.h"

namespace recfleet::worker {
namespace {

namespace fs = std::filesystem;

constexpr char kShardMagic[8] = {'R', 'F', 'C', 'K', 'S', 'H', '0', '1'};
constexpr char kManifestHeader[] = "recfleet-checkpoint 1";
constexpr char kStepPrefix[] = "step-";

std::string ShardName(int rank, int world_size) {
  return absl::StrFormat("shard-%05d-of-%05d", rank, world_size);
}

std::string ErrnoMessage() { return std::strerror(errno); }

// Writes `bytes` to `path` through "<path>.tmp": the file appears whole (after
// fsync) or not at all.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("cannot create ", tmp, ": ", ErrnoMessage()));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::string err = ErrnoMessage();
      ::close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", err));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return absl::InternalError(absl::StrCat("cannot flush ", tmp, ": ", ErrnoMessage()));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path, ": ", ErrnoMessage()));
  }
  // Make the rename itself durable.
  const std::string parent = fs::path(path).parent_path().string();
  int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return out.str();
}

template <typename T>
void PutLe(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // recfleet targets little-endian hosts.
  out->append(buf, sizeof(T));
}

std::string EncodeShard(const CheckpointShard& shard) {
  std::string out(kShardMagic, sizeof(kShardMagic));
  PutLe<uint32_t>(&out, static_cast<uint32_t>(shard.size()));
  for (const auto& [name, value] : shard) {
    PutLe<uint32_t>(&out, static_cast<uint32_t>(name.size()));
    out += name;
    PutLe<uint64_t>(&out, value.size());
    out += value;
  }
  PutLe<uint32_t>(&out, data::Crc32c(out.data(), out.size()));
  return out;
}

absl::StatusOr<CheckpointShard> DecodeShard(const std::string& bytes, const std::string& path) {
  auto damaged = [&](size_t offset, absl::string_view what) {
    return absl::DataLossError(absl::StrCat("checkpoint shard ", path, " is damaged at byte offset ",
                                            offset, ": ", what));
  };
  if (bytes.size() < sizeof(kShardMagic) + 8) return damaged(0, "shorter than a header and trailer");
  if (std::memcmp(bytes.data(), kShardMagic, sizeof(kShardMagic)) != 0) {
    return damaged(0, "bad magic, expected RFCKSH01");
  }
  const size_t body = bytes.size() - 4;
  uint32_t stored;
  std::memcpy(&stored, bytes.data() + body, 4);
  if (data::Crc32c(bytes.data(), body) != stored) return damaged(body, "CRC-32C mismatch");
  size_t pos = sizeof(kShardMagic);
  auto take = [&](void* dst, size_t n) {
    if (pos + n > body) return false;
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
    return true;
  };
  uint32_t count;
  if (!take(&count, 4)) return damaged(pos, "truncated record count");
  CheckpointShard shard;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t name_len;
    if (!take(&name_len, 4) || pos + name_len > body) return damaged(pos, "truncated record name");
    std::string name = bytes.substr(pos, name_len);
    pos += name_len;
    uint64_t value_len;
    if (!take(&value_len, 8) || value_len > body - pos) return damaged(pos, "truncated record value");
    shard[name] = bytes.substr(pos, value_len);
    pos += value_len;
  }
  if (pos != body) return damaged(pos, "trailing bytes after the last record");
  return shard;
}

struct ShardEntry {
  int rank = 0;
  uint64_t bytes = 0;
  uint32_t crc = 0;
};

struct Manifest {
  int64_t step = 0;
  int world_size = 0;
  std::vector<ShardEntry> shards;
};

std::string EncodeManifest(const Manifest& m) {
  std::string out = absl::StrCat(kManifestHeader, "\nstep ", m.step, "\nworld_size ", m.world_size, "\n");
  for (const ShardEntry& s : m.shards) {
    absl::StrAppendFormat(&out, "shard %d %d %08x\n", s.rank, s.bytes, s.crc);
  }
  return out;
}

absl::StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& path) {
  auto bad = [&](absl::string_view line) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, ": unexpected line '", line,
                                            "', expected '", kManifestHeader,
                                            "', 'step N', 'world_size N' and 'shard RANK BYTES CRC'"));
  };
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kManifestHeader) return bad(lines.empty() ? "" : lines[0]);
  Manifest m;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ' ');
    if (f.size() == 2 && f[0] == "step" && absl::SimpleAtoi(f[1], &m.step)) continue;
    if (f.size() == 2 && f[0] == "world_size" && absl::SimpleAtoi(f[1], &m.world_size)) continue;
    ShardEntry s;
    if (f.size() == 4 && f[0] == "shard" && absl::SimpleAtoi(f[1], &s.rank) &&
        absl::SimpleAtoi(f[2], &s.bytes) && absl::SimpleHexAtoi(f[3], &s.crc)) {
      m.shards.push_back(s);
      continue;
    }
    return bad(lines[i]);
  }
  if (m.world_size <= 0 || static_cast<int>(m.shards.size()) != m.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint manifest ", path, " lists ", m.shards.size(),
                                            " shards for world_size ", m.world_size));
  }
  return m;
}

// Reads shard `rank` of `step_dir` and checks it decodes; returns its bytes.
absl::StatusOr<std::string> ReadIntactShard(const std::string& step_dir, int rank, int world_size) {
  const std::string path = absl::StrCat(step_dir, "/", ShardName(rank, world_size));
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<CheckpointShard> decoded = DecodeShard(*bytes, path);
  if (!decoded.ok()) return decoded.status();
  return bytes;
}

// The manifest of `step_dir` if it is complete for `world_size`: every shard
// present with the recorded size and CRC.
absl::StatusOr<Manifest> VerifiedManifest(const std::string& step_dir, int world_size) {
  const std::string path = step_dir + "/MANIFEST";
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(step_dir, " has no MANIFEST (incomplete checkpoint)"));
  absl::StatusOr<Manifest> m = ParseManifest(*text, path);
  if (!m.ok()) return m.status();
  if (m->world_size != world_size) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", step_dir, " was written by ", m->world_size,
                                                      " ranks, the job has ", world_size));
  }
  for (const ShardEntry& s : m->shards) {
    const std::string shard_path = absl::StrCat(step_dir, "/", ShardName(s.rank, world_size));
    absl::StatusOr<std::string> bytes = ReadFile(shard_path);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() != s.bytes || data::Crc32c(bytes->data(), bytes->size()) != s.crc) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", shard_path, " does not match ", path,
                                              ": ", bytes->size(), " bytes, manifest says ", s.bytes));
    }
  }
  return m;
}

// Steps of every "step-N" directory under `dir`, newest first.
std::vector<int64_t> StepDirs(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t step;
    if (e.is_directory() && absl::StartsWith(name, kStepPrefix) &&
        absl::SimpleAtoi(name.substr(sizeof(kStepPrefix) - 1), &step)) {
      steps.push_back(step);
    }
  }
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

// Deletes the "*.tmp" files directly in `step_dir`.
absl::Status RemoveTmpFiles(const std::string& step_dir) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(step_dir, ec)) {
    if (!absl::EndsWith(e.path().filename().string(), ".tmp")) continue;
    std::error_code rm;
    fs::remove(e.path(), rm);
    if (rm) return absl::InternalError(absl::StrCat("cannot remove ", e.path().string(), ": ", rm.message()));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointStepDir(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/%s%012d", dir, kStepPrefix, step);
}

absl::Status WriteCheckpointShard(const std::string& dir, int64_t step, int rank, int world_size,
                                  const CheckpointShard& shard) {
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank must be in [0, ", world_size, "), got ", rank));
  }
  const std::string step_dir = CheckpointStepDir(dir, step);
  std::error_code ec;
  fs::create_directories(step_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", step_dir, ": ", ec.message()));
  return WriteFileAtomically(absl::StrCat(step_dir, "/", ShardName(rank, world_size)), EncodeShard(shard));
}

absl::Status CommitCheckpoint(const std::string& dir, int64_t step, int world_size) {
  const std::string step_dir = CheckpointStepDir(dir, step);
  Manifest m;
  m.step = step;
  m.world_size = world_size;
  for (int r = 0; r < world_size; ++r) {
    absl::StatusOr<std::string> bytes = ReadIntactShard(step_dir, r, world_size);
    if (!bytes.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("cannot commit checkpoint step ", step, ": ",
                                                        bytes.status().message()));
    }
    m.shards.push_back({r, bytes->size(), data::Crc32c(bytes->data(), bytes->size())});
  }
  return WriteFileAtomically(step_dir + "/MANIFEST", EncodeManifest(m));
}

absl::StatusOr<std::optional<int64_t>> LatestCompleteCheckpoint(const std::string& dir, int world_size) {
  for (int64_t step : StepDirs(dir)) {
    if (VerifiedManifest(CheckpointStepDir(dir, step), world_size).ok()) return std::optional<int64_t>(step);
  }
  return std::optional<int64_t>();
}

absl::StatusOr<CheckpointShard> ReadCheckpointShard(const std::string& dir, int64_t step, int rank,
                                                    int world_size) {
  const std::string step_dir = CheckpointStepDir(dir, step);
  absl::StatusOr<Manifest> m = VerifiedManifest(step_dir, world_size);
  if (!m.ok()) return m.status();
  const std::string path = absl::StrCat(step_dir, "/", ShardName(rank, world_size));
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return DecodeShard(*bytes, path);
}

absl::Status PruneCheckpoints(const std::string& dir, int world_size, int keep) {
  if (keep < 1) return absl::InvalidArgumentError(absl::StrCat("keep must be >= 1, got ", keep));
  int complete = 0;
  for (int64_t step : StepDirs(dir)) {
    const std::string step_dir = CheckpointStepDir(dir, step);
    const bool is_complete = VerifiedManifest(step_dir, world_size).ok();
    // Newer incomplete directories may be a checkpoint being written now.
    const bool remove = is_complete ? complete >= keep : complete > 0;
    if (is_complete) ++complete;
    if (!remove) {
      // A complete checkpoint has every shard: a .tmp beside them is left by
      // a writer that died, never one at work.
      if (is_complete) {
        if (absl::Status s = RemoveTmpFiles(step_dir); !s.ok()) return s;
      }
      continue;
    }
    std::error_code ec;
    fs::remove_all(step_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot remove ", step_dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status RemovePartialCheckpointFiles(const std::string& dir) {
  for (int64_t step : StepDirs(dir)) {
    if (absl::Status s = RemoveTmpFiles(CheckpointStepDir(dir, step)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FloatRecord(const float* data, int64_t n) {
  return std::string(reinterpret_cast<const char*>(data), static_cast<size_t>(n) * sizeof(float));
}

std::optional<std::pair<int64_t, int64_t>> RangeRecord(const CheckpointShard& shard, const std::string& key) {
  auto it = shard.find(key);
  if (it == shard.end()) return std::nullopt;
  std::vector<std::string> parts = absl::StrSplit(it->second, ' ');
  std::pair<int64_t, int64_t> r;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &r.first) || !absl::SimpleAtoi(parts[1], &r.second) ||
      r.first > r.second) {
    return std::nullopt;
  }
  return r;
}

int64_t CopyRecordOverlap(const std::string& record, std::pair<int64_t, int64_t> src, int64_t width,
                          std::pair<int64_t, int64_t> dst, float* out) {
  if (record.size() != static_cast<size_t>((src.second - src.first) * width) * sizeof(float)) return -1;
  const int64_t first = std::max(src.first, dst.first), end = std::min(src.second, dst.second);
  if (first >= end) return 0;
  std::memcpy(out + (first - dst.first) * width, record.data() + (first - src.first) * width * sizeof(float),
              static_cast<size_t>((end - first) * width) * sizeof(float));
  return end - first;
}

namespace {

std::string DenseSlotPrefix(int slot) { return slot == 0 ? "dense" : absl::StrCat("dense.", slot); }

}  // namespace

void SaveDenseSlice(CheckpointShard* shard, int slot, std::pair<int64_t, int64_t> range, const float* value,
                    const float* adam_m, const float* adam_v) {
  const std::string prefix = DenseSlotPrefix(slot);
  const int64_t n = range.second - range.first;
  (*shard)[prefix + ".range"] = absl::StrCat(range.first, " ", range.second);
  (*shard)[prefix + ".value"] = FloatRecord(value, n);
  (*shard)[prefix + ".adam_m"] = FloatRecord(adam_m, n);
  (*shard)[prefix + ".adam_v"] = FloatRecord(adam_v, n);
}

std::vector<int> DenseSlots(const CheckpointShard& shard) {
  std::vector<int> slots;
  if (shard.count("dense.range") > 0) slots.push_back(0);
  // "dense.<slot>.range" for slot >= 1; the map is sorted, so they follow
  // "dense.".
  for (auto it = shard.lower_bound("dense."); it != shard.end() && absl::StartsWith(it->first, "dense."); ++it) {
    absl::string_view key = it->first;
    if (!absl::ConsumeSuffix(&key, ".range") || !absl::ConsumePrefix(&key, "dense.")) continue;
    int slot = 0;
    if (absl::SimpleAtoi(key, &slot) && slot >= 1) slots.push_back(slot);
  }
  std::sort(slots.begin(), slots.end());
  return slots;
}

absl::StatusOr<int64_t> RestoreDenseSlice(const std::vector<CheckpointShard>& shards,
                                          std::pair<int64_t, int64_t> range, float* value, float* adam_m,
                                          float* adam_v) {
  int64_t covered = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    for (int slot : DenseSlots(shards[i])) {
      const std::string prefix = DenseSlotPrefix(slot);
      std::optional<std::pair<int64_t, int64_t>> r = RangeRecord(shards[i], prefix + ".range");
      if (!r) continue;
      int64_t n = 0;
      for (auto [key, dst] : {std::pair<std::string, float*>{prefix + ".value", value},
                              {prefix + ".adam_m", adam_m},
                              {prefix + ".adam_v", adam_v}}) {
        auto rec = shards[i].find(key);
        n = rec == shards[i].end() ? -1 : CopyRecordOverlap(rec->second, *r, 1, range, dst);
        if (n < 0) return absl::DataLossError(absl::StrCat("checkpoint shard ", i, ": ", key, " does not match its range"));
      }
      covered += n;
    }
  }
  return covered;
}

void SaveTableBlock(CheckpointShard* shard, int table, int64_t dim, std::pair<int64_t, int64_t> rows,
                    std::pair<int64_t, int64_t> cols, const float* values, const float* momentum) {
  const std::string key = absl::StrCat("table.", table);
  const int64_t n = rows.second - rows.first;
  (*shard)[key + ".rows"] = absl::StrCat(rows.first, " ", rows.second);
  if (cols.first != 0 || cols.second != dim) (*shard)[key + ".cols"] = absl::StrCat(cols.first, " ", cols.second);
  (*shard)[key + ".value"] = FloatRecord(values, n * (cols.second - cols.first));
  if (momentum != nullptr) (*shard)[key + ".adagrad"] = FloatRecord(momentum, n);
}

absl::Status RestoreTableBlock(const std::vector<CheckpointShard>& shards, int table, int64_t dim,
                               std::pair<int64_t, int64_t> rows, std::pair<int64_t, int64_t> cols, float* values,
                               float* momentum) {
  const std::string key = absl::StrCat("table.", table);
  const int64_t width = cols.second - cols.first;
  int64_t cells = 0, accumulators = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const CheckpointShard& s = shards[i];
    std::optional<std::pair<int64_t, int64_t>> r = RangeRecord(s, key + ".rows");
    if (!r) continue;
    const std::pair<int64_t, int64_t> c = RangeRecord(s, key + ".cols").value_or(std::make_pair(int64_t{0}, dim));
    auto value = s.find(key + ".value");
    const int64_t src_width = c.second - c.first;
    if (value == s.end() || c.first < 0 || c.second > dim || src_width < 0 ||
        value->second.size() != static_cast<size_t>((r->second - r->first) * src_width) * sizeof(float)) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", i, ": ", key, " does not match its rows and columns"));
    }
    const int64_t r0 = std::max(r->first, rows.first), r1 = std::min(r->second, rows.second);
    const int64_t c0 = std::max(c.first, cols.first), c1 = std::min(c.second, cols.second);
    if (r0 < r1 && c0 < c1) {
      for (int64_t row = r0; row < r1; ++row) {
        std::memcpy(values + (row - rows.first) * width + (c0 - cols.first),
                    value->second.data() + ((row - r->first) * src_width + (c0 - c.first)) * sizeof(float),
                    static_cast<size_t>(c1 - c0) * sizeof(float));
      }
      cells += (r1 - r0) * (c1 - c0);
    }
    auto adagrad = s.find(key + ".adagrad");
    if (adagrad == s.end()) continue;
    const int64_t n = CopyRecordOverlap(adagrad->second, *r, 1, rows, momentum);
    if (n < 0) return absl::DataLossError(absl::StrCat("checkpoint shard ", i, ": ", key, ".adagrad does not match its rows"));
    accumulators += n;
  }
  const int64_t n = rows.second - rows.first;
  if (cells != n * width || accumulators != n) {
    return absl::DataLossError(absl::StrCat("checkpoint covers ", cells, " of the ", n * width, " elements and ",
                                            accumulators, " of the ", n, " accumulators of this rank's rows [",
                                            rows.first, ", ", rows.second, ") x columns [", cols.first, ", ",
                                            cols.second, ") of table ", table));
  }
  return absl::OkStatus();
}

}  // namespace recfleet::worker
