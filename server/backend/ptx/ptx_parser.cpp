#include "server/backend/ptx/ptx_parser.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

namespace gpuproxy::server::ptx {
namespace {

// Numbers in parameter declarations (alignments, array lengths) beyond this are nonsense; bounding
// them keeps every size computation far from overflow.
constexpr std::uint64_t kMaxNumber = 1u << 20;
constexpr std::uint32_t kMaxAlignment = 1u << 12;

enum class TokenKind { kEnd, kWord, kPunct, kString };

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string_view text;

  bool is(char c) const { return kind == TokenKind::kPunct && text.size() == 1 && text[0] == c; }
  bool isWord(std::string_view word) const { return kind == TokenKind::kWord && text == word; }
};

bool isWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%' || c == '.';
}

bool isSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Splits PTX into words (identifiers, directives, numbers), single punctuation characters and
// string literals, dropping whitespace and comments.
class Lexer {
public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Token next() {
    if (peeked_) {
      Token token = *peeked_;
      peeked_.reset();
      return token;
    }
    return scan();
  }

  const Token& peek() {
    if (!peeked_) peeked_ = scan();
    return *peeked_;
  }

  const std::string& error() const { return error_; }

private:
  Token scan() {
    while (position_ < text_.size()) {
      const char c = text_[position_];
      if (isSpace(c)) {
        ++position_;
      } else if (c == '/' && position_ + 1 < text_.size() && text_[position_ + 1] == '/') {
        const std::size_t end = text_.find('\n', position_);
        position_ = end == std::string_view::npos ? text_.size() : end + 1;
      } else if (c == '/' && position_ + 1 < text_.size() && text_[position_ + 1] == '*') {
        const std::size_t end = text_.find("*/", position_ + 2);
        if (end == std::string_view::npos) {
          fail("unterminated /* comment");
          return {};
        }
        position_ = end + 2;
      } else {
        break;
      }
    }
    if (position_ >= text_.size()) return {};

    const std::size_t start = position_;
    const char c = text_[position_];
    if (isWordChar(c)) {
      while (position_ < text_.size() && isWordChar(text_[position_])) ++position_;
      return {TokenKind::kWord, text_.substr(start, position_ - start)};
    }
    if (c == '"') {
      ++position_;
      while (position_ < text_.size() && text_[position_] != '"') {
        if (text_[position_] == '\\') ++position_;
        ++position_;
      }
      if (position_ >= text_.size()) {
        fail("unterminated string literal");
        return {};
      }
      ++position_;
      return {TokenKind::kString, text_.substr(start, position_ - start)};
    }
    ++position_;
    return {TokenKind::kPunct, text_.substr(start, 1)};
  }

  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    position_ = text_.size();
  }

  std::string_view text_;
  std::size_t position_ = 0;
  std::optional<Token> peeked_;
  std::string error_;
};

std::optional<std::uint64_t> parseNumber(std::string_view text) {
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  }
  if (text.empty()) return std::nullopt;
  std::uint64_t value = 0;
  for (const char c : text) {
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (base == 16 && c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (base == 16 && c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0 || digit >= base) return std::nullopt;
    value = value * base + static_cast<std::uint64_t>(digit);
    if (value > kMaxNumber) return std::nullopt;
  }
  return value;
}

bool isIdentifier(std::string_view text) {
  if (text.empty() || text[0] == '.' || (text[0] >= '0' && text[0] <= '9')) return false;
  return std::none_of(text.begin(), text.end(), [](char c) { return c == '.'; });
}

// Size in bytes of a PTX fundamental type usable as a kernel parameter, or 0.
std::uint32_t typeSize(std::string_view type) {
  static constexpr std::pair<std::string_view, std::uint32_t> kTypes[] = {
      {".b8", 1},    {".u8", 1},     {".s8", 1},         {".b16", 2},     {".u16", 2}, {".s16", 2},
      {".f16", 2},   {".bf16", 2},   {".b32", 4},        {".u32", 4},     {".s32", 4}, {".f32", 4},
      {".f16x2", 4}, {".bf16x2", 4}, {".b64", 8},        {".u64", 8},     {".s64", 8}, {".f64", 8},
      {".b128", 16}, {".texref", 8}, {".samplerref", 8}, {".surfref", 8},
  };
  for (const auto& [name, size] : kTypes) {
    if (name == type) return size;
  }
  return 0;
}

