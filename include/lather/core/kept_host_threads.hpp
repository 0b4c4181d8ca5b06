#pragma once
// Host threads kept for the process between the calls that share work out among threads on a
// serial host backend (for_each_on_host_threads): starting and joining threads costs tens of
// microseconds a call, several times a Shampoo step, where waking kept ones costs a few
// microseconds. Kept threads wait on a condition variable, so they take no CPU between calls.

#include <functional>

namespace lather::Impl {

/// Runs work(thread) for thread in [1, threads) on kept threads and work(0) on this thread, and
/// returns true once every call has returned. Where the system starts fewer threads than asked,
/// fewer calls are made (every caller shares its items out through a queue, so those run take
/// every item). Returns false, having run nothing, where the kept threads are at work for another
/// caller (a second thread sharing work out at the same time, or a call from inside `work`) or
/// where none can be started: the caller then starts threads of its own. An exception from
/// work(0) is rethrown once the kept threads are done; the others' must be caught inside `work`.
bool run_on_kept_host_threads(int threads, const std::function<void(int)>& work);

}  // namespace lather::Impl
