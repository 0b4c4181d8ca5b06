// Damaged checkpoints are refused with a message naming the file and dataset, on every rank, never
// a crash or a hang: bit flips in the data (per-chunk checksums), flips anywhere (refused, or the data
// comes back exactly), truncation, foreign files, absurd dimensions.
#include "checkpoint_test_support.hpp"
#include "integrity_support.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/core/fault_injection.hpp>

#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

namespace {

using namespace lather;
namespace fs = std::filesystem;
using test::chunk_locations;
using test::copy_with;
using test::shared_directory;
using test::world_rank;

struct Fixture {
  std::string dir, file;
  std::vector<checkpoint::ArraySlice> arrays;
  std::vector<std::vector<double>> data;
};

/// A checkpoint with a few arrays of known content.
Fixture make_checkpoint(const std::string& tag) {
  Fixture f;
  f.dir = shared_directory(tag);
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  options.chunk_bytes = 4096;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  const std::vector<std::pair<std::string, TensorShape>> shapes = {{"parameters/dense/kernel", {40, 30}},
                                                                   {"parameters/dense/bias", {30}},
                                                                   {"optimizer/global/statistics", {6, 8, 8}}};
  for (const auto& [path, shape] : shapes) {
    std::vector<double> values(element_count(shape));
    for (std::size_t k = 0; k < values.size(); ++k) values[k] = std::sin(double(k) + path.size());
    f.data.push_back(values);
  }
  for (std::size_t a = 0; a < shapes.size(); ++a) {
    checkpoint::ArraySlice slice;
    slice.path = shapes[a].first;
    slice.dtype = optim::DType::float64;
    slice.shape = shapes[a].second;
    slice.writer = world_rank() == 0;
    slice.data = f.data[a].data();
    f.arrays.push_back(slice);
  }
  f.file = checkpointer.save(3, f.arrays, {});
  return f;
}

/// Loads `file` with the fixture's arrays into fresh buffers; returns the error text ("" if it
/// loaded) and whether the data equal the originals. Every rank must agree on the error.
std::pair<std::string, bool> try_load(const Fixture& f, const std::string& file) {
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  std::vector<std::vector<double>> buffers;
  auto arrays = f.arrays;
  for (auto& a : arrays) {
    buffers.emplace_back(a.elements(), -1.0);
  }
  for (std::size_t k = 0; k < arrays.size(); ++k) arrays[k].data = buffers[k].data();
  std::string error;
  try {
    checkpointer.load(file, arrays);
  } catch (const Error& e) {
    error = e.what();
  }
  // Every rank saw the same outcome.
  int failed = error.empty() ? 0 : 1, all = 0, any = 0;
  MPI_Allreduce(&failed, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(all, any) << "ranks disagree on loading " << file;
  return {error, buffers == f.data};
}

TEST(CheckpointIntegrity, IntactFileLoads) {
  const auto f = make_checkpoint("intact");
  const auto [error, same] = try_load(f, f.file);
  EXPECT_EQ(error, "");
  EXPECT_TRUE(same);
}

// A flipped bit inside any dataset's data fails its chunk's checksum; the message names the
// file and the dataset.
TEST(CheckpointIntegrity, BitFlipsInDataAreDetected) {
  const auto f = make_checkpoint("flips");
  for (const auto& a : f.arrays) {
    std::vector<std::pair<haddr_t, hsize_t>> chunks;
    if (world_rank() == 0) chunks = chunk_locations(f.file, a.path);
    long count = long(chunks.size());
    MPI_Bcast(&count, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    ASSERT_GT(count, 0) << a.path;
    for (int which : {0, int(count - 1)}) {
      for (int bit : {0, 5}) {
        const auto damaged = copy_with(f.file, "flip.h5", [&](std::vector<char>& bytes) {
          const auto [address, size] = chunks[which];
          bytes[address + size / 3] ^= char(1 << bit);
        });
        const auto [error, same] = try_load(f, damaged);
        EXPECT_NE(error.find(a.path), std::string::npos) << "flip in " << a.path << " chunk " << which << ": " << error;
        EXPECT_NE(error.find("flip.h5"), std::string::npos) << error;
      }
    }
  }
}

// A flip anywhere (metadata included) is refused, or changes nothing that is read.
// The same for the layouts distributed runs write and read: statistics rows scattered over the
// ranks (read back as contiguous ranges), a column-split block per rank (every rank holds part of
// each checksum chunk) and a block all ranks hold (replicas, which split its rows for the sums).
TEST(CheckpointIntegrity, FlipsAreFoundInRowsAndBlocksOnEveryRankCount) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int me = world_rank();
  const std::string dir = shared_directory("layouts");
  checkpoint::CheckpointOptions options;
  options.directory = dir;
  options.chunk_bytes = 1024;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  const std::int64_t rows = 40, columns = 8 * ranks;
  auto value = [](std::int64_t array, std::int64_t i) { return std::cos(double(i) * 0.37 + double(array)); };
  std::vector<double> stack, columns_block, shared;
  checkpoint::ArraySlice a;
  a.path = "stack";
  a.dtype = optim::DType::float64;
  a.shape = {rows, 6, 6};
  a.selection = checkpoint::ArraySlice::Selection::rows;
  for (std::int64_t r = me; r < rows; r += ranks) {
    a.rows.push_back(r);
    for (int e = 0; e < 36; ++e) stack.push_back(value(0, r * 36 + e));
  }
  checkpoint::ArraySlice b;
  b.path = "columns";
  b.dtype = optim::DType::float64;
  b.shape = {rows, columns};
  b.selection = checkpoint::ArraySlice::Selection::block;
  b.offset = {0, 8 * me};
  b.count = {rows, 8};
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < 8; ++c) columns_block.push_back(value(1, r * columns + 8 * me + c));
  checkpoint::ArraySlice c;
  c.path = "shared";
  c.dtype = optim::DType::float64;
  c.shape = {rows, 16};
  c.selection = checkpoint::ArraySlice::Selection::block;
  c.offset = {0, 0};
  c.count = {rows, 16};
  for (std::int64_t i = 0; i < rows * 16; ++i) shared.push_back(value(2, i));
  a.data = stack.data(), b.data = columns_block.data(), c.data = shared.data();
  const std::vector<checkpoint::ArraySlice> arrays = {a, b, c};
  const std::string file = checkpointer.save(1, arrays, {});
  EXPECT_EQ(checkpointer.verify(file), "");

  // try_load: every rank loads into fresh buffers and they agree on the outcome.
  const Fixture fixture{dir, file, arrays, {stack, columns_block, shared}};
  auto load = [&](const std::string& path) { return try_load(fixture, path); };
  const auto [intact_error, intact_same] = load(file);
  EXPECT_EQ(intact_error, "");
  EXPECT_TRUE(intact_same);
  for (const auto& array : arrays) {
    std::vector<std::pair<haddr_t, hsize_t>> chunks;
    if (me == 0) chunks = chunk_locations(file, array.path);
    long count = long(chunks.size());
    MPI_Bcast(&count, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    ASSERT_GT(count, 1) << array.path;
    for (const long which : {0L, count / 2, count - 1}) {
      const auto damaged = copy_with(file, "layout-flip.h5", [&](std::vector<char>& bytes) {
        const auto [address, size] = chunks[std::size_t(which)];
        bytes[address + (size * 2) / 3] ^= char(0x20);
      });
      const auto [error, same] = load(damaged);
      EXPECT_NE(error.find("dataset '" + array.path + "' fails its checksum"), std::string::npos)
          << array.path << " chunk " << which << ": " << error;
      EXPECT_NE(checkpointer.verify(damaged).find(array.path), std::string::npos) << array.path;
    }
  }
  // Reading part of a chunk (the first 5 rows of `shared`, a chunk holding 8): that chunk is read
  // whole again by one rank and checked there.
  std::vector<std::pair<haddr_t, hsize_t>> chunks;
  if (me == 0) chunks = chunk_locations(file, "shared");
  auto part = c;
  part.count = {5, 16};
  std::vector<double> few(5 * 16);
  part.data = few.data();
  EXPECT_NO_THROW(checkpointer.load(file, {part}));
  EXPECT_TRUE(std::equal(few.begin(), few.end(), shared.begin()));
  const auto damaged = copy_with(file, "part-flip.h5", [&](std::vector<char>& bytes) {
    bytes[chunks[0].first + chunks[0].second - 3] ^= char(0x01);  // in row 7: not read, still found
  });
  try {
    checkpointer.load(damaged, {part});
    ADD_FAILURE() << "a flip in a chunk read in part was not found";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dataset 'shared' fails its checksum in rows [0, 8)"), std::string::npos)
        << e.what();
  }
}

TEST(CheckpointIntegrity, BitFlipsAnywhereNeverCorruptSilently) {
  const auto f = make_checkpoint("anywhere");
  std::uintmax_t size = world_rank() == 0 ? fs::file_size(f.file) : 0;
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  std::mt19937_64 rng(99);
  int refused = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const std::uintmax_t offset = rng() % size;
    const int bit = int(rng() % 8);
    const auto damaged =
        copy_with(f.file, "anywhere.h5", [&](std::vector<char>& bytes) { bytes[offset] ^= char(1 << bit); });
    const auto [error, same] = try_load(f, damaged);
    if (error.empty())
      EXPECT_TRUE(same) << "a flip at byte " << offset << " bit " << bit << " loaded different data silently";
    else
      ++refused;
  }
  EXPECT_GT(refused, 0);
}

TEST(CheckpointIntegrity, TruncationIsRefusedAndNeverLatest) {
  const auto f = make_checkpoint("truncated");
  std::uintmax_t size = world_rank() == 0 ? fs::file_size(f.file) : 0;
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  for (std::uintmax_t keep : {std::uintmax_t(0), std::uintmax_t(100), size / 4, size / 2, 3 * size / 4, size - 1}) {
    const auto damaged = copy_with(f.file, "cut.h5", [&](std::vector<char>& bytes) { bytes.resize(keep); });
    const auto [error, same] = try_load(f, damaged);
    EXPECT_NE(error, "") << "truncated to " << keep << " of " << size << " bytes";
    EXPECT_NE(error.find("cut.h5"), std::string::npos) << error;
  }
  // A newer checkpoint that was truncated is not offered as the latest.
  copy_with(f.file, "checkpoint-000000000009.h5", [&](std::vector<char>& bytes) { bytes.resize(size / 2); });
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  std::vector<std::string> skipped;
  EXPECT_EQ(checkpointer.latest(&skipped), f.file);
  // ... and the caller learns, on every rank, which file was passed over.
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("checkpoint-000000000009.h5: "), std::string::npos) << skipped[0];
}

