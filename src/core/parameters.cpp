#include <lather/core/parameters.hpp>

namespace lather {

void ParameterSpec::validate() const {
  LATHER_REQUIRE(!name.empty(), "a parameter has no name");
  // A slice may be empty (a rank holding none of a parameter's rows, or of its split axis); every
  // other extent is >= 1.
  for (std::size_t d = 0; d < shape.size(); ++d)
    LATHER_REQUIRE(shape[d] > 0 || (split_axis >= 0 && (int(d) == split_axis || d == 0) && shape[d] == 0),
                   "parameter '", name, "' has shape ", lather::to_string(shape), " with no elements");
  LATHER_REQUIRE(split_axis > 0 || row_offset == 0, "parameter '", name, "': row_offset ", row_offset,
                 " needs a split along a later axis (split_axis ", split_axis, ")");
  if (split_axis < 0) {
    LATHER_REQUIRE(global_shape.empty() || global_shape == shape, "parameter '", name, "' has global shape ",
                   lather::to_string(global_shape), " but is not split (shape ", lather::to_string(shape), ")");
    return;
  }
  LATHER_REQUIRE(split_axis < int(shape.size()), "parameter '", name, "': split_axis ", split_axis,
                 " out of range for shape ", lather::to_string(shape));
  LATHER_REQUIRE(global_shape.size() == shape.size(), "parameter '", name, "': global shape ",
                 lather::to_string(global_shape), " and local shape ", lather::to_string(shape), " differ in rank");
  if (split_axis > 0)  // a band of the slice's rows (ParameterSpec::row_band)
    LATHER_REQUIRE(row_offset >= 0 && row_offset + shape[0] <= global_shape[0], "parameter '", name, "': rows [",
                   row_offset, ", ", row_offset + shape[0], ") outside dimension 0 of extent ", global_shape[0]);
  for (std::size_t d = 0; d < shape.size(); ++d)
    if (int(d) != split_axis && (d != 0 || split_axis == 0))
      LATHER_REQUIRE(global_shape[d] == shape[d], "parameter '", name, "': dimension ", d, " of the local shape ",
                     lather::to_string(shape), " differs from the global shape ", lather::to_string(global_shape));
  LATHER_REQUIRE(split_offset >= 0 && split_offset + shape[split_axis] <= global_shape[split_axis], "parameter '", name,
                 "': slice [", split_offset, ", ", split_offset + shape[split_axis], ") outside dimension ", split_axis,
                 " of extent ", global_shape[split_axis]);
}

}  // namespace lather
