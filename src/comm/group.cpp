#include "group_state.hpp"

#include "affinity.hpp"

#if LATHER_ENABLE_MPI
#include "waiting.hpp"
#endif

#include <algorithm>
#include <climits>
#include <cstring>
#include <tuple>
#include <utility>

namespace lather::comm {

namespace {

#if LATHER_ENABLE_MPI
/// A contiguous MPI datatype of `bytes` bytes, freed at scope exit.
class UnitType {
 public:
  explicit UnitType(std::size_t bytes) {
    LATHER_REQUIRE(bytes >= 1 && bytes <= std::size_t(INT_MAX), "Group: a unit of ", bytes,
                   " bytes cannot be described to MPI");
    Impl::check_mpi(MPI_Type_contiguous(int(bytes), MPI_BYTE, &m_type), "MPI_Type_contiguous");
    Impl::check_mpi(MPI_Type_commit(&m_type), "MPI_Type_commit");
  }
  ~UnitType() {
    if (m_type != MPI_DATATYPE_NULL) MPI_Type_free(&m_type);
  }
  UnitType(const UnitType&) = delete;
  UnitType& operator=(const UnitType&) = delete;
  MPI_Datatype get() const { return m_type; }

 private:
  MPI_Datatype m_type = MPI_DATATYPE_NULL;
};

/// MPI_Sendrecv with one partner, waiting as waiting.hpp says.
int sendrecv(const void* out, int out_count, MPI_Datatype out_type, void* in, int in_count, MPI_Datatype in_type,
             int partner, int tag, MPI_Comm comm) {
  if (!Impl::yield_while_waiting())
    return MPI_Sendrecv(out, out_count, out_type, partner, tag, in, in_count, in_type, partner, tag, comm,
                        MPI_STATUS_IGNORE);
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int status = MPI_Irecv(in, in_count, in_type, partner, tag, comm, &requests[0]);
  if (status == MPI_SUCCESS) status = MPI_Isend(out, out_count, out_type, partner, tag, comm, &requests[1]);
  if (status == MPI_SUCCESS) Impl::wait_yielding(requests, 2, "MPI_Sendrecv");
  return status;
}
#endif

}  // namespace

Group::Group() : m_state(std::make_shared<State>()) {}

Group::Group(std::shared_ptr<State> state) : m_state(std::move(state)) {}

#if LATHER_ENABLE_MPI
Group::Group(MPI_Comm comm) : m_state(std::make_shared<State>()) {
  LATHER_REQUIRE(comm != MPI_COMM_NULL, "Group: the communicator is MPI_COMM_NULL");
  int initialized = 0;
  MPI_Initialized(&initialized);
  LATHER_REQUIRE(initialized, "Group: MPI is not initialised (call MPI_Init first)");
  auto& st = *m_state;
  Impl::check_mpi(MPI_Comm_dup(comm, &st.comm), "MPI_Comm_dup");
  Impl::check_mpi(MPI_Comm_set_errhandler(st.comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Impl::check_mpi(MPI_Comm_size(st.comm, &st.size), "MPI_Comm_size");
  Impl::check_mpi(MPI_Comm_rank(st.comm, &st.rank), "MPI_Comm_rank");
  st.local = false;
  st.occupancy = Impl::note_node_occupancy(st.comm);
}

MPI_Comm Group::native() const {
  const auto& st = state();
  return st.local ? MPI_COMM_SELF : st.comm;
}
#endif

const Group::State& Group::state() const {
  LATHER_REQUIRE(m_state, "Group: used after being moved from, or on a rank that joined no group");
  return *m_state;
}

int Group::size() const { return state().size; }
int Group::rank() const { return state().rank; }
bool Group::member() const noexcept { return bool(m_state); }

Group Group::split(int color, [[maybe_unused]] int key) const {
  const auto& st = state();
  if (st.local) return color >= 0 ? Group() : Group(std::shared_ptr<State>());
#if LATHER_ENABLE_MPI
  MPI_Comm out = MPI_COMM_NULL;
  Impl::check_mpi(MPI_Comm_split(st.comm, color >= 0 ? color : MPI_UNDEFINED, key, &out), "MPI_Comm_split");
  if (out == MPI_COMM_NULL) return Group(std::shared_ptr<State>());
  auto next = std::make_shared<State>();
  next->comm = out;
  next->local = false;
  Impl::check_mpi(MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  Impl::check_mpi(MPI_Comm_size(out, &next->size), "MPI_Comm_size");
  Impl::check_mpi(MPI_Comm_rank(out, &next->rank), "MPI_Comm_rank");
  return Group(std::move(next));
#else
  return Group();
#endif
}

std::vector<int> Group::ranks_in(const Group& other) const {
  const auto& st = state();
  const auto& ot = other.state();
  if (st.local || ot.local) return {st.local && ot.local ? 0 : (ot.local ? -1 : ot.rank)};
#if LATHER_ENABLE_MPI
  MPI_Group mine = MPI_GROUP_NULL, theirs = MPI_GROUP_NULL;
  Impl::check_mpi(MPI_Comm_group(st.comm, &mine), "MPI_Comm_group");
  const int status = MPI_Comm_group(ot.comm, &theirs);
  std::vector<int> ranks(st.size), out(st.size, MPI_UNDEFINED);
  for (int r = 0; r < st.size; ++r) ranks[r] = r;
  const int translated =
      status == MPI_SUCCESS ? MPI_Group_translate_ranks(mine, st.size, ranks.data(), theirs, out.data()) : status;
  MPI_Group_free(&mine);
  if (theirs != MPI_GROUP_NULL) MPI_Group_free(&theirs);
  Impl::check_mpi(translated, "MPI_Group_translate_ranks");
  for (auto& r : out)
    if (r == MPI_UNDEFINED) r = -1;
  return out;
#else
  return {};
#endif
}

void Group::barrier() const {
  const auto& st = state();
  if (st.local) return;
#if LATHER_ENABLE_MPI
  Impl::complete(
      "MPI_Barrier", [&] { return MPI_Barrier(st.comm); }, [&](MPI_Request* r) { return MPI_Ibarrier(st.comm, r); });
#endif
}

NodeOccupancy Group::node_occupancy() const {
#if LATHER_ENABLE_MPI
  if (const auto& st = state(); !st.local) {
    if (!st.occupancy) st.occupancy = Impl::node_occupancy(st.comm);
    return *st.occupancy;
  }
#endif
  // One process: its own CPUs are all the group's.
  NodeOccupancy out;
  out.cpus = out.own_cpus = Impl::node_cpus();
#ifdef __linux__
  cpu_set_t mine;
  out.cpus = out.own_cpus = Impl::own_cpus(mine);
#endif
  return out;
}

template <class T>
void Group::allreduce(T* values, std::size_t count, Combine op) const {
  const auto& st = state();
  if (st.local) return;
#if LATHER_ENABLE_MPI
  for (std::size_t done = 0; done < count; done += max_count) {
    const int n = int(std::min(max_count, count - done));
    Impl::complete(
        "MPI_Allreduce",
        [&] { return MPI_Allreduce(MPI_IN_PLACE, values + done, n, datatype<T>(), operation(op), st.comm); },
        [&](MPI_Request* r) {
          return MPI_Iallreduce(MPI_IN_PLACE, values + done, n, datatype<T>(), operation(op), st.comm, r);
        });
  }
#else
  (void)values, (void)count, (void)op;
#endif
}

template <class T>
void Group::allreduce(const T* send, T* receive, std::size_t count, Combine op) const {
  const auto& st = state();
  if (st.local) {
    if (count > 0 && send != receive) std::memmove(receive, send, count * sizeof(T));
    return;
  }
#if LATHER_ENABLE_MPI
  for (std::size_t done = 0; done < count; done += max_count) {
    const int n = int(std::min(max_count, count - done));
    Impl::complete(
        "MPI_Allreduce",
        [&] { return MPI_Allreduce(send + done, receive + done, n, datatype<T>(), operation(op), st.comm); },
        [&](MPI_Request* r) {
          return MPI_Iallreduce(send + done, receive + done, n, datatype<T>(), operation(op), st.comm, r);
        });
  }
#else
  (void)op;
#endif
}

template <class T>
void Group::reduce_scatter(const T* send, T* receive, const std::vector<std::size_t>& counts, Combine op) const {
  const auto& st = state();
  LATHER_REQUIRE(int(counts.size()) == st.size, "Group::reduce_scatter: ", counts.size(), " counts for a group of ",
                 st.size);
  if (st.local) {
    if (counts[0] > 0 && send != receive) std::memmove(receive, send, counts[0] * sizeof(T));
    return;
  }
#if LATHER_ENABLE_MPI
  std::size_t total = 0;
  for (auto c : counts) total += c;
  LATHER_REQUIRE(total <= std::size_t(INT_MAX), "Group::reduce_scatter: ", total,
                 " elements in all; MPI_Reduce_scatter takes at most ", INT_MAX);
  std::vector<int> count, displacement;  // not structured bindings: lambdas capture them
  std::tie(count, displacement) = int_counts(counts, "Group::reduce_scatter");
  if (send == receive && counts[0] == 0 && total > 0) {
    // In place with nothing for rank 0: MPICH's pairwise algorithm (long messages) moves each
    // rank's result from its displacement to the start of the buffer, skipping rank 0 only, so a
    // later rank at displacement 0 copies a buffer onto itself, which its datatype engine refuses
    // (an assertion that aborts the job). The sum of the whole buffer instead, each rank keeping
    // its part: twice the traffic, for layouts that leave rank 0 no rows of a tensor.
    allreduce(receive, total, op);
    if (count[st.rank] > 0 && displacement[st.rank] > 0)
      std::memmove(receive, receive + displacement[st.rank], std::size_t(count[st.rank]) * sizeof(T));
    return;
  }
  const void* from = send == receive ? MPI_IN_PLACE : send;
  Impl::complete(
      "MPI_Reduce_scatter",
      [&] { return MPI_Reduce_scatter(from, receive, count.data(), datatype<T>(), operation(op), st.comm); },
      [&](MPI_Request* r) {
        return MPI_Ireduce_scatter(from, receive, count.data(), datatype<T>(), operation(op), st.comm, r);
      });
#else
  (void)op;
#endif
}

template <class T>
void Group::broadcast(T* values, std::size_t count, int root) const {
  const auto& st = state();
  LATHER_REQUIRE(root >= 0 && root < st.size, "Group::broadcast: root ", root, " is not a rank of the group of ",
                 st.size);
  if (st.local) return;
#if LATHER_ENABLE_MPI
  for (std::size_t done = 0; done < count; done += max_count) {
    const int n = int(std::min(max_count, count - done));
    Impl::complete(
        "MPI_Bcast", [&] { return MPI_Bcast(values + done, n, datatype<T>(), root, st.comm); },
        [&](MPI_Request* r) { return MPI_Ibcast(values + done, n, datatype<T>(), root, st.comm, r); });
  }
#else
  (void)values, (void)count;
#endif
}

void Group::broadcast(std::string& text, int root) const {
  std::uint64_t length = text.size();
  broadcast(&length, 1, root);
  text.resize(std::size_t(length));
  broadcast(text.data(), text.size(), root);
}

template <class T>
void Group::allgather(const T* send, std::size_t per_rank, T* receive) const {
  const auto& st = state();
  if (st.local) {
    if (per_rank > 0 && send != receive) std::memmove(receive, send, per_rank * sizeof(T));
    return;
  }
#if LATHER_ENABLE_MPI
  LATHER_REQUIRE(per_rank <= std::size_t(INT_MAX) && per_rank * std::size_t(st.size) <= std::size_t(INT_MAX),
                 "Group::allgather: ", per_rank, " elements per rank exceed MPI's int counts");
  const int n = int(per_rank);
  Impl::complete(
      "MPI_Allgather", [&] { return MPI_Allgather(send, n, datatype<T>(), receive, n, datatype<T>(), st.comm); },
      [&](MPI_Request* r) { return MPI_Iallgather(send, n, datatype<T>(), receive, n, datatype<T>(), st.comm, r); });
#endif
}

template <class T>
void Group::allgatherv(const T* send, T* receive, const std::vector<std::size_t>& counts) const {
  const auto& st = state();
  LATHER_REQUIRE(int(counts.size()) == st.size, "Group::allgatherv: ", counts.size(), " counts for a group of ",
                 st.size);
  if (st.local) {
    if (counts[0] > 0 && send != receive) std::memmove(receive, send, counts[0] * sizeof(T));
    return;
  }
#if LATHER_ENABLE_MPI
  std::size_t total = 0, largest = 0;
  for (auto c : counts) total += c, largest = std::max(largest, c);
  if (total <= std::size_t(INT_MAX)) {
    std::vector<int> count, displacement;  // not structured bindings: lambdas capture them
    std::tie(count, displacement) = int_counts(counts, "Group::allgatherv");
    // This rank's values already in place in `receive`: MPI_IN_PLACE spares MPI a local copy.
    const bool in_place = send == receive + displacement[st.rank];
    if (st.size == 2) {
      // Two ranks: each part crosses once, straight into its place on the other rank (one
      // MPI_Sendrecv). MPICH's MPI_Allgatherv takes up to about twice as long for parts of a MB
      // (docs/reference/collectives.md). The tag is the allgather's own,
      // and both ranks make their collectives in the same order, so no other message matches.
      constexpr int allgather_tag = 0x1c00;
      const int partner = 1 - st.rank;
      if (!in_place && count[st.rank] > 0)
        std::memmove(receive + displacement[st.rank], send, std::size_t(count[st.rank]) * sizeof(T));
      Impl::check_mpi(
          sendrecv(receive + displacement[st.rank], count[st.rank], datatype<T>(), receive + displacement[partner],
                   count[partner], datatype<T>(), partner, allgather_tag, st.comm),
          "MPI_Sendrecv (allgatherv of two ranks)");
      return;
    }
    const void* from = in_place ? MPI_IN_PLACE : send;
    Impl::complete(
        "MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(from, count[st.rank], datatype<T>(), receive, count.data(), displacement.data(),
                                datatype<T>(), st.comm);
        },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(from, count[st.rank], datatype<T>(), receive, count.data(), displacement.data(),
                                 datatype<T>(), st.comm, r);
        });
    return;
  }
  // More than int counts can place: rounds of at most INT_MAX / size elements per rank, staged.
  const std::size_t round = std::max<std::size_t>(1, std::size_t(INT_MAX) / std::size_t(st.size));
  std::vector<std::size_t> offset(st.size, 0), piece(st.size);
  for (int r = 1; r < st.size; ++r) offset[r] = offset[r - 1] + counts[r - 1];
  std::vector<T> staging;
  for (std::size_t done = 0; done < largest; done += round) {
    std::size_t in_round = 0;
    for (int r = 0; r < st.size; ++r) {
      piece[r] = counts[r] > done ? std::min(round, counts[r] - done) : 0;
      in_round += piece[r];
    }
    staging.resize(in_round);
    std::vector<int> count, displacement;  // not structured bindings: lambdas capture them
    std::tie(count, displacement) = int_counts(piece, "Group::allgatherv");
    const T* from = send + std::min(done, counts[st.rank]);
    Impl::complete(
        "MPI_Allgatherv",
        [&] {
          return MPI_Allgatherv(from, count[st.rank], datatype<T>(), staging.data(), count.data(), displacement.data(),
                                datatype<T>(), st.comm);
        },
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(from, count[st.rank], datatype<T>(), staging.data(), count.data(), displacement.data(),
                                 datatype<T>(), st.comm, r);
        });
    for (int r = 0; r < st.size; ++r)
      std::copy_n(staging.data() + displacement[r], piece[r], receive + offset[r] + done);
  }
#endif
}