// One rule for resuming: a newer checkpoint with any damage -- here a flipped byte in each
// dataset's data in turn, which only reading every chunk finds -- is skipped with the file and
// dataset named, and latest_intact() (what restore_latest loads) is the newest intact one.
TEST(CheckpointIntegrity, ResumeFallsBackPastABadChecksum) {
  const auto f = make_checkpoint("fallback");
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  EXPECT_EQ(checkpointer.verify(f.file), "");
  for (const auto& a : f.arrays) {
    std::vector<std::pair<haddr_t, hsize_t>> chunks;
    if (world_rank() == 0) chunks = chunk_locations(f.file, a.path);
    long count = long(chunks.size());
    MPI_Bcast(&count, 1, MPI_LONG, 0, MPI_COMM_WORLD);
    ASSERT_GT(count, 0) << a.path;
    const auto newer = copy_with(f.file, "checkpoint-000000000009.h5", [&](std::vector<char>& bytes) {
      const auto [address, size] = chunks[count - 1];
      bytes[address + size / 2] ^= char(0x10);
    });
    // latest() only vets the root attributes: the damage is in the data.
    EXPECT_EQ(checkpointer.latest(), newer);
    // What lather-checkpoint verify runs names the dataset for a flip at any offset of its
    // first and last chunk's data.
    if (world_rank() == 0)
      for (const int which : {0, int(count - 1)})
        for (const double at : {0.0, 0.2, 0.5, 0.8, 0.999}) {
          const auto [address, size] = chunks[std::size_t(which)];
          const hsize_t offset = address + hsize_t(at * double(size - 1));
          // Rank 0 alone (copy_with is collective).
          const std::string flipped = (fs::path(f.file).parent_path() / "verify-flip.h5").string();
          {
            std::ifstream in(f.file, std::ios::binary);
            std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
            bytes[offset] ^= 0x4;
            std::ofstream(flipped, std::ios::binary | std::ios::trunc)
                .write(bytes.data(), std::streamsize(bytes.size()));
          }
          const std::string why = checkpoint::verify_checkpoint(flipped);
          EXPECT_NE(why.find(a.path), std::string::npos) << "offset " << offset << ": '" << why << "'";
          fs::remove(flipped);
        }
    const std::string reason = checkpointer.verify(newer);
    EXPECT_NE(reason.find(a.path), std::string::npos) << reason;
    std::vector<std::string> skipped;
    EXPECT_EQ(checkpointer.latest_intact(&skipped), f.file) << a.path;
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_NE(skipped[0].find("checkpoint-000000000009.h5: "), std::string::npos) << skipped[0];
    EXPECT_NE(skipped[0].find(a.path), std::string::npos) << skipped[0];
  }
  // Nothing intact at all: no checkpoint to resume from.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove(f.file);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<std::string> skipped;
  EXPECT_EQ(checkpointer.latest_intact(&skipped), "");
  EXPECT_EQ(skipped.size(), 1u);
}