bool isStateSpace(std::string_view word) {
  return word == ".global" || word == ".const" || word == ".local" || word == ".shared";
}

std::string quoted(std::string_view text) {
  constexpr std::size_t kMaxShown = 64;
  std::string shown(text.substr(0, kMaxShown));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return "'" + shown + (text.size() > kMaxShown ? "...'" : "'");
}

class Parser {
public:
  explicit Parser(std::string_view text) : lexer_(text) {}

  PtxParseResult run() {
    PtxParseResult result;
    std::uint64_t depth = 0;
    std::set<std::string, std::less<>> names;
    while (error_.empty()) {
      const Token token = lexer_.next();
      if (token.kind == TokenKind::kEnd) break;
      if (token.is('{')) {
        ++depth;
      } else if (token.is('}')) {
        if (depth == 0) {
          fail("unbalanced '}'");
          break;
        }
        --depth;
      } else if (depth == 0 && token.isWord(".entry")) {
        bool defined = false;
        std::optional<PtxEntry> entry = parseEntry(depth, defined);
        if (!entry) break;
        if (!defined) continue;  // a declaration of a kernel defined elsewhere
        if (!names.insert(entry->name).second) {
          fail("duplicate .entry " + quoted(entry->name));
          break;
        }
        result.module.entries.push_back(std::move(*entry));
      }
    }
    if (error_.empty() && !lexer_.error().empty()) error_ = lexer_.error();
    if (error_.empty() && depth != 0) error_ = "unterminated '{' block at end of input";
    if (!error_.empty()) {
      result.module.entries.clear();
      result.error = std::move(error_);
    }
    return result;
  }

private:
  // Parses what follows `.entry`; `defined` says whether a body follows (a definition) or `;` (a
  // declaration of a kernel defined elsewhere). On a body, `depth` counts its opening brace.
  std::optional<PtxEntry> parseEntry(std::uint64_t& depth, bool& defined) {
    const Token name = lexer_.next();
    if (name.kind != TokenKind::kWord || !isIdentifier(name.text)) {
      fail(".entry without a valid name");
      return std::nullopt;
    }
    PtxEntry entry;
    entry.name = std::string(name.text);
    if (lexer_.peek().is('(')) {
      lexer_.next();
      if (lexer_.peek().is(')')) {
        lexer_.next();
      } else {
        std::set<std::string, std::less<>> parameterNames;
        std::uint64_t end = 0;
        for (;;) {
          std::optional<PtxParameter> parameter = parseParameter(entry.name, end);
          if (!parameter) return std::nullopt;
          if (!parameterNames.insert(parameter->name).second) {
            fail("duplicate parameter " + quoted(parameter->name) + " in .entry " +
                 quoted(entry.name));
            return std::nullopt;
          }
          entry.parameters.push_back(std::move(*parameter));
          const Token separator = lexer_.next();
          if (separator.is(')')) break;
          if (!separator.is(',')) {
            fail("expected ',' or ')' in the parameter list of .entry " + quoted(entry.name));
            return std::nullopt;
          }
        }
        entry.parameterBytes = static_cast<std::uint32_t>(end);
      }
    }
    // Performance directives (.maxntid 256, 1, 1 and the like) may sit between the parameter list
    // and the body.
    for (;;) {
      const Token token = lexer_.next();
      if (token.is('{')) {
        ++depth;
        defined = true;
        return entry;
      }
      if (token.is(';')) {
        defined = false;
        return entry;
      }
      if (token.kind == TokenKind::kEnd) {
        fail(".entry " + quoted(entry.name) + " has no body");
        return std::nullopt;
      }
      if (token.kind != TokenKind::kWord && !token.is(',')) {
        fail("unexpected " + quoted(token.text) + " after the parameters of .entry " +
             quoted(entry.name));
        return std::nullopt;
      }
    }
  }