template <class T>
void Group::alltoall(const T* send, std::size_t per_rank, T* receive) const {
  const auto& st = state();
  if (st.local) {
    if (per_rank > 0 && send != receive) std::memmove(receive, send, per_rank * sizeof(T));
    return;
  }
#if LATHER_ENABLE_MPI
  LATHER_REQUIRE(per_rank <= std::size_t(INT_MAX), "Group::alltoall: ", per_rank,
                 " elements per rank exceed MPI's int counts");
  const int n = int(per_rank);
  Impl::complete(
      "MPI_Alltoall", [&] { return MPI_Alltoall(send, n, datatype<T>(), receive, n, datatype<T>(), st.comm); },
      [&](MPI_Request* r) { return MPI_Ialltoall(send, n, datatype<T>(), receive, n, datatype<T>(), st.comm, r); });
#endif
}

void Group::alltoallv(const void* send, const std::vector<std::size_t>& send_counts, void* receive,
                      const std::vector<std::size_t>& receive_counts, std::size_t unit_bytes) const {
  const auto& st = state();
  LATHER_REQUIRE(int(send_counts.size()) == st.size && int(receive_counts.size()) == st.size,
                 "Group::alltoallv: counts for ", send_counts.size(), " and ", receive_counts.size(),
                 " ranks in a group of ", st.size);
  if (st.local) {
    if (send_counts[0] > 0 && send != receive) std::memmove(receive, send, send_counts[0] * unit_bytes);
    return;
  }
#if LATHER_ENABLE_MPI
  const UnitType unit(unit_bytes);
  // Not structured bindings: the lambdas below capture them (C++17 forbids it; clang refuses).
  std::vector<int> out_count, out_at, in_count, in_at;
  std::tie(out_count, out_at) = int_counts(send_counts, "Group::alltoallv");
  std::tie(in_count, in_at) = int_counts(receive_counts, "Group::alltoallv");
  Impl::complete(
      "MPI_Alltoallv",
      [&] {
        return MPI_Alltoallv(send, out_count.data(), out_at.data(), unit.get(), receive, in_count.data(), in_at.data(),
                             unit.get(), st.comm);
      },
      [&](MPI_Request* r) {
        return MPI_Ialltoallv(send, out_count.data(), out_at.data(), unit.get(), receive, in_count.data(), in_at.data(),
                              unit.get(), st.comm, r);
      });
#endif
}