/// Saves the fixture's arrays as `step` with the fault point `point` failing on rank 0 (where
/// the fixture's bytes are written and the file is published) and returns the error every rank
/// got; then checks that the failed save left nothing in the directory and that the checkpoint
/// before it is still the latest and restores.
std::string failed_save(const Fixture& f, checkpoint::Checkpointer& checkpointer, long step, const char* point) {
  static const char* failing = nullptr;
  failing = point;
  if (world_rank() == 0)
    lather::Impl::set_fault_hook([](const char* at) {
      if (std::string(at) == failing) throw Error("injected", nullptr, 0);
    });
  std::string error;
  try {
    checkpointer.save(step, f.arrays, {});
  } catch (const Error& e) {
    error = e.message();
  }
  lather::Impl::set_fault_hook(nullptr);
  EXPECT_FALSE(error.empty()) << point << ": the save did not fail";
  EXPECT_EQ(checkpointer.latest(), f.file);
  if (world_rank() == 0)
    for (const auto& entry : fs::directory_iterator(f.dir))
      EXPECT_EQ(entry.path().string(), f.file) << "left behind by the failed save (" << point << ")";
  EXPECT_EQ(try_load(f, f.file), std::make_pair(std::string(), true));
  return error;
}

// A save whose fsync fails (EIO, injected where the publishing rank checks it) is an error on
// every rank; the file never takes its final name and is deleted, and the checkpoint before it
// stays the latest, unpruned, and restores. The next save publishes and prunes as usual.
TEST(CheckpointIntegrity, AFailedFsyncPublishesNothingAndKeepsThePreviousCheckpoint) {
  const auto f = make_checkpoint("fsync");
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  options.keep_last = 1;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  const std::string error = failed_save(f, checkpointer, 4, "checkpoint.fsync");
  EXPECT_NE(error.find("checkpoint-000000000004.h5' was not published"), std::string::npos) << error;
  EXPECT_NE(error.find(std::strerror(EIO)), std::string::npos) << error;

  const std::string next = checkpointer.save(5, f.arrays, {});
  EXPECT_EQ(checkpointer.latest(), next);
  EXPECT_EQ(checkpointer.list(), std::vector<std::string>{next});
  EXPECT_EQ(try_load(f, next), std::make_pair(std::string(), true));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(f.dir);
}

