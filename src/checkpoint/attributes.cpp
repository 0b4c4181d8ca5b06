#include "attributes.hpp"

#include <cstring>

namespace lather::checkpoint::Impl {

namespace {

template <class T>
void write_number_attribute(hid_t object, const std::string& name, hid_t type, T value) {
  Dataspace space(check(H5Screate(H5S_SCALAR), "creating a scalar dataspace"));
  Attribute attribute(check(H5Acreate2(object, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                            "creating attribute " + name));
  check(H5Awrite(attribute.get(), type, &value), "writing attribute " + name);
}

herr_t read_attribute(hid_t object, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<Attributes*>(data);
  Attribute attribute(H5Aopen(object, name, H5P_DEFAULT));
  if (!attribute.valid()) return -1;
  Datatype type(H5Aget_type(attribute.get()));
  Dataspace space(H5Aget_space(attribute.get()));
  if (!type.valid() || !space.valid() || H5Sget_simple_extent_npoints(space.get()) != 1) return 0;
  switch (H5Tget_class(type.get())) {
    case H5T_INTEGER: {
      std::int64_t v = 0;
      if (H5Aread(attribute.get(), H5T_NATIVE_INT64, &v) >= 0) out->integers[name] = v;
      break;
    }
    case H5T_FLOAT: {
      double v = 0;
      if (H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &v) >= 0) out->reals[name] = v;
      break;
    }
    case H5T_STRING: {
      if (H5Tis_variable_str(type.get()) > 0) break;
      const std::size_t size = H5Tget_size(type.get());
      if (size > (1u << 20)) break;  // not ours: refuse to size a buffer from it
      std::string v(size, '\0');
      if (H5Aread(attribute.get(), type.get(), v.data()) >= 0) {
        v.resize(std::strlen(v.c_str()));
        out->strings[name] = v;
      }
      break;
    }
    default:
      break;
  }
  return 0;
}

}  // namespace

void write_string_attribute(hid_t object, const std::string& name, const std::string& value) {
  Datatype type(check(H5Tcopy(H5T_C_S1), "copying the string type"));
  check(H5Tset_size(type.get(), std::max<std::size_t>(1, value.size())), "sizing a string attribute");
  check(H5Tset_strpad(type.get(), H5T_STR_NULLPAD), "padding a string attribute");
  Dataspace space(check(H5Screate(H5S_SCALAR), "creating a scalar dataspace"));
  Attribute attribute(check(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                            "creating attribute " + name));
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  check(H5Awrite(attribute.get(), type.get(), padded.data()), "writing attribute " + name);
}

void write_integer_attribute(hid_t object, const std::string& name, std::int64_t value) {
  write_number_attribute<std::int64_t>(object, name, H5T_NATIVE_INT64, value);
}

void write_real_attribute(hid_t object, const std::string& name, double value) {
  write_number_attribute<double>(object, name, H5T_NATIVE_DOUBLE, value);
}

Attributes read_root_attributes(hid_t file) {
  Attributes attributes;
  hsize_t index = 0;
  check(H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_NATIVE, &index, read_attribute, &attributes),
        "reading the root attributes");
  return attributes;
}

}  // namespace lather::checkpoint::Impl
