// Loads whose ranges of 8 MiB and more come straight from the disk with O_DIRECT
// (placed_reads.hpp) when the cache does not hold them: rows each rank reads where it keeps them
// and where they travel to another rank afterwards, and an array every rank loads whole, of which
// each rank reads a share and hands it to the others while the disk reads its rows. They come
// back exact, a flip in them is still named, and a read that fails on one rank, before or after
// its share went out, is an error on every rank, never a hang. The directories are under the
// build tree, on a disk (not /tmp, which may be tmpfs).
#include "integrity_support.hpp"
#include "page_cache_support.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>
#include <lather/core/fault_injection.hpp>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

namespace {

using namespace lather;
namespace fs = std::filesystem;
using test::world_rank;
using test::world_size;

/// Drops `file`'s pages from the page cache (rank 0, then every rank), as on a fresh node.
void evict_everywhere(const std::string& file) {
  if (world_rank() == 0) test::drop_from_page_cache(file);
  MPI_Barrier(MPI_COMM_WORLD);
}

float value(std::int64_t array, std::int64_t i) { return float(std::sin(double(i) * 1e-3 + double(array))); }

/// A saved checkpoint of a statistics stack (64 KiB rows, block size 128; 150 rows, 9.4 MiB, per
/// rank) and `shared_elements` replicated parameters that every rank loads whole.
class LargeRanges {
 public:
  static constexpr std::int64_t m = 128, row = m * m, per_rank = 150;

  LargeRanges(const std::string& tag, std::int64_t shared_elements)
      : dir(test::shared_directory(tag, fs::current_path())), shared_elements(shared_elements) {
    if (dir.empty()) return;
    options.directory = dir;
    checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
    stack.path = "optimizer/global/statistics";
    stack.dtype = optim::DType::float32;
    stack.shape = {per_rank * ranks, m, m};
    stack.selection = checkpoint::ArraySlice::Selection::rows;
    m_mine.resize(std::size_t(per_rank * row));
    for (std::int64_t r = 0; r < per_rank; ++r) {
      stack.rows.push_back(me * per_rank + r);
      for (std::int64_t e = 0; e < row; ++e) m_mine[std::size_t(r * row + e)] = value(0, (me * per_rank + r) * row + e);
    }
    stack.data = m_mine.data();
    shared.path = "parameters/all";
    shared.dtype = optim::DType::float32;
    shared.shape = {shared_elements};
    shared.writer = me == 0;
    m_parameters.resize(std::size_t(shared_elements));
    for (std::int64_t i = 0; i < shared_elements; ++i) m_parameters[std::size_t(i)] = value(1, i);
    shared.data = m_parameters.data();
    file = checkpointer.save(1, {stack, shared}, {});
  }
  ~LargeRanges() {
    MPI_Barrier(MPI_COMM_WORLD);
    std::error_code ignored;
    if (me == 0 && !dir.empty()) fs::remove_all(dir, ignored);
  }
  LargeRanges(const LargeRanges&) = delete;
  LargeRanges& operator=(const LargeRanges&) = delete;

  /// Loads `path` with `loader` into fresh page-aligned buffers, from the disk: rows in place (as
  /// saved), or dealt round-robin (read by ranges, then sent to their owners). Returns the error
  /// ("" if none) and whether the bytes are the saved ones.
  std::pair<std::string, bool> load(const checkpoint::Checkpointer& loader, const std::string& path,
                                    bool round_robin) const {
    evict_everywhere(path);
    auto rows_slice = stack;
    rows_slice.rows.clear();
    for (std::int64_t r = 0; r < per_rank; ++r)
      rows_slice.rows.push_back(round_robin ? r * ranks + me : me * per_rank + r);
    checkpoint::PageAlignedVector<float> got_rows(std::size_t(per_rank * row), -1.0f);
    checkpoint::PageAlignedVector<float> got_shared(std::size_t(shared_elements), -1.0f);
    rows_slice.data = got_rows.data();
    auto shared_slice = shared;
    shared_slice.data = got_shared.data();
    std::string error;
    try {
      loader.load(path, {rows_slice, shared_slice});
    } catch (const Error& e) {
      error = e.what();
    }
    bool same = true;
    for (std::int64_t r = 0; r < per_rank && same; ++r)
      for (std::int64_t e = 0; e < row && same; ++e)
        same = got_rows[std::size_t(r * row + e)] == value(0, rows_slice.rows[std::size_t(r)] * row + e);
    for (std::int64_t i = 0; i < shared_elements && same; ++i) same = got_shared[std::size_t(i)] == value(1, i);
    return {error, same};
  }

  const int me = world_rank();
  const int ranks = world_size();
  const std::string dir;
  const std::int64_t shared_elements;
  std::string file;
  checkpoint::CheckpointOptions options;
  checkpoint::ArraySlice stack, shared;

 private:
  checkpoint::PageAlignedVector<float> m_mine, m_parameters;
};

}  // namespace