template <class T>
void Group::send(const T* values, std::size_t count, int destination, int tag) const {
  const auto& st = state();
  LATHER_REQUIRE(!st.local && destination >= 0 && destination < st.size && destination != st.rank, "Group::send: rank ",
                 destination, " is not another rank of the group of ", st.size);
#if LATHER_ENABLE_MPI
  for (std::size_t done = 0; done < count || done == 0; done += max_count) {
    const int n = int(std::min(max_count, count - done));
    Impl::complete(
        "MPI_Send", [&] { return MPI_Send(values + done, n, datatype<T>(), destination, tag, st.comm); },
        [&](MPI_Request* r) { return MPI_Isend(values + done, n, datatype<T>(), destination, tag, st.comm, r); });
    if (count == 0) break;
  }
#else
  (void)values, (void)count, (void)tag;
#endif
}

template <class T>
void Group::receive(T* values, std::size_t count, int source, int tag) const {
  const auto& st = state();
  LATHER_REQUIRE(!st.local && source >= 0 && source < st.size && source != st.rank, "Group::receive: rank ", source,
                 " is not another rank of the group of ", st.size);
#if LATHER_ENABLE_MPI
  for (std::size_t done = 0; done < count || done == 0; done += max_count) {
    const int n = int(std::min(max_count, count - done));
    Impl::complete(
        "MPI_Recv", [&] { return MPI_Recv(values + done, n, datatype<T>(), source, tag, st.comm, MPI_STATUS_IGNORE); },
        [&](MPI_Request* r) { return MPI_Irecv(values + done, n, datatype<T>(), source, tag, st.comm, r); });
    if (count == 0) break;
  }
#else
  (void)values, (void)count, (void)tag;
#endif
}