// A save whose writes fail on one rank (ENOSPC: a full disk; rank 0 writes the fixture's arrays)
// is an error on every rank naming the reason; rank 0 deletes the partial file at once, so a full
// disk gets its space back, and the checkpoint before it stays the latest.
TEST(CheckpointIntegrity, AFailedWriteLeavesNoPartialFile) {
  const auto f = make_checkpoint("full-disk");
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  const std::string error = failed_save(f, checkpointer, 4, "checkpoint.write");
  EXPECT_NE(error.find(std::strerror(ENOSPC)), std::string::npos) << error;
  EXPECT_NE(error.find("dataset '"), std::string::npos) << error;
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(f.dir);
}

TEST(CheckpointIntegrity, ForeignFilesAreRefused) {
  const auto f = make_checkpoint("foreign");
  const auto text = copy_with(f.file, "checkpoint-000000000010.h5", [](std::vector<char>& bytes) {
    const std::string s = "this is not HDF5\n";
    bytes.assign(s.begin(), s.end());
  });
  auto [error, same] = try_load(f, text);
  EXPECT_NE(error.find("cannot be opened as HDF5"), std::string::npos) << error;
  // A valid HDF5 file that is not ours.
  const std::string other = (fs::path(f.dir) / "checkpoint-000000000011.h5").string();
  if (world_rank() == 0) {
    hid_t file = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(file);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::tie(error, same) = try_load(f, other);
  EXPECT_NE(error.find("is not a Lather checkpoint"), std::string::npos) << error;
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  EXPECT_EQ(checkpointer.latest(), f.file);  // neither foreign file is taken for a checkpoint
}

// keep_last counts only checkpoints that open as Lather checkpoints (latest()'s check): a damaged
// file under a final name -- truncated, or not HDF5 at all -- newer than the oldest kept one is
// kept as evidence (resume skips it with a warning) and costs no intact checkpoint its place;
// damaged files older than the oldest kept one go with the intact ones there. Before, the newest
// keep_last files went by name alone, so each damaged one pushed out an intact checkpoint.
TEST(CheckpointIntegrity, KeepLastCountsOnlyCheckpointsThatOpen) {
  const auto f = make_checkpoint("keep-damaged");  // step 3, intact
  std::uintmax_t size = world_rank() == 0 ? fs::file_size(f.file) : 0;
  MPI_Bcast(&size, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  const auto not_hdf5 = [](std::vector<char>& bytes) {
    const std::string s = "this is not HDF5\n";
    bytes.assign(s.begin(), s.end());
  };
  const std::string older = copy_with(f.file, "checkpoint-000000000001.h5", not_hdf5);
  const std::string truncated =
      copy_with(f.file, "checkpoint-000000000004.h5", [&](std::vector<char>& bytes) { bytes.resize(size / 2); });
  const std::string foreign = copy_with(f.file, "checkpoint-000000000005.h5", not_hdf5);
  checkpoint::CheckpointOptions options;
  options.directory = f.dir;
  options.keep_last = 2;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);
  const std::string sixth = checkpointer.save(6, f.arrays, {});
  // Kept: steps 6 and 3, the two newest that open, and the damaged 4 and 5 between them.
  EXPECT_EQ(checkpointer.list(), (std::vector<std::string>{f.file, sixth}));
  if (world_rank() == 0) {
    EXPECT_FALSE(fs::exists(older)) << "a damaged file older than the oldest kept checkpoint was kept";
    EXPECT_TRUE(fs::exists(truncated)) << "a damaged file newer than the oldest kept checkpoint was deleted";
    EXPECT_TRUE(fs::exists(foreign)) << "a damaged file newer than the oldest kept checkpoint was deleted";
  }
  EXPECT_EQ(try_load(f, f.file), std::make_pair(std::string(), true));
  // The next save keeps 6 and 7; everything older goes, the damaged files included.
  const std::string seventh = checkpointer.save(7, f.arrays, {});
  EXPECT_EQ(checkpointer.list(), (std::vector<std::string>{sixth, seventh}));
  if (world_rank() == 0) {
    std::vector<std::string> left;
    for (const auto& entry : fs::directory_iterator(f.dir)) left.push_back(entry.path().string());
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, (std::vector<std::string>{sixth, seventh}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) fs::remove_all(f.dir);
}

// A file that declares a dataset of 2^40 x 2^40 elements is refused from its metadata alone.
TEST(CheckpointIntegrity, AbsurdDimensionsAreRefusedBeforeAllocation) {
  const auto f = make_checkpoint("absurd");
  const std::string absurd = (fs::path(f.dir) / "absurd.h5").string();
  if (world_rank() == 0) {
    hid_t file = H5Fcreate(absurd.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const auto attribute_string = [&](const char* name, const char* value) {
      hid_t type = H5Tcopy(H5T_C_S1);
      H5Tset_size(type, std::strlen(value));
      hid_t space = H5Screate(H5S_SCALAR);
      hid_t a = H5Acreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, type, value);
      H5Aclose(a), H5Sclose(space), H5Tclose(type);
    };
    const auto attribute_int = [&](const char* name, long long value) {
      hid_t space = H5Screate(H5S_SCALAR);
      hid_t a = H5Acreate2(file, name, H5T_NATIVE_LLONG, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_LLONG, &value);
      H5Aclose(a), H5Sclose(space);
    };
    attribute_string("format", "lather-checkpoint");
    attribute_int("format_version", 1);
    attribute_int("complete", 1);
    const hsize_t dims[2] = {hsize_t(1) << 40, hsize_t(1) << 40}, chunk[2] = {64, 64};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_chunk(dcpl, 2, chunk);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t d = H5Dcreate2(file, "parameters/dense/kernel", H5T_NATIVE_DOUBLE, space, lcpl, dcpl, H5P_DEFAULT);
    H5Dclose(d), H5Pclose(lcpl), H5Pclose(dcpl), H5Sclose(space), H5Fclose(file);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const auto [error, same] = try_load(f, absurd);
  EXPECT_NE(error.find("has shape [1099511627776, 1099511627776], expected [40, 30]"), std::string::npos) << error;
}

}  // namespace
