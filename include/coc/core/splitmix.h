// splitmix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix whose outputs for consecutive inputs are
// statistically independent, which is all coc's counter-based samplers and initialisers need.
#pragma once

#include <cstdint>

namespace coc {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace coc
