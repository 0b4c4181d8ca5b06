#include <lather/checkpoint/checkpoint.hpp>
#include <lather/checkpoint/page_aligned.hpp>

#include "directory.hpp"
#include "attributes.hpp"
#include "file_format.hpp"
#include "hdf5_handles.hpp"
#include "placed_reads.hpp"
#include "placed_writes.hpp"
#include "row_exchange.hpp"
#include "selection.hpp"
#include "stage_arrays.hpp"
#include "stored_checksums.hpp"

#include <lather/core/error.hpp>
#include <lather/core/fault_injection.hpp>
#include <lather/core/hash.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>

namespace lather::checkpoint {

using namespace Impl;

std::int64_t ArraySlice::elements() const {
  switch (selection) {
    case Selection::whole:
      return element_count(shape);
    case Selection::rows: {
      std::int64_t row = 1;
      for (std::size_t d = 1; d < shape.size(); ++d) row *= shape[d];
      return std::int64_t(rows.size()) * row;
    }
    case Selection::block: {
      std::int64_t n = 1;
      for (auto c : count) n *= c;
      return n;
    }
  }
  return 0;
}

void CheckpointOptions::validate() const {
  LATHER_REQUIRE(!directory.empty(), "CheckpointOptions::directory is empty");
  LATHER_REQUIRE(!prefix.empty() && prefix.find('/') == std::string::npos,
                 "CheckpointOptions::prefix must be a plain file name prefix, got '", prefix, "'");
  LATHER_REQUIRE(keep_last >= 1, "CheckpointOptions::keep_last must be >= 1, got ", keep_last);
  LATHER_REQUIRE(chunk_bytes >= 1024, "CheckpointOptions::chunk_bytes must be >= 1024, got ", chunk_bytes);
}

namespace {

/// Every rank must pass the same list of arrays (paths, types, shapes): one allreduce of the
/// hash of the list and of its complement gives the smallest and the largest hash at once.
void agree_on_arrays(const comm::Group& group, const std::vector<ArraySlice>& arrays) {
  ::lather::Impl::Fnv1a hash;
  for (const auto& a : arrays) {
    hash.add(a.path).add(std::uint64_t(a.dtype)).add(a.shape.size());
    for (auto d : a.shape) hash.add(std::uint64_t(d));
  }
  std::uint64_t extremes[2] = {hash.value(), ~hash.value()};
  group.allreduce(extremes, 2, comm::Combine::min);
  if (extremes[0] != ~extremes[1])
    LATHER_FAIL("checkpoint: the ranks passed different lists of arrays (paths, types or shapes differ)");
}

/// With pipeline stages, this rank's part of the stages' common list of arrays (stage_arrays.hpp):
/// one exchange over the pipeline group, and a problem with the stages' lists fails every rank.
/// Null with one stage (no communication).
std::unique_ptr<StageArrays> merge_stages(const comm::Group& world, const comm::Group& pipeline, int stages,
                                          const std::vector<ArraySlice>& arrays, bool saving) {
  if (stages <= 1) return nullptr;
  const auto lists = exchange_stage_arrays(pipeline, arrays);
  std::unique_ptr<StageArrays> merged;
  world.run_agreed("", [&] { merged = std::make_unique<StageArrays>(lists, pipeline.rank(), arrays, saving); });
  return merged;
}

}  // namespace

Checkpointer::Checkpointer(const comm::Mesh& mesh, CheckpointOptions options)
    : m_group(mesh.world()),
      // Each stage's root writes what all of its ranks hold: the stages' arrays differ, and of
      // those they share (the step) the merge keeps the first stage's copy (stage_arrays.hpp).
      m_roles{mesh.stage_ranks().rank() == 0, mesh.replica() == 0, mesh.shard()},
      m_weight_shards(mesh.weight_shards()),
      m_options(std::move(options)),
      m_pipeline(mesh.pipeline()),
      m_pipeline_stages(mesh.pipeline_stages()) {
  m_options.validate();
}

Checkpointer::Checkpointer(const comm::Group& group, CheckpointOptions options)
    : m_group(group), m_roles{group.rank() == 0, group.rank() == 0, 0}, m_options(std::move(options)) {
  m_options.validate();
}

std::string Checkpointer::save(long step, const std::vector<ArraySlice>& own, const Attributes& attributes) {
  QuietHdf5 quiet;
  finish_pruning();
  // What can fail on one rank alone is checked and agreed before the file's collective calls:
  // inside them a rank that stopped would leave the others waiting.
  m_group.run_agreed("", [&] {
    ::lather::Impl::fault_point("checkpoint.save");
    LATHER_REQUIRE(step >= 0, "checkpoint step must be >= 0, got ", step);
    for (const auto& a : own) check_slice(a);
  });
  // With pipeline stages, the stages' lists become the one list the file holds.
  const auto stages = merge_stages(m_group, m_pipeline, m_pipeline_stages, own, true);
  const std::vector<ArraySlice>& arrays = stages ? stages->arrays() : own;
  agree_on_arrays(m_group, arrays);

  // Rank 0 prepares the directory and names the temporary file.
  std::string temporary;
  m_group.run_agreed("", [&] {
    if (m_group.rank() != 0) return;
    make_directories(m_options.directory);
    remove_temporaries(m_options.directory, m_options.prefix);
    temporary = temporary_name(m_options.directory, m_options.prefix, step);
  });
  m_group.broadcast(temporary, 0);
  std::optional<PartialFile> partial;  // every failure from here on is agreed: rank 0 deletes the file
  if (m_group.rank() == 0) partial.emplace(temporary);

  // Which part of each array every rank adds to its checksums (one allgather of the selections).
  SelectionChecksums checks(m_group, arrays, SelectionChecksums::Use::saving);

  // (1) Rank 0 lays the file out alone and every rank learns where each dataset's bytes go
  // (placed_writes.hpp).
  std::vector<std::int64_t> offsets(arrays.size(), -1);
  m_group.run_agreed("", [&] {
    for (std::size_t k = 0; k < arrays.size(); ++k)
      if (element_count(arrays[k].shape) > 0) checks.set_grid(k, grid_of(arrays[k], m_options.chunk_bytes));
    if (m_group.rank() != 0) return;
    Attributes root = attributes;
    root.integers["step"] = step;
    root.integers["writer_ranks"] = m_group.size();
    offsets = lay_out(temporary, arrays, root);
  });
  m_group.broadcast(offsets.data(), offsets.size(), 0);

  // (2) Every rank writes its bytes at their offsets. A rank whose write fails keeps its error and
  // still takes part in the exchanges of rows and checksums; the ranks agree on it after them.
  std::string error;
  {
    // Copies of an array's rows, sorted or gathered from other ranks. Declared before the writer,
    // which writes from them on its helper thread: on an exception the writer is destroyed (and
    // waits for its queue) first.
    PageAlignedVector<char> sorted, bytes;
    PlacedWriter writer(temporary, m_options.fsync, m_options.direct_io);
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      const auto& a = arrays[k];
      if (element_count(a.shape) == 0) continue;
      const std::string where = "dataset '" + a.path + "'";
      const auto dims = stored_dims(a.shape);
      const void* source = a.data;
      if (!rows_sorted(a) && a.elements() > 0) {
        sorted.resize(a.bytes());
        permute_rows(a, row_order(a), static_cast<const char*>(a.data), sorted.data(), true);
        source = sorted.data();
      }
      if (a.selection == ArraySlice::Selection::rows) {
        // Rows move to contiguous writers first (where the ranks' rows are not already the
        // contiguous ranges), then each run of rows is one write.
        ArraySlice contiguous = a;
        contiguous.writer = true;
        if (!rows_in_place(m_group, a, true)) {
          std::tie(contiguous.rows, bytes) = gather_contiguous_rows(m_group, a, static_cast<const char*>(source));
          source = bytes.data();
        } else if (!a.writer) {
          contiguous.rows.clear();
        }
        const std::size_t bytes_per_row = row_bytes(a);
        const std::int64_t row = std::int64_t(bytes_per_row / ::lather::size_of(a.dtype));
        // In pieces of about 1 MiB: each piece's checksum terms are added while the disk writes it
        // (from page-aligned memory, on the writer's helper thread), or right after its staged
        // write has read it into cache.
        const std::int64_t piece_rows = std::max<std::int64_t>(1, std::int64_t((std::size_t(1) << 20) / bytes_per_row));
        std::int64_t at = 0, counted_to = 0;
        for (const auto& [run_first, run_rows] : row_runs(contiguous)) {
          // Rows that several writers hold (replicated statistics) arrive once per writer: each
          // row's terms are added once.
          const std::int64_t skip = std::clamp<std::int64_t>(counted_to - run_first, 0, run_rows);
          for (std::int64_t p = 0; p < run_rows; p += piece_rows) {
            const std::int64_t n = std::min(piece_rows, run_rows - p), from = std::max(p, skip);
            const char* piece = static_cast<const char*>(source) + std::size_t(at + p) * bytes_per_row;
            writer.write(piece, std::size_t(n) * bytes_per_row,
                         offsets[k] + (run_first + p) * std::int64_t(bytes_per_row), where);
            if (from < p + n)
              checks.add_elements(k, (run_first + from) * row, (p + n - from) * row,
                                  piece + std::size_t(from - p) * bytes_per_row);
          }
          counted_to = std::max(counted_to, run_first + run_rows);
          at += run_rows;
        }
        if (source != a.data) writer.wait();  // before the copies change
        continue;
      }
      // A whole array or a block: this rank writes its share of the rows. Ranks holding the same
      // block (replicas of a weight shard), or the same whole array as writers, split it, so
      // every byte is written once and no rank writes all of a replicated array.
      const auto [first, rows] = checks.share(k);
      if (rows == 0) continue;
      std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
      if (a.selection == ArraySlice::Selection::block && !a.shape.empty()) {
        start.assign(a.offset.begin(), a.offset.end());
        count.assign(a.count.begin(), a.count.end());
      }
      std::size_t block_row_bytes = ::lather::size_of(a.dtype);
      for (std::size_t d = 1; d < count.size(); ++d) block_row_bytes *= std::size_t(count[d]);
      start[0] += hsize_t(first);
      count[0] = hsize_t(rows);
      writer.write_box(static_cast<const char*>(source) + std::size_t(first) * block_row_bytes, dims, start, count,
                       ::lather::size_of(a.dtype), offsets[k], where);
      checks.add_selection(k, source);
      if (source != a.data) writer.wait();
    }
    writer.flush();
    error = writer.error();
  }
  // One allreduce sums every rank's checksum terms; then the ranks agree on any failure.
  checks.finish();
  m_group.agree_on_failure("", error);

