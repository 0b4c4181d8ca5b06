// A main for the libFuzzer harnesses of tests/fuzz without libFuzzer: runs LLVMFuzzerTestOneInput
// once on every file of the directories (or on the files) given, in name order, so that any
// compiler replays the committed corpora (ctest label `fuzz`). A harness rejects bad input by
// returning; anything that crashes it (an escaping exception, a failed check, a sanitizer report
// in a sanitized build) fails the replay, which then names the input it was running.
#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <unistd.h>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
// Present in sanitized builds (gcc and clang): called before a sanitizer ends the process.
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

std::string g_current_input;  // set before each input runs; read only when the process dies

void name_the_input() {
  // write(2): async-signal-safe, unlike stdio, for the SIGABRT path.
  const char prefix[] = "\nreplay: the harness crashed on input ";
  (void)!write(2, prefix, sizeof prefix - 1);
  (void)!write(2, g_current_input.data(), g_current_input.size());
  (void)!write(2, "\n", 1);
}

extern "C" void on_abort(int signal) {
  name_the_input();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

// Optional, as with libFuzzer: a harness may set itself up (or take options of its own) first.
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int a = 1; a < argc; ++a) {
    const fs::path path(argv[a]);
    if (fs::is_directory(path)) {
      for (const auto& entry : fs::directory_iterator(path))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else {
      std::fprintf(stderr, "%s: '%s' is neither a directory nor a file\n", argv[0], argv[a]);
      return 2;
    }
  }
  std::sort(inputs.begin(), inputs.end());
  if (inputs.empty()) {
    std::fprintf(stderr, "%s: no inputs in the corpus given\n", argv[0]);
    return 2;
  }
  // SIGABRT only (an escaping exception, a failed check, abort_on_error): the sanitizers keep
  // their own handlers for the other signals and report through the death callback.
  std::signal(SIGABRT, on_abort);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(name_the_input);
  std::size_t bytes = 0;
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::vector<char> content{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: cannot read '%s'\n", argv[0], input.c_str());
      return 2;
    }
    g_current_input = input.string();
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(content.data()), content.size());
    bytes += content.size();
  }
  std::printf("%zu inputs (%zu bytes) replayed without a crash\n", inputs.size(), bytes);
  return 0;
}
