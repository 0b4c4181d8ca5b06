#include <lather/comm/request.hpp>

#if LATHER_ENABLE_MPI
#include "mpi_check.hpp"
#include "waiting.hpp"
#endif

#include <utility>

namespace lather::comm {

Request::Request(Request&& other) noexcept {
#if LATHER_ENABLE_MPI
  m_request = std::exchange(other.m_request, MPI_REQUEST_NULL);
#endif
  m_receive = other.m_receive;
  m_call = other.m_call;
  m_arguments = std::move(other.m_arguments);
}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    release();
#if LATHER_ENABLE_MPI
    m_request = std::exchange(other.m_request, MPI_REQUEST_NULL);
#endif
    m_receive = other.m_receive;
    m_call = other.m_call;
    m_arguments = std::move(other.m_arguments);
  }
  return *this;
}

Request::~Request() { release(); }

bool Request::active() const noexcept {
#if LATHER_ENABLE_MPI
  return m_request != MPI_REQUEST_NULL;
#else
  return false;
#endif
}

void Request::wait() {
#if LATHER_ENABLE_MPI
  if (m_request == MPI_REQUEST_NULL) return;
  if (Impl::yield_while_waiting())
    Impl::wait_yielding(&m_request, 1, m_call);
  else
    Impl::check_mpi(MPI_Wait(&m_request, MPI_STATUS_IGNORE), m_call);
  m_request = MPI_REQUEST_NULL;
#endif
}

bool Request::test() {
#if LATHER_ENABLE_MPI
  if (m_request == MPI_REQUEST_NULL) return true;
  int done = 0;
  Impl::check_mpi(MPI_Test(&m_request, &done, MPI_STATUS_IGNORE), m_call);
  if (done) m_request = MPI_REQUEST_NULL;
  return done != 0;
#else
  return true;
#endif
}

void Request::release() noexcept {
#if LATHER_ENABLE_MPI
  if (m_request == MPI_REQUEST_NULL) return;
  // An error path: the transfer's owner unwinds. A receive nobody will match is cancelled; a send
  // completes once its receiver takes it (the pipeline's protocol posts every receive), a
  // collective once every rank has started it (its owner's protocol starts it everywhere).
  if (m_receive) MPI_Cancel(&m_request);
  MPI_Wait(&m_request, MPI_STATUS_IGNORE);
  m_request = MPI_REQUEST_NULL;
#endif
}

}  // namespace lather::comm
