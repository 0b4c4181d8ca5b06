// lather-checkpoint: what users run on a checkpoint file or directory.
//   lather-checkpoint verify PATH...   every dataset's checksum; exit 0 when all are intact, 1 if not
//   lather-checkpoint info PATH        step, ranks, shards, optimizer options, version, the arrays of
//                                      a file, or of the checkpoint --resume takes from a directory
// Exit status: 0 on success; 1 when a file is damaged or cannot be read (verify: any file; info: the
// FILE given, which it verifies before describing it and names on one line with what is wrong, or a
// DIRECTORY without an intact checkpoint); 2 for a usage error (a path that does not exist).
// Runs on one process: it reads files with HDF5's serial driver and needs no mpiexec.
#include <lather/checkpoint/checkpoint.hpp>
#include <lather/comm/mpi_session.hpp>
#include <lather/core/config.hpp>
#include <lather/core/error.hpp>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

/// The files a path names: itself, or a directory's *.h5 files in name order.
std::vector<std::string> files_of(const std::string& path) {
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.is_regular_file() && entry.path().extension() == ".h5") files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

int verify(const std::vector<std::string>& paths) {
  int checked = 0, damaged = 0;
  for (const auto& path : paths) {
    const auto files = files_of(path);
    if (files.empty()) std::printf("no checkpoint files (*.h5) in %s\n", path.c_str());
    for (const auto& file : files) {
      const std::string reason = lather::checkpoint::verify_checkpoint(file);
      ++checked;
      if (reason.empty()) {
        std::printf("ok       %s\n", file.c_str());
      } else {
        ++damaged;
        std::printf("DAMAGED  %s: %s\n", file.c_str(), reason.c_str());
      }
    }
  }
  std::printf("%d of %d checkpoint files intact\n", checked - damaged, checked);
  return checked > 0 && damaged == 0 ? 0 : 1;
}

/// The checkpoint --resume would take from a directory: the newest intact one (every checksum
/// verified), after naming the newer ones it skips; "" when none is intact.
std::string newest_intact(const std::string& directory) {
  auto files = files_of(directory);
  std::reverse(files.begin(), files.end());  // checkpoint-<zero-padded step>.h5: newest first
  for (const auto& file : files) {
    const std::string reason = lather::checkpoint::verify_checkpoint(file);
    if (reason.empty()) return file;
    std::printf("skipped:         %s: %s\n", file.c_str(), reason.c_str());
  }
  return {};
}

int info(const std::string& path) {
  std::string file = path;
  if (fs::is_directory(path)) {
    file = newest_intact(path);
    if (file.empty()) {
      std::fprintf(stderr, "lather-checkpoint: no intact checkpoint file (*.h5) in %s\n", path.c_str());
      return 1;
    }
    std::printf("newest intact checkpoint of %s (the one --resume takes)\n", path.c_str());
  } else {
    // Described only once every checksum holds: a file damaged in its data still opens, and its
    // description alone would pass for an intact checkpoint's.
    std::string reason = lather::checkpoint::verify_checkpoint(file);
    if (!reason.empty()) {
      std::replace(reason.begin(), reason.end(), '\n', ' ');
      std::fprintf(stderr, "lather-checkpoint: DAMAGED %s: %s\n", file.c_str(), reason.c_str());
      return 1;
    }
  }
  const auto summary = lather::checkpoint::describe_checkpoint(file);
  const auto& a = summary.attributes;
  const auto integer = [&](const char* name) {
    const auto it = a.integers.find(name);
    return it == a.integers.end() ? std::string("-") : std::to_string(it->second);
  };
  const auto text = [&](const char* name) {
    const auto it = a.strings.find(name);
    return it == a.strings.end() ? std::string("-") : it->second;
  };
  std::printf("file:            %s\n", file.c_str());
  std::printf("step:            %s\n", integer("step").c_str());
  std::printf("written by:      %s ranks (world_size %s, weight_shards %s, pipeline_stages %s)\n",
              integer("writer_ranks").c_str(), integer("world_size").c_str(), integer("weight_shards").c_str(),
              integer("pipeline_stages").c_str());
  std::printf("data position:   epoch %s, sample %s\n", integer("epoch").c_str(), integer("sample_offset").c_str());
  std::printf("library version: %s (format %s), created %s\n", text("library_version").c_str(),
              integer("format_version").c_str(), text("created").c_str());
  std::printf("optimizer:       %s\n", text("optimizer").c_str());
  const std::string options = text("optimizer_options");
  if (options != "-") {
    std::string indented = "  " + options;
    for (std::size_t at = indented.find('\n'); at != std::string::npos && at + 1 < indented.size();
         at = indented.find('\n', at + 3))
      indented.insert(at + 1, "  ");
    std::printf("optimizer options:\n%s%s", indented.c_str(), indented.empty() || indented.back() == '\n' ? "" : "\n");
  }
  // What the application added (lather-train: the model, a transformer's vocabulary and sizes).
  const std::vector<std::string> known = {"format", "library_version", "created", "optimizer", "optimizer_options"};
  for (const auto& [name, value] : a.strings)
    if (std::find(known.begin(), known.end(), name) == known.end())
      std::printf("%-16s %s\n", (name + ":").c_str(),
                  value.size() > 120 ? (std::to_string(value.size()) + " characters").c_str() : value.c_str());
  std::int64_t total = 0;
  for (const auto& d : summary.datasets) total += d.bytes;
  std::printf("arrays:          %zu, %.2f MiB\n", summary.datasets.size(), double(total) / 1048576.0);
  for (const auto& d : summary.datasets)
    std::printf("  %-56s %-8s %-18s %lld bytes\n", d.path.c_str(), d.type.c_str(), lather::to_string(d.shape).c_str(),
                static_cast<long long>(d.bytes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  const lather::comm::MpiSession mpi(argc, argv);
  CLI::App app{"lather-checkpoint " LATHER_VERSION_STRING ": verify and describe Lather checkpoint files"};
  app.require_subcommand(1);
  std::vector<std::string> paths;
  std::string file;
  auto* verify_command = app.add_subcommand(
      "verify", "Read every dataset so that every checksum is checked; exit 0 when every file is intact, 1 if not");
  // A path that does not exist is a mistake on the command line (exit 2), not a damaged file.
  verify_command->add_option("paths", paths, "Checkpoint files or directories (their *.h5 files)")
      ->required()
      ->check(CLI::ExistingPath);
  auto* info_command = app.add_subcommand(
      "info",
      "Step, ranks, shards, optimizer options, version and arrays of a checkpoint file, or of a directory's "
      "newest intact one (the one --resume takes); exit 1 when the file is damaged (every checksum is checked)");
  info_command->add_option("path", file, "A checkpoint file or directory")->required()->check(CLI::ExistingPath);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    if (*verify_command) return verify(paths);
    return info(file);
  } catch (const lather::Error& e) {
    std::fprintf(stderr, "lather-checkpoint: %s\n", e.message().c_str());
    return 1;
  }
} catch (const lather::Error& e) {
  std::fprintf(stderr, "lather-checkpoint: %s\n", e.message().c_str());
  return 2;
}
