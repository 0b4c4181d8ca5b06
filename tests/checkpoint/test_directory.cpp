// The checkpoint directory (src/checkpoint/directory.hpp), white box: names, listing, pruning, and
// publication, whose fsyncs are checked. A FIFO under the temporary name makes the kernel's own
// fsync fail (EINVAL: a FIFO cannot be synchronised), so the failure path runs for real, not
// through a hook: the file never takes its final name, and the error says which and why.
#include "checkpoint/directory.hpp"

#include <lather/core/error.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace lather::checkpoint::Impl;

/// A fresh directory, removed with the fixture.
class CheckpointDirectory : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "lather-directory-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << std::strerror(errno);
    m_directory = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(m_directory, ignored);
  }
  std::string path(const std::string& name) const { return (fs::path(m_directory) / name).string(); }
  static void write_text(const std::string& file, const std::string& text) { std::ofstream(file) << text; }
  static std::string read_text(const std::string& file) {
    std::ifstream in(file);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::string m_directory;
};

TEST_F(CheckpointDirectory, PublishRenamesTheSyncedFileIntoPlace) {
  for (bool sync : {true, false}) {
    const long step = sync ? 7 : 8;
    const std::string from = temporary_name(m_directory, "ckpt", step), to = final_name(m_directory, "ckpt", step);
    write_text(from, "checkpoint bytes");
    for (const auto& listed : list_final(m_directory, "ckpt"))
      EXPECT_NE(listed.first, step) << "the temporary name is listed as a checkpoint";
    publish(from, to, sync);
    EXPECT_FALSE(fs::exists(from));
    EXPECT_EQ(read_text(to), "checkpoint bytes");
    EXPECT_EQ(list_final(m_directory, "ckpt").back(), std::make_pair(step, to));
  }
}

TEST_F(CheckpointDirectory, AFileWhoseFsyncFailsIsNeverPublished) {
  const std::string from = temporary_name(m_directory, "ckpt", 3), to = final_name(m_directory, "ckpt", 3);
  ASSERT_EQ(::mkfifo(from.c_str(), 0600), 0) << std::strerror(errno);
  try {
    publish(from, to, true);
    FAIL() << "publishing a file whose fsync fails did not throw";
  } catch (const lather::Error& e) {
    const std::string message = e.message();
    EXPECT_NE(message.find("'" + to + "' was not published"), std::string::npos) << message;
    EXPECT_NE(message.find("fsync of '" + from + "' failed: " + std::strerror(EINVAL)), std::string::npos) << message;
  }
  EXPECT_FALSE(fs::exists(to));
  EXPECT_FALSE(fs::exists(from)) << "the temporary that failed its fsync is left behind";
  EXPECT_TRUE(list_final(m_directory, "ckpt").empty());
}

TEST_F(CheckpointDirectory, AMissingTemporaryIsAnErrorNamingIt) {
  const std::string from = temporary_name(m_directory, "ckpt", 4), to = final_name(m_directory, "ckpt", 4);
  for (bool sync : {true, false}) {
    try {
      publish(from, to, sync);
      FAIL() << "publishing a missing file did not throw (sync " << sync << ")";
    } catch (const lather::Error& e) {
      EXPECT_NE(e.message().find("'" + from + "'"), std::string::npos) << e.message();
      EXPECT_NE(e.message().find(std::strerror(ENOENT)), std::string::npos) << e.message();
    }
    EXPECT_FALSE(fs::exists(to));
  }
}

