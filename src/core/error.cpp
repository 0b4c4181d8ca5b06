#include <lather/core/error.hpp>

#include <cstring>

namespace lather {

namespace {
std::string with_location(const std::string& message, const char* file, int line) {
  if (file == nullptr) return message;  // the message already carries its origin
  // Keep the path from the project root on: users report it, we find it.
  const char* shown = file;
  for (const char* marker : {"/src/", "/include/"}) {
    if (const char* at = std::strstr(file, marker)) {
      shown = at + 1;
      break;
    }
  }
  return message + " [" + shown + ":" + std::to_string(line) + "]";
}
}  // namespace

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(with_location(message, file, line)), m_message(std::move(message)) {}

namespace Impl {
void throw_error(const char* file, int line, std::string message) { throw Error(std::move(message), file, line); }
}  // namespace Impl

}  // namespace lather
