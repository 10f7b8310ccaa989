#include "kernels/embedding/bucket.h"

#include <algorithm>
#include <climits>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/base/checks.h"
#include "kernels/base/cuda_status.h"
#include "kernels/embedding/bucket_kernels.h"

namespace recfleet {
namespace {

absl::Status CheckInt64Vector(const TensorView& t, absl::string_view what, Device device) {
  RECFLEET_RETURN_IF_ERROR(CheckDevice(t, what, device));
  RECFLEET_RETURN_IF_ERROR(CheckDType(t, what, {DType::kInt64}));
  return CheckRank(t, what, 1);
}

// Shapes, dtypes, devices and the layout of `lengths` and `counts`, which
// the host can check on either device without reading the ids.
absl::Status CheckBucketing(absl::Span<const IdBucketing> tables, const TensorView& lengths,
                            const TensorView& routed, const TensorView& counts) {
  const Device device = lengths.device;
  RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(lengths, "lengths", device));
  RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(routed, "routed", device));
  RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(counts, "counts", device));
  if (lengths.numel() > INT_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("bucketing: ", lengths.numel(), " lengths; at most 2^31 - 1 per call, split the tables"));
  }
  for (size_t t = 0; t < tables.size(); ++t) {
    const std::string what = absl::StrCat("tables[", t, "].ids");
    RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(tables[t].ids.values, what, device));
    RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(tables[t].ids.offsets, absl::StrCat(what, ".offsets"), device));
    if (device == Device::kCpu) RECFLEET_RETURN_IF_ERROR(CheckJagged(tables[t].ids, what));
    const int64_t bags = tables[t].ids.offsets.numel() - 1;
    if (bags < 0) return absl::InvalidArgumentError(absl::StrCat(what, ".offsets is empty; need bags + 1 >= 1"));
    for (size_t s = 0; s < tables[t].shards.size(); ++s) {
      const IdShard& shard = tables[t].shards[s];
      if (shard.lengths_at < 0 || shard.lengths_at + bags > lengths.numel()) {
        return absl::InvalidArgumentError(absl::StrCat("tables[", t, "].shards[", s, "]: lengths [",
                                                       shard.lengths_at, ", ", shard.lengths_at + bags,
                                                       ") outside the ", lengths.numel(), " lengths"));
      }
      if (shard.count_slot < 0 || shard.count_slot >= counts.numel()) {
        return absl::InvalidArgumentError(absl::StrCat("tables[", t, "].shards[", s, "]: count slot ",
                                                       shard.count_slot, " outside the ", counts.numel(),
                                                       " counts"));
      }
    }
  }
  return absl::OkStatus();
}

// Calls fn(shard, ids, begin, end, lengths index) for every table, shard
// and bag, in that order; stops at the first error.
template <typename Fn>
absl::Status ForEachShardBag(absl::Span<const IdBucketing> tables, Fn fn) {
  for (const IdBucketing& table : tables) {
    const int64_t* ids = table.ids.values.as<int64_t>();
    const int64_t* off = table.ids.offsets.as<int64_t>();
    const int64_t bags = table.ids.offsets.numel() - 1;
    for (const IdShard& s : table.shards) {
      for (int64_t b = 0; b < bags; ++b) RECFLEET_RETURN_IF_ERROR(fn(s, ids, off[b], off[b + 1], s.lengths_at + b));
    }
  }
  return absl::OkStatus();
}

