#pragma once
// The harness of test_fault_injection: a test-only hook (<lather/core/fault_injection.hpp>)
// that throws at one named point on one rank, the check that every rank then reports one
// lather::Error naming that rank and its message, and inputs every rank can make for every rank.

#include <lather/comm/tensor_parallel.hpp>
#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/tensor.hpp>

#include "comm/comm_test_utils.hpp"
#include "common/host_copies.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

// Exec, Memory, world_rank() and world_size() come from comm_test_utils.hpp (lather::test).
namespace lather::test::faults {

using Matrix = comm::Matrix<double, Memory>;

// ---- the hook ---------------------------------------------------------------------------------

/// Where the hook throws: a function pointer carries no state, so it reads this.
struct Injection {
  std::string point;
  int failing_rank = -1;
};
inline Injection& injection() {
  static Injection state;
  return state;
}

inline void throwing_hook(const char* point) {
  const Injection& in = injection();
  if (world_rank() == in.failing_rank && in.point == point)
    throw Error(Impl::concat("injected at ", point, " on rank ", in.failing_rank), nullptr, 0);
}

/// The hook installed for one call: removed on every path out.
class ScopedFault {
 public:
  ScopedFault(const std::string& point, int failing_rank) {
    injection() = {point, failing_rank};
    Impl::set_fault_hook(&throwing_hook);
  }
  ~ScopedFault() {
    Impl::set_fault_hook(nullptr);
    injection() = {};
  }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
};

/// How many ranks passed `flag` (raw MPI: the check must not lean on what it checks).
inline int count_over_ranks(bool flag) {
  int mine = flag ? 1 : 0, total = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

/// Runs `call` with a failure injected at `point` on `failing`, and checks that every rank threw
/// one lather::Error naming the injected message and, on more than one rank, the failing rank as
/// "on group rank k of n". Returns the number of ranks that threw (all of them when it passes; 0
/// when the point was never reached, a failure unless `may_be_absent`), the same on every rank,
/// so callers stop consistently.
/// Where the message must say the failure was: "(on group rank <rank> of <size>" of the object's
/// group (the world unless given).
struct Where {
  int rank = -1, size = 0;
};

template <class Call>
int expect_failure_everywhere(const std::string& point, int failing, Call&& call, bool may_be_absent = false,
                              Where where = {}) {
  std::string message;
  bool threw = false;
  {
    const ScopedFault fault(point, failing);
    try {
      call();
    } catch (const Error& e) {
      threw = true;
      message = e.message();
    }
  }
  const int size = world_size(), threw_count = count_over_ranks(threw);
  if (threw_count == 0) {
    if (!may_be_absent) ADD_FAILURE() << "no rank reached " << point;
    return 0;
  }
  EXPECT_EQ(threw_count, size) << "only some ranks reported the failure at " << point << "; rank " << world_rank()
                               << (threw ? " threw: " + message : " did not throw");
  if (!threw) return threw_count;
  const std::string injected = Impl::concat("injected at ", point, " on rank ", failing);
  EXPECT_NE(message.find(injected), std::string::npos) << "rank " << world_rank() << ": " << message;
  if (where.size == 0) where = {failing, size};
  if (where.size > 1) {
    const std::string named = Impl::concat("(on group rank ", where.rank, " of ", where.size);
    EXPECT_NE(message.find(named), std::string::npos) << "rank " << world_rank() << ": " << message;
  }
  return threw_count;
}

// ---- inputs -------------------------------------------------------------------------------------

/// A value in [-1, 1) fixed by (rank, id, index): every rank can make every rank's inputs.
inline double value_of(int rank, int id, std::int64_t index) {
  return std::sin(0.37 * double(index + 1) + 1.3 * id + 0.71 * rank);
}

inline TensorList<double, Memory> tensors(int rank, const std::vector<std::int64_t>& sizes, int id = 0) {
  TensorList<double, Memory> out;
  for (std::size_t t = 0; t < sizes.size(); ++t) {
    FlatTensor<double, Memory> v("tensor", std::size_t(sizes[t]));
    auto h = Kokkos::create_mirror_view(v);
    for (std::int64_t i = 0; i < sizes[t]; ++i) h(i) = value_of(rank, id + int(t), i);
    Kokkos::deep_copy(v, h);
    out.push_back(v);
  }
  return out;
}

inline Matrix matrix(int rows, int columns, int id, int column0 = 0, int row0 = 0) {
  Matrix m("matrix", rows, columns);
  auto h = Kokkos::create_mirror_view(m);
  for (int i = 0; i < rows; ++i)
    for (int j = 0; j < columns; ++j) h(i, j) = value_of(0, id, std::int64_t(i + row0) * 1000 + j + column0);
  Kokkos::deep_copy(m, h);
  return m;
}

template <class View>
std::vector<double> host(const View& view) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), view);
  return std::vector<double>(h.data(), h.data() + h.size());
}

inline std::vector<std::vector<double>> host(const TensorList<double, Memory>& list) {
  return test::host_vectors(list);
}

}  // namespace lather::test::faults