  // (3) Rank 0 stores the checksums beside the arrays, and "complete" last.
  m_group.run_agreed("", [&] {
    if (m_group.rank() != 0) return;
    File file(check(H5Fopen(temporary.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "reopening checkpoint '" + temporary + "'"));
    PropertyList lcpl(check(H5Pcreate(H5P_LINK_CREATE), "creating a link list"));
    check(H5Pset_create_intermediate_group(lcpl.get(), 1), "enabling intermediate groups");
    for (std::size_t k = 0; k < arrays.size(); ++k)
      if (checks.has_grid(k)) write_checksums(file.get(), lcpl.get(), arrays[k], checks.grid(k), checks.saved_sums(k));
    write_integer_attribute(file.get(), "complete", 1);
    check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "flushing checkpoint '" + temporary + "'");
  });

  // Closed everywhere: rank 0 makes it visible under its final name and prunes old ones.
  std::string final = final_name(m_options.directory, m_options.prefix, step);
  m_group.run_agreed("", [&] {
    if (m_group.rank() != 0) return;
    publish(temporary, final, m_options.fsync);
    partial->published();
    // keep_last counts the checkpoints that open as ours, by latest()'s check (inspect: the root
    // attributes, a few reads per file), not by a full verify, which would read every byte of the
    // kept files at every save: a damaged file (truncated, foreign) takes no intact one's place.
    // Decided here, on this thread: this HDF5 is not thread-safe, and the caller may use it while
    // the helper thread below runs.
    std::vector<std::string> doomed;
    try {
      doomed = files_to_prune(m_options.directory, m_options.prefix, m_options.keep_last, [](const std::string& file) {
        try {
          inspect(file, {});
          return true;
        } catch (const Error&) {
          return false;
        }
      });
    } catch (...) {  // pruning never fails a save: a file left over goes at the next one
    }
    // The new checkpoint is durable under its final name: the old ones go off the critical path.
    m_pruning = std::async(std::launch::async, [doomed = std::move(doomed)] { remove_files(doomed); }).share();
  });
  return final;
}

