// libFuzzer harness: the bytes are an IDX file (plain or gzip) given to data::read_idx.
// A lather::Error is the expected rejection; anything else (a sanitizer report, an escaping
// exception, a broken invariant below, an allocation past -rss_limit_mb) is a bug.
#include "fuzz_support.hpp"

#include <lather/core/error.hpp>
#include <lather/data/idx.hpp>

#include <cstring>
#include <functional>
#include <numeric>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = lather::fuzz::scratch().write("input-idx3-ubyte", data, size);
  lather::data::IdxArray array;
  try {
    array = lather::data::read_idx(path);
  } catch (const lather::Error&) {
    return 0;
  }
  LATHER_FUZZ_CHECK(array.dims.size() >= 1 && array.dims.size() <= 4);
  std::int64_t elements = 1;
  for (const std::int64_t dim : array.dims) {
    LATHER_FUZZ_CHECK(dim >= 1);
    elements *= dim;
  }
  LATHER_FUZZ_CHECK(std::size_t(elements) == array.values.size());
  // A plain file (gzip starts with 0x1F 0x8B; IDX with two zero bytes) holds its header and then
  // exactly the values, nothing after them.
  if (size >= 2 && data[0] == 0 && data[1] == 0) {
    const std::size_t header = 4 + 4 * array.dims.size();
    LATHER_FUZZ_CHECK(size == header + array.values.size());
    LATHER_FUZZ_CHECK(array.values.empty() ||
                      std::memcmp(array.values.data(), data + header, array.values.size()) == 0);
  }
  return 0;
}
