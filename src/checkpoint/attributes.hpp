#pragma once
// Scalar HDF5 attributes as Lather writes them (strings, int64, double) and the root group's read
// back into Attributes.

#include "hdf5_handles.hpp"

#include <lather/checkpoint/checkpoint.hpp>

#include <cstdint>
#include <string>

namespace lather::checkpoint::Impl {

void write_string_attribute(hid_t object, const std::string& name, const std::string& value);
void write_integer_attribute(hid_t object, const std::string& name, std::int64_t value);
void write_real_attribute(hid_t object, const std::string& name, double value);
/// Every scalar attribute of the root group (strings longer than 1 MiB are not read).
Attributes read_root_attributes(hid_t file);

}  // namespace lather::checkpoint::Impl
