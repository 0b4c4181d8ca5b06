#pragma once
// RAII for HDF5 identifiers and HDF5 errors turned into messages: every hid_t is closed once,
// whatever path leaves the scope, and a failed call throws with HDF5's own innermost reason.

#include <lather/core/error.hpp>
#include <lather/core/state_array.hpp>

#include <hdf5.h>

#include <string>
#include <utility>

namespace lather::checkpoint::Impl {

/// The innermost messages of the current HDF5 error stack, e.g. "checksum verification failed".
std::string hdf5_error_reason();

/// Turns off HDF5's printing of error stacks to stderr for the life of the object.
class QuietHdf5 {
 public:
  QuietHdf5();
  ~QuietHdf5();

 private:
  H5E_auto2_t m_function = nullptr;
  void* m_data = nullptr;
};

template <herr_t (*Close)(hid_t)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(hid_t id) : m_id(id) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& other) noexcept : m_id(std::exchange(other.m_id, H5I_INVALID_HID)) {}
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      m_id = std::exchange(other.m_id, H5I_INVALID_HID);
    }
    return *this;
  }
  ~Handle() { reset(); }
  void reset() {
    if (m_id >= 0) Close(m_id);
    m_id = H5I_INVALID_HID;
  }
  hid_t get() const { return m_id; }
  bool valid() const { return m_id >= 0; }

 private:
  hid_t m_id = H5I_INVALID_HID;
};

using File = Handle<H5Fclose>;
using Dataset = Handle<H5Dclose>;
using Dataspace = Handle<H5Sclose>;
using Datatype = Handle<H5Tclose>;
using Attribute = Handle<H5Aclose>;
using PropertyList = Handle<H5Pclose>;

/// Throws lather::Error "<what>: <hdf5 reason>" when id < 0; returns id otherwise.
inline hid_t check(hid_t id, const std::string& what) {
  if (id < 0) LATHER_FAIL(what, ": ", hdf5_error_reason());
  return id;
}

/// The HDF5 native type of a Lather dtype.
hid_t native_type(::lather::DType dtype);
/// The Lather dtype a stored HDF5 type reads as, if it is one of ours exactly.
bool dtype_of_stored(hid_t type, ::lather::DType& dtype);

}  // namespace lather::checkpoint::Impl
