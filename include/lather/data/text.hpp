#pragma once
// Text for character-level language models: a vocabulary of UTF-8 code points, a corpus split into
// training and validation token ids, and the random windows a training step reads. Host only.

#if defined(LATHER_AREA) && !defined(LATHER_AREA_SEES_DATA)
#error "lather/data/ is not below the area being compiled (the layers: src/CMakeLists.txt)"
#endif

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lather::data {

/// The characters of a text (UTF-8 code points), sorted by code point: token id = position.
/// UTF-8 is strict throughout: overlong forms, surrogates, code points past U+10FFFF and truncated
/// sequences are errors naming the byte offset.
class Vocabulary {
 public:
  Vocabulary() = default;
  /// Every distinct code point of `utf8`. Throws lather::Error on invalid UTF-8, naming the byte offset.
  static Vocabulary of_text(std::string_view utf8);
  /// Each symbol one UTF-8 code point, strictly increasing by code point, else lather::Error naming it.
  explicit Vocabulary(std::vector<std::string> symbols);

  int size() const { return int(m_symbols.size()); }
  const std::vector<std::string>& symbols() const { return m_symbols; }

  /// Token ids of `utf8`. A character not in the vocabulary is a lather::Error naming it (escaped if not
  /// printable), its line and column (1-based, columns in code points) and `what` (e.g. "validation text
  /// '/path'"); invalid UTF-8 is an Error naming `what` and the byte offset.
  std::vector<std::int32_t> encode(std::string_view utf8, const std::string& what) const;
  /// The text of `ids`; lather::Error for an id out of [0, size()), naming it and its position.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  std::string decode(std::int32_t id) const;

  /// All symbols concatenated (what a checkpoint stores as a string attribute) and back.
  std::string to_string() const;
  static Vocabulary from_string(std::string_view concatenated);

  friend bool operator==(const Vocabulary& a, const Vocabulary& b) { return a.m_symbols == b.m_symbols; }
  friend bool operator!=(const Vocabulary& a, const Vocabulary& b) { return !(a == b); }

 private:
  /// Token id of `code_point`, -1 if absent.
  std::int32_t find(char32_t code_point) const;

  std::vector<std::string> m_symbols;
  std::vector<char32_t> m_code_points;                                         ///< m_symbols decoded, for binary search
  std::vector<std::int32_t> m_ascii_ids = std::vector<std::int32_t>(128, -1);  ///< fast path, -1 = absent
};

struct TextCorpus {
  Vocabulary vocabulary;  ///< of the training text
  std::vector<std::int32_t> train, validation;
  std::string source;  ///< for messages, e.g. "'/usr/share/datasets/shakespeare' (train.txt, validation.txt)"
};

/// `path` is a directory holding train.txt and validation.txt (what scripts/fetch-shakespeare writes),
/// or a single UTF-8 file split by position: of its n characters (code points) the last
/// round(n * validation_fraction) (half up) are for validation, the ones before for training;
/// validation_fraction must lie in (0, 1) and is not used for a directory.
/// The vocabulary is the training text's; a validation character not in it is an error naming it.
/// Refuses (lather::Error naming the file) a missing/unreadable file, one larger than max_bytes (checked
/// before reading it), invalid UTF-8, a training text shorter than min_tokens, or a validation part
/// shorter than min_tokens.
TextCorpus load_text_corpus(const std::string& path, double validation_fraction = 0.1, std::size_t min_tokens = 2,
                            std::size_t max_bytes = std::size_t(1) << 31);

/// Where scripts/fetch-shakespeare (run by scripts/install-deps) puts the corpus.
inline constexpr const char* default_shakespeare_directory = "/usr/share/datasets/shakespeare";

/// Start offsets of the `count` windows of a step: window k covers tokens [o_k, o_k + block_size]
/// (block_size inputs and the next token of each as its target), o_k uniform in
/// [0, tokens - block_size - 1], drawn from a generator seeded by (seed, step) only, so every rank
/// count and every resume draws the same windows for a step. Error if tokens < block_size + 1.
///
/// The draw is specified exactly, so it is the same with every standard library and platform:
///   key   = splitmix64(splitmix64(seed) ^ uint64(step)), splitmix64 as in Steele, Lea & Flood (2014):
///           z = x + 0x9E3779B97F4A7C15; z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9;
///           z = (z ^ z >> 27) * 0x94D049BB133111EB; return z ^ z >> 31
///   engine = std::mt19937_64(key)  (its seeding and outputs are fixed by the C++ standard)
///   o_k   = x mod r for the first engine output x >= 2^64 mod r, r = tokens - block_size
///           (rejection makes every offset exactly equally likely; std::uniform_int_distribution is
///           not used because its algorithm differs between standard libraries).
/// The offsets are drawn in order, so the first k of them do not depend on `count`.
std::vector<std::int64_t> window_offsets(std::uint64_t seed, std::int64_t step, int count, std::int64_t tokens,
                                         int block_size);

}  // namespace lather::data