absl::Status BucketCpu(absl::Span<const IdBucketing> tables, const TensorView& lengths, const TensorView& routed,
                       const TensorView& counts) {
  int64_t* len = lengths.as<int64_t>();
  int64_t* count = counts.as<int64_t>();
  std::fill(count, count + counts.numel(), 0);
  std::vector<char> written(lengths.numel(), 0);
  RECFLEET_RETURN_IF_ERROR(ForEachShardBag(
      tables, [&](const IdShard& s, const int64_t* ids, int64_t begin, int64_t end, int64_t at) {
        if (written[at]++) {
          return absl::InvalidArgumentError(
              absl::StrCat("bucketing: lengths[", at, "] belongs to two (shard, bag) pairs"));
        }
        int64_t c = 0;
        for (int64_t i = begin; i < end; ++i) c += ids[i] >= s.first && ids[i] < s.end;
        len[at] = c;
        count[s.count_slot] += c;
        return absl::OkStatus();
      }));
  // Each entry's run starts where the previous entries' runs end.
  std::vector<int64_t> starts(lengths.numel() + 1, 0);
  for (int64_t i = 0; i < lengths.numel(); ++i) {
    if (!written[i]) {
      return absl::InvalidArgumentError(absl::StrCat("bucketing: lengths[", i, "] belongs to no (shard, bag) pair"));
    }
    starts[i + 1] = starts[i] + len[i];
  }
  if (starts.back() != routed.numel()) {
    return absl::InvalidArgumentError(absl::StrCat("bucketing: ", starts.back(), " ids are routed but `routed` holds ",
                                                   routed.numel()));
  }
  int64_t* out = routed.as<int64_t>();
  return ForEachShardBag(tables,
                         [&](const IdShard& s, const int64_t* ids, int64_t begin, int64_t end, int64_t at) {
                           int64_t pos = starts[at];
                           for (int64_t i = begin; i < end; ++i) {
                             if (ids[i] >= s.first && ids[i] < s.end) out[pos++] = ids[i] - s.first;
                           }
                           return absl::OkStatus();
                         });
}

absl::Status BucketCuda(absl::Span<const IdBucketing> tables, const TensorView& lengths, const TensorView& routed,
                        const TensorView& counts, void* stream) {
  std::vector<bucket_cuda::Launch> launches;
  for (const IdBucketing& table : tables) {
    for (size_t s0 = 0; s0 < table.shards.size(); s0 += bucket_cuda::kMaxShards) {
      bucket_cuda::Launch l;
      l.ids = table.ids.values.as<int64_t>();
      l.offsets = table.ids.offsets.as<int64_t>();
      l.bags = table.ids.offsets.numel() - 1;
      l.num_shards = static_cast<int>(std::min<size_t>(bucket_cuda::kMaxShards, table.shards.size() - s0));
      for (int i = 0; i < l.num_shards; ++i) {
        const IdShard& s = table.shards[s0 + i];
        l.shards[i] = {s.first, s.end, s.lengths_at, s.count_slot};
      }
      launches.push_back(l);
    }
  }
  return CudaStatus(bucket_cuda::Bucket(launches.data(), static_cast<int>(launches.size()), lengths.as<int64_t>(),
                                        lengths.numel(), routed.as<int64_t>(), counts.as<int64_t>(),
                                        counts.numel(), stream),
                    "id bucketing");
}

}  // namespace

absl::Status BucketIdsByShard(absl::Span<const IdBucketing> tables, const TensorView& lengths,
                              const TensorView& routed, const TensorView& counts, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckBucketing(tables, lengths, routed, counts));
  if (lengths.device == Device::kCpu) return BucketCpu(tables, lengths, routed, counts);
  return BucketCuda(tables, lengths, routed, counts, stream);
}

absl::Status OffsetsFromLengths(const TensorView& lengths, const TensorView& offsets, void* stream) {
  RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(lengths, "lengths", lengths.device));
  RECFLEET_RETURN_IF_ERROR(CheckInt64Vector(offsets, "offsets", lengths.device));
  RECFLEET_RETURN_IF_ERROR(CheckDim(offsets, "offsets", 0, lengths.numel() + 1));
  if (lengths.numel() > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("offsets of ", lengths.numel(), " lengths; at most 2^31 - 1"));
  }
  if (lengths.device == Device::kCpu) {
    const int64_t* len = lengths.as<int64_t>();
    int64_t* off = offsets.as<int64_t>();
    off[0] = 0;
    for (int64_t i = 0; i < lengths.numel(); ++i) off[i + 1] = off[i] + len[i];
    return absl::OkStatus();
  }
  return CudaStatus(bucket_cuda::OffsetsFromLengths(lengths.as<int64_t>(), lengths.numel(), offsets.as<int64_t>(),
                                                    stream),
                    "offsets from lengths");
}

}  // namespace recfleet
