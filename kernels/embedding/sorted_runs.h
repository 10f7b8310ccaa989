#ifndef RECFLEET_KERNELS_EMBEDDING_SORTED_RUNS_H_
#define RECFLEET_KERNELS_EMBEDDING_SORTED_RUNS_H_

// How the embedding backward finds the occurrences of each id after a radix
// sort that may leave the lowest `lo` bits of the ids unsorted: the keys are
// then in runs of equal id >> lo ("bucket runs"), each mixing up to 2^lo
// distinct ids in their original order. With lo = 0 a bucket run is a run of
// one id. Shared by the CUDA kernel and its CPU test (host and device code).
//
// key_at(q) returns the sorted key at position q (an int64_t); positions are
// [0, n).

#include <cstdint>

#if defined(__CUDACC__)
#define RECFLEET_RUNS_HD __host__ __device__ __forceinline__
#else
#define RECFLEET_RUNS_HD inline
#endif

namespace recfleet::sorted_runs {

// The low bits a radix sort of `bits`-bit ids may skip: the sort moves 8
// bits per pass, so where the width is one or two bits past a multiple of 8
// (25-bit ids: 4 passes), skipping them saves a pass (3 passes); more would
// make bucket runs of up to 2^lo ids too long to scan.
RECFLEET_RUNS_HD int LowBitsToSkip(int bits) {
  return bits > 8 && bits % 8 <= 2 ? bits % 8 : 0;
}

RECFLEET_RUNS_HD bool SameBucket(int64_t a, int64_t b, int lo) { return (a >> lo) == (b >> lo); }

// True when position p holds the first occurrence of `id` (the key at p):
// no earlier position of its bucket run holds the id.
template <typename KeyAt>
RECFLEET_RUNS_HD bool FirstOccurrence(const KeyAt& key_at, int64_t p, int64_t id, int lo) {
  for (int64_t q = p - 1; q >= 0; --q) {
    const int64_t k = key_at(q);
    if (k == id) return false;
    if (lo == 0 || !SameBucket(k, id, lo)) return true;
  }
  return true;
}

// Calls add(q) for each position q > p of p's bucket run that holds `id`,
// in increasing order.
template <typename KeyAt, typename Add>
RECFLEET_RUNS_HD void ForEachLaterOccurrence(const KeyAt& key_at, int64_t n, int64_t p,
                                             int64_t id, int lo, const Add& add) {
  for (int64_t q = p + 1; q < n; ++q) {
    const int64_t k = key_at(q);
    if (!SameBucket(k, id, lo)) return;
    if (k == id) add(q);
  }
}

}  // namespace recfleet::sorted_runs

#undef RECFLEET_RUNS_HD

#endif  // RECFLEET_KERNELS_EMBEDDING_SORTED_RUNS_H_
