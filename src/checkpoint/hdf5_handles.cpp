#include "hdf5_handles.hpp"

#include <vector>

namespace lather::checkpoint::Impl {

namespace {
herr_t collect(unsigned n, const H5E_error2_t* error, void* data) {
  auto* messages = static_cast<std::vector<std::string>*>(data);
  (void)n;
  if (error->desc && *error->desc) messages->push_back(error->desc);
  return 0;
}
}  // namespace

std::string hdf5_error_reason() {
  std::vector<std::string> messages;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, collect, &messages);
  H5Eclear2(H5E_DEFAULT);
  if (messages.empty()) return "unknown HDF5 error";
  // Innermost first: the first message says what really went wrong; add the next for context.
  std::string reason = messages.front();
  if (messages.size() > 1 && messages[1] != reason) reason += " (" + messages[1] + ")";
  return reason;
}

QuietHdf5::QuietHdf5() {
  H5Eget_auto2(H5E_DEFAULT, &m_function, &m_data);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
QuietHdf5::~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, m_function, m_data); }

hid_t native_type(::lather::DType dtype) {
  switch (dtype) {
    case ::lather::DType::float32:
      return H5T_NATIVE_FLOAT;
    case ::lather::DType::float64:
      return H5T_NATIVE_DOUBLE;
    case ::lather::DType::int8:
      return H5T_NATIVE_INT8;
    case ::lather::DType::int16:
      return H5T_NATIVE_INT16;
    case ::lather::DType::int32:
      return H5T_NATIVE_INT32;
    case ::lather::DType::int64:
      return H5T_NATIVE_INT64;
  }
  return H5T_NATIVE_FLOAT;
}

bool dtype_of_stored(hid_t type, ::lather::DType& dtype) {
  const H5T_class_t kind = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (kind == H5T_FLOAT) {
    if (size == 4)
      dtype = ::lather::DType::float32;
    else if (size == 8)
      dtype = ::lather::DType::float64;
    else
      return false;
    return true;
  }
  if (kind == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2) {
    switch (size) {
      case 1:
        dtype = ::lather::DType::int8;
        return true;
      case 2:
        dtype = ::lather::DType::int16;
        return true;
      case 4:
        dtype = ::lather::DType::int32;
        return true;
      case 8:
        dtype = ::lather::DType::int64;
        return true;
      default:
        return false;
    }
  }
  return false;
}

}  // namespace lather::checkpoint::Impl
