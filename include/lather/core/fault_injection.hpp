#pragma once
// Test-only fault injection. Every step that ends in a collective calls fault_point("<name>")
// where a real failure could happen (inside the work whose outcome the ranks agree on). Without a
// hook installed -- always, outside tests -- that is one relaxed atomic load. A test installs a
// hook that throws on the rank and at the point it chooses, and checks that every rank of the
// group reports an error naming the failing rank and that nobody blocks.

#include <lather/core/error.hpp>

#include <atomic>
#include <exception>
#include <string>

namespace lather::Impl {

/// Called with the point's name; throws to inject a failure.
using FaultHook = void (*)(const char* point);

inline std::atomic<FaultHook>& fault_hook() {
  static std::atomic<FaultHook> hook{nullptr};
  return hook;
}

/// Installs `hook` (nullptr removes it). For tests only.
inline void set_fault_hook(FaultHook hook) { fault_hook().store(hook, std::memory_order_relaxed); }

/// A place where a failure is injected in tests.
inline void fault_point(const char* point) {
  if (const FaultHook hook = fault_hook().load(std::memory_order_relaxed)) hook(point);
}

/// For points where a test stands in for a failing system call (a full disk, a failed fsync): true
/// when the hook throws at `point`, so that the caller takes its own error path, with the errno a
/// real failure leaves, instead of unwinding from here.
inline bool fault_injected(const char* point) {
  const FaultHook hook = fault_hook().load(std::memory_order_relaxed);
  if (!hook) return false;
  try {
    hook(point);
  } catch (...) {
    return true;
  }
  return false;
}

/// This rank's verdict on its local work before a collective: runs `work` after the fault point
/// `point` (none when null) and returns the message of what either threw, "" when nothing did.
/// An agreement (comm::Group::agree_on_failure, or a flag in a collective the call makes anyway)
/// then makes it an error on every rank.
template <class Work>
std::string local_failure(const char* point, Work&& work) {
  try {
    if (point) fault_point(point);
    work();
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

/// A rank's preparation for a collective call (buffers, host copies), unless its arguments already
/// failed: what `work` throws becomes `error`, which the call's agreement then makes an error on
/// every rank. `point` is the call's fault-injection point (tests).
template <class Work>
void prepare_locally(const char* point, std::string& error, Work&& work) {
  if (error.empty()) error = local_failure(point, std::forward<Work>(work));
}

}  // namespace lather::Impl
