#ifndef RECFLEET_DATA_INT_CODEC_H_
#define RECFLEET_DATA_INT_CODEC_H_

// Compression of int64 arrays for the dataset format (data/FORMAT.md,
// version 2): each value is stored as the zigzag-encoded difference from
// the previous one (the first from 0) in LEB128 varint bytes. Sorted or
// clustered columns (sample ids, offsets, a user's timestamps, ids grouped
// by user) shrink from 8 bytes to 1-3 per value; the writer keeps an array
// raw when encoding would not save space. Pure functions.
//
// (Debian's libstreamvbyte codes 32-bit integers only; recfleet's ids and
// timestamps are 64-bit.)

#include <cstddef>
#include <cstdint>
#include <string>

namespace recfleet::data {

// Appends the encoding of values[0..n) to `out`.
void AppendDeltaVarint(const int64_t* values, size_t n, std::string* out);

// Bytes AppendDeltaVarint would append, without encoding.
size_t DeltaVarintSize(const int64_t* values, size_t n);

// Decodes exactly n values from bytes[0..size) into `out`; false if the
// bytes end early, a varint runs past 10 bytes, or bytes are left over.
bool DecodeDeltaVarint(const uint8_t* bytes, size_t size, size_t n, int64_t* out);

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_INT_CODEC_H_
