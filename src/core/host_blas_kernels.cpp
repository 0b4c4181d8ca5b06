#include <lather/core/host_blas_kernels.hpp>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#include <unistd.h>
#define LATHER_HAVE_DLSYM 1
#else
#define LATHER_HAVE_DLSYM 0
#endif

namespace lather {

namespace {

/// Set in the environment of the restarted process: the chooser then only reports.
constexpr const char* restarted_from = "LATHER_BLAS_KERNELS_REPLACED";

/// OpenBLAS's own answer, looked up at run time: the BLAS is whichever libblas.so.3 the system's
/// alternatives name, and only OpenBLAS has this function.
std::string openblas_core() {
#if LATHER_HAVE_DLSYM
  using CoreName = char* (*)();
  const auto get = reinterpret_cast<CoreName>(::dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* core = get ? get() : nullptr;
  if (core && *core) return core;
#endif
  return {};
}

/// The widest vector instructions a core's kernels use: 3 AVX-512, 2 AVX2 + FMA, 1 AVX, 0 SSE
/// (OpenBLAS 0.3's x86-64 core names; those not listed are generic or older).
int level_of_core(const std::string& core) {
  std::string name = core;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const char* k : {"skylakex", "cooperlake", "sapphirerapids"})
    if (name == k) return 3;
  for (const char* k : {"haswell", "zen", "skylake"})
    if (name == k) return 2;
  for (const char* k : {"sandybridge", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (name == k) return 1;
  return 0;
}

/// The same levels for this CPU (0 where it is not x86-64).
int level_of_cpu() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
  if (__builtin_cpu_supports("avx")) return 1;
#endif
  return 0;
}

const char* instructions_of(int level) {
  switch (level) {
    case 3:
      return "AVX-512";
    case 2:
      return "AVX2 and FMA";
    case 1:
      return "AVX";
    default:
      return "SSE";
  }
}

bool amd_cpu() {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

/// What OpenBLAS chose, or what the test hook says it chose.
std::string chosen_core() {
  const char* simulated = std::getenv("LATHER_TEST_BLAS_FALLBACK");
  if (simulated && *simulated && !std::getenv(restarted_from)) return simulated;
  return openblas_core();
}

}  // namespace

std::string host_blas_kernels() {
  const std::string core = openblas_core();
  return core.empty() ? "unknown" : core;
}

std::string best_host_blas_kernels() {
  switch (level_of_cpu()) {
    case 3:
      return "SkylakeX";
    case 2:
      return amd_cpu() ? "Zen" : "Haswell";
    case 1:
      return "Sandybridge";
    default:
      return {};
  }
}

std::string choose_host_blas_kernels(char** argv) {
  const char* replaced = std::getenv(restarted_from);
  if (replaced && *replaced) {
    // The restarted process: say what was done, and whether OpenBLAS took it (a build without
    // the kernels asked for ignores OPENBLAS_CORETYPE).
    const std::string now = openblas_core();
    const char* asked = std::getenv("OPENBLAS_CORETYPE");
    const std::string wanted = asked ? asked : "";
    if (now == wanted)
      return "BLAS: OpenBLAS chose its " + std::string(replaced) + " kernels, below this CPU's " +
             instructions_of(level_of_cpu()) + "; running with OPENBLAS_CORETYPE=" + wanted +
             " instead (set OPENBLAS_CORETYPE yourself to choose, LATHER_BLAS_KERNELS=keep to keep OpenBLAS's)";
    return "warning: BLAS: OpenBLAS chose its " + std::string(replaced) + " kernels, below this CPU's " +
           instructions_of(level_of_cpu()) + ", and did not take OPENBLAS_CORETYPE=" + wanted + " (it runs " + now +
           "): products run at a fraction of the CPU's speed; use an OpenBLAS that knows this CPU";
  }
  const std::string core = chosen_core();
  if (core.empty()) return {};  // not OpenBLAS: its dispatch is its own
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  if (user && *user) return {};  // the user's choice
  const int cpu = level_of_cpu();
  if (level_of_core(core) >= cpu) return {};
  const std::string best = best_host_blas_kernels();
  const char* keep = std::getenv("LATHER_BLAS_KERNELS");
  const std::string remedy = "OPENBLAS_CORETYPE=" + best;
  if (keep && std::string(keep) == "keep")
    return "warning: BLAS: OpenBLAS chose its " + core + " kernels, below this CPU's " + instructions_of(cpu) +
           " (LATHER_BLAS_KERNELS=keep keeps them); products run at a fraction of the CPU's speed; set " + remedy;
#if LATHER_HAVE_DLSYM && defined(__linux__)
  if (argv && argv[0]) {
    ::setenv("OPENBLAS_CORETYPE", best.c_str(), 1);
    ::setenv(restarted_from, core.c_str(), 1);
    std::fflush(nullptr);
    ::execv("/proc/self/exe", argv);
    // execv returned: the program goes on with OpenBLAS's kernels, and says so.
    ::unsetenv("OPENBLAS_CORETYPE");
    ::unsetenv(restarted_from);
  }
#endif
  return "warning: BLAS: OpenBLAS chose its " + core + " kernels, below this CPU's " + instructions_of(cpu) +
         "; products run at a fraction of the CPU's speed; set " + remedy + " before starting the program";
}

}  // namespace lather
