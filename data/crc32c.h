#ifndef RECFLEET_DATA_CRC32C_H_
#define RECFLEET_DATA_CRC32C_H_

// CRC-32C (Castagnoli polynomial 0x1EDC6F41, reflected 0x82F63B78), the
// checksum of every block of a recfleet dataset file. Uses the SSE4.2 crc32
// instruction when the CPU has it and a table otherwise; both give the same
// values (the standard CRC-32C: Crc32c("123456789") == 0xE3069283).
// Thread-safe, no allocation.

#include <cstddef>
#include <cstdint>

namespace recfleet::data {

// CRC-32C of `n` bytes at `data`, continuing from a previous result `crc`
// (0 to start), so Crc32c(ab) == Crc32c(Crc32c(a), b).
uint32_t Crc32c(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32c(0, data, n); }

// The table implementation alone (exposed so tests compare both paths).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t n);

// True when Crc32c uses the SSE4.2 instruction on this CPU.
bool Crc32cIsHardware();

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_CRC32C_H_
