// libFuzzer harness: the bytes are a text for the character-level language model.
//  * Vocabulary::of_text / encode / decode / to_string / from_string: strict UTF-8, and every text
//    they accept comes back byte for byte;
//  * load_text_corpus on one file (split by position) and on a directory (train.txt = the bytes,
//    validation.txt = their second half): the two parts decode back to the file;
//  * window_offsets over the training tokens: every window inside the text.
// A lather::Error is the expected rejection; anything else is a bug.
#include "fuzz_support.hpp"

#include <lather/core/error.hpp>
#include <lather/data/text.hpp>

#include <filesystem>
#include <string_view>

namespace {

using lather::data::Vocabulary;

void vocabulary_round_trips(std::string_view text) {
  Vocabulary vocabulary;
  try {
    vocabulary = Vocabulary::of_text(text);
  } catch (const lather::Error&) {
    return;
  }
  const std::vector<std::int32_t> ids = vocabulary.encode(text, "the fuzzer's text");  // valid: must not throw
  LATHER_FUZZ_CHECK(vocabulary.decode(ids) == text);
  for (const std::int32_t id : ids) LATHER_FUZZ_CHECK(id >= 0 && id < vocabulary.size());
  LATHER_FUZZ_CHECK(Vocabulary::from_string(vocabulary.to_string()) == vocabulary);
}

void vocabulary_string_round_trips(std::string_view concatenated) {
  try {
    const Vocabulary vocabulary = Vocabulary::from_string(concatenated);
    LATHER_FUZZ_CHECK(vocabulary.to_string() == concatenated);
  } catch (const lather::Error&) {
  }
}

void corpus_splits(const std::string& path, std::string_view text, double validation_fraction) {
  lather::data::TextCorpus corpus;
  try {
    corpus = lather::data::load_text_corpus(path, validation_fraction, 2);
  } catch (const lather::Error&) {
    return;
  }
  LATHER_FUZZ_CHECK(corpus.train.size() >= 2 && corpus.validation.size() >= 2);
  LATHER_FUZZ_CHECK(corpus.vocabulary.decode(corpus.train) + corpus.vocabulary.decode(corpus.validation) == text);
  // Windows of a step stay inside the training text.
  const int block_size = 1 + int(text.size() % 5);
  const auto tokens = std::int64_t(corpus.train.size());
  if (tokens < block_size + 1) return;
  for (const std::int64_t offset : lather::data::window_offsets(text.size(), 3, 4, tokens, block_size))
    LATHER_FUZZ_CHECK(offset >= 0 && offset + block_size < tokens);
}

void corpus_directory(const std::uint8_t* data, std::size_t size) {
  const auto& scratch = lather::fuzz::scratch();
  const std::filesystem::path directory = scratch.path() / "corpus";
  std::filesystem::create_directories(directory);
  scratch.write("corpus/train.txt", data, size);
  scratch.write("corpus/validation.txt", data + size / 2, size - size / 2);
  lather::data::TextCorpus corpus;
  try {
    corpus = lather::data::load_text_corpus(directory.string());
  } catch (const lather::Error&) {
    return;
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  LATHER_FUZZ_CHECK(corpus.vocabulary.decode(corpus.train) == text);
  LATHER_FUZZ_CHECK(corpus.vocabulary.decode(corpus.validation) == text.substr(size / 2));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vocabulary_round_trips(text);
  vocabulary_string_round_trips(text);
  const std::string path = lather::fuzz::scratch().write("text.txt", data, size);
  corpus_splits(path, text, 0.1 + 0.1 * double(size % 8));
  corpus_directory(data, size);
  return 0;
}
