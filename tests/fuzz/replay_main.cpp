// A main for the libFuzzer harnesses of tests/fuzz without libFuzzer: runs LLVMFuzzerTestOneInput
// once on every file of the directories (or on the files) given, in name order, so that any
// compiler replays the committed corpora (ctest label `fuzz`). A harness rejects bad input by
// returning; anything that crashes it (an escaping exception, a failed check, a sanitizer report
// in a sanitized build) fails the replay, which names the file it was reading first.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
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
  std::size_t bytes = 0;
  for (const fs::path& input : inputs) {
    std::ifstream in(input, std::ios::binary);
    const std::vector<char> content{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "%s: cannot read '%s'\n", argv[0], input.c_str());
      return 2;
    }
    // Named before it runs: a crash leaves this line as the last one in the log.
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", input.c_str(), content.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(content.data()), content.size());
    bytes += content.size();
  }
  std::printf("%zu inputs (%zu bytes) replayed without a crash\n", inputs.size(), bytes);
  return 0;
}
