// Crash safety: a writer killed with SIGKILL at any moment of a checkpoint write leaves the newest
// complete checkpoint loadable and its half-written file is never taken for the latest.
#include <lather/checkpoint/checkpoint.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <spawn.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace lather;

/// The environment without the launcher's PMI/Hydra variables, so the child is an MPI
/// singleton instead of a second rank 0 of our job.
std::vector<std::string> clean_environment() {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    if (entry.rfind("PMI_", 0) == 0 || entry.rfind("HYDRA", 0) == 0 || entry.rfind("MPIR_", 0) == 0 ||
        entry.rfind("PMIX_", 0) == 0 || entry.rfind("OMPI_", 0) == 0)
      continue;
    env.push_back(entry);
  }
  return env;
}

pid_t spawn_writer(const std::string& dir, long step, int megabytes) {
  std::vector<std::string> args = {LATHER_CRASH_WRITER, dir, std::to_string(step), std::to_string(megabytes)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto env = clean_environment();
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, LATHER_CRASH_WRITER, nullptr, nullptr, argv.data(), envp.data());
  EXPECT_EQ(rc, 0) << std::strerror(rc);
  return pid;
}

/// Loads checkpoint `file` fully and checks every element equals its step.
void expect_loadable(const checkpoint::Checkpointer& checkpointer, const std::string& file) {
  const auto attributes = checkpointer.read_attributes(file);
  const auto elements = attributes.integers.at("elements");
  const auto step = attributes.integers.at("step");
  ASSERT_GT(elements, 0);
  ASSERT_LT(elements, std::int64_t(1) << 28);
  std::vector<double> data(elements, -1.0);
  checkpoint::ArraySlice slice;
  slice.path = "data";
  slice.dtype = optim::DType::float64;
  slice.shape = {elements};
  slice.data = data.data();
  checkpointer.load(file, {slice});
  for (double x : data) ASSERT_EQ(x, double(step)) << file;
}

TEST(CheckpointCrash, KilledWriterLeavesPreviousCheckpointLoadable) {
  char name[256];
  std::strncpy(name, (fs::temp_directory_path() / "lather-crash-XXXXXX").c_str(), sizeof name - 1);
  ASSERT_NE(mkdtemp(name), nullptr);
  const std::string dir = name;
  checkpoint::CheckpointOptions options;
  options.directory = dir;
  options.keep_last = 100;
  checkpoint::Checkpointer checkpointer(MPI_COMM_WORLD, options);

  // A small complete checkpoint first, by a writer that finishes.
  {
    const pid_t pid = spawn_writer(dir, 1, 1);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ASSERT_EQ(fs::path(checkpointer.latest()).filename(), "checkpoint-000000000001.h5");

  // Kill writers of larger checkpoints at different moments of their write.
  int killed_mid_write = 0;
  for (int trial = 0; trial < 4; ++trial) {
    const long step = 10 + trial;
    const pid_t pid = spawn_writer(dir, step, 96);
    // Wait until the temporary file exists and has grown past a point that moves each trial.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    const std::uintmax_t threshold = std::uintmax_t(trial) * 20 * (1u << 20);
    bool seen = false;
    while (std::chrono::steady_clock::now() < deadline) {
      std::error_code ec;
      for (const auto& entry : fs::directory_iterator(dir, ec))
        if (entry.path().filename().string().find(".partial-") != std::string::npos &&
            fs::file_size(entry.path(), ec) >= std::max<std::uintmax_t>(threshold, 1))
          seen = true;
      if (seen) break;
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) break;  // finished before we struck
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    const bool final_exists = fs::exists(fs::path(dir) / ("checkpoint-0000000000" + std::to_string(step) + ".h5"));
    if (seen && !final_exists) ++killed_mid_write;

    // Whatever the moment: the latest is complete, loads, and is either the new one or older.
    const std::string latest = checkpointer.latest();
    ASSERT_FALSE(latest.empty());
    EXPECT_EQ(latest.find(".partial-"), std::string::npos);
    expect_loadable(checkpointer, latest);
    if (!final_exists) EXPECT_LT(checkpointer.read_attributes(latest).integers.at("step"), step);
  }
  EXPECT_GE(killed_mid_write, 2) << "the writer finished before it could be killed too often";

  // The next save cleans the leftovers.
  std::vector<double> data(4, 50.0);
  checkpoint::ArraySlice slice;
  slice.path = "data";
  slice.dtype = optim::DType::float64;
  slice.shape = {4};
  slice.data = data.data();
  checkpoint::Attributes attributes;
  attributes.integers["elements"] = 4;
  checkpointer.save(50, {slice}, attributes);
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".partial-"), std::string::npos) << entry.path();
  expect_loadable(checkpointer, checkpointer.latest());
  fs::remove_all(dir);
}

}  // namespace
