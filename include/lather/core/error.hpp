#pragma once
// One exception type and one precondition macro for everything Lather checks on the host.

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace lather {

/// Thrown for every violated precondition, bad option, bad input or failed computation. The message
/// names the object and the offending value; `what()` also carries the source location.
class Error : public std::runtime_error {
 public:
  /// file == nullptr: `message` already says where it comes from (e.g. relayed from another rank).
  Error(std::string message, const char* file, int line);
  /// The message without the source location, for one-line reports to users.
  const std::string& message() const noexcept { return m_message; }

 private:
  std::string m_message;
};

namespace Impl {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
[[noreturn]] void throw_error(const char* file, int line, std::string message);
}  // namespace Impl

}  // namespace lather

/// LATHER_REQUIRE(condition, message parts...): throws lather::Error with the concatenated message.
#define LATHER_REQUIRE(condition, ...)                                                                      \
  do {                                                                                                      \
    if (!(condition)) ::lather::Impl::throw_error(__FILE__, __LINE__, ::lather::Impl::concat(__VA_ARGS__)); \
  } while (false)

/// LATHER_FAIL(message parts...): throws unconditionally.
#define LATHER_FAIL(...) ::lather::Impl::throw_error(__FILE__, __LINE__, ::lather::Impl::concat(__VA_ARGS__))
