// The text data of the character-level model: the vocabulary (UTF-8 code points), the corpus split,
// and the windows a step reads. Exact checks throughout; the only statistical one, the uniformity of
// the bounded draw, says its bound below.
#include <lather/core/error.hpp>
#include <lather/data/text.hpp>

#include "common/scratch_files.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using lather::data::load_text_corpus;
using lather::data::Vocabulary;
using lather::data::window_offsets;

const std::string tiny_shakespeare = std::string(LATHER_TEST_TEXT_DIR) + "/tiny_shakespeare.txt";

/// Greek, Latin with diacritics, typographic punctuation, CJK and a character outside the BMP: 1 to 4
/// bytes per code point.
const std::string multi_byte_sample =
    "\xE1\xBC\x80\xCF\x81\xCF\x87\xE1\xBD\xB4 na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x94 \xE2\x80\x9Cquoted\xE2\x80\x9D\n"
    "\xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80 end\n";

/// Runs `f`, expects a lather::Error, returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const lather::Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "no lather::Error thrown";
  return {};
}

std::size_t code_points(const std::string& utf8) {
  std::size_t n = 0;
  for (const char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

/// Byte offset of code point `k` of `utf8`.
std::size_t byte_of(const std::string& utf8, std::size_t k) {
  std::size_t pos = 0;
  for (std::size_t seen = 0; pos < utf8.size(); ++pos)
    if ((static_cast<unsigned char>(utf8[pos]) & 0xC0) != 0x80 && seen++ == k) return pos;
  return pos;
}

using TextFiles = lather::testing::ScratchFiles;

TEST(Vocabulary, OfTextIsSortedAndUnique) {
  const Vocabulary v = Vocabulary::of_text("hello world\nhello");
  EXPECT_EQ(v.symbols(), (std::vector<std::string>{"\n", " ", "d", "e", "h", "l", "o", "r", "w"}));
  EXPECT_EQ(v.size(), 9);

  // UTF-8 byte order is code point order: ASCII, then U+00E9, U+20AC, U+1F600.
  const Vocabulary m = Vocabulary::of_text(
      "\xF0\x9F\x98\x80z\xE2\x82\xAC\xC3\xA9"
      "a\xC3\xA9z");
  EXPECT_EQ(m.symbols(), (std::vector<std::string>{"a", "z", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"}));
  EXPECT_EQ(Vocabulary::of_text("").size(), 0);
  EXPECT_EQ(Vocabulary().size(), 0);
}

TEST(Vocabulary, RoundTripAscii) {
  std::ifstream in(tiny_shakespeare, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 20000u) << tiny_shakespeare;
  const Vocabulary v = Vocabulary::of_text(text);
  const std::vector<std::int32_t> ids = v.encode(text, "tiny_shakespeare.txt");
  ASSERT_EQ(ids.size(), text.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_GE(ids[i], 0);
    ASSERT_LT(ids[i], v.size());
    ASSERT_EQ(v.symbols()[std::size_t(ids[i])], std::string(1, text[i])) << "position " << i;
  }
  EXPECT_EQ(v.decode(ids), text);
  EXPECT_EQ(v.decode(v.encode("Hamlet", "a name")), "Hamlet");
}

TEST(Vocabulary, RoundTripMultiByte) {
  const Vocabulary v = Vocabulary::of_text(multi_byte_sample);
  const std::vector<std::int32_t> ids = v.encode(multi_byte_sample, "the sample");
  EXPECT_EQ(ids.size(), code_points(multi_byte_sample));
  EXPECT_EQ(v.decode(ids), multi_byte_sample);
  for (int id = 0; id < v.size(); ++id) EXPECT_EQ(v.decode(id), v.symbols()[std::size_t(id)]);
  // The emoji is the largest code point, so the last id.
  EXPECT_EQ(v.encode("\xF0\x9F\x98\x80", "emoji"), std::vector<std::int32_t>{v.size() - 1});
  EXPECT_EQ(v.encode("", "nothing").size(), 0u);
}

TEST(Vocabulary, UnseenCharacterNamesItsLineAndColumn) {
  const Vocabulary v = Vocabulary::of_text("abc\n");
  std::string message = error_of([&] {
    v.encode(
        "ab\nca\nb\xC3\xA9"
        "c",
        "validation text '/data/validation.txt'");
  });
  EXPECT_NE(message.find("character '\xC3\xA9' (U+00E9) at line 3, column 2 of validation text "
                         "'/data/validation.txt' is not in the vocabulary (4 characters)"),
            std::string::npos)
      << message;
  // Not printable: escaped, or named by code point only.
  message = error_of([&] { v.encode("a\tb", "t"); });
  EXPECT_NE(message.find("'\\t' (U+0009) at line 1, column 2 of t"), std::string::npos) << message;
  message = error_of([&] { v.encode("\n\nab\xE2\x80\x8B", "t"); });  // zero-width space
  EXPECT_NE(message.find("U+200B (not printable) at line 3, column 3 of t"), std::string::npos) << message;
  message = error_of([&] { v.encode("abc\x01", "t"); });
  EXPECT_NE(message.find("U+0001 (not printable) at line 1, column 4"), std::string::npos) << message;
}

TEST(Vocabulary, InvalidUtf8IsRefusedWithItsByteOffset) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("ab\x80", 3), "byte offset 2: byte 0x80 is a continuation byte"},
      {std::string("a\xE2\x82", 3), "byte offset 1: lead byte 0xE2 starts a 3-byte sequence"},
      {std::string("xy\xC0\xAF", 4), "byte offset 2: byte 0xC0 never occurs"},                 // overlong '/'
      {std::string("\xE0\x80\xAF", 3), "byte offset 0: byte 0x80 at offset 1 cannot follow"},  // overlong
      {std::string("\xED\xA0\x80", 3), "byte offset 0: byte 0xA0 at offset 1 cannot follow"},  // surrogate
      {std::string("\xF4\x90\x80\x80", 4), "byte offset 0: byte 0x90"},                        // past U+10FFFF
      {std::string("\xC3(", 2), "byte offset 0: byte 0x28 at offset 1"},
      {std::string("\xFF", 1), "byte 0xFF never occurs in UTF-8"},
  };
  for (const auto& [text, expected] : cases) {
    const std::string& bytes = text;  // lambdas cannot capture a structured binding in C++17
    const std::string message = error_of([&] { Vocabulary::of_text(bytes); });
    EXPECT_NE(message.find("invalid UTF-8 in text at "), std::string::npos) << message;
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  }
  const Vocabulary v = Vocabulary::of_text("abc\n");
  const std::string message = error_of([&] { v.encode(std::string("abc\nab\x80", 7), "validation text '/v'"); });
  EXPECT_NE(message.find("invalid UTF-8 in validation text '/v' at byte offset 6"), std::string::npos) << message;
}

TEST(Vocabulary, ConstructorChecksItsSymbols) {
  EXPECT_EQ(Vocabulary({"\n", "a", "\xC3\xA9"}).size(), 3);
  EXPECT_NE(error_of([] {
              Vocabulary({"b", "a"});
            }).find("symbol 1 'a' (U+0061) does not come after symbol 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { Vocabulary({"a", "a"}); }).find("distinct and sorted"), std::string::npos);
  EXPECT_NE(error_of([] { Vocabulary({"a", "bc"}); }).find("symbol 1 holds 2 bytes"), std::string::npos);
  EXPECT_NE(error_of([] { Vocabulary({""}); }).find("symbol 0 is empty"), std::string::npos);
  EXPECT_NE(error_of([] { Vocabulary({std::string("\xC3", 1)}); }).find("invalid UTF-8 in vocabulary symbol 0"),
            std::string::npos);
}

TEST(Vocabulary, DecodeRefusesIdsOutOfRange) {
  const Vocabulary v = Vocabulary::of_text("abc");
  EXPECT_EQ(v.decode(std::vector<std::int32_t>{2, 0, 1}), "cab");
  EXPECT_NE(error_of([&] {
              v.decode(std::vector<std::int32_t>{0, 3});
            }).find("token id 3 at position 1 is out of the vocabulary's range [0, 3)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { v.decode(std::int32_t(-1)); }).find("token id -1"), std::string::npos);
}

TEST(Vocabulary, StringRoundTrip) {
  const Vocabulary v = Vocabulary::of_text(multi_byte_sample);
  const std::string stored = v.to_string();
  EXPECT_EQ(code_points(stored), std::size_t(v.size()));
  EXPECT_EQ(Vocabulary::from_string(stored), v);
  EXPECT_EQ(Vocabulary::from_string(stored).symbols(), v.symbols());
  EXPECT_EQ(Vocabulary::from_string("").size(), 0);
  EXPECT_NE(Vocabulary::from_string("ab"), Vocabulary::from_string("abc"));
  EXPECT_NE(error_of([] { Vocabulary::from_string("ba"); }).find("does not come after"), std::string::npos);
  EXPECT_NE(error_of([] {
              Vocabulary::from_string(std::string("a\xE2", 2));
            }).find("invalid UTF-8 in the vocabulary string at byte offset 1"),
            std::string::npos);
}

TEST_F(TextFiles, SingleFileIsSplitByCharacterPosition) {
  // 1000 code points of 1, 2, 3 and 4 bytes: the split counts characters, not bytes.
  std::string text;
  const char* pieces[] = {"a", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\n", "b"};
  for (int i = 0; i < 1000; ++i) text += pieces[(i * 7 + i / 3) % 6];
  ASSERT_EQ(code_points(text), 1000u);
  const std::string path = write("one.txt", text);

  const auto corpus = load_text_corpus(path);
  ASSERT_EQ(corpus.train.size(), 900u);
  ASSERT_EQ(corpus.validation.size(), 100u);
  EXPECT_EQ(corpus.vocabulary, Vocabulary::of_text(text.substr(0, byte_of(text, 900))));
  EXPECT_EQ(corpus.vocabulary.decode(corpus.train), text.substr(0, byte_of(text, 900)));
  EXPECT_EQ(corpus.vocabulary.decode(corpus.validation), text.substr(byte_of(text, 900)));
  EXPECT_NE(corpus.source.find(path), std::string::npos);

  // The same text as train.txt + validation.txt: the same ids.
  write("dir/train.txt", text.substr(0, byte_of(text, 900)));
  write("dir/validation.txt", text.substr(byte_of(text, 900)));
  const auto from_directory = load_text_corpus((m_dir / "dir").string());
  EXPECT_EQ(from_directory.vocabulary, corpus.vocabulary);
  EXPECT_EQ(from_directory.train, corpus.train);
  EXPECT_EQ(from_directory.validation, corpus.validation);

  // Other fractions: n * fraction rounded to nearest, half up (1000 * 0.0125 = 12.5 -> 13).
  EXPECT_EQ(load_text_corpus(path, 0.25).validation.size(), 250u);
  EXPECT_EQ(load_text_corpus(path, 0.0125).validation.size(), 13u);
  EXPECT_EQ(load_text_corpus(path, 0.0125).train.size(), 987u);
}

TEST_F(TextFiles, TinyShakespeare) {
  const auto corpus = load_text_corpus(tiny_shakespeare);
  // 38,185 characters (ASCII): 10% = 3818.5, rounded half up to 3819 for validation.
  EXPECT_EQ(corpus.train.size(), 34366u);
  EXPECT_EQ(corpus.validation.size(), 3819u);
  EXPECT_EQ(corpus.vocabulary.size(), 62);
  std::ifstream in(tiny_shakespeare, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(corpus.vocabulary.decode(corpus.train) + corpus.vocabulary.decode(corpus.validation), text);
}

TEST_F(TextFiles, ValidationCharacterMissingFromTrainingIsNamedWithItsFilePosition) {
  // 19 characters, the last round(1.9) = 2 for validation: 'z' at line 3, column 2 of the file.
  const std::string path = write("t.txt", "aaaaaaa\nbbbbbbbb\naz");
  const std::string message = error_of([&] { load_text_corpus(path); });
  EXPECT_NE(message.find("character 'z' (U+007A) at line 3, column 2 of the validation part of text file '" + path +
                         "' (from character 18 on) is not in the vocabulary (3 characters)"),
            std::string::npos)
      << message;

  write("dir/train.txt", "abc\n");
  const std::string validation = write("dir/validation.txt", "cab\nc\xC3\xA9");
  const std::string in_directory = error_of([&] { load_text_corpus((m_dir / "dir").string()); });
  EXPECT_NE(
      in_directory.find("character '\xC3\xA9' (U+00E9) at line 2, column 2 of validation text '" + validation + "'"),
      std::string::npos)
      << in_directory;
}

TEST_F(TextFiles, RefusesBadInput) {
  // Missing file or directory, a directory without one of its files.
  EXPECT_NE(error_of([&] { load_text_corpus((m_dir / "nothing").string()); }).find("does not exist"),
            std::string::npos);
  write("half/train.txt", "abcd");
  EXPECT_NE(error_of([&] { load_text_corpus((m_dir / "half").string()); }).find("has no validation.txt"),
            std::string::npos);

  // Invalid UTF-8 names the file and the byte offset.
  const std::string bad = write("bad.txt", std::string("abcdefghij\nklm\xFE", 15));
  const std::string message = error_of([&] { load_text_corpus(bad); });
  EXPECT_NE(message.find("invalid UTF-8 in text file '" + bad + "' at byte offset 14"), std::string::npos) << message;

  // Too short: 5 characters leave round(0.5) = 1 for validation; an empty validation.txt.
  const std::string five = write("five.txt", "abcab");
  EXPECT_EQ(load_text_corpus(five, 0.1, 1).validation.size(), 1u);
  EXPECT_NE(error_of([&] { load_text_corpus(five); })
                .find("the validation part (the last 1 of 5 characters) of text file '" + five +
                      "' has 1 characters, fewer than min_tokens = 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_text_corpus(five, 0.5, 3); }).find("the training part (the first 2 of 5"),
            std::string::npos);
  write("empty/train.txt", "abc");
  const std::string empty = write("empty/validation.txt", "");
  EXPECT_NE(error_of([&] {
              load_text_corpus((m_dir / "empty").string());
            }).find("validation text '" + empty + "' has 0 characters, fewer than min_tokens = 2"),
            std::string::npos);

  // The fraction must leave both parts.
  for (const double fraction : {0.0, 1.0, -0.1, 1.5})
    EXPECT_NE(error_of([&] { load_text_corpus(five, fraction); }).find("validation_fraction must lie in (0, 1)"),
              std::string::npos);
}

TEST_F(TextFiles, TooLargeIsRefusedBeforeReading) {
  const std::string path = write("large.txt", std::string(1000, 'x'));
  EXPECT_NE(error_of([&] {
              load_text_corpus(path, 0.1, 2, 999);
            }).find("text file '" + path + "' has 1000 bytes, more than max_bytes = 999"),
            std::string::npos);
  EXPECT_EQ(load_text_corpus(path, 0.1, 2, 1000).train.size(), 900u);

  // A sparse 1 TiB file: reading it (or allocating for it) first would fail differently or not at all.
  std::error_code error;
  fs::resize_file(path, std::uintmax_t(1) << 40, error);
  if (error) GTEST_SKIP() << "cannot make a sparse 1 TiB file here: " << error.message();
  EXPECT_NE(error_of([&] { load_text_corpus(path); }).find("has 1099511627776 bytes, more than max_bytes = 2147483648"),
            std::string::npos);
  write("dir/train.txt", "abc");
  write("dir/validation.txt", "abc");
  fs::resize_file(m_dir / "dir/validation.txt", std::uintmax_t(1) << 40, error);
  ASSERT_FALSE(error);
  EXPECT_NE(error_of([&] { load_text_corpus((m_dir / "dir").string()); }).find("validation text '"), std::string::npos);
}

/// The fetched corpus, when scripts/fetch-shakespeare has run (the tests never need it): its split is
/// the one load_text_corpus makes of shakespeare.txt, and validation has no unseen character.
TEST(ShakespeareCorpus, DirectoryMatchesTheSingleFileSplit) {
  const fs::path dir = lather::data::default_shakespeare_directory;
  if (!fs::exists(dir / "shakespeare.txt")) GTEST_SKIP() << "no " << dir << " (scripts/fetch-shakespeare)";
  const auto from_directory = load_text_corpus(dir.string());
  const auto from_file = load_text_corpus((dir / "shakespeare.txt").string());
  EXPECT_GT(from_directory.train.size(), 1000000u);
  EXPECT_EQ(from_directory.vocabulary, from_file.vocabulary);
  EXPECT_EQ(from_directory.train, from_file.train);
  EXPECT_EQ(from_directory.validation, from_file.validation);
}

/// The documented recipe, written out independently of src/data/text.cpp.
std::vector<std::int64_t> reference_offsets(std::uint64_t seed, std::int64_t step, int count, std::int64_t tokens,
                                            int block_size) {
  const auto splitmix64 = [](std::uint64_t x) {
    std::uint64_t z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  std::mt19937_64 engine(splitmix64(splitmix64(seed) ^ std::uint64_t(step)));
  const std::uint64_t r = std::uint64_t(tokens - block_size);
  const std::uint64_t threshold = (~r + 1) % r;  // 2^64 mod r
  std::vector<std::int64_t> out;
  while (int(out.size()) < count) {
    const std::uint64_t x = engine();
    if (x >= threshold) out.push_back(std::int64_t(x % r));
  }
  return out;
}

TEST(WindowOffsets, DeterministicAndInRange) {
  const std::int64_t tokens = 34366;
  const int block = 128;
  const auto a = window_offsets(42, 7, 64, tokens, block);
  ASSERT_EQ(a.size(), 64u);
  for (const std::int64_t o : a) {
    EXPECT_GE(o, 0);
    EXPECT_LE(o + block, tokens - 1);  // the last target is token o + block
  }
  EXPECT_EQ(window_offsets(42, 7, 64, tokens, block), a);
  EXPECT_NE(window_offsets(42, 8, 64, tokens, block), a);
  EXPECT_NE(window_offsets(43, 7, 64, tokens, block), a);
  // The first k offsets do not depend on count: 4 ranks x 16 windows see the same 64 as 1 rank.
  const auto first = window_offsets(42, 7, 16, tokens, block);
  EXPECT_EQ(first, std::vector<std::int64_t>(a.begin(), a.begin() + 16));
  EXPECT_TRUE(window_offsets(42, 7, 0, tokens, block).empty());
  // Many steps give many different windows.
  std::set<std::int64_t> firsts;
  for (std::int64_t step = 0; step < 100; ++step) firsts.insert(window_offsets(1, step, 1, tokens, block)[0]);
  EXPECT_GT(firsts.size(), 95u);
  // Exactly one window: always offset 0.
  EXPECT_EQ(window_offsets(5, 3, 4, block + 1, block), std::vector<std::int64_t>(4, 0));
}

TEST(WindowOffsets, RefusesTooShortText) {
  EXPECT_NE(error_of([] {
              window_offsets(1, 0, 1, 128, 128);
            }).find("a text of 128 tokens is shorter than one window of block_size + 1 = 129 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([] { window_offsets(1, 0, -1, 1000, 8); }).find("count must be >= 0, got -1"), std::string::npos);
  EXPECT_NE(error_of([] { window_offsets(1, 0, 1, 1000, 0); }).find("block_size must be >= 1, got 0"),
            std::string::npos);
}

TEST(WindowOffsets, FollowTheDocumentedRecipe) {
  for (const std::uint64_t seed : {0ull, 1ull, 0xDEADBEEFull, ~0ull})
    for (const std::int64_t step : {std::int64_t(0), std::int64_t(1), std::int64_t(123456), std::int64_t(-1)})
      for (const std::int64_t tokens :
           {std::int64_t(2), std::int64_t(1000), std::int64_t(4551589), (std::int64_t(3) << 61) + 8})
        ASSERT_EQ(window_offsets(seed, step, 50, tokens, 1), reference_offsets(seed, step, 50, tokens, 1))
            << seed << " " << step << " " << tokens;
  // Pinned, so that a change of the recipe (which would change every resumed run's data) is noticed.
  EXPECT_EQ(window_offsets(1234, 5, 4, 4551589, 256), (std::vector<std::int64_t>{3056362, 1750109, 278270, 1819889}));
}

/// Chi-square of `counts` against equal expected counts.
double chi_square(const std::vector<std::int64_t>& counts) {
  std::int64_t total = 0;
  for (const auto c : counts) total += c;
  const double expected = double(total) / double(counts.size());
  double sum = 0;
  for (const auto c : counts) sum += (double(c) - expected) * (double(c) - expected) / expected;
  return sum;
}

TEST(WindowOffsets, BoundedDrawIsUniform) {
  // 10 offsets, 100,000 draws over 500 steps. Chi-square with 9 degrees of freedom has mean 9 and
  // P(> 40) ~ 5e-6: a loose bound that a fair draw passes and a broken range (say, one offset never
  // drawn: chi-square ~ 11,000) fails.
  std::vector<std::int64_t> counts(10, 0);
  for (std::int64_t step = 0; step < 500; ++step)
    for (const std::int64_t o : window_offsets(2024, step, 200, 10 + 16, 16)) ++counts[std::size_t(o)];
  EXPECT_LT(chi_square(counts), 40.0);

  // r = 3 * 2^61: a plain x mod r would give the thirds [0, 2^61), [2^61, 2^62), [2^62, r) the
  // probabilities 3/8, 3/8, 2/8 (chi-square ~ 940 for 30,000 draws); the rejection makes them 1/3
  // each. 2 degrees of freedom: P(chi-square > 25) ~ 4e-6.
  const std::int64_t third = std::int64_t(1) << 61;
  std::vector<std::int64_t> thirds(3, 0);
  for (std::int64_t step = 0; step < 300; ++step)
    for (const std::int64_t o : window_offsets(7, step, 100, 3 * third + 1, 1)) ++thirds[std::size_t(o / third)];
  EXPECT_LT(chi_square(thirds), 25.0);
}

}  // namespace