  // One `.param ...` declaration; `end` is the packed size so far and is advanced past it.
  std::optional<PtxParameter> parseParameter(std::string_view entryName, std::uint64_t& end) {
    const std::string where = " in .entry " + quoted(entryName);
    if (!lexer_.next().isWord(".param")) {
      fail("expected .param" + where);
      return std::nullopt;
    }
    std::uint32_t explicitAlignment = 0;
    std::uint32_t elementSize = 0;
    std::uint32_t vector = 1;
    bool pointer = false;
    Token token;
    for (;;) {
      token = lexer_.next();
      if (token.kind != TokenKind::kWord) {
        fail("malformed .param" + where);
        return std::nullopt;
      }
      if (token.text[0] != '.') break;
      if (token.text == ".align") {
        const Token number = lexer_.next();
        const std::optional<std::uint64_t> value =
            number.kind == TokenKind::kWord ? parseNumber(number.text) : std::nullopt;
        if (!value || *value == 0 || *value > kMaxAlignment || (*value & (*value - 1)) != 0) {
          fail("bad .align value" + where);
          return std::nullopt;
        }
        // After .ptr, .align describes the memory pointed to, not the parameter itself.
        if (!pointer) explicitAlignment = static_cast<std::uint32_t>(*value);
      } else if (token.text == ".ptr") {
        if (elementSize == 0) {
          fail(".ptr before the parameter's type" + where);
          return std::nullopt;
        }
        pointer = true;
      } else if (isStateSpace(token.text)) {
        if (!pointer) {
          fail(quoted(token.text) + " without .ptr" + where);
          return std::nullopt;
        }
      } else if (token.text == ".v2" || token.text == ".v4") {
        if (vector != 1 || elementSize != 0) {
          fail("misplaced vector qualifier" + where);
          return std::nullopt;
        }
        vector = token.text == ".v2" ? 2 : 4;
      } else if (const std::uint32_t size = typeSize(token.text); size != 0) {
        if (elementSize != 0) {
          fail("two types for one .param" + where);
          return std::nullopt;
        }
        elementSize = size;
      } else {
        fail("unknown .param qualifier " + quoted(token.text) + where);
        return std::nullopt;
      }
    }
    if (elementSize == 0) {
      fail(".param without a type" + where);
      return std::nullopt;
    }
    if (!isIdentifier(token.text)) {
      fail("bad parameter name " + quoted(token.text) + where);
      return std::nullopt;
    }
    PtxParameter parameter;
    parameter.name = std::string(token.text);

    std::uint64_t count = 1;
    if (lexer_.peek().is('[')) {
      lexer_.next();
      const Token number = lexer_.next();
      const std::optional<std::uint64_t> value =
          number.kind == TokenKind::kWord ? parseNumber(number.text) : std::nullopt;
      if (!value || *value == 0 || !lexer_.next().is(']')) {
        fail("bad array length for parameter " + quoted(parameter.name) + where);
        return std::nullopt;
      }
      count = *value;
    }

    const std::uint64_t natural = std::uint64_t{elementSize} * vector;
    const std::uint64_t alignment = std::max<std::uint64_t>(explicitAlignment, natural);
    const std::uint64_t size = natural * count;
    const std::uint64_t offset = (end + alignment - 1) / alignment * alignment;
    if (size > kMaxParameterBytes || offset + size > kMaxParameterBytes) {
      fail("parameters exceed " + std::to_string(kMaxParameterBytes) + " bytes" + where);
      return std::nullopt;
    }
    parameter.offset = static_cast<std::uint32_t>(offset);
    parameter.size = static_cast<std::uint32_t>(size);
    parameter.alignment = static_cast<std::uint32_t>(alignment);
    end = offset + size;
    return parameter;
  }

  void fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
  }

  Lexer lexer_;
  std::string error_;
};

std::string_view untilNul(std::span<const std::byte> image) {
  const char* begin = reinterpret_cast<const char*>(image.data());
  const void* nul = std::memchr(begin, 0, image.size());
  const std::size_t length = nul == nullptr
                                 ? image.size()
                                 : static_cast<std::size_t>(static_cast<const char*>(nul) - begin);
  return {begin, length};
}

}  // namespace

PtxParseResult parsePtx(std::string_view text) {
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    text = text.substr(0, nul);
  }
  return Parser(text).run();
}

PtxParseResult parsePtx(std::span<const std::byte> image) {
  if (image.empty()) return parsePtx(std::string_view{});
  return parsePtx(untilNul(image));
}

bool looksLikePtx(std::span<const std::byte> image) {
  if (image.empty()) return false;
  const std::string_view text = untilNul(image);
  return text.find(".version") != std::string_view::npos &&
         text.find(".target") != std::string_view::npos;
}

}  // namespace gpuproxy::server::ptx
