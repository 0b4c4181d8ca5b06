#include "bench_common.hpp"

#include <dlfcn.h>

namespace lather::bench {

std::string blas_kernels() {
  // Looked up at run time: the BLAS is whichever libblas.so the system's alternatives name, and
  // only OpenBLAS has this function.
  using CoreName = char* (*)();
  static const std::string name = [] {
    const auto get = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    const char* core = get ? get() : nullptr;
    return std::string(core ? core : "unknown");
  }();
  return name;
}

void emit(nlohmann::json record) {
  record["blas_kernels"] = blas_kernels();
  std::cout << record.dump() << std::endl;
}

}  // namespace lather::bench