void Checkpointer::check_directory() const {
  m_group.run_agreed("", [&] {
    if (m_group.rank() != 0) return;
    make_directories(m_options.directory);
    check_writable(m_options.directory, m_options.prefix);
  });
}

void Checkpointer::finish_pruning() const {
  if (m_pruning.valid()) m_pruning.wait();
}

std::vector<std::string> Checkpointer::list(std::vector<std::string>* skipped) const {
  QuietHdf5 quiet;
  finish_pruning();
  // One line per file; a skipped file's line starts with '\x01' and carries the reason.
  std::string joined;
  if (m_group.rank() == 0) {
    for (const auto& [step, path] : list_final(m_options.directory, m_options.prefix)) {
      try {
        inspect(path, {});
        joined += path + '\n';
      } catch (const Error& e) {
        // Not complete or not ours: never offered as a checkpoint, but reported.
        std::string reason = e.message();
        std::replace(reason.begin(), reason.end(), '\n', ' ');
        joined += '\x01' + path + ": " + reason + '\n';
      }
    }
  }
  m_group.broadcast(joined, 0);
  std::vector<std::string> files;
  if (skipped) skipped->clear();
  std::size_t start = 0;
  for (std::size_t end; (end = joined.find('\n', start)) != std::string::npos; start = end + 1) {
    std::string line = joined.substr(start, end - start);
    if (!line.empty() && line[0] == '\x01') {
      if (skipped) skipped->push_back(line.substr(1));
    } else {
      files.push_back(std::move(line));
    }
  }
  return files;
}

