#include <lather/data/text.hpp>

#include <lather/core/error.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>

namespace lather::data {

namespace {

std::string hex_byte(unsigned char byte) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02X", unsigned(byte));
  return text;
}

/// The code point starting at byte `pos` of `text`; `pos` moves past it. Strict UTF-8 (RFC 3629):
/// the second-byte ranges below exclude overlong forms, surrogates and code points past U+10FFFF.
char32_t next_code_point(std::string_view text, std::size_t& pos, const std::string& what) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) {
    ++pos;
    return lead;
  }
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  char32_t value = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    value = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
    if (lead == 0xED) high = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    value = lead & 0x07;
    if (lead == 0xF0) low = 0x90;   // overlong below U+10000
    if (lead == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    LATHER_FAIL("invalid UTF-8 in ", what, " at byte offset ", pos, ": byte ", hex_byte(lead),
                lead < 0xC0 ? " is a continuation byte without a lead byte" : " never occurs in UTF-8");
  }
  LATHER_REQUIRE(pos + std::size_t(length) <= text.size(), "invalid UTF-8 in ", what, " at byte offset ", pos,
                 ": lead byte ", hex_byte(lead), " starts a ", length, "-byte sequence but the text ends after ",
                 text.size() - pos, " byte(s)");
  for (int i = 1; i < length; ++i) {
    const unsigned char next = byte(pos + std::size_t(i));
    const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    LATHER_REQUIRE(next >= lo && next <= hi, "invalid UTF-8 in ", what, " at byte offset ", pos, ": byte ",
                   hex_byte(next), " at offset ", pos + std::size_t(i), " cannot follow ",
                   i == 1 ? "lead byte " + hex_byte(lead) : std::string("a continuation byte"),
                   " (an overlong form, a surrogate, a code point past U+10FFFF, or a truncated sequence)");
    value = (value << 6) | (next & 0x3F);
  }
  pos += std::size_t(length);
  return value;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

/// Controls, format characters, separators and lone combining marks show nothing useful in a message.
bool printable(char32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0xAD) return false;
  if (c >= 0x300 && c <= 0x36F) return false;
  if ((c >= 0x200B && c <= 0x200F) || (c >= 0x2028 && c <= 0x202E) || (c >= 0x2060 && c <= 0x206F)) return false;
  if (c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  if ((c >= 0xE000 && c <= 0xF8FF) || c >= 0xF0000) return false;  // private use
  return true;
}

/// e.g. "'a' (U+0061)", "'\n' (U+000A)", "U+200B (not printable)".
std::string describe(char32_t c) {
  char code[16];
  std::snprintf(code, sizeof code, "U+%04X", unsigned(c));
  switch (c) {
    case '\n':
      return std::string("'\\n' (") + code + ")";
    case '\t':
      return std::string("'\\t' (") + code + ")";
    case '\r':
      return std::string("'\\r' (") + code + ")";
    case '\'':
      return std::string("'\\'' (") + code + ")";
    case '\\':
      return std::string("'\\\\' (") + code + ")";
    default:
      break;
  }
  if (!printable(c)) return std::string(code) + " (not printable)";
  std::string out = "'";
  append_utf8(out, c);
  return out + "' (" + code + ")";
}

/// The distinct code points of `text`, sorted, as UTF-8 symbols.
std::vector<std::string> symbols_of(std::string_view text, const std::string& what) {
  std::vector<bool> ascii(128, false);
  std::vector<char32_t> others;
  for (std::size_t pos = 0; pos < text.size();) {
    const char32_t c = next_code_point(text, pos, what);
    if (c < 128)
      ascii[c] = true;
    else
      others.push_back(c);
  }
  std::sort(others.begin(), others.end());
  others.erase(std::unique(others.begin(), others.end()), others.end());
  std::vector<std::string> symbols;
  for (char32_t c = 0; c < 128; ++c)
    if (ascii[c]) symbols.emplace_back(1, char(c));
  for (const char32_t c : others) {
    std::string symbol;
    append_utf8(symbol, c);
    symbols.push_back(std::move(symbol));
  }
  return symbols;
}

