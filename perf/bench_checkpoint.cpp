// lather-bench checkpoint: write and read bandwidth of a checkpoint of a Shampoo-like state (a
// statistics stack distributed by rows over the ranks, plus replicated parameters), beside the raw
// bandwidth of the same disk in the same run: every rank writing (and reading back) its share with
// plain POSIX I/O to its own file, fsync'ed, as the checkpoint is.
//
// The raw baseline is the faster of two plain ways to move the bytes, each measured every repeat:
// through the page cache, and with O_DIRECT (as checkpoints write). Which is faster depends on the
// machine: on a VM whose balloon hands freed memory back to the host, allocating page-cache pages
// can make cached writes several times slower than O_DIRECT ones, and a baseline of cached writes
// alone would flatter the checkpoint.
//
// The raw files live as checkpoints do: each repeat writes new files, and the previous ones are
// deleted untimed afterwards (a checkpoint's pruning runs in the background after the save
// returns, and is waited for untimed here too). Overwriting one file in place is also reported
// (raw_rewrite_gbps): on thin-provisioned or discard-mounted disks (cloud VMs) rewriting blocks
// just freed can be several times faster than allocating new ones, which no crash-safe checkpoint
// (always a new file, renamed into place) can use.
//
// Reads are timed from the disk: before each read every file to be read is fsync'ed and its pages
// dropped from the page cache (posix_fadvise DONTNEED, which needs no privileges), as after a
// restart on a fresh node. A read that finds the bytes still cached measures memory copies (every
// rank copying the replicated parameters, the checksums' pass) rather than the disk; those warm
// reads are reported too (*_cached_*), right after the cold ones. A load reads what the cache
// does not hold with O_DIRECT, which leaves nothing cached, so before its warm read the file is
// first read through the cache, untimed (as a `lather-checkpoint verify` before a resume would).
//
// Odd repeats time the checkpoint before the raw I/O, even ones after, so that a drift of the
// disk's speed during a run does not favour either side.
#include "bench_common.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>
#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fcntl.h>
#include <filesystem>
#include <unistd.h>