std::string Checkpointer::latest(std::vector<std::string>* skipped) const {
  const auto files = list(skipped);
  return files.empty() ? std::string() : files.back();
}

std::string Checkpointer::verify(const std::string& file) const {
  QuietHdf5 quiet;
  std::string reason;
  if (m_group.rank() == 0) reason = verify_datasets(file);
  m_group.broadcast(reason, 0);
  return reason;
}

std::string Checkpointer::latest_intact(std::vector<std::string>* skipped) const {
  const auto files = list(skipped);
  for (auto file = files.rbegin(); file != files.rend(); ++file) {
    const std::string reason = verify(*file);
    if (reason.empty()) return *file;
    if (skipped) skipped->push_back(*file + ": " + reason);
  }
  return {};
}

Attributes Checkpointer::read_attributes(const std::string& file) const {
  Attributes attributes;
  load(file, {}, &attributes);
  return attributes;
}

void Checkpointer::load(const std::string& file, const std::vector<ArraySlice>& own, Attributes* attributes) const {
  QuietHdf5 quiet;
  m_group.run_agreed("", [&] {  // as in save(): before any collective call on the file
    ::lather::Impl::fault_point("checkpoint.load");
    for (const auto& a : own) check_slice(a);
  });
  const auto stages = merge_stages(m_group, m_pipeline, m_pipeline_stages, own, false);
  const std::vector<ArraySlice>& arrays = stages ? stages->arrays() : own;
  agree_on_arrays(m_group, arrays);
  // Rank 0 vets the file alone, so a foreign or damaged file fails before any collective open.
  Attributes root;
  m_group.run_agreed("", [&] {
    if (m_group.rank() == 0) root = inspect(file, arrays);
  });
  // Which part of each array every rank checks as it reads (one allgather of the selections).
  SelectionChecksums verification(m_group, arrays, SelectionChecksums::Use::loading);
  // The group's ranks and CPUs on this node (counted once per communicator, kept by the group).
  const comm::NodeOccupancy node = m_group.node_occupancy();
  // Checksums on a second thread only where a CPU is free for it: not on a rank bound to one CPU,
  // however many the node has.
  const bool overlap = node.spare_cpu();
  // Rows come straight from the disk into the caller's memory (placed_reads.hpp). So do the
  // arrays every rank loads whole (replicated parameters): each rank reads only the share of
  // their rows it checks, and one allgatherv per array hands every rank the others' shares, so
  // that the disk reads each byte once and no rank copies the array out of the page cache.
  // Every rank of a node reading the whole array through the cache makes cold loads measurably
  // slower (benchmarks.md).
  std::vector<char> split_whole(arrays.size(), 0);
  for (std::size_t k = 0; k < arrays.size(); ++k)
    split_whole[k] = m_group.size() > 1 && arrays[k].selection == ArraySlice::Selection::whole &&
                     verification.whole_on_every_rank(k);
  const bool whole_direct = node.ranks == 1;
  m_group.run_agreed("", [&] {
    // Every rank opens the file on its own (HDF5's default POSIX driver), not through MPI-IO: a
    // load only reads, each rank its own rows, and MPI_File_open and MPI_File_close are
    // collectives of their own (about 20 on MPICH), whose busy waits cost a hundred milliseconds or
    // more where ranks outnumber cores. Lather's own collectives below yield the CPU there.
    File f(check(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "opening checkpoint '" + file + "'"));
    std::string error;
    PropertyList dxpl(check(H5Pcreate(H5P_DATASET_XFER), "creating a transfer list"));
    // Arrays read by rows: each rank reads one contiguous range, and the rows then travel to the
    // ranks that asked for them; with the rank count and layout they were written with, the range
    // goes straight into the caller's buffer (a collective test, so decided before any read).
    struct RowRange {
      std::int64_t first = 0, last = 0;
      bool in_place = false;
      PageAlignedVector<char> bytes;  // the range, where it is not read in place (aligned for O_DIRECT)
    };
    std::vector<RowRange> ranges(arrays.size());
    // The shares of the arrays loaded whole, handed to every rank in place: one allgatherv per
    // array, collective, so every rank makes each exactly once, inside the reads below as soon as
    // its own shares are in, or after them where a failure cut them short (its bytes are then
    // never used: the load throws below).
    std::size_t gathered = 0;  // arrays [0, gathered) done or failed (each at most once)
    auto gather_whole_shares = [&] {
      while (gathered < arrays.size()) {
        const std::size_t k = gathered++;
        if (!split_whole[k]) continue;
        const auto& a = arrays[k];
        const std::int64_t rows = std::int64_t(stored_dims(a.shape)[0]);
        std::vector<std::size_t> counts(std::size_t(m_group.size()));
        for (int r = 0; r < m_group.size(); ++r)
          counts[std::size_t(r)] = std::size_t(row_share(rows, r, m_group.size()).second) * row_bytes(a);
        char* whole = static_cast<char*>(a.data);
        m_group.allgatherv(whole + std::size_t(verification.share(k).first) * row_bytes(a), whole, counts);
      }
    };
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      const auto& a = arrays[k];
      if (a.selection != ArraySlice::Selection::rows || element_count(a.shape) == 0) continue;
      auto& r = ranges[k];
      r.first = first_row(m_group.rank(), a.shape[0], m_group.size());
      r.last = first_row(m_group.rank() + 1, a.shape[0], m_group.size());
      r.in_place = rows_in_place(m_group, a, false);
      if (!r.in_place) r.bytes.resize(std::size_t(r.last - r.first) * row_bytes(a));
    }
    try {
      const Attributes stored_root = read_root_attributes(f.get());
      if (attributes) *attributes = stored_root;
      const auto version = stored_root.integers.find("format_version");
      const bool checksummed = version != stored_root.integers.end() && version->second >= 2;
      // In the order of the datasets in the file, so that each rank's reads move forward through
      // it as one stream: closer to the raw bandwidth than reading whole arrays ahead of the rows
      // where they lie after them in the file (benchmarks.md). Only the shares of the whole
      // arrays that ranks read straight from the disk go first (below), a few MiB a rank.
      // The datasets stay open for the reads; one that does not open is opened again below, so
      // that the error names it.
      std::vector<Dataset> datasets(arrays.size());
      std::vector<std::pair<haddr_t, std::size_t>> order;
      for (std::size_t k = 0; k < arrays.size(); ++k) {
        if (element_count(arrays[k].shape) == 0) continue;
        datasets[k] = Dataset(H5Dopen2(f.get(), arrays[k].path.c_str(), H5P_DEFAULT));
        order.emplace_back(datasets[k].valid() ? H5Dget_offset(datasets[k].get()) : HADDR_UNDEF, k);
      }
      std::stable_sort(order.begin(), order.end());
      auto where_of = [&](std::size_t k) { return "checkpoint '" + file + "' dataset '" + arrays[k].path + "'"; };
      // The rows this rank reads of an array read by rows or whole, and where they go.
      struct RowsToRead {
        std::int64_t first, count;
        char* into;
      };
      auto rows_to_read = [&](std::size_t k) {
        const auto& a = arrays[k];
        if (split_whole[k]) {  // a whole array read in shares
          const auto share = verification.share(k);
          return RowsToRead{share.first, share.second,
                            static_cast<char*>(a.data) + std::size_t(share.first) * row_bytes(a)};
        }
        if (a.selection == ArraySlice::Selection::whole)
          return RowsToRead{0, std::int64_t(stored_dims(a.shape)[0]), static_cast<char*>(a.data)};
        auto& r = ranges[k];
        return RowsToRead{r.first, r.last - r.first, r.in_place ? static_cast<char*>(a.data) : r.bytes.data()};
      };
      // Each piece's checksum terms, taken while its bytes are in cache.
      auto check_piece = [&](std::size_t k) {
        const auto& a = arrays[k];
        const std::int64_t row = std::int64_t(row_bytes(a) / ::lather::size_of(a.dtype));
        return [&verification, &a, k, row](std::int64_t first, std::int64_t rows, const char* bytes) {
          if (a.selection == ArraySlice::Selection::rows)
            verification.add_elements(k, first * row, rows * row, bytes);
          else
            verification.add_whole_rows(k, first, rows, bytes);
        };
      };
      // First the stored checksums (small reads, before the disk is busy with the large ones),
      // and the datasets that did not open opened again, so that the error names them.
      for (const auto& in_file : order) {
        const std::size_t k = in_file.second;
        const auto& a = arrays[k];
        if (checksummed) {
          try {
            verification.set_stored(k,
                                    read_checksums(f.get(), a.path, stored_dims(a.shape), ::lather::size_of(a.dtype)));
          } catch (const Error& e) {
            LATHER_FAIL("checkpoint '", file, "': ", e.message());
          }
        }
        if (!datasets[k].valid())
          datasets[k] = Dataset(check(H5Dopen2(f.get(), a.path.c_str(), H5P_DEFAULT), where_of(k)));
      }
      // The whole arrays read through the cache (below) asked of the disk next, so that copying
      // them out of the cache overlaps the disk's reading of the queued ranges: closer to the raw
      // bandwidth than asking for them after (benchmarks.md).
      if (!whole_direct)
        for (const auto& in_file : order) {
          const std::size_t k = in_file.second;
          if (arrays[k].selection != ArraySlice::Selection::whole || split_whole[k]) continue;
          const RowsToRead whole = rows_to_read(k);
          read_ahead(datasets[k].get(), whole.first, whole.count, row_bytes(arrays[k]));
        }
      // Then the ranges read straight from the disk queued: the disk reads them on a helper
      // thread while this thread reads the rest through HDF5 below. The shares of the arrays
      // loaded whole go first, so that handing them to the other ranks overlaps the disk's
      // reading of the rows: after the last read, the allgatherv would add several per cent to a
      // cold load.
      auto direct_order = order;  // the shares first, each part in file order
      std::stable_partition(direct_order.begin(), direct_order.end(),
                            [&](const auto& in_file) { return split_whole[in_file.second] != 0; });
      PlacedReader placed(file);  // destroyed (its thread stopped) before the buffers it fills
      std::vector<int> queued(arrays.size(), -1);
      for (const auto& in_file : direct_order) {
        if (!m_options.direct_io) break;
        const std::size_t k = in_file.second;
        const auto& a = arrays[k];
        if (a.selection != ArraySlice::Selection::rows &&
            !(a.selection == ArraySlice::Selection::whole && (whole_direct || split_whole[k])))
          continue;
        const RowsToRead rows = rows_to_read(k);
        if (rows.count > 0)
          queued[k] = placed.add(datasets[k].get(), native_type(a.dtype), rows.first, rows.count, row_bytes(a),
                                 rows.into, where_of(k));
      }
      // What is not queued, through HDF5 and the cache.
      for (const auto& in_file : order) {
        const std::size_t k = in_file.second;
        if (queued[k] >= 0) continue;
        const auto& a = arrays[k];
        const std::string where = where_of(k);
        const Dataset& dataset = datasets[k];
        if (a.selection == ArraySlice::Selection::rows || a.selection == ArraySlice::Selection::whole) {
          // In pieces, each checked while in cache.
          const RowsToRead rows = rows_to_read(k);
          if (rows.count > 0)
            read_rows_in_pieces(dataset.get(), native_type(a.dtype), dxpl.get(), stored_dims(a.shape), rows.first,
                                rows.count, row_bytes(a), rows.into, where, overlap, check_piece(k));
          continue;
        }
        Dataspace space(check(H5Dget_space(dataset.get()), where));
        select(space.get(), a);
        const hssize_t selected = H5Sget_select_npoints(space.get());
        if (selected <= 0) continue;
        LATHER_REQUIRE(hsize_t(selected) == hsize_t(a.elements()), where, ": selection of ", selected,
                       " elements for a buffer of ", a.elements());
        Dataspace memory(check(memory_space_for(a, selected), where));
        check(H5Dread(dataset.get(), native_type(a.dtype), memory.get(), space.get(), dxpl.get(), a.data),
              where + ": read failed (corrupted or truncated?)");
        verification.add_selection(k, a.data);
      }
      // Last, the queued ranges' pieces as they arrive: the whole arrays' shares, which go to the
      // other ranks once they are all in (before the first other array; a no-op after that) while
      // the disk reads the rows, then the rows.
      for (const auto& in_file : direct_order) {
        if (!split_whole[in_file.second]) gather_whole_shares();
        if (queued[in_file.second] >= 0) placed.finish(queued[in_file.second], check_piece(in_file.second));
      }
      gather_whole_shares();  // where every array is loaded whole
    } catch (const Error& e) {
      error = e.message();
    }
    gather_whole_shares();  // where a failure came before it
    // The rows to the ranks that asked for them. Collective, so every rank takes part even after
    // a failure above (its bytes are then never used: the load throws below).
    for (std::size_t k = 0; k < arrays.size(); ++k) {
      const auto& a = arrays[k];
      if (a.selection != ArraySlice::Selection::rows || element_count(a.shape) == 0 || ranges[k].in_place) continue;
      std::vector<char> sorted(a.bytes());
      scatter_contiguous_rows(m_group, a, ranges[k].bytes.data(), ranges[k].first, sorted.data());
      if (sorted.empty()) continue;  // no rows here (another stage's array): a.data may be null
      if (rows_sorted(a))
        std::memcpy(a.data, sorted.data(), sorted.size());
      else
        permute_rows(a, row_order(a), sorted.data(), static_cast<char*>(a.data), false);
    }
    // Every chunk read is compared with its stored checksum (collective, whatever happened above),
    // unless a rank's reads failed: the terms of what it did not read are missing from the sums,
    // and its error (a disk's EIO), not the checksum mismatch every rank would then see, is the
    // one to report.
    verification.finish();
    const bool reads_failed = m_group.allreduce(int(!error.empty()), comm::Combine::max) != 0;
    if (!reads_failed) {
      const std::string damage = verification.compare(f.get(), dxpl.get());
      if (!damage.empty()) error = "checkpoint '" + file + "': " + damage;
    }
    f.reset();
    LATHER_REQUIRE(error.empty(), error);
  });
}

}  // namespace lather::checkpoint