template <class T>
void Group::exchange(const T* out, std::size_t out_count, T* in, std::size_t in_count, int partner, int tag) const {
  const auto& st = state();
  LATHER_REQUIRE(!st.local && partner >= 0 && partner < st.size && partner != st.rank, "Group::exchange: rank ",
                 partner, " is not another rank of the group of ", st.size);
#if LATHER_ENABLE_MPI
  // Both sides split their transfers into the same number of pieces, so messages always match.
  const std::size_t pieces = std::max<std::size_t>(
      1, std::max((out_count + max_count - 1) / max_count, (in_count + max_count - 1) / max_count));
  for (std::size_t k = 0; k < pieces; ++k) {
    const std::size_t out_at = std::min(out_count, k * max_count), in_at = std::min(in_count, k * max_count);
    Impl::check_mpi(sendrecv(out + out_at, int(std::min(max_count, out_count - out_at)), datatype<T>(), in + in_at,
                             int(std::min(max_count, in_count - in_at)), datatype<T>(), partner, tag, st.comm),
                    "MPI_Sendrecv");
  }
#else
  (void)out, (void)out_count, (void)in, (void)in_count, (void)tag;
#endif
}

void Group::agree_on_failure(const std::string& context, const std::string& local_error) const {
  const auto& st = state();
  const int failing = allreduce(local_error.empty() ? st.size : st.rank, Combine::min);
  if (failing == st.size) return;
  std::string message = local_error;
  broadcast(message, failing);
  std::string where;
  if (st.size > 1)
    where = ::lather::Impl::concat(" (on group rank ", failing, " of ", st.size,
                                   failing == st.rank ? ", this rank" : "", ")");
  // A message that already names the context ("Shampoo: ...") is not prefixed with it twice.
  const std::string prefix = context.empty() ? std::string() : context + ": ";
  const bool named = !prefix.empty() && message.compare(0, prefix.size(), prefix) == 0;
  throw Error((named ? std::string() : prefix) + message + where, nullptr, 0);
}