// 9 MiB + 12 bytes of replicated parameters, so that the whole array ends inside a page.
TEST(CheckpointLargeRanges, ReadFromTheDiskTheyComeBackExactAndFlipsInThemAreNamed) {
  const LargeRanges f("direct", (std::int64_t(9) << 18) + 3);
  ASSERT_FALSE(f.dir.empty());
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, f.options);
  checkpoint::CheckpointOptions through_cache = f.options;
  through_cache.direct_io = false;  // every byte through HDF5 and the page cache
  checkpoint::Checkpointer cached_loader(MPI_COMM_WORLD, through_cache);
  for (bool direct : {true, false})
    for (bool round_robin : {false, true}) {
      const auto [error, same] = f.load(direct ? checkpointer : cached_loader, f.file, round_robin);
      EXPECT_EQ(error, "") << (round_robin ? "round robin" : "in place") << " direct_io " << direct;
      EXPECT_TRUE(same) << (round_robin ? "round robin" : "in place") << " direct_io " << direct;
    }
  // A flip in the middle of the last rank's rows, and one in the last page of the parameters.
  std::vector<std::pair<haddr_t, hsize_t>> stack_chunks, shared_chunks;
  if (f.me == 0)
    stack_chunks = test::chunk_locations(f.file, f.stack.path),
    shared_chunks = test::chunk_locations(f.file, f.shared.path);
  std::int64_t flips[2] = {0, 0};
  if (f.me == 0) {
    flips[0] = std::int64_t(stack_chunks.front().first) +
               ((f.ranks - 1) * LargeRanges::per_rank + LargeRanges::per_rank / 2) * LargeRanges::row * 4 + 1234;
    flips[1] = std::int64_t(shared_chunks.back().first + shared_chunks.back().second) - 5;
  }
  MPI_Bcast(flips, 2, MPI_INT64_T, 0, MPI_COMM_WORLD);
  for (int k = 0; k < 2; ++k) {
    const std::string& path = k == 0 ? f.stack.path : f.shared.path;
    const auto damaged = test::copy_with(f.file, "direct-flip.h5",
                                         [&](std::vector<char>& bytes) { bytes[std::size_t(flips[k])] ^= char(0x10); });
    for (bool round_robin : {false, true}) {
      const auto [error, same] = f.load(checkpointer, damaged, round_robin);
      EXPECT_NE(error.find("dataset '" + path + "' fails its checksum"), std::string::npos) << path << ": " << error;
    }
  }
}

namespace {
std::atomic<int> reads{0};                 // the disk reads asked for (rank 0's clean load)
std::atomic<int> reads_before_failure{0};  // on the failing rank: reads that still succeed
}  // namespace

// A read the disk fails (EIO, injected on one rank) is an error on every rank naming that rank
// (where there are several) and the reason, wherever it falls: on the last rank from its first
// read (before its share of the replicated parameters goes to the others, who are already
// handing theirs out), or on rank 0 at its last read (a piece of its rows, read after its share
// went out). Never a checksum mismatch: the sums lack the terms of what was not read. Afterwards
// the same Checkpointer loads the file exactly. 9 MiB of parameters a rank, so that every share
// is read with O_DIRECT, where the injected failure is (HDF5's own reads have no fault point).
TEST(CheckpointLargeRanges, AReadFailingOnOneRankFailsTheLoadOnEveryRank) {
  const LargeRanges f("failed-read", std::int64_t(world_size()) * (std::int64_t(9) << 18) + 3);
  ASSERT_FALSE(f.dir.empty());
  if (!test::direct_supported(f.file)) GTEST_SKIP() << "the build tree's file system refuses O_DIRECT";
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, f.options);
  // How many reads a clean load asks of the disk on rank 0 (the same again after eviction).
  if (f.me == 0)
    lather::Impl::set_fault_hook([](const char* at) {
      if (std::string(at) == "checkpoint.read") ++reads;
    });
  EXPECT_EQ(f.load(checkpointer, f.file, false), std::make_pair(std::string(), true));
  lather::Impl::set_fault_hook(nullptr);
  int last_read = reads - 1;
  MPI_Bcast(&last_read, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_GT(last_read, 0);
  for (const auto& [failing, succeeding] : {std::pair<int, int>{f.ranks - 1, 0}, std::pair<int, int>{0, last_read}}) {
    reads_before_failure = succeeding;
    if (f.me == failing)
      lather::Impl::set_fault_hook([](const char* at) {
        if (std::string(at) == "checkpoint.read" && reads_before_failure.fetch_sub(1) <= 0)
          throw Error("injected", nullptr, 0);
      });
    const auto [error, same] = f.load(checkpointer, f.file, false);
    lather::Impl::set_fault_hook(nullptr);
    EXPECT_NE(error.find(std::strerror(EIO)), std::string::npos) << "rank " << failing << " failing: " << error;
    EXPECT_NE(error.find("checkpoint '" + f.file + "' dataset '"), std::string::npos) << error;
    const std::string where = "(on group rank " + std::to_string(failing) + " of " + std::to_string(f.ranks);
    if (f.ranks > 1) EXPECT_NE(error.find(where), std::string::npos) << error;
  }
  for (bool round_robin : {false, true})
    EXPECT_EQ(f.load(checkpointer, f.file, round_robin), std::make_pair(std::string(), true)) << round_robin;
}
