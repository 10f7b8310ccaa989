#include "data/int_codec.h"

namespace recfleet::data {
namespace {

// Two's-complement wrap-around keeps the delta of any two int64 values
// exact (the decoder adds it back modulo 2^64).
uint64_t ZigzagDelta(int64_t value, int64_t prev) {
  uint64_t d = static_cast<uint64_t>(value) - static_cast<uint64_t>(prev);
  return (d << 1) ^ (0 - (d >> 63));
}

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

}  // namespace

void AppendDeltaVarint(const int64_t* values, size_t n, std::string* out) {
  // Encoded into a stack buffer and appended in chunks: appending each
  // value's few bytes separately costs more than encoding them.
  constexpr size_t kChunk = 256;
  char buf[kChunk * 10];
  int64_t prev = 0;
  for (size_t i = 0; i < n;) {
    const size_t stop = i + kChunk < n ? i + kChunk : n;
    char* p = buf;
    for (; i < stop; ++i) {
      uint64_t z = ZigzagDelta(values[i], prev);
      prev = values[i];
      while (z >= 0x80) {
        *p++ = static_cast<char>(z | 0x80);
        z >>= 7;
      }
      *p++ = static_cast<char>(z);
    }
    out->append(buf, p - buf);
  }
}

size_t DeltaVarintSize(const int64_t* values, size_t n) {
  size_t bytes = 0;
  int64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    bytes += VarintBytes(ZigzagDelta(values[i], prev));
    prev = values[i];
  }
  return bytes;
}

bool DecodeDeltaVarint(const uint8_t* bytes, size_t size, size_t n, int64_t* out) {
  const uint8_t* p = bytes;
  const uint8_t* end = bytes + size;
  uint64_t prev = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t z = 0;
    int shift = 0;
    while (true) {
      if (p == end || shift > 63) return false;
      uint8_t b = *p++;
      z |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) break;
      shift += 7;
    }
    uint64_t d = (z >> 1) ^ (0 - (z & 1));
    prev += d;
    out[i] = static_cast<int64_t>(prev);
  }
  return p == end;
}

}  // namespace recfleet::data