namespace lather::bench {
namespace {

struct CheckpointBenchOptions {
  std::vector<double> bytes = {1024.0 * 1024 * 1024};
  std::string directory = "lather-bench-checkpoint";
  int repeats = 3;
  bool scattered = false;  ///< rows owned round-robin (worst case of the balanced assignment)
};

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

/// Seconds of the slowest rank for `work` (all ranks start together).
template <class Work>
double timed(const comm::Group& world, Work&& work) {
  world.barrier();
  const double start = now();
  work();
  return world.allreduce(now() - start, comm::Combine::max);
}

/// The raw baseline's bytes: the same kind of memory as the checkpoint's (page-aligned, as
/// O_DIRECT needs them, and offered to huge pages), so that neither side gains from its memory.
using RawBytes = checkpoint::PageAlignedVector<char>;

/// Opens `path` with O_DIRECT where the file system allows it, else -1 (then the cache is used).
int open_direct(const std::string& path, int flags) {
#ifdef O_DIRECT
  return ::open(path.c_str(), flags | O_DIRECT, 0644);
#else
  (void)path, (void)flags;
  return -1;
#endif
}

/// Writes `data` to a new file `path` and fsyncs it (`writing`), or reads the file into `data`:
/// through the page cache, or with `direct` the whole pages with O_DIRECT (as checkpoints write)
/// and the tail through the cache.
void move_raw(const std::string& path, RawBytes& data, bool direct, bool writing) {
  const int fd = ::open(path.c_str(), writing ? O_WRONLY | O_CREAT | O_TRUNC : O_RDONLY, 0644);
  LATHER_REQUIRE(fd >= 0, "cannot open '", path, "'");
  auto transfer = [&](int through, std::size_t from, std::size_t to) {
    while (from < to) {
      const ssize_t n = writing ? ::pwrite(through, data.data() + from, to - from, off_t(from))
                                : ::pread(through, data.data() + from, to - from, off_t(from));
      LATHER_REQUIRE(n > 0, writing ? "write to '" : "read of '", path, "' failed");
      from += std::size_t(n);
    }
  };
  std::size_t cached_from = 0;
  if (direct) {
    const int direct_fd = open_direct(path, writing ? O_WRONLY : O_RDONLY);
    if (direct_fd >= 0) {
      cached_from = data.size() / checkpoint::page_bytes * checkpoint::page_bytes;
      transfer(direct_fd, 0, cached_from);
      ::close(direct_fd);
    }
  }
  transfer(fd, cached_from, data.size());
  if (writing) ::fsync(fd);
  ::close(fd);
}

void write_raw(const std::string& path, RawBytes& data, bool direct) { move_raw(path, data, direct, true); }
void read_raw(const std::string& path, RawBytes& data, bool direct) { move_raw(path, data, direct, false); }

void remove_file(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

/// Reads `path` through the page cache, so that the next read finds it there.
void warm(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  LATHER_REQUIRE(fd >= 0, "cannot open '", path, "'");
  std::vector<char> piece(std::size_t(8) << 20);
  for (off_t at = 0;; at += off_t(piece.size())) {
    const ssize_t n = ::pread(fd, piece.data(), piece.size(), at);
    if (n <= 0) break;
  }
  ::close(fd);
}

/// Writes back and drops the cached pages of `path`, so the next read comes from the disk.
void evict(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  LATHER_REQUIRE(fd >= 0, "cannot open '", path, "'");
  ::fsync(fd);
  const int failed = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
  LATHER_REQUIRE(failed == 0, "posix_fadvise(DONTNEED) on '", path, "' failed");
}

void run_checkpoint(const CheckpointBenchOptions& o) {
  const comm::Group world(MPI_COMM_WORLD);
  const int rank = world.rank(), ranks = world.size();
  namespace fs = std::filesystem;
  // A scratch directory: what an interrupted run left there would be pruned against the new steps.
  if (rank == 0) {
    fs::remove_all(o.directory);
    fs::create_directories(o.directory);
  }
  world.barrier();
  // The state, its read-back and the raw baselines' buffers: a few copies of the largest state.
  const double largest = o.bytes.empty() ? 0 : *std::max_element(o.bytes.begin(), o.bytes.end());
  check_memory(std::int64_t(std::min(largest, 1e18)) * 4, "the largest --bytes state",
               "the state, its read-back and the raw baselines' buffers");
  const std::int64_t m = 128, row = m * m;  // 64 KiB float rows: statistics of block size 128
  long step = 0;                            // rising over all sizes, so pruning (keep_last 1) never removes the newest
  long raw_files = 0;
  for (double requested : o.bytes) {
    LATHER_REQUIRE(requested >= double(row * 4), "--bytes must be at least one 64 KiB row, got ", requested);
    // 1/8 of the state in replicated parameters (held by every rank, each writing a share of it,
    // as lather-train saves unsplit parameters), 7/8 in the stack.
    const std::int64_t stack_rows = std::max<std::int64_t>(1, std::int64_t(requested * 7 / 8) / (row * 4));
    const std::int64_t parameter_elements = std::max<std::int64_t>(1, std::int64_t(requested / 8) / 4);
    const double total_bytes = double(stack_rows * row + parameter_elements) * 4;

    checkpoint::ArraySlice stack;
    stack.path = "optimizer/global/statistics";
    stack.dtype = optim::DType::float32;
    stack.shape = {stack_rows, m, m};
    stack.selection = checkpoint::ArraySlice::Selection::rows;
    if (o.scattered)
      for (std::int64_t r = rank; r < stack_rows; r += ranks) stack.rows.push_back(r);
    else
      for (std::int64_t r = stack_rows * rank / ranks; r < stack_rows * (rank + 1) / ranks; ++r)
        stack.rows.push_back(r);
    checkpoint::PageAlignedVector<float> stack_data(stack.rows.size() * row);
    for (std::size_t k = 0; k < stack_data.size(); ++k) stack_data[k] = float(k % 1000) * 1e-3f;
    stack.data = stack_data.data();
    checkpoint::ArraySlice parameters;
    parameters.path = "parameters/all";
    parameters.dtype = optim::DType::float32;
    parameters.shape = {parameter_elements};
    parameters.writer = true;
    checkpoint::PageAlignedVector<float> parameter_data(parameter_elements, 0.5f);
    parameters.data = parameter_data.data();

    checkpoint::CheckpointOptions options;
    options.directory = o.directory;
    options.keep_last = 1;
    checkpoint::Checkpointer checkpointer(world, options);
    // What each rank writes, for the raw baseline: the same bytes as its checkpoint share.
    const std::int64_t parameter_share =
        parameter_elements * (rank + 1) / ranks - parameter_elements * rank / ranks;  // the checkpoint's split
    const std::size_t mine = stack_data.size() * 4 + std::size_t(parameter_share) * 4;
    RawBytes raw(mine, char(1));
    auto raw_path = [&](const char* kind, long k) {
      return (fs::path(o.directory) /
              ("raw-" + std::string(kind) + "-" + std::to_string(rank) + "-" + std::to_string(k) + ".bin"))
          .string();
    };

    double best_write = 1e300, best_read = 1e300, best_cached_read = 1e300;
    double best_raw_write[2] = {1e300, 1e300}, best_raw_read[2] = {1e300, 1e300};  // [page cache, O_DIRECT]
    double best_raw_rewrite = 1e300, best_raw_cached_read = 1e300;
    const char* kinds[2] = {"page-cache", "direct"};
    auto time_raw = [&] {
      const long raw_step = ++raw_files;
      for (int direct = 0; direct < 2; ++direct) {
        const std::string path = raw_path(kinds[direct], raw_step);
        best_raw_write[direct] =
            std::min(best_raw_write[direct], timed(world, [&] { write_raw(path, raw, direct == 1); }));
        remove_file(raw_path(kinds[direct], raw_step - 1));  // untimed, as the checkpoint's pruning
        evict(path);
        best_raw_read[direct] =
            std::min(best_raw_read[direct], timed(world, [&] { read_raw(path, raw, direct == 1); }));
      }
      const std::string path = raw_path(kinds[0], raw_step);
      best_raw_cached_read = std::min(best_raw_cached_read, timed(world, [&] { read_raw(path, raw, false); }));
      best_raw_rewrite = std::min(best_raw_rewrite, timed(world, [&] { write_raw(path, raw, false); }));
    };
    auto time_checkpoint = [&] {
      std::string file;
      best_write = std::min(best_write, timed(world, [&] {
                              file = checkpointer.save(++step, {stack, parameters}, {});
                            }));
      // The previous checkpoint is deleted on a helper thread after the save returns; in training
      // the next steps overlap it, here it is waited for (untimed) so that it does not slow the read.
      checkpointer.list();
      if (rank == 0) evict(file);
      auto read_parameters = parameters;  // every rank reads the replicated part back
      best_read = std::min(best_read, timed(world, [&] { checkpointer.load(file, {stack, read_parameters}); }));
      if (rank == 0) warm(file);
      best_cached_read = std::min(best_cached_read, timed(world, [&] {
                                    checkpointer.load(file, {stack, read_parameters});
                                  }));
    };
    for (int repeat = 0; repeat < o.repeats; ++repeat) {
      if (repeat % 2 == 0) {
        time_raw();
        time_checkpoint();
      } else {
        time_checkpoint();
        time_raw();
      }
    }
    for (const char* kind : kinds) remove_file(raw_path(kind, raw_files));
    const double raw_write = std::min(best_raw_write[0], best_raw_write[1]);
    const double raw_read = std::min(best_raw_read[0], best_raw_read[1]);
    const double gb = total_bytes / 1e9;
    if (rank == 0)
      emit({{"bench", "checkpoint"},
            {"ranks", ranks},
            {"bytes", total_bytes},
            {"layout", o.scattered ? "scattered" : "contiguous"},
            {"write_gbps", gb / best_write},
            {"read_gbps", gb / best_read},
            {"raw_write_gbps", gb / raw_write},
            {"raw_read_gbps", gb / raw_read},
            {"raw_write_page_cache_gbps", gb / best_raw_write[0]},
            {"raw_write_direct_gbps", gb / best_raw_write[1]},
            {"raw_read_page_cache_gbps", gb / best_raw_read[0]},
            {"raw_read_direct_gbps", gb / best_raw_read[1]},
            {"raw_rewrite_gbps", gb / best_raw_rewrite},
            {"ratio_write", raw_write / best_write},
            {"ratio_read", raw_read / best_read},
            {"read_cached_gbps", gb / best_cached_read},
            {"raw_read_cached_gbps", gb / best_raw_cached_read},
            {"ratio_read_cached", best_raw_cached_read / best_cached_read},
            {"write_seconds", best_write},
            {"read_seconds", best_read}});
  }
  world.barrier();
  if (rank == 0) fs::remove_all(o.directory);
}

}  // namespace

void register_checkpoint(CLI::App& app) {
  auto options = std::make_shared<CheckpointBenchOptions>();
  auto* sub = app.add_subcommand(
      "checkpoint",
      "Checkpoint write/read bandwidth (one HDF5 file, every rank's bytes written and read in parallel "
      "with per-chunk checksums, fsync + rename) against raw POSIX "
      "write/read of the same bytes on the same disk, same run. Run under mpiexec -n 1, 2, 4.");
  add_list_option(*sub, "--bytes", options->bytes, "State sizes in bytes");
  sub->add_option("--dir", options->directory, "Scratch directory on the disk to measure (removed afterwards)")
      ->capture_default_str();
  sub->add_flag("--scattered", options->scattered,
                "Statistic rows owned round-robin (worst case of the balanced root assignment) instead of in "
                "contiguous ranges");
  sub->add_option("--repeats", options->repeats, "Best of this many runs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->callback([options] { run_checkpoint(*options); });
}

}  // namespace lather::bench