#define LATHER_COMM_GROUP_INSTANTIATE(T)                                                                \
  template void Group::allreduce<T>(T*, std::size_t, Combine) const;                                    \
  template void Group::allreduce<T>(const T*, T*, std::size_t, Combine) const;                          \
  template void Group::broadcast<T>(T*, std::size_t, int) const;                                        \
  template void Group::allgather<T>(const T*, std::size_t, T*) const;                                   \
  template void Group::allgatherv<T>(const T*, T*, const std::vector<std::size_t>&) const;              \
  template void Group::reduce_scatter<T>(const T*, T*, const std::vector<std::size_t>&, Combine) const; \
  template void Group::alltoall<T>(const T*, std::size_t, T*) const;                                    \
  template void Group::send<T>(const T*, std::size_t, int, int) const;                                  \
  template void Group::receive<T>(T*, std::size_t, int, int) const;                                     \
  template void Group::exchange<T>(const T*, std::size_t, T*, std::size_t, int, int) const;

LATHER_COMM_GROUP_INSTANTIATE(char)
LATHER_COMM_GROUP_INSTANTIATE(std::int8_t)
LATHER_COMM_GROUP_INSTANTIATE(int)
LATHER_COMM_GROUP_INSTANTIATE(std::int64_t)
LATHER_COMM_GROUP_INSTANTIATE(std::uint16_t)
LATHER_COMM_GROUP_INSTANTIATE(std::uint32_t)
LATHER_COMM_GROUP_INSTANTIATE(std::uint64_t)
LATHER_COMM_GROUP_INSTANTIATE(float)
LATHER_COMM_GROUP_INSTANTIATE(double)

}  // namespace lather::comm
