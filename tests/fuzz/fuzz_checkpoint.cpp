// libFuzzer harness: the bytes are a checkpoint file given to everything that reads one on a
// single process: verify_checkpoint (every chunk against its checksums), describe_checkpoint, and
// Checkpointer::load of the arrays the seed checkpoints hold (MPI-IO on one rank; MPI is
// initialised once as a singleton). A lather::Error is the expected rejection; anything else (a
// sanitizer report, an escaping exception, an allocation past -rss_limit_mb) is a bug. The seeds
// (tests/fuzz/seeds/fuzz_checkpoint) are written by `fuzz_checkpoint --write-seeds DIR`.
#include "fuzz_support.hpp"

#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/group.hpp>
#include <lather/core/error.hpp>

#include <hdf5.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <vector>

namespace {

using namespace lather;

/// The arrays of the seed checkpoints: a whole matrix, a statistics stack read by rows, a block
/// and a scalar step, in three element types.
struct Arrays {
  std::vector<float> kernel = std::vector<float>(24 * 40);
  std::vector<double> statistics = std::vector<double>(5 * 8 * 8);
  std::vector<std::int8_t> codes = std::vector<std::int8_t>(30 * 7);
  std::vector<std::int64_t> step = std::vector<std::int64_t>(1);
  std::vector<checkpoint::ArraySlice> slices() {
    checkpoint::ArraySlice kernel_slice, statistics_slice, codes_slice, step_slice;
    kernel_slice.path = "parameters/dense/kernel";
    kernel_slice.dtype = optim::DType::float32;
    kernel_slice.shape = {24, 40};
    kernel_slice.data = kernel.data();
    statistics_slice.path = "optimizer/global/statistics";
    statistics_slice.dtype = optim::DType::float64;
    statistics_slice.shape = {5, 8, 8};
    statistics_slice.selection = checkpoint::ArraySlice::Selection::rows;
    statistics_slice.rows = {0, 1, 2, 3, 4};
    statistics_slice.data = statistics.data();
    codes_slice.path = "optimizer/global/codes";
    codes_slice.dtype = optim::DType::int8;
    codes_slice.shape = {30, 7};
    codes_slice.selection = checkpoint::ArraySlice::Selection::block;
    codes_slice.offset = {0, 0};
    codes_slice.count = {30, 7};
    codes_slice.data = codes.data();
    step_slice.path = "optimizer/step";
    step_slice.dtype = optim::DType::int64;
    step_slice.shape = {};
    step_slice.data = step.data();
    return {kernel_slice, statistics_slice, codes_slice, step_slice};
  }
};

void initialise_mpi() {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    MPI_Init(nullptr, nullptr);
    std::atexit([] { MPI_Finalize(); });
  }
}

