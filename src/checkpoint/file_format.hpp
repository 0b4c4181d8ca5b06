#pragma once
// What makes an HDF5 file a Lather checkpoint: the root attributes that identify it (format name,
// format version, "complete" written last), and rank 0's serial vetting of a file before every
// rank opens it.

#include "hdf5_handles.hpp"

#include <lather/checkpoint/checkpoint.hpp>

#include <string>
#include <vector>

namespace lather::checkpoint::Impl {

/// The value of the root attribute `format` in every Lather checkpoint.
inline constexpr const char* format_name = "lather-checkpoint";

/// Rank 0's serial look at a file before every rank opens it: is it a Lather checkpoint of a
/// format we read, complete, and does every requested array exist with the expected type and
/// shape? Nothing is allocated from what the file claims. Returns the root attributes.
Attributes inspect(const std::string& file, const std::vector<ArraySlice>& arrays);
/// Rank 0's serial read of every dataset of a checkpoint, which makes HDF5 check each chunk's
/// Fletcher-32 checksum: "" when all pass, else which dataset failed and why. Reads in pieces of
/// at most 64 MiB; allocates nothing from what the file claims beyond one piece.
std::string verify_datasets(const std::string& file);
/// Rank 0's serial listing of a checkpoint: its root attributes and every dataset.
CheckpointSummary describe(const std::string& file);

}  // namespace lather::checkpoint::Impl
