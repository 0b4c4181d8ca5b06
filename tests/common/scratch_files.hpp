#pragma once
// A GoogleTest fixture with a directory of its own for the files a test writes (one per test,
// removed afterwards), for the readers that take a path.

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

namespace lather::testing {

class ScratchFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    m_dir = std::filesystem::temp_directory_path() /
            ("lather_test_files_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(m_dir);
    std::filesystem::create_directories(m_dir);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(m_dir, ignored);
  }
  /// Writes `bytes` to `name` (sub-directories created) and returns its path.
  std::string write(const std::string& name, const std::string& bytes) const {
    const std::filesystem::path path = m_dir / name;
    std::filesystem::create_directories(path.parent_path());
    std::ofstream(path, std::ios::binary) << bytes;
    return path.string();
  }
  std::filesystem::path m_dir;
};

}  // namespace lather::testing