std::string read_text_file(const std::filesystem::path& path, std::size_t max_bytes, const char* role) {
  const std::string name = path.string();
  std::error_code error;
  LATHER_REQUIRE(std::filesystem::is_regular_file(path, error), role, " '", name, "' does not exist or is not a file");
  const std::uintmax_t bytes = std::filesystem::file_size(path, error);
  LATHER_REQUIRE(!error, "cannot read the size of ", role, " '", name, "': ", error.message());
  LATHER_REQUIRE(bytes <= max_bytes, role, " '", name, "' has ", bytes, " bytes, more than max_bytes = ", max_bytes);
  std::ifstream in(path, std::ios::binary);
  LATHER_REQUIRE(in.is_open(), "cannot open ", role, " '", name, "' for reading");
  std::string text(std::size_t(bytes), '\0');
  in.read(text.data(), std::streamsize(bytes));
  LATHER_REQUIRE(std::uintmax_t(in.gcount()) == bytes, "cannot read ", role, " '", name, "': got ", in.gcount(),
                 " of its ", bytes, " bytes");
  return text;
}

std::uint64_t splitmix64(std::uint64_t x) {
  std::uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Vocabulary Vocabulary::of_text(std::string_view utf8) { return Vocabulary(symbols_of(utf8, "text")); }

Vocabulary::Vocabulary(std::vector<std::string> symbols) : m_symbols(std::move(symbols)) {
  m_code_points.reserve(m_symbols.size());
  for (std::size_t i = 0; i < m_symbols.size(); ++i) {
    const std::string& symbol = m_symbols[i];
    const std::string what = "vocabulary symbol " + std::to_string(i);
    LATHER_REQUIRE(!symbol.empty(), what, " is empty, not one UTF-8 code point");
    std::size_t pos = 0;
    const char32_t c = next_code_point(symbol, pos, what);
    LATHER_REQUIRE(pos == symbol.size(), what, " holds ", symbol.size(), " bytes starting with ", describe(c),
                   ", not one UTF-8 code point");
    LATHER_REQUIRE(m_code_points.empty() || m_code_points.back() < c, what, " ", describe(c),
                   " does not come after symbol ", i - 1, " ",
                   describe(m_code_points.empty() ? 0 : m_code_points.back()),
                   ": symbols must be distinct and sorted by code point");
    m_code_points.push_back(c);
    if (c < 128) m_ascii_ids[c] = std::int32_t(i);
  }
}

std::int32_t Vocabulary::find(char32_t code_point) const {
  if (code_point < 128) return m_ascii_ids[code_point];
  const auto it = std::lower_bound(m_code_points.begin(), m_code_points.end(), code_point);
  return it != m_code_points.end() && *it == code_point ? std::int32_t(it - m_code_points.begin()) : -1;
}

std::vector<std::int32_t> Vocabulary::encode(std::string_view utf8, const std::string& what) const {
  std::vector<std::int32_t> ids;
  ids.reserve(utf8.size());
  std::size_t line = 1, column = 1;
  for (std::size_t pos = 0; pos < utf8.size();) {
    const char32_t c = next_code_point(utf8, pos, what);
    const std::int32_t id = find(c);
    LATHER_REQUIRE(id >= 0, "character ", describe(c), " at line ", line, ", column ", column, " of ", what,
                   " is not in the vocabulary (", size(), " characters)");
    ids.push_back(id);
    if (c == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return ids;
}

std::string Vocabulary::decode(std::int32_t id) const {
  LATHER_REQUIRE(id >= 0 && id < size(), "token id ", id, " is out of the vocabulary's range [0, ", size(), ")");
  return m_symbols[std::size_t(id)];
}

std::string Vocabulary::decode(const std::vector<std::int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i) {
    LATHER_REQUIRE(ids[i] >= 0 && ids[i] < size(), "token id ", ids[i], " at position ", i,
                   " is out of the vocabulary's range [0, ", size(), ")");
    text += m_symbols[std::size_t(ids[i])];
  }
  return text;
}

std::string Vocabulary::to_string() const {
  std::string out;
  for (const std::string& symbol : m_symbols) out += symbol;
  return out;
}

Vocabulary Vocabulary::from_string(std::string_view concatenated) {
  std::vector<std::string> symbols;
  for (std::size_t pos = 0; pos < concatenated.size();) {
    const std::size_t start = pos;
    next_code_point(concatenated, pos, "the vocabulary string");
    symbols.emplace_back(concatenated.substr(start, pos - start));
  }
  return Vocabulary(std::move(symbols));
}

TextCorpus load_text_corpus(const std::string& path, double validation_fraction, std::size_t min_tokens,
                            std::size_t max_bytes) {
  LATHER_REQUIRE(std::isfinite(validation_fraction) && validation_fraction > 0 && validation_fraction < 1,
                 "validation_fraction must lie in (0, 1), got ", validation_fraction);
  std::error_code error;
  LATHER_REQUIRE(std::filesystem::exists(path, error), "text corpus '", path,
                 "' does not exist (the Shakespeare corpus: run scripts/fetch-shakespeare, which writes ",
                 default_shakespeare_directory, ")");
  const auto require_length = [&](std::size_t tokens, const std::string& what) {
    LATHER_REQUIRE(tokens >= min_tokens, what, " has ", tokens, " characters, fewer than min_tokens = ", min_tokens);
  };
  TextCorpus corpus;
  if (std::filesystem::is_directory(path, error)) {
    const auto file = [&](const char* name) {
      const auto file_path = std::filesystem::path(path) / name;
      LATHER_REQUIRE(std::filesystem::exists(file_path, error), "text corpus directory '", path, "' has no ", name,
                     " (scripts/fetch-shakespeare writes train.txt and validation.txt)");
      return file_path;
    };
    const auto train_path = file("train.txt"), validation_path = file("validation.txt");
    const std::string train_what = "training text '" + train_path.string() + "'";
    const std::string validation_what = "validation text '" + validation_path.string() + "'";
    const std::string train_text = read_text_file(train_path, max_bytes, "training text");
    corpus.vocabulary = Vocabulary(symbols_of(train_text, train_what));
    corpus.train = corpus.vocabulary.encode(train_text, train_what);
    require_length(corpus.train.size(), train_what);
    corpus.validation =
        corpus.vocabulary.encode(read_text_file(validation_path, max_bytes, "validation text"), validation_what);
    require_length(corpus.validation.size(), validation_what);
    corpus.source = "'" + path + "' (train.txt, validation.txt)";
    return corpus;
  }

  const std::string text = read_text_file(path, max_bytes, "text file");
  const std::string what = "text file '" + path + "'";
  std::size_t characters = 0;
  for (std::size_t pos = 0; pos < text.size(); ++characters) next_code_point(text, pos, what);
  const auto validation_characters =
      std::size_t(std::floor(double(characters) * validation_fraction + 0.5));  // nearest, half up
  const std::size_t train_characters = characters - validation_characters;
  require_length(train_characters, "the training part (the first " + std::to_string(train_characters) + " of " +
                                       std::to_string(characters) + " characters) of " + what);
  require_length(validation_characters, "the validation part (the last " + std::to_string(validation_characters) +
                                            " of " + std::to_string(characters) + " characters) of " + what);
  std::size_t split_byte = 0;
  for (std::size_t k = 0; k < train_characters; ++k) next_code_point(text, split_byte, what);
  corpus.vocabulary = Vocabulary(symbols_of(std::string_view(text).substr(0, split_byte), what));
  // The whole file at once, so that a character missing from the training part is reported with its
  // line and column in the file (it can only lie in the validation part).
  std::vector<std::int32_t> ids = corpus.vocabulary.encode(
      text, "the validation part of " + what + " (from character " + std::to_string(train_characters + 1) + " on)");
  corpus.validation.assign(ids.begin() + std::ptrdiff_t(train_characters), ids.end());
  ids.resize(train_characters);
  corpus.train = std::move(ids);
  corpus.source = "'" + path + "' (the last " + std::to_string(validation_characters) + " of " +
                  std::to_string(characters) + " characters for validation)";
  return corpus;
}

std::vector<std::int64_t> window_offsets(std::uint64_t seed, std::int64_t step, int count, std::int64_t tokens,
                                         int block_size) {
  LATHER_REQUIRE(count >= 0, "window_offsets: count must be >= 0, got ", count);
  LATHER_REQUIRE(block_size >= 1, "window_offsets: block_size must be >= 1, got ", block_size);
  LATHER_REQUIRE(tokens >= std::int64_t(block_size) + 1, "window_offsets: a text of ", tokens,
                 " tokens is shorter than one window of block_size + 1 = ", std::int64_t(block_size) + 1, " tokens");
  const auto range = std::uint64_t(tokens - block_size);
  const std::uint64_t threshold = (std::uint64_t(0) - range) % range;  // 2^64 mod range
  std::mt19937_64 engine(splitmix64(splitmix64(seed) ^ std::uint64_t(step)));
  std::vector<std::int64_t> offsets(static_cast<std::size_t>(count));
  for (std::int64_t& offset : offsets) {
    std::uint64_t x = engine();
    while (x < threshold) x = engine();
    offset = std::int64_t(x % range);
  }
  return offsets;
}

}  // namespace lather::data