/// Writes the seed checkpoints into `directory`: an intact one (small chunks, so every array has
/// several), and copies with a flipped data byte, cut short, without its "complete" attribute.
void write_seeds(const std::string& directory) {
  initialise_mpi();
  Arrays arrays;
  for (std::size_t k = 0; k < arrays.kernel.size(); ++k) arrays.kernel[k] = float(std::sin(double(k)));
  for (std::size_t k = 0; k < arrays.statistics.size(); ++k) arrays.statistics[k] = std::cos(double(k));
  for (std::size_t k = 0; k < arrays.codes.size(); ++k) arrays.codes[k] = std::int8_t(k * 37);
  arrays.step[0] = 42;
  checkpoint::CheckpointOptions options;
  options.directory = directory;
  options.chunk_bytes = 1024;
  options.keep_last = 1;
  checkpoint::Checkpointer checkpointer(comm::Group(MPI_COMM_WORLD), options);
  checkpoint::Attributes attributes;
  attributes.strings["optimizer"] = "shampoo";
  attributes.reals["learning_rate"] = 0.5;
  const std::string file = checkpointer.save(42, arrays.slices(), attributes);
  namespace fs = std::filesystem;
  const fs::path dir(directory);
  fs::rename(file, dir / "intact.h5");
  const std::string intact = (dir / "intact.h5").string();
  std::ifstream in(intact, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  auto write = [&](const std::string& name, const std::vector<char>& content) {
    std::ofstream(dir / name, std::ios::binary | std::ios::trunc)
        .write(content.data(), std::streamsize(content.size()));
  };
  // A flipped byte in the middle of each array's data and of one checksum dataset.
  hid_t f = H5Fopen(intact.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  for (const char* path : {"parameters/dense/kernel", "optimizer/global/statistics", "optimizer/global/codes",
                           "optimizer/step", "_checksums/parameters/dense/kernel"}) {
    hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
    auto flipped = bytes;
    flipped[H5Dget_offset(d) + H5Dget_storage_size(d) / 2] ^= 0x10;
    H5Dclose(d);
    std::string name = std::string("flip-") + path + ".h5";
    std::replace(name.begin(), name.end(), '/', '-');
    write(name, flipped);
  }
  H5Fclose(f);
  auto metadata = bytes;
  metadata[200] ^= 0x01;  // object headers, whose checksums HDF5 checks
  write("flip-metadata.h5", metadata);
  write("truncated-half.h5", std::vector<char>(bytes.begin(), bytes.begin() + std::ptrdiff_t(bytes.size() / 2)));
  write("truncated-header.h5", std::vector<char>(bytes.begin(), bytes.begin() + 600));
  write("empty.h5", {});
  const std::string text = "not a checkpoint\n";
  write("not-hdf5.h5", std::vector<char>(text.begin(), text.end()));
  // Edited copies: what HDF5 itself would accept but a Lather reader must refuse.
  auto edited = [&](const std::string& name, const std::function<void(hid_t)>& edit) {
    fs::copy_file(intact, dir / name, fs::copy_options::overwrite_existing);
    hid_t g = H5Fopen((dir / name).c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    edit(g);
    H5Fclose(g);
  };
  edited("incomplete.h5", [](hid_t g) { H5Adelete(g, "complete"); });
  edited("missing-checksums.h5", [](hid_t g) { H5Ldelete(g, "_checksums/optimizer/global/statistics", H5P_DEFAULT); });
  edited("missing-array.h5", [](hid_t g) { H5Ldelete(g, "optimizer/global/codes", H5P_DEFAULT); });
  edited("absurd-rows-per-chunk.h5", [](hid_t g) {
    hid_t d = H5Dopen2(g, "_checksums/parameters/dense/kernel", H5P_DEFAULT);
    hid_t a = H5Aopen(d, "rows_per_chunk", H5P_DEFAULT);
    const long long absurd = 1LL << 40;
    H5Awrite(a, H5T_NATIVE_LLONG, &absurd);
    H5Aclose(a), H5Dclose(d);
  });
  edited("newer-format.h5", [](hid_t g) {
    hid_t a = H5Aopen(g, "format_version", H5P_DEFAULT);
    const long long version = 99;
    H5Awrite(a, H5T_NATIVE_LLONG, &version);
    H5Aclose(a);
  });
  edited("foreign-format.h5", [](hid_t g) { H5Adelete(g, "format"); });
  edited("absurd-claim.h5", [](hid_t g) {  // 2^40 elements, never allocated: refused by its claim
    const hsize_t dims[2] = {hsize_t(1) << 20, hsize_t(1) << 20};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_LATE);
    hid_t d = H5Dcreate2(g, "parameters/huge", H5T_NATIVE_DOUBLE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    H5Dclose(d), H5Pclose(dcpl), H5Sclose(space);
  });
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  for (int a = 1; a + 1 < *argc; ++a)
    if (std::strcmp((*argv)[a], "--write-seeds") == 0) {
      write_seeds((*argv)[a + 1]);
      std::exit(0);
    }
  initialise_mpi();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const bool initialised = [] {
    initialise_mpi();  // the replay main does not call LLVMFuzzerInitialize
    return true;
  }();
  (void)initialised;
  const std::string path = lather::fuzz::scratch().write("input.h5", data, size);
  std::string damage;
  // Nothing a reader opens may stay open, whatever the file holds (a leak per input would
  // exhaust memory and descriptors in a long job that scans many files).
  const auto nothing_open = [] { return H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) == 0; };
  try {
    damage = checkpoint::verify_checkpoint(path);
  } catch (const Error&) {
  }
  LATHER_FUZZ_CHECK(nothing_open());
  try {
    const auto summary = checkpoint::describe_checkpoint(path);
    for (const auto& d : summary.datasets) LATHER_FUZZ_CHECK(d.bytes >= 0);
  } catch (const Error&) {
  }
  LATHER_FUZZ_CHECK(nothing_open());
  Arrays arrays;
  try {
    static const comm::Group self(MPI_COMM_SELF);
    checkpoint::CheckpointOptions options;
    options.directory = lather::fuzz::scratch().path().string();
    const checkpoint::Checkpointer checkpointer(self, options);
    checkpoint::Attributes attributes;
    checkpointer.load(path, arrays.slices(), &attributes);
    // What loads was read whole and matched its checksums: verify, which reads every dataset,
    // can only object to another one.
    for (const auto& slice : arrays.slices())
      LATHER_FUZZ_CHECK(damage.find("dataset '" + slice.path + "' fails") == std::string::npos);
  } catch (const Error&) {
  }
  LATHER_FUZZ_CHECK(nothing_open());
  return 0;
}