TEST_F(CheckpointDirectory, ListingPruningAndLeftoversKeepToTheirPrefix) {
  for (long step : {30, 4, 120}) write_text(final_name(m_directory, "ckpt", step), "x");
  write_text(final_name(m_directory, "other", 50), "x");
  write_text(path("ckpt-12.h5"), "x");                // not 12 digits
  write_text(path("ckpt-0000000000ab.h5"), "x");      // not digits
  write_text(path("ckpt-000000000001.h5.bak"), "x");  // not .h5
  write_text(temporary_name(m_directory, "ckpt", 200), "x");
  write_text(temporary_name(m_directory, "other", 200), "x");

  auto listed = list_final(m_directory, "ckpt");
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(listed[0].first, 4);
  EXPECT_EQ(listed[1].first, 30);
  EXPECT_EQ(listed[2].first, 120);

  remove_files(files_to_prune(m_directory, "ckpt", 2, [](const std::string&) { return true; }));
  listed = list_final(m_directory, "ckpt");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].first, 30);
  EXPECT_EQ(listed[1].first, 120);
  EXPECT_TRUE(fs::exists(final_name(m_directory, "other", 50)));
  EXPECT_TRUE(fs::exists(path("ckpt-12.h5")));

  remove_temporaries(m_directory, "ckpt");
  EXPECT_FALSE(fs::exists(temporary_name(m_directory, "ckpt", 200)));
  EXPECT_TRUE(fs::exists(temporary_name(m_directory, "other", 200)));
  EXPECT_TRUE(list_final(path("absent"), "ckpt").empty());
}

// Pruning keeps the newest `keep` files that open (`opens`, here: not named damaged), and every
// file newer than the oldest of them; it asks newest first and stops once `keep` opened. With
// fewer than `keep` that open, nothing goes.
TEST_F(CheckpointDirectory, PruningCountsOnlyFilesThatOpen) {
  for (long step = 1; step <= 7; ++step) write_text(final_name(m_directory, "ckpt", step), "x");
  const std::set<long> damaged = {2, 5, 6};
  std::vector<long> asked;
  const auto opens = [&](const std::string& file) {
    for (const auto& [step, path] : list_final(m_directory, "ckpt"))
      if (path == file) {
        asked.push_back(step);
        return damaged.count(step) == 0;
      }
    ADD_FAILURE() << "asked about " << file;
    return false;
  };
  // Keep 2: steps 7 and 4 open; 5 and 6 between them stay; 1, 2 and 3 go, the damaged 2 too.
  EXPECT_EQ(files_to_prune(m_directory, "ckpt", 2, opens),
            (std::vector<std::string>{final_name(m_directory, "ckpt", 1), final_name(m_directory, "ckpt", 2),
                                      final_name(m_directory, "ckpt", 3)}));
  EXPECT_EQ(asked, (std::vector<long>{7, 6, 5, 4}));
  // Keep 4: 7, 4, 3 and 1 open; only what is older than 1 would go.
  EXPECT_TRUE(files_to_prune(m_directory, "ckpt", 4, opens).empty());
  // Keep 5: only 4 open, nothing goes.
  EXPECT_TRUE(files_to_prune(m_directory, "ckpt", 5, opens).empty());
  remove_files(files_to_prune(m_directory, "ckpt", 2, opens));
  std::vector<long> left;
  for (const auto& listed : list_final(m_directory, "ckpt")) left.push_back(listed.first);
  EXPECT_EQ(left, (std::vector<long>{4, 5, 6, 7}));
}

TEST_F(CheckpointDirectory, AnUnwritableDirectoryIsFoundBeforeAnySave) {
  EXPECT_NO_THROW(check_writable(m_directory, "ckpt"));
  EXPECT_TRUE(fs::is_empty(m_directory)) << "the probe file is left behind";
  // A path under a regular file can never be a directory, whoever runs the test (root included).
  const std::string file = path("plain-file");
  write_text(file, "x");
  try {
    make_directories(file + "/checkpoints");
    FAIL() << "a directory under a file was created";
  } catch (const lather::Error& e) {
    EXPECT_NE(e.message().find("'" + file + "/checkpoints'"), std::string::npos) << e.message();
  }
  // Linux's /proc/self is a directory in which nobody, root included, may create a file.
  if (fs::is_directory("/proc/self")) {
    try {
      check_writable("/proc/self", "ckpt");
      FAIL() << "a file was created in /proc/self";
    } catch (const lather::Error& e) {
      EXPECT_NE(e.message().find("cannot create files in checkpoint directory '/proc/self': "), std::string::npos)
          << e.message();
    }
  }
}

}  // namespace
