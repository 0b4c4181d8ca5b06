#pragma once
// The one hash Lather uses to compare lists across ranks (tensor sizes, labels, checkpoint array
// lists) before a collective: 64-bit FNV-1a over the bytes of each value, in order. Not for
// security; equal inputs give equal hashes on every rank and platform of one run.

#include <cstdint>
#include <string>

namespace lather::Impl {

class Fnv1a {
 public:
  /// Adds the 8 bytes of `value`, least significant first.
  Fnv1a& add(std::uint64_t value) {
    for (int byte = 0; byte < 8; ++byte) mix((value >> (8 * byte)) & 0xffu);
    return *this;
  }
  /// Adds the characters of `text`, then its length (so that "ab" + "c" differs from "a" + "bc").
  Fnv1a& add(const std::string& text) {
    for (unsigned char c : text) mix(c);
    return add(std::uint64_t(text.size()));
  }
  std::uint64_t value() const { return m_hash; }

 private:
  void mix(std::uint64_t byte) {
    m_hash ^= byte;
    m_hash *= 1099511628211ull;
  }
  std::uint64_t m_hash = 1469598103934665603ull;
};

}  // namespace lather::Impl
