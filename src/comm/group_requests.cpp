// The collectives of a Group that start and return a Request (lather/comm/request.hpp), for a
// caller that computes while they move.
#include "group_state.hpp"

#include <cstring>
#include <tuple>

namespace lather::comm {

template <class T>
Request Group::start_send(const T* values, std::size_t count, int destination, int tag) const {
  const auto& st = state();
  LATHER_REQUIRE(!st.local && destination >= 0 && destination < st.size && destination != st.rank,
                 "Group::start_send: rank ", destination, " is not another rank of the group of ", st.size);
  LATHER_REQUIRE(count <= max_count, "Group::start_send: ", count, " elements; at most ", max_count, " at once");
  Request request;
#if LATHER_ENABLE_MPI
  Impl::check_mpi(MPI_Isend(values, int(count), datatype<T>(), destination, tag, st.comm, &request.m_request),
                  "MPI_Isend");
#else
  (void)values, (void)tag;
#endif
  return request;
}

template <class T>
Request Group::start_receive(T* values, std::size_t count, int source, int tag) const {
  const auto& st = state();
  LATHER_REQUIRE(!st.local && source >= 0 && source < st.size && source != st.rank, "Group::start_receive: rank ",
                 source, " is not another rank of the group of ", st.size);
  LATHER_REQUIRE(count <= max_count, "Group::start_receive: ", count, " elements; at most ", max_count, " at once");
  Request request;
  request.m_receive = true;
  request.m_call = "MPI_Irecv";
#if LATHER_ENABLE_MPI
  Impl::check_mpi(MPI_Irecv(values, int(count), datatype<T>(), source, tag, st.comm, &request.m_request), "MPI_Irecv");
#else
  (void)values, (void)tag;
#endif
  return request;
}

Request Group::start_barrier() const {
  const auto& st = state();
  Request request;
  request.m_call = "MPI_Ibarrier";
#if LATHER_ENABLE_MPI
  if (!st.local) Impl::check_mpi(MPI_Ibarrier(st.comm, &request.m_request), "MPI_Ibarrier");
#else
  (void)st;
#endif
  return request;
}

template <class T>
Request Group::start_allreduce(T* values, std::size_t count, Combine op) const {
  const auto& st = state();
  LATHER_REQUIRE(count <= max_count, "Group::start_allreduce: ", count, " elements; at most ", max_count, " at once");
  Request request;
  request.m_call = "MPI_Iallreduce";
#if LATHER_ENABLE_MPI
  if (!st.local)
    Impl::check_mpi(
        MPI_Iallreduce(MPI_IN_PLACE, values, int(count), datatype<T>(), operation(op), st.comm, &request.m_request),
        "MPI_Iallreduce");
#else
  (void)st, (void)values, (void)op;
#endif
  return request;
}

template <class T>
Request Group::start_alltoall(const T* send, std::size_t per_rank, T* receive) const {
  const auto& st = state();
  LATHER_REQUIRE(per_rank <= max_count, "Group::start_alltoall: ", per_rank, " elements per rank; at most ", max_count,
                 " at once");
  Request request;
  request.m_call = "MPI_Ialltoall";
  if (st.local) {
    if (per_rank > 0 && send != receive) std::memmove(receive, send, per_rank * sizeof(T));
    return request;
  }
#if LATHER_ENABLE_MPI
  const int n = int(per_rank);
  Impl::check_mpi(MPI_Ialltoall(send, n, datatype<T>(), receive, n, datatype<T>(), st.comm, &request.m_request),
                  "MPI_Ialltoall");
#endif
  return request;
}

template <class T>
Request Group::start_allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts) const {
  std::vector<std::size_t> displacements(counts.size(), 0);
  for (std::size_t r = 1; r < counts.size(); ++r) displacements[r] = displacements[r - 1] + counts[r - 1];
  return start_allgatherv(send, receive, counts, displacements);
}

template <class T>
Request Group::start_allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts,
                                const std::vector<std::size_t>& displacements) const {
  const auto& st = state();
  LATHER_REQUIRE(int(counts.size()) == st.size && displacements.size() == counts.size(),
                 "Group::start_allgatherv: ", counts.size(), " counts and ", displacements.size(),
                 " displacements for a group of ", st.size);
  Request request;
  request.m_call = "MPI_Iallgatherv";
  if (st.local) {
    if (counts[0] > 0 && send != receive + displacements[0])
      std::memmove(receive + displacements[0], send, counts[0] * sizeof(T));
    return request;
  }
#if LATHER_ENABLE_MPI
  // MPI reads the counts and displacements until the transfer completes: the Request keeps them.
  request.m_arguments.reserve(2 * counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r) {
    LATHER_REQUIRE(counts[r] <= std::size_t(INT_MAX) && counts[r] + displacements[r] <= std::size_t(INT_MAX),
                   "Group::start_allgatherv: ", counts[r], " elements at offset ", displacements[r],
                   " exceed what MPI's int counts describe");
    request.m_arguments.push_back(int(counts[r]));
  }
  for (std::size_t r = 0; r < counts.size(); ++r) request.m_arguments.push_back(int(displacements[r]));
  const int* counts_kept = request.m_arguments.data();
  const int* displacements_kept = counts_kept + st.size;
  const void* from = send == receive + displacements[std::size_t(st.rank)] ? MPI_IN_PLACE : send;
  Impl::check_mpi(MPI_Iallgatherv(from, counts_kept[st.rank], datatype<T>(), receive, counts_kept, displacements_kept,
                                  datatype<T>(), st.comm, &request.m_request),
                  "MPI_Iallgatherv");
#endif
  return request;
}

#define LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(T)                                                   \
  template Request Group::start_send<T>(const T*, std::size_t, int, int) const;                     \
  template Request Group::start_receive<T>(T*, std::size_t, int, int) const;                        \
  template Request Group::start_allreduce<T>(T*, std::size_t, Combine) const;                       \
  template Request Group::start_alltoall<T>(const T*, std::size_t, T*) const;                       \
  template Request Group::start_allgatherv<T>(const T*, T*, const std::vector<std::size_t>&) const; \
  template Request Group::start_allgatherv<T>(const T*, T*, const std::vector<std::size_t>&,        \
                                              const std::vector<std::size_t>&) const;

LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(char)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(std::int8_t)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(int)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(std::int64_t)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(std::uint16_t)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(std::uint32_t)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(std::uint64_t)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(float)
LATHER_COMM_GROUP_REQUESTS_INSTANTIATE(double)

}  // namespace lather::comm
