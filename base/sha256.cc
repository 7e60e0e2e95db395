#include "base/sha256.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvl {
namespace {

// SHA-256 round constants and initial state are the fractional parts of the
// cube and square roots of the first primes (FIPS 180-4, 4.2.2 and 5.3.3);
// computed rather than transcribed. long double carries 64 mantissa bits, far
// more than the 32 fractional bits needed for roots of primes below 312.
struct Sha256Constants {
  uint32_t k[64];
  uint32_t h0[8];
  Sha256Constants() {
    int found = 0;
    for (int p = 2; found < 64; ++p) {
      bool prime = true;
      for (int d = 2; d * d <= p; ++d) prime = prime && (p % d != 0);
      if (!prime) continue;
      const long double c = cbrtl(static_cast<long double>(p));
      k[found] = static_cast<uint32_t>(std::floor((c - std::floor(c)) * 4294967296.0L));
      if (found < 8) {
        const long double r = sqrtl(static_cast<long double>(p));
        h0[found] = static_cast<uint32_t>(std::floor((r - std::floor(r)) * 4294967296.0L));
      }
      ++found;
    }
  }
};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Sha256Block(const uint8_t* p, const uint32_t* k, uint32_t* h) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = (uint32_t{p[4 * t]} << 24) | (uint32_t{p[4 * t + 1]} << 16) |
           (uint32_t{p[4 * t + 2]} << 8) | uint32_t{p[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = Rotr(w[t - 15], 7) ^ Rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = Rotr(w[t - 2], 17) ^ Rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = hh + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[t] + w[t];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += hh;
}

}  // namespace

std::string Sha256Hex(std::string_view data) {
  static const Sha256Constants kC;
  uint32_t h[8];
  std::memcpy(h, kC.h0, sizeof(h));
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  const size_t n = data.size();
  size_t off = 0;
  for (; off + 64 <= n; off += 64) Sha256Block(p + off, kC.k, h);
  // Padding: 0x80, zeros, then the message length in bits, big-endian.
  uint8_t tail[128] = {};
  const size_t rem = n - off;
  std::memcpy(tail, p + off, rem);
  tail[rem] = 0x80;
  const size_t tail_len = rem + 9 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(n) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = static_cast<uint8_t>(bits >> (8 * i));
  for (size_t o = 0; o < tail_len; o += 64) Sha256Block(tail + o, kC.k, h);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(64, '0');
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) hex[8 * i + j] = kHex[(h[i] >> (28 - 4 * j)) & 0xF];
  }
  return hex;
}

}  // namespace kvl
