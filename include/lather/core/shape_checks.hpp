#pragma once
// Argument checks that describe what is wrong instead of throwing: each returns "" or a message
// naming the argument, its shape and the shape expected, so that a caller can agree on the
// outcome with other ranks before it throws.

#include <lather/core/error.hpp>

#include <cstddef>
#include <initializer_list>
#include <string>

namespace lather::Impl {

inline std::string matrix_shape(std::size_t rows, std::size_t columns) {
  return "[" + std::to_string(rows) + ", " + std::to_string(columns) + "]";
}

/// "" when `view` is [rows, columns], else what it is instead.
template <class View>
std::string expect_shape(const char* what, const View& view, std::size_t rows, std::size_t columns) {
  if (view.extent(0) == rows && view.extent(1) == columns) return {};
  return concat(what, " is ", matrix_shape(view.extent(0), view.extent(1)), ", expected ", matrix_shape(rows, columns));
}

/// "" when `view` has `length` elements, else how many it has.
template <class View>
std::string expect_length(const char* what, const View& view, std::size_t length) {
  if (view.extent(0) == length) return {};
  return concat(what, " has ", view.extent(0), " elements, expected ", length);
}

/// The first non-empty message, or "".
inline std::string first_error(std::initializer_list<std::string> errors) {
  for (const auto& e : errors)
    if (!e.empty()) return e;
  return {};
}

}  // namespace lather::Impl
