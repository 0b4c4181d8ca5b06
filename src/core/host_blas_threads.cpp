#include <lather/core/host_blas_threads.hpp>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#define LATHER_HAVE_DLSYM 1
#else
#define LATHER_HAVE_DLSYM 0
#endif

namespace lather {

namespace {

/// One BLAS's pair of calls, each taking and giving the count as that BLAS types it (BLIS's
/// dim_t is 64 bits); null where no such BLAS is loaded.
struct ThreadCalls {
  int (*get)(void* get_call) = nullptr;
  void (*set)(void* set_call, int threads) = nullptr;
  void* get_call = nullptr;
  void* set_call = nullptr;
};

template <class Count>
ThreadCalls calls_of(void* get_call, void* set_call) noexcept {
  ThreadCalls c;
  c.get = [](void* call) { return int(reinterpret_cast<Count (*)()>(call)()); };
  c.set = [](void* call, int threads) { reinterpret_cast<void (*)(Count)>(call)(Count(threads)); };
  c.get_call = get_call;
  c.set_call = set_call;
  return c;
}

/// The calls of the first threaded BLAS loaded into the process. Looked up by name rather than
/// linked: the BLAS is whichever the system's libblas.so.3 points at, and a program built against
/// one still runs with another.
ThreadCalls find_calls() noexcept {
#if LATHER_HAVE_DLSYM
  auto both = [](const char* get, const char* set, auto count) {
    void* g = ::dlsym(RTLD_DEFAULT, get);
    void* s = ::dlsym(RTLD_DEFAULT, set);
    return g && s ? calls_of<decltype(count)>(g, s) : ThreadCalls{};
  };
  for (const ThreadCalls& c : {both("openblas_get_num_threads", "openblas_set_num_threads", int()),
                               both("bli_thread_get_num_threads", "bli_thread_set_num_threads", std::int64_t()),
                               both("MKL_Get_Max_Threads", "MKL_Set_Num_Threads", int())})
    if (c.get) return c;
#endif
  return {};
}

const ThreadCalls& calls() noexcept {
  static const ThreadCalls found = find_calls();
  return found;
}

}  // namespace

int host_blas_threads() noexcept {
  const auto& c = calls();
  return c.get ? c.get(c.get_call) : 0;
}

bool set_host_blas_threads(int threads) noexcept {
  const auto& c = calls();
  if (!c.set || threads < 1) return false;
  c.set(c.set_call, threads);
  return true;
}

bool host_blas_threads_from_environment() noexcept {
  for (const char* name :
       {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "BLIS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"}) {
    const char* value = std::getenv(name);
    if (value && *value) return true;
  }
  return false;
}

ScopedHostBlasThreads::ScopedHostBlasThreads(int threads) noexcept {
  const int found = host_blas_threads();
  if (found > 0 && found != threads && set_host_blas_threads(threads)) m_restore = found;
}

ScopedHostBlasThreads::~ScopedHostBlasThreads() {
  if (m_restore > 0) set_host_blas_threads(m_restore);
}

}  // namespace lather
