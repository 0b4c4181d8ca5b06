#include <lather/comm/communicator.hpp>
#include <lather/comm/work_group.hpp>
#include <lather/core/error.hpp>

#include <algorithm>
#include <climits>
#include <numeric>

namespace lather::comm {

namespace {

class MpiWorkGroup final : public optim::WorkGroup {
 public:
  explicit MpiWorkGroup(MPI_Comm group) : m_comm(Communicator::duplicate(group)) {
    MPI_Comm_size(m_comm.get(), &m_size);
    MPI_Comm_rank(m_comm.get(), &m_rank);
  }
  int size() const override { return m_size; }
  int rank() const override { return m_rank; }

  void allgatherv(const void* send, std::size_t bytes, void* received, const std::vector<std::size_t>& counts) override {
    LATHER_REQUIRE(int(counts.size()) == m_size && counts[m_rank] == bytes,
                   "WorkGroup::allgatherv: counts do not match the group or this rank's contribution");
    std::vector<std::size_t> offsets(m_size, 0);
    for (int r = 1; r < m_size; ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
    // MPI counts and displacements are int: exchange in rounds that keep their sum below INT_MAX.
    const std::size_t round = std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(1) << 30, INT_MAX / m_size));
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    std::vector<int> piece(m_size), displacement(m_size);
    for (std::size_t done = 0; done < largest || done == 0; done += round) {
      std::size_t total = 0;
      for (int r = 0; r < m_size; ++r) {
        const std::size_t left = counts[r] > done ? counts[r] - done : 0;
        piece[r] = int(std::min(left, round));
        total += std::size_t(piece[r]);
      }
      std::vector<char> staging(total);
      std::size_t at = 0;
      for (int r = 0; r < m_size; ++r) {
        displacement[r] = int(at);
        at += std::size_t(piece[r]);
      }
      MPI_Allgatherv(static_cast<const char*>(send) + std::min(done, bytes), piece[m_rank], MPI_BYTE, staging.data(),
                     piece.data(), displacement.data(), MPI_BYTE, m_comm.get());
      for (int r = 0; r < m_size; ++r)
        std::copy_n(staging.data() + displacement[r], piece[r], static_cast<char*>(received) + offsets[r] + done);
      if (largest == 0) break;
    }
  }

  void max_in_place(std::vector<std::int64_t>& values) override {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_INT64_T, MPI_MAX, m_comm.get());
  }

  void sum_in_place(std::vector<double>& values) override {
    MPI_Allreduce(MPI_IN_PLACE, values.data(), int(values.size()), MPI_DOUBLE, MPI_SUM, m_comm.get());
  }

 private:
  Communicator m_comm;
  int m_size = 1, m_rank = 0;
};

}  // namespace

std::shared_ptr<optim::WorkGroup> make_work_group(MPI_Comm group) { return std::make_shared<MpiWorkGroup>(group); }

}  // namespace lather::comm
