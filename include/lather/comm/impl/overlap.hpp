#pragma once
// The overlapped reduction of GradientReducer (start, ready, progress, finish): each bucket's
// reduction written as a list of steps, the same steps the blocking reduction makes (the same
// pieces, chunks and kernels, so the same bits), in which every MPI call is a nonblocking one.
// The steps of all started buckets run in one queue, in order, as far as MPI's progress allows
// without waiting: a step that starts transfers lets the queue go on only once they complete.
// One queue means one transfer in flight at a time, so the reducer's single set of buffers
// (fusion, partner, the 16-bit wire, the window slot a copied bucket uses) serves every bucket.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_IS_COMM)
#error "lather/comm/impl/ headers are comm's own; other areas and programs use its public headers"
#endif

#include <lather/comm/request.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lather::comm::Impl {

/// Local work (kernels, copies) or the start of nonblocking transfers.
struct Step {
  std::function<void()> local;
  std::function<std::vector<Request>()> start;
};

/// Steps run in order. A local step that throws is recorded (the first message is kept) and the
/// steps go on: a rank that failed still makes every transfer, so no other rank waits forever,
/// and the caller's agreement after the queue makes the failure an error on every rank. An MPI
/// error starting or completing a transfer is thrown where MPI reports it.
class StepQueue {
 public:
  void push(Step step) { m_steps.push_back(std::move(step)); }

  /// Runs steps until one's transfers are still in flight (tested once) or none is left; returns
  /// true when the queue is empty and nothing is in flight.
  bool advance() {
    for (;;) {
      if (!in_flight_done(false)) return false;
      if (m_steps.empty()) return true;
      Step step = std::move(m_steps.front());
      m_steps.pop_front();
      if (step.local) {
        const std::string error = ::lather::Impl::local_failure(nullptr, step.local);
        if (m_error.empty()) m_error = error;
      } else {
        m_in_flight = step.start();
      }
    }
  }

  /// Runs every step, waiting for the transfers.
  void drain() {
    while (!advance()) in_flight_done(true);
  }

  /// The first local step's failure on this rank ("" when none).
  const std::string& error() const { return m_error; }
  void record(const std::string& error) {
    if (m_error.empty()) m_error = error;
  }
  void clear() {
    m_steps.clear();
    m_in_flight.clear();
    m_error.clear();
  }

 private:
  /// Whether the transfers in flight are complete: tested once, or waited for when `wait`.
  bool in_flight_done(bool wait) {
    for (auto& request : m_in_flight) {
      if (wait)
        request.wait();
      else if (!request.test())
        return false;
    }
    m_in_flight.clear();
    return true;
  }

  std::deque<Step> m_steps;
  std::vector<Request> m_in_flight;
  std::string m_error;
};

/// What an overlapped reduction tracks between start() and finish().
struct OverlapState {
  bool active = false;
  int operation = 0;                       ///< the ReduceOp
  double factor = 1.0;                     ///< of the sums: 1, 1 / n or 1 / (global weight)
  double result = 1.0;                     ///< what finish() returns: the global weight or the group size
  bool deferred = false;                   ///< Adasum: every bucket waits for finish()
  bool windowed = false;                   ///< sums go through the node-shared window
  std::vector<char> ready;                 ///< per tensor
  std::vector<std::int64_t> missing;       ///< per bucket: tensors not yet ready
  std::vector<std::size_t> bucket_of;      ///< per tensor
  std::vector<std::int64_t> bucket_first;  ///< per bucket: its first element in the list
  int next = -1;                           ///< the next bucket to start (they start last first)
  StepQueue queue;
};

}  // namespace lather::comm::Impl
