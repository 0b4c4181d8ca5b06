#include <lather/core/kept_host_threads.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <unistd.h>

namespace lather::Impl {

namespace {

class KeptThreads {
 public:
  bool run(int threads, const std::function<void(int)>& work) {
    // A forked child has none of its parent's threads: it starts its own per call.
    if (getpid() != m_pid) return false;
    bool idle = false;
    if (!m_busy.compare_exchange_strong(idle, true)) return false;
    struct Release {
      std::atomic<bool>& busy;
      ~Release() { busy.store(false); }
    } release{m_busy};
    const int helpers = threads - 1;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      try {
        while (int(m_threads.size()) < helpers) {
          const int index = int(m_threads.size()) + 1;
          // The generation as it stands before this call's: a thread started here takes its part.
          m_threads.emplace_back([this, index, seen = m_generation] { serve(index, seen); });
        }
      } catch (const std::system_error&) {
        if (m_threads.empty()) return false;
      }
      m_work = &work;
      m_helpers = std::min(helpers, int(m_threads.size()));
      m_running = m_helpers;
      ++m_generation;
    }
    m_wake.notify_all();
    std::exception_ptr failure;
    try {
      work(0);
    } catch (...) {
      failure = std::current_exception();  // rethrown once the others are done with `work`
    }
    std::unique_lock<std::mutex> lock(m_mutex);
    m_done.wait(lock, [&] { return m_running == 0; });
    m_work = nullptr;
    if (failure) std::rethrow_exception(failure);
    return true;
  }

 private:
  void serve(int index, std::uint64_t seen) {
    std::unique_lock<std::mutex> lock(m_mutex);
    for (;;) {
      m_wake.wait(lock, [&] { return m_generation != seen; });
      seen = m_generation;
      if (index > m_helpers) continue;  // kept from a call that asked for more threads
      const std::function<void(int)>* work = m_work;
      lock.unlock();
      (*work)(index);
      lock.lock();
      if (--m_running == 0) m_done.notify_one();
    }
  }

  const pid_t m_pid = getpid();
  std::atomic<bool> m_busy{false};
  std::mutex m_mutex;
  std::condition_variable m_wake, m_done;
  std::vector<std::thread> m_threads;
  const std::function<void(int)>* m_work = nullptr;
  int m_helpers = 0, m_running = 0;
  std::uint64_t m_generation = 0;
};

}  // namespace

bool run_on_kept_host_threads(int threads, const std::function<void(int)>& work) {
  if (threads <= 1) {
    work(0);
    return true;
  }
  // Never destroyed: the kept threads wait until the process ends, and nothing joins them at
  // exit while another static's destructor or a detached thread might still share work out.
  static KeptThreads* const kept = new KeptThreads;
  return kept->run(threads, work);
}

}  // namespace lather::Impl
