// The C++ side of the Python checkpoint reader's test (checkpoint_test.py):
//
//   checkpoint_fixture write DIR
//     writes a complete 3-rank checkpoint (step 7) through the worker's
//     checkpoint writer, with the layouts a distributed job produces: the
//     flat dense vector split into FSDP ranges on both sides of an
//     expert-parallel span (elements [4, 6), one "expert" on each of ranks
//     0 and 1, as their third slice), table "item" split by rows,
//     table "user" split by columns (only the first slice recording the
//     accumulators). Element values follow formulas the test recomputes.
//   checkpoint_fixture dump DIR WORLD_SIZE OUT
//     reads the newest complete checkpoint of DIR with the worker's reader
//     and restore functions (ReadCheckpointShard, RestoreDenseSlice,
//     RestoreTableBlock), the way a resuming rank does, and writes what they
//     assembled to OUT: meta.txt ("step N", "adam_step N") and raw
//     little-endian float32 files dense.value.f32, dense.adam_m.f32,
//     dense.adam_v.f32 (the flat dense vector), table.<name>.value.f32
//     (rows x dim) and table.<name>.adagrad.f32.

#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker/checkpoint.h"

namespace recfleet::worker {
namespace {

constexpr int64_t kStep = 7;
constexpr int kWorld = 3;
constexpr int64_t kDenseNumel = 9;  // "mlp.w:6;mlp.b:3;"

float Dense(int64_t i, int moment) { return moment == 0 ? 0.5f * i - 1 : 0.01f * moment * (i + 1); }
float Cell(int t, int64_t r, int64_t c) { return 100.0f * t + 10.0f * r + c + 0.25f; }
float Accumulator(int t, int64_t r) { return t + 0.5f * r; }

// Table t's block [rows) x [cols) and its rows' accumulators, from the formulas.
void SaveBlock(CheckpointShard* shard, int t, int64_t dim, std::pair<int64_t, int64_t> rows,
               std::pair<int64_t, int64_t> cols, bool accumulators) {
  std::vector<float> values, momentum;
  for (int64_t r = rows.first; r < rows.second; ++r) {
    momentum.push_back(Accumulator(t, r));
    for (int64_t c = cols.first; c < cols.second; ++c) values.push_back(Cell(t, r, c));
  }
  SaveTableBlock(shard, t, dim, rows, cols, values.data(), accumulators ? momentum.data() : nullptr);
}

constexpr int kSlots = 3;

absl::Status Write(const std::string& dir) {
  // Per rank, its slices of the flat dense vector by slot (empty: none).
  const std::pair<int64_t, int64_t> dense_slices[kWorld][kSlots] = {
      {{0, 4}, {0, 0}, {4, 5}}, {{0, 0}, {6, kDenseNumel}, {5, 6}}, {{0, 0}, {0, 0}, {0, 0}}};
  for (int rank = 0; rank < kWorld; ++rank) {
    CheckpointShard shard;
    shard["fingerprint"] = "mlp.w:6;mlp.b:3;table.item:5x4;table.user:4x6;";
    shard["adam_step"] = "11";
    shard["samples"] = "1408";
    shard["step"] = absl::StrCat(kStep);
    for (int slot = 0; slot < kSlots; ++slot) {
      const auto [first, end] = dense_slices[rank][slot];
      if (end <= first) continue;
      std::vector<float> v[3];
      for (int moment = 0; moment < 3; ++moment) {
        for (int64_t i = first; i < end; ++i) v[moment].push_back(Dense(i, moment));
      }
      SaveDenseSlice(&shard, slot, {first, end}, v[0].data(), v[1].data(), v[2].data());
    }
    // Table 0, "item" (5 x 4), row-wise over ranks 0 and 1.
    if (rank == 0) SaveBlock(&shard, 0, 4, {0, 2}, {0, 4}, true);
    if (rank == 1) SaveBlock(&shard, 0, 4, {2, 5}, {0, 4}, true);
    // Table 1, "user" (4 x 6), column-wise over ranks 1 and 2.
    if (rank == 1) SaveBlock(&shard, 1, 6, {0, 4}, {0, 3}, true);
    if (rank == 2) SaveBlock(&shard, 1, 6, {0, 4}, {3, 6}, false);
    if (absl::Status s = WriteCheckpointShard(dir, kStep, rank, kWorld, shard); !s.ok()) return s;
  }
  return CommitCheckpoint(dir, kStep, kWorld);
}

absl::Status WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return out ? absl::OkStatus() : absl::InternalError(absl::StrCat("cannot write ", path));
}

absl::Status Dump(const std::string& dir, int world, const std::string& out) {
  absl::StatusOr<std::optional<int64_t>> step = LatestCompleteCheckpoint(dir, world);
  if (!step.ok()) return step.status();
  if (!step->has_value()) return absl::NotFoundError(absl::StrCat("no complete checkpoint under ", dir));
  std::vector<CheckpointShard> shards;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<CheckpointShard> shard = ReadCheckpointShard(dir, **step, r, world);
    if (!shard.ok()) return shard.status();
    shards.push_back(*std::move(shard));
  }
  // The fingerprint names the dense parameters' sizes and the tables' shapes.
  int64_t dense_numel = 0;
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> tables;
  for (absl::string_view entry : absl::StrSplit(shards[0]["fingerprint"], ';', absl::SkipEmpty())) {
    const size_t colon = entry.rfind(':');
    const std::string name(entry.substr(0, colon)), size(entry.substr(colon + 1));
    std::vector<std::string> rxd = absl::StrSplit(size, 'x');
    int64_t a = 0, b = 0;
    if (rxd.size() == 2 && absl::SimpleAtoi(rxd[0], &a) && absl::SimpleAtoi(rxd[1], &b)) {
      tables.push_back({name.substr(6), {a, b}});
    } else if (absl::SimpleAtoi(size, &a)) {
      dense_numel += a;
    } else {
      return absl::DataLossError(absl::StrCat("fingerprint entry ", entry));
    }
  }
  std::vector<float> value(dense_numel), adam_m(dense_numel), adam_v(dense_numel);
  absl::StatusOr<int64_t> covered = RestoreDenseSlice(shards, {0, dense_numel}, value.data(), adam_m.data(), adam_v.data());
  if (!covered.ok()) return covered.status();
  if (*covered != dense_numel) return absl::DataLossError(absl::StrCat("dense covers ", *covered, " of ", dense_numel));
  for (const auto& [key, flat] : {std::pair<const char*, const std::vector<float>*>{"dense.value", &value},
                                  {"dense.adam_m", &adam_m},
                                  {"dense.adam_v", &adam_v}}) {
    if (absl::Status s = WriteFloats(absl::StrCat(out, "/", key, ".f32"), *flat); !s.ok()) return s;
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const auto& [name, shape] = tables[t];
    std::vector<float> values(shape.first * shape.second), momentum(shape.first);
    if (absl::Status s = RestoreTableBlock(shards, static_cast<int>(t), shape.second, {0, shape.first},
                                           {0, shape.second}, values.data(), momentum.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = WriteFloats(absl::StrCat(out, "/table.", name, ".value.f32"), values); !s.ok()) return s;
    if (absl::Status s = WriteFloats(absl::StrCat(out, "/table.", name, ".adagrad.f32"), momentum); !s.ok()) return s;
  }
  std::ofstream meta(out + "/meta.txt");
  meta << "step " << **step << "\nadam_step " << shards[0]["adam_step"] << "\n";
  return meta ? absl::OkStatus() : absl::InternalError("cannot write meta.txt");
}

}  // namespace
}  // namespace recfleet::worker

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::Status s;
  int world = 0;
  if (args.size() == 2 && args[0] == "write") {
    s = recfleet::worker::Write(args[1]);
  } else if (args.size() == 4 && args[0] == "dump" && absl::SimpleAtoi(args[2], &world) && world > 0) {
    s = recfleet::worker::Dump(args[1], world, args[3]);
  } else {
    std::fprintf(stderr, "usage: checkpoint_fixture write DIR | dump DIR WORLD_SIZE OUT\n");
    return 2;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "checkpoint_fixture: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
