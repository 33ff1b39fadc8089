#include "server/backend/ptx/ptx_frontend.hpp"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/backend/ptx/ptx_exec.hpp"
#include "server/backend/ptx/ptx_syntax.hpp"

namespace gpuproxy::server::ptx {

const Function* Program::findFunction(const std::string& name) const {
  for (const Function& function : functions) {
    if (function.name == name) return &function;
  }
  return nullptr;
}

const Variable* Program::findVariable(const std::string& name) const {
  for (const Variable& variable : variables) {
    if (variable.name == name) return &variable;
  }
  return nullptr;
}

Type parseType(std::string_view word) {
  static constexpr std::pair<std::string_view, Type> kTypes[] = {
      {".b8", Type::kB8},     {".b16", Type::kB16},       {".b32", Type::kB32},
      {".b64", Type::kB64},   {".b128", Type::kB128},     {".u8", Type::kU8},
      {".u16", Type::kU16},   {".u32", Type::kU32},       {".u64", Type::kU64},
      {".s8", Type::kS8},     {".s16", Type::kS16},       {".s32", Type::kS32},
      {".s64", Type::kS64},   {".f16", Type::kF16},       {".f16x2", Type::kF16x2},
      {".bf16", Type::kBf16}, {".bf16x2", Type::kBf16x2}, {".tf32", Type::kTf32},
      {".f32", Type::kF32},   {".f64", Type::kF64},       {".pred", Type::kPred},
  };
  for (const auto& [name, type] : kTypes) {
    if (name == word) return type;
  }
  return Type::kNone;
}

unsigned typeBytes(Type type) {
  switch (type) {
    case Type::kB8:
    case Type::kU8:
    case Type::kS8:
      return 1;
    case Type::kB16:
    case Type::kU16:
    case Type::kS16:
    case Type::kF16:
    case Type::kBf16:
      return 2;
    case Type::kB32:
    case Type::kU32:
    case Type::kS32:
    case Type::kF32:
    case Type::kF16x2:
    case Type::kBf16x2:
    case Type::kTf32:
      return 4;
    case Type::kB64:
    case Type::kU64:
    case Type::kS64:
    case Type::kF64:
      return 8;
    case Type::kB128:
      return 16;
    case Type::kPred:
      return 1;
    case Type::kNone:
      return 0;
  }
  return 0;
}

bool isSigned(Type type) {
  return type == Type::kS8 || type == Type::kS16 || type == Type::kS32 || type == Type::kS64;
}

bool isFloat(Type type) {
  return type == Type::kF16 || type == Type::kBf16 || type == Type::kF32 || type == Type::kF64 ||
         type == Type::kTf32;
}

bool isInteger(Type type) {
  switch (type) {
    case Type::kB8:
    case Type::kB16:
    case Type::kB32:
    case Type::kB64:
    case Type::kU8:
    case Type::kU16:
    case Type::kU32:
    case Type::kU64:
    case Type::kS8:
    case Type::kS16:
    case Type::kS32:
    case Type::kS64:
      return true;
    default:
      return false;
  }
}

namespace {

constexpr std::uint64_t kMaxCount = 1ull << 32;
constexpr std::uint32_t kMaxAlignment = 1u << 16;
constexpr std::size_t kMaxScopeDepth = 256;
constexpr std::size_t kMaxOperands = 64;

// ---- Lexer --------------------------------------------------------------------------------

enum class TokenKind : std::uint8_t { kEnd, kWord, kPunct, kString };

struct Token {
  TokenKind kind = TokenKind::kEnd;
  std::string_view text;
  std::uint32_t line = 0;

  bool is(char c) const { return kind == TokenKind::kPunct && text.size() == 1 && text[0] == c; }
  bool isWord(std::string_view word) const { return kind == TokenKind::kWord && text == word; }
  bool end() const { return kind == TokenKind::kEnd; }
};

bool isWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$' || c == '%' || c == '.';
}

class Lexer {
public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Token next() {
    if (hasPeeked_) {
      hasPeeked_ = false;
      return peeked_;
    }
    return scan();
  }
  const Token& peek() {
    if (!hasPeeked_) {
      peeked_ = scan();
      hasPeeked_ = true;
    }
    return peeked_;
  }
  // Drops the rest of the current line (for .loc and .file, which end at the newline).
  void skipLine(std::uint32_t line) {
    if (hasPeeked_ && peeked_.line != line) return;
    hasPeeked_ = false;
    while (position_ < text_.size() && text_[position_] != '\n') ++position_;
  }
  const std::string& error() const { return error_; }
  std::uint32_t line() const { return line_; }

private:
  Token scan() {
    while (position_ < text_.size()) {
      const char c = text_[position_];
      if (c == '\n') {
        ++line_;
        ++position_;
      } else if (c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v') {
        ++position_;
      } else if (c == '/' && position_ + 1 < text_.size() && text_[position_ + 1] == '/') {
        while (position_ < text_.size() && text_[position_] != '\n') ++position_;
      } else if (c == '/' && position_ + 1 < text_.size() && text_[position_ + 1] == '*') {
        const std::size_t end = text_.find("*/", position_ + 2);
        if (end == std::string_view::npos) {
          fail("unterminated /* comment");
          return {};
        }
        line_ += static_cast<std::uint32_t>(
            std::count(text_.begin() + static_cast<std::ptrdiff_t>(position_),
                       text_.begin() + static_cast<std::ptrdiff_t>(end), '\n'));
        position_ = end + 2;
      } else {
        break;
      }
    }
    if (position_ >= text_.size()) return Token{TokenKind::kEnd, {}, line_};
    const std::size_t start = position_;
    const char c = text_[position_];
    if (isWordChar(c)) {
      while (position_ < text_.size()) {
        const char d = text_[position_];
        if (d == '.' && c == '.' && position_ > start) {
          break;  // directives and qualifiers are words of their own: ".reg.b32" is ".reg .b32"
        }
        if (isWordChar(d)) {
          ++position_;
        } else if (d == ':' && position_ + 2 < text_.size() && text_[position_ + 1] == ':' &&
                   isWordChar(text_[position_ + 2])) {
          position_ += 2;  // a qualifier such as .L2::cache_hint
        } else if ((d == '+' || d == '-') && position_ > start && c >= '0' && c <= '9' &&
                   (text_[position_ - 1] == 'e' || text_[position_ - 1] == 'E') &&
                   !(text_.substr(start, 2) == "0x" || text_.substr(start, 2) == "0X" ||
                     text_.substr(start, 2) == "0f" || text_.substr(start, 2) == "0F" ||
                     text_.substr(start, 2) == "0d" || text_.substr(start, 2) == "0D")) {
          ++position_;  // the exponent sign of a decimal float: 1.5e-3
        } else {
          break;
        }
      }
      return Token{TokenKind::kWord, text_.substr(start, position_ - start), line_};
    }
    if (c == '"') {
      ++position_;
      while (position_ < text_.size() && text_[position_] != '"') {
        if (text_[position_] == '\n') break;
        if (text_[position_] == '\\') ++position_;
        ++position_;
      }
      if (position_ >= text_.size() || text_[position_] != '"') {
        fail("unterminated string literal");
        return {};
      }
      ++position_;
      return Token{TokenKind::kString, text_.substr(start, position_ - start), line_};
    }
    ++position_;
    return Token{TokenKind::kPunct, text_.substr(start, 1), line_};
  }

  void fail(std::string message) {
    if (error_.empty()) error_ = "line " + std::to_string(line_) + ": " + std::move(message);
    position_ = text_.size();
  }

  std::string_view text_;
  std::size_t position_ = 0;
  std::uint32_t line_ = 1;
  Token peeked_;
  bool hasPeeked_ = false;
  std::string error_;
};

std::string shown(std::string_view text) {
  constexpr std::size_t kMaxShown = 80;
  std::string out(text.substr(0, kMaxShown));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  if (text.size() > kMaxShown) out += "...";
  return "'" + out + "'";
}

std::optional<std::uint64_t> parseUnsigned(std::string_view text) {
  if (text.empty()) return std::nullopt;
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    base = 16;
    text.remove_prefix(2);
  } else if (text.size() > 2 && text[0] == '0' && (text[1] == 'b' || text[1] == 'B')) {
    base = 2;
    text.remove_prefix(2);
  } else if (text.size() > 1 && text[0] == '0') {
    base = 8;
    text.remove_prefix(1);
  }
  if (!text.empty() && (text.back() == 'U' || text.back() == 'u')) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// 0f3F800000 (f32 bits), 0d3FF0000000000000 (f64 bits) or a decimal float.
struct FloatLiteral {
  std::uint64_t bits = 0;
  bool single = false;  // 0f
  bool hexDouble = false;
};

std::optional<FloatLiteral> parseFloatLiteral(std::string_view text) {
  if (text.size() == 10 && text[0] == '0' && (text[1] == 'f' || text[1] == 'F')) {
    const auto bits = parseUnsigned("0x" + std::string(text.substr(2)));
    if (!bits) return std::nullopt;
    return FloatLiteral{*bits, true, false};
  }
  if (text.size() == 18 && text[0] == '0' && (text[1] == 'd' || text[1] == 'D')) {
    const auto bits = parseUnsigned("0x" + std::string(text.substr(2)));
    if (!bits) return std::nullopt;
    return FloatLiteral{*bits, false, true};
  }
  // A hexadecimal integer (0xfe, 0x8E: inline assembly writes them) holds an 'e' but is no float.
  if (text.size() > 1 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) return std::nullopt;
  if (text.find_first_of(".eE") == std::string_view::npos) return std::nullopt;
  if (text.empty() || !((text[0] >= '0' && text[0] <= '9') || text[0] == '.')) return std::nullopt;
  std::string copy(text);
  char* end = nullptr;
  const double value = std::strtod(copy.c_str(), &end);
  if (end != copy.c_str() + copy.size()) return std::nullopt;
  return FloatLiteral{std::bit_cast<std::uint64_t>(value), false, false};
}

// ---- Syntax tree of a module ----------------------------------------------------------------

struct InitItem {
  enum class Kind : std::uint8_t { kNumber, kFloat, kSymbol };
  Kind kind = Kind::kNumber;
  std::uint64_t bits = 0;
  FloatLiteral floating;
  std::string symbol;
  std::int64_t addend = 0;
  bool generic = false;
  std::uint64_t mask = 0;  // 0xFF00(sym): a byte of an address; 0: the whole value
};

struct VariableDecl {
  Space space = Space::kGlobal;
  std::string name;
  Type type = Type::kNone;
  std::uint32_t alignment = 0;
  std::uint32_t vector = 1;
  std::uint64_t count = 1;  // elements (product of the array dimensions)
  bool unsized = false;     // name[]
  bool external = false;
  bool managed = false;  // .attribute(.managed)
  bool hasInitializer = false;
  std::vector<InitItem> initializer;
  std::uint32_t line = 0;
  std::uint64_t bytes() const { return std::uint64_t{typeBytes(type)} * vector * count; }
  std::uint32_t naturalAlignment() const {
    return std::max<std::uint32_t>(1, typeBytes(type) * vector);
  }
};

struct ParamDecl {
  std::string name;
  Type type = Type::kNone;
  std::uint32_t alignment = 0;
  std::uint32_t vector = 1;
  std::uint64_t count = 1;
  bool isRegister = false;
  std::uint64_t bytes() const { return std::uint64_t{typeBytes(type)} * vector * count; }
  std::uint32_t align() const {
    return std::max<std::uint32_t>(alignment, std::max<std::uint32_t>(1, typeBytes(type) * vector));
  }
};

struct RegisterDecl {
  Type type = Type::kNone;
  std::uint32_t vector = 1;
  std::string name;         // a single register, or the prefix of a range
  std::uint32_t count = 0;  // %r<45>: 45; 0 for a single register
};

struct Statement {
  enum class Kind : std::uint8_t {
    kOpen,
    kClose,
    kRegisters,
    kVariable,
    kLabel,
    kInstruction,
    kPrototype
  };
  Kind kind = Kind::kInstruction;
  std::uint32_t line = 0;
  std::vector<RegisterDecl> registers;
  VariableDecl variable;  // kVariable (.local, .shared, .param, .const inside a body)
  std::string label;      // kLabel, kPrototype
  ParsedInstruction instruction;
  std::vector<ParamDecl> prototypeResults;  // kPrototype
  std::vector<ParamDecl> prototypeParameters;
};

struct FunctionDecl {
  std::string name;
  bool isKernel = false;
  bool defined = false;
  bool external = false;
  std::vector<ParamDecl> results;
  std::vector<ParamDecl> parameters;
  std::uint32_t maxThreads[3] = {0, 0, 0};
  std::uint32_t requiredThreads[3] = {0, 0, 0};
  std::uint32_t minBlocksPerSm = 0;  // .minnctapersm; 0: none
  std::uint32_t maxRegisters = 0;    // .maxnreg; 0: none
  std::vector<Statement> body;
  std::uint32_t line = 0;
  std::string unsupported;  // the first directive of it the interpreter cannot honour
};

struct ModuleSyntax {
  std::uint32_t major = 0;
  std::uint32_t minor = 0;
  std::uint32_t sm = 0;
  bool sawVersion = false;
  bool sawTarget = false;
  std::vector<VariableDecl> variables;
  std::vector<FunctionDecl> functions;
  std::string unsupported;  // a module-level feature the interpreter cannot honour
};

// ---- Parser -------------------------------------------------------------------------------

class Parser {
public:
  explicit Parser(std::string_view text) : lexer_(text) {}

  bool run(ModuleSyntax& module) {
    module_ = &module;
    while (ok()) {
      Token token = lexer_.next();
      if (token.end()) break;
      if (!topLevel(token)) break;
    }
    if (error_.empty() && !lexer_.error().empty()) error_ = lexer_.error();
    return error_.empty();
  }

  const std::string& error() const { return error_; }

private:
  bool ok() const { return error_.empty() && lexer_.error().empty(); }

  bool fail(std::uint32_t line, const std::string& message) {
    if (error_.empty()) error_ = "line " + std::to_string(line) + ": " + message;
    return false;
  }

  bool expect(char c, const char* where) {
    const Token token = lexer_.next();
    if (token.is(c)) return true;
    return fail(token.line,
                std::string("expected '") + c + "' " + where + ", found " + shown(token.text));
  }

  std::optional<std::uint64_t> number(const char* what) {
    Token token = lexer_.next();
    bool negative = false;
    if (token.is('-')) {
      negative = true;
      token = lexer_.next();
    }
    const std::optional<std::uint64_t> value =
        token.kind == TokenKind::kWord ? parseUnsigned(token.text) : std::nullopt;
    if (!value || negative) {
      fail(token.line, std::string("expected ") + what + ", found " + shown(token.text));
      return std::nullopt;
    }
    return value;
  }

  bool topLevel(const Token& first) {
    Token token = first;
    if (token.isWord(".version")) {
      const Token version = lexer_.next();
      const std::size_t dot = version.text.find('.');
      const auto major = parseUnsigned(version.text.substr(0, dot));
      const auto minor = dot == std::string_view::npos
                             ? std::optional<std::uint64_t>(0)
                             : parseUnsigned(version.text.substr(dot + 1));
      if (version.kind != TokenKind::kWord || !major || !minor || *major > 99 || *minor > 99) {
        return fail(version.line, "bad .version " + shown(version.text));
      }
      module_->major = static_cast<std::uint32_t>(*major);
      module_->minor = static_cast<std::uint32_t>(*minor);
      module_->sawVersion = true;
      return true;
    }
    if (token.isWord(".target")) {
      for (;;) {
        const Token target = lexer_.next();
        if (target.kind != TokenKind::kWord) return fail(target.line, "bad .target");
        if (target.text.substr(0, 3) == "sm_" || target.text.substr(0, 8) == "compute_") {
          std::string_view digits = target.text.substr(target.text[0] == 's' ? 3 : 8);
          while (!digits.empty() && !(digits.back() >= '0' && digits.back() <= '9')) {
            digits.remove_suffix(1);  // sm_90a
          }
          const auto sm = parseUnsigned(digits);
          if (!sm || *sm > 1000) return fail(target.line, "bad .target " + shown(target.text));
          module_->sm = static_cast<std::uint32_t>(*sm);
        } else if (target.text == "texmode_independent" || target.text == "texmode_unified" ||
                   target.text == "debug" || target.text == "map_f64_to_f32") {
          if (target.text == "map_f64_to_f32" && module_->unsupported.empty()) {
            module_->unsupported = ".target map_f64_to_f32";
          }
        } else {
          return fail(target.line, "unknown .target " + shown(target.text));
        }
        if (!lexer_.peek().is(',')) break;
        lexer_.next();
      }
      module_->sawTarget = true;
      return true;
    }
    if (token.isWord(".address_size")) {
      const auto size = number("an address size");
      if (!size) return false;
      if (*size != 64 && module_->unsupported.empty()) module_->unsupported = ".address_size 32";
      if (*size != 64 && *size != 32) return fail(token.line, "bad .address_size");
      return true;
    }
    if (token.isWord(".file")) {
      lexer_.skipLine(token.line);
      return true;
    }
    if (token.isWord(".section")) return skipSection(token);
    if (token.isWord(".pragma")) return skipPragma(token);
    if (token.isWord(".alias")) {
      if (module_->unsupported.empty()) module_->unsupported = ".alias";
      return skipTo(';');
    }
    bool external = false;
    for (;;) {
      if (token.isWord(".visible") || token.isWord(".weak") || token.isWord(".common")) {
        token = lexer_.next();
      } else if (token.isWord(".extern")) {
        external = true;
        token = lexer_.next();
      } else {
        break;
      }
    }
    if (token.isWord(".entry") || token.isWord(".func")) {
      return function(token.isWord(".entry"), external, token.line);
    }
    if (token.isWord(".global") || token.isWord(".const") || token.isWord(".shared") ||
        token.isWord(".local") || token.isWord(".tex") || token.isWord(".texref") ||
        token.isWord(".samplerref") || token.isWord(".surfref")) {
      VariableDecl variable;
      if (!variableDecl(token, external, variable)) return false;
      module_->variables.push_back(std::move(variable));
      return true;
    }
    return fail(token.line, "unexpected " + shown(token.text) + " at module level");
  }

  bool skipTo(char c) {
    for (;;) {
      const Token token = lexer_.next();
      if (token.end()) return fail(token.line, std::string("missing '") + c + "'");
      if (token.is(c)) return true;
    }
  }

  bool skipPragma(const Token& pragma) {
    const Token text = lexer_.next();
    if (text.kind != TokenKind::kString) return fail(pragma.line, ".pragma without a string");
    return expect(';', "after .pragma");
  }

  // .section name { ... }: debug information, which the interpreter does not need.
  bool skipSection(const Token& section) {
    const Token name = lexer_.next();
    if (name.kind != TokenKind::kWord) return fail(section.line, "bad .section");
    if (!expect('{', "after .section")) return false;
    std::size_t depth = 1;
    while (depth > 0) {
      const Token token = lexer_.next();
      if (token.end()) return fail(section.line, "unterminated .section");
      if (token.is('{')) ++depth;
      if (token.is('}')) --depth;
    }
    return true;
  }

  // [.align N] [.v2|.v4] .type name[dims] [= init] ;  (the state space word already read)
  bool variableDecl(const Token& spaceToken, bool external, VariableDecl& variable) {
    variable.line = spaceToken.line;
    variable.external = external;
    const std::string_view spaceWord = spaceToken.text;
    if (spaceWord == ".global") {
      variable.space = Space::kGlobal;
    } else if (spaceWord == ".const") {
      variable.space = Space::kConst;
    } else if (spaceWord == ".shared") {
      variable.space = Space::kShared;
    } else if (spaceWord == ".local") {
      variable.space = Space::kLocal;
    } else if (spaceWord == ".param") {
      variable.space = Space::kParam;
    } else {
      // Texture, sampler and surface references.
      if (module_->unsupported.empty()) module_->unsupported = std::string(spaceWord);
      return skipTo(';');
    }
    for (;;) {
      const Token token = lexer_.next();
      if (token.kind != TokenKind::kWord) {
        return fail(token.line, "malformed variable declaration near " + shown(token.text));
      }
      if (token.text == ".align") {
        const auto alignment = number("an alignment");
        if (!alignment) return false;
        if (*alignment == 0 || *alignment > kMaxAlignment || !std::has_single_bit(*alignment)) {
          return fail(token.line, "bad .align");
        }
        variable.alignment = static_cast<std::uint32_t>(*alignment);
      } else if (token.text == ".v2" || token.text == ".v4" || token.text == ".v8") {
        variable.vector = token.text == ".v2" ? 2 : token.text == ".v4" ? 4 : 8;
      } else if (token.text == ".attribute") {
        // .attribute(.managed) on a .global variable; any other attribute is not executed.
        if (!lexer_.next().is('(')) return fail(token.line, "malformed .attribute");
        const Token which = lexer_.next();
        if (which.isWord(".managed") && variable.space == Space::kGlobal && lexer_.peek().is(')')) {
          lexer_.next();
          variable.managed = true;
          continue;
        }
        if (module_->unsupported.empty()) {
          module_->unsupported = "variable .attribute " + shown(which.text);
        }
        return skipTo(';');
      } else if (token.text == ".ptr" || token.text == ".global" || token.text == ".shared" ||
                 token.text == ".const" || token.text == ".local") {
        continue;
      } else if (const Type type = parseType(token.text); type != Type::kNone) {
        if (type == Type::kPred) return fail(token.line, "a variable cannot be .pred");
        variable.type = type;
      } else if (token.text[0] == '.') {
        if (token.text == ".texref" || token.text == ".samplerref" || token.text == ".surfref") {
          if (module_->unsupported.empty()) module_->unsupported = std::string(token.text);
          return skipTo(';');
        }
        return fail(token.line, "unknown qualifier " + shown(token.text));
      } else {
        if (variable.type == Type::kNone) return fail(token.line, "variable without a type");
        variable.name = std::string(token.text);
        break;
      }
    }
    // Array dimensions.
    while (lexer_.peek().is('[')) {
      lexer_.next();
      if (lexer_.peek().is(']')) {
        lexer_.next();
        variable.unsized = true;
        continue;
      }
      const auto count = number("an array length");
      if (!count) return false;
      if (!expect(']', "after an array length")) return false;
      if (*count == 0 && !variable.external) return fail(variable.line, "zero-length array");
      if (variable.count > kMaxCount / std::max<std::uint64_t>(*count, 1)) {
        return fail(variable.line, "array too large");
      }
      variable.count *= *count;
    }
    if (lexer_.peek().is('=')) {
      lexer_.next();
      variable.hasInitializer = true;
      if (!initializer(variable)) return false;
    }
    if (variable.unsized) {
      if (variable.hasInitializer) {
        variable.count = std::max<std::uint64_t>(1, variable.initializer.size() / variable.vector);
      } else {
        variable.count = 0;  // extern .shared x[]: dynamic shared memory
      }
    }
    if (variable.bytes() > kMaxVariableBytes) return fail(variable.line, "variable too large");
    return expect(';', "after a variable declaration");
  }

  // = value | {values, {nested}}: flattened in order.
  bool initializer(VariableDecl& variable) {
    std::size_t depth = 0;
    for (;;) {
      Token token = lexer_.next();
      if (token.is('{')) {
        if (++depth > kMaxScopeDepth) return fail(token.line, "initializer nested too deep");
        continue;
      }
      if (token.is('}')) {
        if (depth == 0) return fail(token.line, "unbalanced '}' in an initializer");
        --depth;
      } else {
        InitItem item;
        if (!initItem(token, item)) return false;
        variable.initializer.push_back(std::move(item));
        if (variable.initializer.size() > kMaxCount)
          return fail(token.line, "initializer too long");
      }
      if (depth == 0) return true;
      if (lexer_.peek().is(',')) {
        lexer_.next();
      } else if (!lexer_.peek().is('}')) {
        return fail(lexer_.peek().line, "expected ',' in an initializer");
      }
    }
  }

  bool initItem(Token token, InitItem& item) {
    bool negative = false;
    if (token.is('-')) {
      negative = true;
      token = lexer_.next();
    }
    if (token.kind != TokenKind::kWord) {
      return fail(token.line, "bad initializer value " + shown(token.text));
    }
    if (token.text == "generic") {
      if (!expect('(', "after generic")) return false;
      const Token symbol = lexer_.next();
      if (symbol.kind != TokenKind::kWord) return fail(symbol.line, "bad generic()");
      item.kind = InitItem::Kind::kSymbol;
      item.symbol = std::string(symbol.text);
      item.generic = true;
      if (!expect(')', "after generic(symbol")) return false;
      return symbolAddend(item);
    }
    if (const auto floating = parseFloatLiteral(token.text)) {
      item.kind = InitItem::Kind::kFloat;
      item.floating = *floating;
      if (negative) {
        if (floating->single) {
          item.floating.bits ^= 0x80000000u;
        } else {
          item.floating.bits ^= 0x8000000000000000ull;
        }
      }
      return true;
    }
    if (const auto value = parseUnsigned(token.text)) {
      if (lexer_.peek().is('(')) {
        // 0xFF00(symbol): one byte of an address.
        lexer_.next();
        item.kind = InitItem::Kind::kSymbol;
        item.mask = *value;
        Token symbol = lexer_.next();
        if (symbol.isWord("generic")) {
          if (!expect('(', "after generic")) return false;
          symbol = lexer_.next();
          item.generic = true;
          if (!expect(')', "after generic(symbol")) return false;
        }
        if (symbol.kind != TokenKind::kWord) return fail(symbol.line, "bad address mask");
        item.symbol = std::string(symbol.text);
        if (!symbolAddend(item)) return false;
        return expect(')', "after a masked address");
      }
      item.kind = InitItem::Kind::kNumber;
      item.bits = negative ? (~*value + 1) : *value;
      return true;
    }
    if (negative) return fail(token.line, "bad initializer value");
    item.kind = InitItem::Kind::kSymbol;
    item.symbol = std::string(token.text);
    return symbolAddend(item);
  }

  bool symbolAddend(InitItem& item) {
    if (lexer_.peek().is('+') || lexer_.peek().is('-')) {
      const bool minus = lexer_.next().is('-');
      const auto value = number("an offset");
      if (!value) return false;
      item.addend = minus ? -static_cast<std::int64_t>(*value) : static_cast<std::int64_t>(*value);
    }
    return true;
  }

  // .param [.align N] [.ptr .space .align N] .type name[N] (or .reg .type name)
  bool paramDecl(ParamDecl& parameter, bool allowUnnamed) {
    Token token = lexer_.next();
    if (token.isWord(".reg")) {
      parameter.isRegister = true;
    } else if (!token.isWord(".param")) {
      return fail(token.line, "expected .param, found " + shown(token.text));
    }
    bool pointer = false;
    for (;;) {
      token = lexer_.next();
      if (token.kind != TokenKind::kWord) return fail(token.line, "malformed .param");
      if (token.text == ".align") {
        const auto alignment = number("an alignment");
        if (!alignment) return false;
        if (*alignment == 0 || *alignment > kMaxAlignment || !std::has_single_bit(*alignment)) {
          return fail(token.line, "bad .align");
        }
        if (!pointer) parameter.alignment = static_cast<std::uint32_t>(*alignment);
      } else if (token.text == ".ptr") {
        pointer = true;
      } else if (token.text == ".global" || token.text == ".shared" || token.text == ".const" ||
                 token.text == ".local") {
        continue;
      } else if (token.text == ".v2" || token.text == ".v4") {
        parameter.vector = token.text == ".v2" ? 2 : 4;
      } else if (const Type type = parseType(token.text); type != Type::kNone) {
        parameter.type = type;
      } else if (token.text[0] == '.') {
        return fail(token.line, "unknown .param qualifier " + shown(token.text));
      } else {
        break;
      }
    }
    if (parameter.type == Type::kNone) return fail(token.line, ".param without a type");
    if (token.kind != TokenKind::kWord) return fail(token.line, "bad parameter name");
    parameter.name = std::string(token.text);
    if (parameter.name == "_" && !allowUnnamed) return fail(token.line, "unnamed parameter");
    while (lexer_.peek().is('[')) {
      lexer_.next();
      const auto count = number("an array length");
      if (!count) return false;
      if (!expect(']', "after an array length")) return false;
      if (*count == 0 || *count > kMaxCount) return fail(token.line, "bad parameter array length");
      parameter.count *= *count;
      if (parameter.bytes() > kMaxCount) return fail(token.line, "parameter too large");
    }
    return true;
  }

  bool paramList(std::vector<ParamDecl>& list, bool allowUnnamed) {
    if (!expect('(', "before a parameter list")) return false;
    if (lexer_.peek().is(')')) {
      lexer_.next();
      return true;
    }
    for (;;) {
      ParamDecl parameter;
      if (!paramDecl(parameter, allowUnnamed)) return false;
      list.push_back(std::move(parameter));
      if (list.size() > 4096) return fail(lexer_.line(), "too many parameters");
      const Token separator = lexer_.next();
      if (separator.is(')')) return true;
      if (!separator.is(',')) return fail(separator.line, "expected ',' or ')' in parameters");
    }
  }

  bool dimensions(std::uint32_t (&out)[3]) {
    for (int i = 0; i < 3; ++i) {
      const auto value = number("a thread count");
      if (!value) return false;
      if (*value == 0 || *value > 1024 * 1024) return fail(lexer_.line(), "bad thread count");
      out[i] = static_cast<std::uint32_t>(*value);
      if (!lexer_.peek().is(',')) {
        for (int j = i + 1; j < 3; ++j) out[j] = 1;
        return true;
      }
      lexer_.next();
    }
    return true;
  }

  bool function(bool isKernel, bool external, std::uint32_t line) {
    FunctionDecl function;
    function.isKernel = isKernel;
    function.external = external;
    function.line = line;
    if (!isKernel && lexer_.peek().is('(')) {
      if (!paramList(function.results, false)) return false;
    }
    const Token name = lexer_.next();
    if (name.kind != TokenKind::kWord || name.text[0] == '.' || name.text[0] == '%') {
      return fail(name.line, "function without a valid name");
    }
    function.name = std::string(name.text);
    if (lexer_.peek().is('(')) {
      if (!paramList(function.parameters, false)) return false;
    }
    for (;;) {
      const Token token = lexer_.next();
      if (token.is('{')) {
        function.defined = true;
        if (!body(function)) return false;
        break;
      }
      if (token.is(';')) break;
      if (token.isWord(".maxntid")) {
        if (!dimensions(function.maxThreads)) return false;
      } else if (token.isWord(".reqntid")) {
        if (!dimensions(function.requiredThreads)) return false;
      } else if (token.isWord(".minnctapersm") || token.isWord(".maxnreg")) {
        const auto count = number("a count");
        if (!count) return false;
        const auto value = static_cast<std::uint32_t>(std::min<std::uint64_t>(*count, 1u << 20));
        (token.isWord(".maxnreg") ? function.maxRegisters : function.minBlocksPerSm) = value;
      } else if (token.isWord(".maxnctapersm")) {
        if (!number("a count")) return false;
      } else if (token.isWord(".noreturn")) {
        continue;
      } else if (token.isWord(".pragma")) {
        if (!skipPragma(token)) return false;
      } else if (token.isWord(".explicitcluster") || token.isWord(".reqnctapercluster") ||
                 token.isWord(".maxclusterrank")) {
        if (function.unsupported.empty()) function.unsupported = std::string(token.text);
        if (!token.isWord(".explicitcluster")) {
          std::uint32_t ignored[3];
          if (!dimensions(ignored)) return false;
        }
      } else {
        return fail(token.line, "unexpected " + shown(token.text) + " after the parameters of " +
                                    shown(function.name));
      }
    }
    module_->functions.push_back(std::move(function));
    return true;
  }

  bool body(FunctionDecl& function) {
    std::size_t depth = 1;
    while (ok()) {
      Token token = lexer_.next();
      if (token.end()) return fail(token.line, "unterminated body of " + shown(function.name));
      Statement statement;
      statement.line = token.line;
      if (token.is('{')) {
        if (++depth > kMaxScopeDepth) return fail(token.line, "blocks nested too deep");
        statement.kind = Statement::Kind::kOpen;
      } else if (token.is('}')) {
        if (--depth == 0) return true;
        statement.kind = Statement::Kind::kClose;
      } else if (token.isWord(".reg")) {
        statement.kind = Statement::Kind::kRegisters;
        if (!registerDecl(statement)) return false;
      } else if (token.isWord(".local") || token.isWord(".shared") || token.isWord(".param") ||
                 token.isWord(".const") || token.isWord(".global")) {
        statement.kind = Statement::Kind::kVariable;
        if (!variableDecl(token, false, statement.variable)) return false;
      } else if (token.isWord(".pragma")) {
        if (!skipPragma(token)) return false;
        continue;
      } else if (token.isWord(".loc") || token.isWord(".file")) {
        lexer_.skipLine(token.line);
        continue;
      } else if (token.kind == TokenKind::kWord && lexer_.peek().is(':')) {
        lexer_.next();
        if (lexer_.peek().isWord(".callprototype")) {
          lexer_.next();
          statement.kind = Statement::Kind::kPrototype;
          statement.label = std::string(token.text);
          if (!prototype(statement)) return false;
        } else {
          statement.kind = Statement::Kind::kLabel;
          statement.label = std::string(token.text);
        }
      } else if (token.kind == TokenKind::kWord && lexer_.peek().isWord(".branchtargets")) {
        return fail(token.line, ".branchtargets needs a ':'");
      } else {
        statement.kind = Statement::Kind::kInstruction;
        if (!instruction(token, statement.instruction)) return false;
      }
      function.body.push_back(std::move(statement));
      if (function.body.size() > kMaxInstructionsPerFunction) {
        return fail(token.line, "function too long");
      }
    }
    return false;
  }

  bool prototype(Statement& statement) {
    if (lexer_.peek().is('(')) {
      if (!paramList(statement.prototypeResults, true)) return false;
    }
    const Token name = lexer_.next();
    if (name.kind != TokenKind::kWord) return fail(name.line, "bad .callprototype");
    if (lexer_.peek().is('(')) {
      if (!paramList(statement.prototypeParameters, true)) return false;
    }
    while (lexer_.peek().isWord(".noreturn")) lexer_.next();
    return expect(';', "after .callprototype");
  }

  bool registerDecl(Statement& statement) {
    Type type = Type::kNone;
    std::uint32_t vector = 1;
    for (;;) {
      const Token token = lexer_.next();
      if (token.kind != TokenKind::kWord) return fail(token.line, "malformed .reg");
      if (token.text == ".v2" || token.text == ".v4") {
        vector = token.text == ".v2" ? 2 : 4;
        continue;
      }
      if (token.text == ".align") {
        if (!number("an alignment")) return false;
        continue;
      }
      type = parseType(token.text);
      if (type == Type::kNone) return fail(token.line, "bad .reg type " + shown(token.text));
      break;
    }
    for (;;) {
      const Token name = lexer_.next();
      if (name.kind != TokenKind::kWord || name.text[0] == '.') {
        return fail(name.line, "bad register name " + shown(name.text));
      }
      RegisterDecl declaration;
      declaration.type = type;
      declaration.vector = vector;
      declaration.name = std::string(name.text);
      if (lexer_.peek().is('<')) {
        lexer_.next();
        const auto count = number("a register count");
        if (!count) return false;
        if (*count > kMaxRegistersPerFunction) return fail(name.line, "too many registers");
        if (!expect('>', "after a register count")) return false;
        declaration.count = static_cast<std::uint32_t>(*count);
        if (declaration.count == 0) continue;
      }
      statement.registers.push_back(std::move(declaration));
      const Token separator = lexer_.next();
      if (separator.is(';')) return true;
      if (!separator.is(',')) return fail(separator.line, "expected ',' or ';' in .reg");
    }
  }

  bool instruction(Token token, ParsedInstruction& instruction) {
    instruction.line = token.line;
    if (token.is('@')) {
      Token guard = lexer_.next();
      if (guard.is('!')) {
        instruction.guardNegated = true;
        guard = lexer_.next();
      }
      if (guard.kind != TokenKind::kWord) return fail(guard.line, "bad guard predicate");
      instruction.guard = std::string(guard.text);
      token = lexer_.next();
    }
    if (token.kind != TokenKind::kWord || token.text[0] == '.' || token.text[0] == '%') {
      return fail(token.line, "expected an instruction, found " + shown(token.text));
    }
    instruction.opcode = std::string(token.text);
    if (lexer_.peek().is(';')) {
      lexer_.next();
      return true;
    }
    // Instructions whose operands this parser does not model (surface reductions, TMA tuples, ...)
    // are skipped whole: the binder refuses them by name.
    if (unmodelledOperands(instruction.opcode)) return skipTo(';');
    for (;;) {
      Operand operand;
      if (!parseOperand(operand, 0)) return false;
      instruction.operands.push_back(std::move(operand));
      if (instruction.operands.size() > kMaxOperands) return fail(token.line, "too many operands");
      const Token separator = lexer_.next();
      if (separator.is(';')) return true;
      if (!separator.is(',')) {
        return fail(separator.line, "expected ',' or ';' after an operand of " +
                                        shown(instruction.opcode) + ", found " +
                                        shown(separator.text));
      }
    }
  }

  static bool unmodelledOperands(std::string_view opcode) {
    const std::string_view base = opcode.substr(0, opcode.find('.'));
    static constexpr std::string_view kSkipped[] = {"sured",     "istypep", "wgmma",
                                                    "brx",       "tcgen05", "clusterlaunchcontrol",
                                                    "tensormap", "multimem"};
    // cp.async's operands are addresses and sizes; its bulk (TMA) forms take tensor tuples.
    if (base == "cp")
      return !opcode.starts_with("cp.async.") || opcode.starts_with("cp.async.bulk");
    return std::find(std::begin(kSkipped), std::end(kSkipped), base) != std::end(kSkipped);
  }

  bool parseOperand(Operand& operand, std::size_t depth) {
    if (depth > 4) return fail(lexer_.line(), "operand nested too deep");
    Token token = lexer_.next();
    if (token.is('!')) {
      operand.negated = true;
      token = lexer_.next();
    }
    if (token.is('[')) {
      operand.kind = Operand::Kind::kAddress;
      Token base = lexer_.next();
      bool negative = false;
      if (base.is('-')) {
        negative = true;
        base = lexer_.next();
      }
      if (base.kind != TokenKind::kWord) return fail(base.line, "bad address");
      if (const auto value = parseUnsigned(base.text); value && !(base.text[0] == '%')) {
        operand.integer =
            negative ? -static_cast<std::int64_t>(*value) : static_cast<std::int64_t>(*value);
      } else {
        if (negative) return fail(base.line, "bad address");
        operand.name = std::string(base.text);
        operand.baseIsRegister = base.text[0] == '%';
      }
      while (lexer_.peek().is('+') || lexer_.peek().is('-')) {
        bool minus = lexer_.next().is('-');
        if (lexer_.peek().is('-')) {
          lexer_.next();
          minus = !minus;
        }
        const auto value = number("an address offset");
        if (!value) return false;
        const auto offset = static_cast<std::int64_t>(*value);
        operand.integer += minus ? -offset : offset;
      }
      // A texture or surface address: the handle, then the coordinates.
      if (lexer_.peek().is(',')) {
        lexer_.next();
        Operand coordinates;
        if (!parseOperand(coordinates, depth + 1)) return false;
        if (coordinates.kind != Operand::Kind::kVector) {
          return fail(base.line, "expected coordinates {...} in a texture address");
        }
        operand.elements = std::move(coordinates.elements);
      }
      return expect(']', "after an address");
    }
    if (token.is('{') || token.is('(')) {
      const char close = token.is('{') ? '}' : ')';
      operand.kind = Operand::Kind::kVector;
      operand.parenthesized = token.is('(');
      if (lexer_.peek().is(close)) {
        lexer_.next();
        return true;
      }
      for (;;) {
        Operand element;
        if (!parseOperand(element, depth + 1)) return false;
        operand.elements.push_back(std::move(element));
        if (operand.elements.size() > kMaxOperands) return fail(token.line, "list too long");
        const Token separator = lexer_.next();
        // A vector destination may carry a paired predicate too: a sparse texture fetch's
        // "{d0, d1, d2, d3}|p" says whether the texels were resident.
        if (separator.is(close)) return close == '}' ? pairedPredicate(operand) : true;
        if (!separator.is(',')) return fail(separator.line, "expected ',' in an operand list");
      }
    }
    bool negative = false;
    if (token.is('-')) {
      negative = true;
      token = lexer_.next();
    }
    if (token.kind != TokenKind::kWord) {
      return fail(token.line, "bad operand " + shown(token.text));
    }
    if (token.text == "_") {
      operand.kind = Operand::Kind::kSink;
      return true;
    }
    if (token.text[0] != '%' && !negative && (token.text[0] < '0' || token.text[0] > '9') &&
        token.text[0] != '.') {
      // A symbol (variable, function, label), possibly plus an offset.
      operand.kind = Operand::Kind::kSymbol;
      operand.name = std::string(token.text);
      if (operand.name == "generic" && lexer_.peek().is('(')) {
        return fail(token.line, "generic() is only allowed in initializers");
      }
      if (lexer_.peek().is('+')) {
        lexer_.next();
        const auto value = number("a symbol offset");
        if (!value) return false;
        operand.integer = static_cast<std::int64_t>(*value);
      }
      // A register named without '%' (inline assembly declares its own, e.g. "r0|p" in CUB's
      // scans) may carry a paired predicate like any other.
      if (!pairedPredicate(operand)) return false;
      return true;
    }
    if (token.text[0] == '%') {
      operand.kind = Operand::Kind::kRegister;
      operand.name = std::string(token.text);
      if (negative) return fail(token.line, "bad operand");
      return pairedPredicate(operand);
    }
    if (const auto floating = parseFloatLiteral(token.text)) {
      operand.kind = Operand::Kind::kFloat;
      operand.floatBits = floating->bits;
      operand.hexFloatSingle = floating->single;
      operand.hexFloatDouble = floating->hexDouble;
      if (negative) {
        operand.floatBits ^= floating->single ? 0x80000000ull : 0x8000000000000000ull;
      }
      return true;
    }
    const auto value = parseUnsigned(token.text);
    if (!value) return fail(token.line, "bad number " + shown(token.text));
    operand.kind = Operand::Kind::kInteger;
    operand.integer =
        negative ? static_cast<std::int64_t>(~*value + 1) : static_cast<std::int64_t>(*value);
    return true;
  }

  // The "|p" of a destination such as "d|p" (shfl.sync, setp's second result), if one follows.
  bool pairedPredicate(Operand& operand) {
    if (!lexer_.peek().is('|')) return true;
    lexer_.next();
    const Token paired = lexer_.next();
    if (paired.kind != TokenKind::kWord) return fail(paired.line, "bad paired predicate");
    operand.pairedPredicate = std::string(paired.text);
    return true;
  }

  Lexer lexer_;
  ModuleSyntax* module_ = nullptr;
  std::string error_;
};

// ---- Lowering -----------------------------------------------------------------------------

std::uint64_t alignUp(std::uint64_t value, std::uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

struct ModuleSymbols {
  std::unordered_map<std::string, std::uint32_t> variables;  // module-scope, by name
  std::unordered_map<std::string, std::uint32_t> functions;
};

struct SpecialRegister {
  std::string_view name;
};

bool isSpecialRegister(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {"%tid",
                                                   "%ntid",
                                                   "%ctaid",
                                                   "%nctaid",
                                                   "%laneid",
                                                   "%warpid",
                                                   "%nwarpid",
                                                   "%smid",
                                                   "%nsmid",
                                                   "%gridid",
                                                   "%clock",
                                                   "%clock64",
                                                   "%clock_hi",
                                                   "%globaltimer",
                                                   "%globaltimer_lo",
                                                   "%globaltimer_hi",
                                                   "%lanemask_eq",
                                                   "%lanemask_le",
                                                   "%lanemask_lt",
                                                   "%lanemask_ge",
                                                   "%lanemask_gt",
                                                   "%dynamic_smem_size",
                                                   "%total_smem_size",
                                                   "%aggr_smem_size",
                                                   "%pm0",
                                                   "%pm1",
                                                   "%pm2",
                                                   "%pm3",
                                                   "%pm4",
                                                   "%pm5",
                                                   "%pm6",
                                                   "%pm7",
                                                   "%envreg",
                                                   "%is_explicit_cluster",
                                                   "%clusterid",
                                                   "%nclusterid",
                                                   "%cluster_ctaid",
                                                   "%cluster_nctaid",
                                                   "%cluster_ctarank",
                                                   "%cluster_nctarank",
                                                   "%reserved_smem_offset_begin",
                                                   "%reserved_smem_offset_end",
                                                   "%reserved_smem_offset_cap",
                                                   "%reserved_smem_offset_0",
                                                   "%reserved_smem_offset_1",
                                                   "%current_graph_exec"};
  const std::string_view base = name.substr(0, name.find('.'));
  if (base.substr(0, 7) == "%envreg") return true;
  return std::find(std::begin(kPrefixes), std::end(kPrefixes), base) != std::end(kPrefixes);
}

class FunctionLowering final : public OperandResolver {
public:
  FunctionLowering(Program& program, const ModuleSymbols& symbols,
                   const std::vector<FunctionDecl>& declarations, std::uint32_t index,
                   const std::vector<std::vector<std::uint32_t>>& localShared)
      : program_(program),
        symbols_(symbols),
        declaration_(declarations[index]),
        function_(program.functions[index]),
        localShared_(localShared[index]) {}

  // Returns CUDA_SUCCESS, or the error with message_ set.
  CUresult lower() {
    scopes_.emplace_back();
    // Own parameters are visible in the body by name.
    for (std::size_t i = 0; i < declaration_.parameters.size(); ++i) {
      Symbol symbol;
      symbol.kind = function_.isKernel ? SymbolKind::kKernelParam : SymbolKind::kFrameParam;
      symbol.offset =
          function_.isKernel ? function_.kernelParameters[i].offset : function_.parameterOffsets[i];
      symbol.bytes = static_cast<std::uint32_t>(declaration_.parameters[i].bytes());
      scopes_.back()[declaration_.parameters[i].name] = symbol;
    }
    for (std::size_t i = 0; i < declaration_.results.size(); ++i) {
      Symbol symbol;
      symbol.kind = SymbolKind::kFrameParam;
      symbol.offset = function_.resultOffsets[i];
      symbol.bytes = static_cast<std::uint32_t>(declaration_.results[i].bytes());
      scopes_.back()[declaration_.results[i].name] = symbol;
    }
    paramTop_ = function_.parameterBytes;
    std::size_t sharedIndex = 0;
    for (const Statement& statement : declaration_.body) {
      line_ = statement.line;
      switch (statement.kind) {
        case Statement::Kind::kOpen:
          scopes_.emplace_back();
          paramMarks_.push_back(paramTop_);
          break;
        case Statement::Kind::kClose:
          scopes_.pop_back();
          paramTop_ = paramMarks_.back();
          paramMarks_.pop_back();
          break;
        case Statement::Kind::kRegisters:
          for (const RegisterDecl& declaration : statement.registers) {
            if (!declareRegisters(declaration)) return invalid();
          }
          break;
        case Statement::Kind::kVariable:
          if (!declareVariable(statement.variable, sharedIndex)) {
            return status_ != CUDA_SUCCESS ? status_ : invalid();
          }
          break;
        case Statement::Kind::kLabel:
          if (!labelPc_.emplace(statement.label, static_cast<std::uint32_t>(function_.code.size()))
                   .second) {
            error_ = "duplicate label " + shown(statement.label);
            return invalid();
          }
          break;
        case Statement::Kind::kPrototype: {
          Prototype prototype;
          for (const ParamDecl& result : statement.prototypeResults) {
            prototype.results.push_back(static_cast<std::uint32_t>(result.bytes()));
          }
          for (const ParamDecl& parameter : statement.prototypeParameters) {
            prototype.parameters.push_back(static_cast<std::uint32_t>(parameter.bytes()));
          }
          prototypes_[statement.label] = std::move(prototype);
          break;
        }
        case Statement::Kind::kInstruction: {
          const CUresult status = lowerInstruction(statement.instruction);
          if (status != CUDA_SUCCESS) return status;
          break;
        }
      }
      if (function_.parameterBytes > kMaxLocalBytesPerFunction) {
        error_ = "call-site parameters too large";
        return invalid();
      }
    }
    // Running off the end returns (or exits a kernel), as ret would.
    Instruction end;
    end.flow = Flow::kReturn;
    end.source =
        static_cast<std::uint16_t>(std::min<std::size_t>(function_.sourceLines.size(), 0xffff));
    if (function_.sourceLines.size() < 0xffff) function_.sourceLines.push_back("end of function");
    function_.code.push_back(end);
    // Branch targets.
    for (Instruction& instruction : function_.code) {
      if (instruction.flow != Flow::kBranch) continue;
      const std::string& name = labelNames_[instruction.target];
      const auto found = labelPc_.find(name);
      if (found == labelPc_.end()) {
        error_ = "branch to undefined label " + shown(name);
        line_ = instruction.source;
        return invalid();
      }
      instruction.target = found->second;
    }
    // Constant rows follow the registers.
    function_.registerRows = nextRow_;
    const auto place = [this](std::uint32_t& row) {
      if (row != kNoRegister && (row & kConstantTag) != 0) row = nextRow_ + (row & ~kConstantTag);
    };
    for (Instruction& instruction : function_.code) {
      for (std::uint32_t& op : instruction.op) place(op);
    }
    for (MatrixOperation& operation : function_.matrixOperations) {
      forEachOperationRow(operation, place);
    }
    for (TextureOperation& operation : function_.textureOperations) {
      forEachOperationRow(operation, place);
    }
    function_.predicates = nextPredicate_;
    if (function_.rows() > kMaxRegistersPerFunction * 2) {
      error_ = "too many registers and constants";
      return invalid();
    }
    return CUDA_SUCCESS;
  }

  const std::string& message() const { return error_; }
  std::uint32_t line() const { return line_; }

  // OperandResolver
  std::uint32_t source(const Operand& operand, Type type) override {
    switch (operand.kind) {
      case Operand::Kind::kRegister: {
        const Symbol* symbol = lookup(operand.name);
        if (symbol == nullptr) {
          if (isSpecialRegister(operand.name)) {
            error_ = "special register " + shown(operand.name) + " used outside mov";
          } else {
            error_ = "undeclared register " + shown(operand.name);
          }
          return kNoRegister;
        }
        if (symbol->kind != SymbolKind::kRegister) {
          error_ = shown(operand.name) + " is not a value register";
          return kNoRegister;
        }
        return symbol->row;
      }
      case Operand::Kind::kInteger:
        return constant(integerBits(operand.integer, type));
      case Operand::Kind::kFloat: {
        std::uint64_t bits = 0;
        if (!floatBits(operand, type, bits)) return kNoRegister;
        return constant(bits);
      }
      case Operand::Kind::kSymbol:
        // Registers may be named without a '%' (inline asm declares "lo", "hi" and the like).
        if (const Symbol* symbol = lookup(operand.name);
            symbol != nullptr && symbol->kind == SymbolKind::kRegister && operand.integer == 0) {
          return symbol->row;
        }
        return symbolAddress(operand.name, operand.integer, false);
      default:
        error_ = "unexpected operand";
        return kNoRegister;
    }
  }

  std::uint32_t destination(const Operand& operand, Type /*type*/) override {
    if (operand.kind == Operand::Kind::kSink) return sinkRow();
    if (operand.kind != Operand::Kind::kRegister &&
        !(operand.kind == Operand::Kind::kSymbol && operand.integer == 0)) {
      error_ = "destination is not a register";
      return kNoRegister;
    }
    const Symbol* symbol = lookup(operand.name);
    if (symbol == nullptr || symbol->kind != SymbolKind::kRegister) {
      error_ = "destination " + shown(operand.name) + " is not a declared register";
      return kNoRegister;
    }
    return symbol->row;
  }

  unsigned registerBytes(std::uint32_t row) const override {
    if ((row & kConstantTag) != 0 || row >= rowBytes_.size()) return 0;
    return rowBytes_[row];
  }

  std::uint32_t predicate(const Operand& operand) override {
    if (operand.kind == Operand::Kind::kSink) return sinkPredicate();
    const Symbol* symbol = operand.kind == Operand::Kind::kRegister ||
                                   (operand.kind == Operand::Kind::kSymbol && operand.integer == 0)
                               ? lookup(operand.name)
                               : nullptr;
    if (symbol == nullptr || symbol->kind != SymbolKind::kPredicate) {
      error_ = shown(operand.name) + " is not a declared predicate";
      return kNoPredicate;
    }
    return symbol->row;
  }

  std::uint32_t constant(std::uint64_t bits) override {
    Constant value;
    value.kind = Constant::Kind::kValue;
    value.value = bits;
    return addConstant(value);
  }

  std::optional<Address> address(const Operand& operand, Space space) override {
    if (operand.kind != Operand::Kind::kAddress) {
      error_ = "expected an address operand [..]";
      return std::nullopt;
    }
    Address address;
    address.offset = operand.integer;
    if (operand.name.empty()) {
      address.row = constant(0);
      address.isConstant = true;
      return address;
    }
    const Symbol* named = lookup(operand.name);
    if (operand.baseIsRegister || (named != nullptr && named->kind == SymbolKind::kRegister)) {
      const Symbol* symbol = named;
      if (symbol == nullptr || symbol->kind != SymbolKind::kRegister) {
        error_ = "address register " + shown(operand.name) + " is not declared";
        return std::nullopt;
      }
      address.row = symbol->row;
      address.base32 = rowBytes_[symbol->row] == 4;
      if (rowBytes_[symbol->row] != 4 && rowBytes_[symbol->row] != 8) {
        error_ = "address register " + shown(operand.name) + " is neither 32 nor 64 bits";
        return std::nullopt;
      }
      return address;
    }
    address.row = symbolAddress(operand.name, 0, space == Space::kGeneric);
    if (address.row == kNoRegister) return std::nullopt;
    const Constant& value = function_.constants[address.row & ~kConstantTag];
    if (value.kind == Constant::Kind::kValue) {
      address.isConstant = true;
      address.constantValue = value.value;
    }
    return address;
  }

  std::optional<std::uint32_t> label(const Operand& operand) override {
    if (operand.kind != Operand::Kind::kSymbol || operand.integer != 0) {
      error_ = "expected a label";
      return std::nullopt;
    }
    auto [entry, inserted] =
        labelIds_.emplace(operand.name, static_cast<std::uint32_t>(labelNames_.size()));
    if (inserted) labelNames_.push_back(operand.name);
    return entry->second;
  }

  std::optional<std::uint32_t> function(std::string_view name) override {
    const auto found = symbols_.functions.find(std::string(name));
    if (found == symbols_.functions.end()) return std::nullopt;
    return found->second;
  }

  std::uint32_t matrixOperation(MatrixOperation operation) override {
    function_.matrixOperations.push_back(std::move(operation));
    return static_cast<std::uint32_t>(function_.matrixOperations.size() - 1);
  }
  std::uint32_t textureOperation(TextureOperation operation) override {
    function_.textureOperations.push_back(std::move(operation));
    return static_cast<std::uint32_t>(function_.textureOperations.size() - 1);
  }

  std::optional<std::uint32_t> callSite(const ParsedInstruction& call, std::uint32_t callee,
                                        bool indirect) override {
    // call[.uni] [(results),] target, [(arguments)] [, prototype]
    const std::vector<Operand>& operands = call.operands;
    std::size_t next = 0;
    const Operand* results = nullptr;
    const Operand* arguments = nullptr;
    if (next < operands.size() && operands[next].kind == Operand::Kind::kVector &&
        operands[next].parenthesized) {
      results = &operands[next++];
    }
    ++next;  // the target
    if (next < operands.size() && operands[next].kind == Operand::Kind::kVector &&
        operands[next].parenthesized) {
      arguments = &operands[next++];
    }
    CallSite site;
    auto slot = [&](const Operand& operand, CallSite::Slot& out) {
      if (operand.kind != Operand::Kind::kSymbol && operand.kind != Operand::Kind::kRegister) {
        error_ = "call arguments must be .param variables";
        return false;
      }
      const Symbol* symbol = lookup(operand.name);
      if (symbol == nullptr || symbol->kind != SymbolKind::kFrameParam) {
        if (symbol != nullptr && symbol->kind == SymbolKind::kRegister) {
          error_ = "call arguments in registers";
          unsupportedCall_ = true;
        } else {
          error_ = "call argument " + shown(operand.name) + " is not a declared .param";
        }
        return false;
      }
      out.callerOffset = symbol->offset;
      out.bytes = symbol->bytes;
      return true;
    };
    if (results != nullptr) {
      for (const Operand& operand : results->elements) {
        CallSite::Slot out;
        if (!slot(operand, out)) return std::nullopt;
        site.results.push_back(out);
      }
    }
    if (arguments != nullptr) {
      for (const Operand& operand : arguments->elements) {
        CallSite::Slot out;
        if (!slot(operand, out)) return std::nullopt;
        site.arguments.push_back(out);
      }
    }
    if (!indirect) {
      const Function& target = program_.functions[callee];
      if (site.arguments.size() != target.parameterSizes.size() ||
          site.results.size() > target.resultSizes.size()) {
        error_ = "call to " + shown(target.name) + " with " +
                 std::to_string(site.arguments.size()) + " arguments, which takes " +
                 std::to_string(target.parameterSizes.size());
        return std::nullopt;
      }
    }
    function_.callSites.push_back(std::move(site));
    return static_cast<std::uint32_t>(function_.callSites.size() - 1);
  }

  std::uint32_t carry() override {
    if (function_.carryRow == kNoRegister) function_.carryRow = newRow(4);
    return function_.carryRow;
  }

  std::uint32_t smVersion() const override { return program_.smVersion; }
  bool inKernel() const override { return function_.isKernel; }
  std::string& error() override { return error_; }

  bool unsupportedCall() const { return unsupportedCall_; }

private:
  static constexpr std::uint32_t kConstantTag = 0x80000000u;

  enum class SymbolKind : std::uint8_t {
    kRegister,
    kPredicate,
    kKernelParam,
    kFrameParam,
    kLocal,
    kSharedVariable
  };
  struct Symbol {
    SymbolKind kind = SymbolKind::kRegister;
    std::uint32_t row = 0;     // register row or predicate index
    std::uint32_t offset = 0;  // params, locals
    std::uint32_t bytes = 0;
    std::uint32_t variable = 0;  // shared variables
  };
  struct Range {
    SymbolKind kind = SymbolKind::kRegister;
    std::uint32_t first = 0;
    std::uint32_t count = 0;
  };
  struct Scope {
    std::unordered_map<std::string, Symbol> symbols;
    std::unordered_map<std::string, Range> ranges;  // %r<45>: prefix "%r"
    Symbol& operator[](const std::string& name) { return symbols[name]; }
  };
  struct Prototype {
    std::vector<std::uint32_t> results;
    std::vector<std::uint32_t> parameters;
  };

  CUresult invalid() {
    if (status_ == CUDA_SUCCESS) status_ = CUDA_ERROR_INVALID_PTX;
    return status_;
  }

  std::uint32_t newRow(unsigned bytes) {
    rowBytes_.push_back(static_cast<std::uint8_t>(bytes));
    return nextRow_++;
  }

  std::uint32_t sinkRow() {
    if (sinkRow_ == kNoRegister) sinkRow_ = newRow(8);
    return sinkRow_;
  }

  std::uint32_t sinkPredicate() {
    if (sinkPredicate_ == kNoPredicate) sinkPredicate_ = nextPredicate_++;
    return sinkPredicate_;
  }

  bool declareRegisters(const RegisterDecl& declaration) {
    const bool predicate = declaration.type == Type::kPred;
    if (declaration.vector != 1) {
      error_ = "vector registers (.reg .v2/.v4)";
      return false;
    }
    const unsigned bytes = typeBytes(declaration.type);
    if (bytes > 8) {
      error_ = ".reg .b128";
      return false;
    }
    const std::uint32_t count = declaration.count == 0 ? 1 : declaration.count;
    if (nextRow_ + count > kMaxRegistersPerFunction ||
        nextPredicate_ + count > kMaxRegistersPerFunction) {
      error_ = "too many registers";
      return false;
    }
    std::uint32_t first = 0;
    if (predicate) {
      first = nextPredicate_;
      nextPredicate_ += count;
    } else {
      first = nextRow_;
      for (std::uint32_t i = 0; i < count; ++i) newRow(bytes);
    }
    Scope& scope = scopes_.back();
    if (declaration.count == 0) {
      Symbol symbol;
      symbol.kind = predicate ? SymbolKind::kPredicate : SymbolKind::kRegister;
      symbol.row = first;
      scope.symbols[declaration.name] = symbol;
    } else {
      scope.ranges[declaration.name] =
          Range{predicate ? SymbolKind::kPredicate : SymbolKind::kRegister, first, count};
    }
    return true;
  }

  bool declareVariable(const VariableDecl& variable, std::size_t& sharedIndex) {
    Symbol symbol;
    switch (variable.space) {
      case Space::kParam: {
        const std::uint64_t alignment =
            std::max<std::uint64_t>(variable.alignment, variable.naturalAlignment());
        const std::uint64_t offset = alignUp(paramTop_, alignment);
        if (offset + variable.bytes() > kMaxLocalBytesPerFunction) {
          error_ = "call-site parameters too large";
          return false;
        }
        symbol.kind = SymbolKind::kFrameParam;
        symbol.offset = static_cast<std::uint32_t>(offset);
        symbol.bytes = static_cast<std::uint32_t>(variable.bytes());
        paramTop_ = static_cast<std::uint32_t>(offset + variable.bytes());
        function_.parameterBytes = std::max(function_.parameterBytes, paramTop_);
        break;
      }
      case Space::kLocal: {
        const std::uint64_t alignment =
            std::max<std::uint64_t>(variable.alignment, variable.naturalAlignment());
        const std::uint64_t offset = alignUp(function_.localBytes, alignment);
        if (offset + variable.bytes() > kMaxLocalBytesPerFunction) {
          error_ = ".local variables too large";
          return false;
        }
        symbol.kind = SymbolKind::kLocal;
        symbol.offset = static_cast<std::uint32_t>(offset);
        function_.localBytes = static_cast<std::uint32_t>(offset + variable.bytes());
        function_.localAlignment = std::max<std::uint32_t>(function_.localAlignment,
                                                           static_cast<std::uint32_t>(alignment));
        if (variable.hasInitializer) {
          status_ = CUDA_ERROR_NOT_SUPPORTED;
          error_ = "an initialised .local variable";
          return false;
        }
        break;
      }
      case Space::kShared:
        symbol.kind = SymbolKind::kSharedVariable;
        symbol.variable = localShared_.at(sharedIndex++);
        break;
      default:
        status_ = CUDA_ERROR_NOT_SUPPORTED;
        error_ = "a function-scope .global/.const variable";
        return false;
    }
    scopes_.back()[variable.name] = symbol;
    return true;
  }

  const Symbol* lookup(const std::string& name) {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      const auto found = scope->symbols.find(name);
      if (found != scope->symbols.end()) return &found->second;
      // %r12: prefix %r, index 12.
      std::size_t digits = name.size();
      while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
      if (digits == name.size() || digits == 0) continue;
      const auto range = scope->ranges.find(name.substr(0, digits));
      if (range == scope->ranges.end()) continue;
      if (name.size() - digits > 1 && name[digits] == '0') continue;  // %r01 is not %r1
      const auto index = parseUnsigned(std::string_view(name).substr(digits));
      if (!index || *index >= range->second.count) continue;
      scratch_.kind = range->second.kind;
      scratch_.row = range->second.first + static_cast<std::uint32_t>(*index);
      return &scratch_;
    }
    return nullptr;
  }

  std::uint32_t addConstant(const Constant& value) {
    const auto key =
        std::make_tuple(static_cast<int>(value.kind), value.value, value.symbol, value.addend);
    const auto found = constantRows_.find(key);
    if (found != constantRows_.end()) return found->second;
    const auto index = static_cast<std::uint32_t>(function_.constants.size());
    if (index >= kMaxRegistersPerFunction) {
      error_ = "too many constants";
      return kNoRegister;
    }
    function_.constants.push_back(value);
    const std::uint32_t row = kConstantTag | index;
    constantRows_.emplace(key, row);
    return row;
  }

  static std::uint64_t integerBits(std::int64_t value, Type /*type*/) {
    return static_cast<std::uint64_t>(value);
  }

  bool floatBits(const Operand& operand, Type type, std::uint64_t& bits) {
    double value = 0;
    if (operand.hexFloatSingle) {
      value = std::bit_cast<float>(static_cast<std::uint32_t>(operand.floatBits));
    } else {
      value = std::bit_cast<double>(operand.floatBits);
    }
    switch (type) {
      case Type::kF32:
        bits = operand.hexFloatSingle ? operand.floatBits
                                      : std::bit_cast<std::uint32_t>(static_cast<float>(value));
        return true;
      case Type::kF64:
        bits = std::bit_cast<std::uint64_t>(value);
        return true;
      case Type::kF16:
      case Type::kF16x2:
      case Type::kBf16:
      case Type::kBf16x2:
        // Half immediates are written as their bits (0x3C00); a float literal is converted.
        bits = std::bit_cast<std::uint64_t>(value);
        error_ = "a float literal for a half-precision operand";
        return false;
      default:
        // A float literal where bits are expected (mov.b32 %r, 0f3F800000): its bits.
        if (operand.hexFloatSingle) {
          bits = operand.floatBits;
        } else {
          bits = std::bit_cast<std::uint64_t>(value);
        }
        return true;
    }
  }

  // The address of a symbol as a constant row: in its own state space (shared offset, local
  // offset, parameter offset, device address), or its generic address when `generic`.
  std::uint32_t symbolAddress(const std::string& name, std::int64_t offset, bool generic) {
    if (const Symbol* symbol = lookup(name)) {
      Constant value;
      switch (symbol->kind) {
        case SymbolKind::kKernelParam:
          value.value =
              (generic ? kParamWindow : 0) + symbol->offset + static_cast<std::uint64_t>(offset);
          return addConstant(value);
        case SymbolKind::kFrameParam:
          if (generic) {
            error_ = "generic address of a function parameter";
            return kNoRegister;
          }
          value.value = kFrameParamBase + symbol->offset + static_cast<std::uint64_t>(offset);
          return addConstant(value);
        case SymbolKind::kLocal:
          value.kind = Constant::Kind::kLocalAddress;
          value.value = symbol->offset + static_cast<std::uint64_t>(offset);
          value.addend = generic ? static_cast<std::int64_t>(kLocalWindow) : 0;
          return addConstant(value);
        case SymbolKind::kSharedVariable:
          value.value = (generic ? kSharedWindow : 0) +
                        program_.variables[symbol->variable].sharedOffset +
                        static_cast<std::uint64_t>(offset);
          return addConstant(value);
        default:
          error_ = shown(name) + " is a register, not a symbol";
          return kNoRegister;
      }
    }
    if (const auto variable = symbols_.variables.find(name); variable != symbols_.variables.end()) {
      const Variable& target = program_.variables[variable->second];
      Constant value;
      if (target.space == Space::kShared) {
        value.value = (generic ? kSharedWindow : 0) + target.sharedOffset +
                      static_cast<std::uint64_t>(offset);
        return addConstant(value);
      }
      value.kind = Constant::Kind::kVariableAddress;
      value.symbol = variable->second;
      value.addend = offset;
      return addConstant(value);
    }
    if (const auto callee = symbols_.functions.find(name); callee != symbols_.functions.end()) {
      Constant value;
      value.kind = Constant::Kind::kFunctionAddress;
      value.symbol = callee->second;
      value.addend = offset;
      return addConstant(value);
    }
    // WARP_SZ is PTX's predefined run-time constant for the warp size (nvcc writes it for
    // warpSize); no declaration can shadow it, as every user symbol above was looked up first.
    if (name == "WARP_SZ" && offset == 0) {
      Constant value;
      value.value = kWarpSize;
      return addConstant(value);
    }
    error_ = "undefined symbol " + shown(name);
    return kNoRegister;
  }

  CUresult lowerInstruction(const ParsedInstruction& parsed) {
    for (const Operand& operand : parsed.operands) {
      if (operand.kind == Operand::Kind::kRegister &&
          operand.name.starts_with("%reserved_smem_offset")) {
        program_.usesReservedShared = true;
      }
    }
    Instruction instruction;
    instruction.source =
        static_cast<std::uint16_t>(std::min<std::size_t>(function_.sourceLines.size(), 0xffff));
    if (!parsed.guard.empty()) {
      Operand guard;
      guard.kind = Operand::Kind::kRegister;
      guard.name = parsed.guard;
      instruction.guard = predicate(guard);
      if (instruction.guard == kNoPredicate) return invalid();
      instruction.guardNegated = parsed.guardNegated ? 1 : 0;
    }
    bool unsupported = false;
    error_.clear();
    if (!bindInstruction(parsed, *this, instruction, unsupported)) {
      if (unsupported || unsupportedCall_) {
        status_ = CUDA_ERROR_NOT_SUPPORTED;
        if (error_.empty()) error_ = "the instruction";
        error_ = "'" + parsed.opcode + "' (" + error_ + ")";
        return status_;
      }
      if (error_.empty()) error_ = "malformed instruction";
      error_ = shown(parsed.opcode) + ": " + error_;
      return invalid();
    }
    if (function_.sourceLines.size() < 0xffff) {
      function_.sourceLines.push_back(parsed.opcode + " (line " + std::to_string(parsed.line) +
                                      ")");
    }
    function_.code.push_back(instruction);
    return CUDA_SUCCESS;
  }

  Program& program_;
  const ModuleSymbols& symbols_;
  const FunctionDecl& declaration_;
  Function& function_;
  const std::vector<std::uint32_t>& localShared_;
  std::vector<Scope> scopes_;
  std::vector<std::uint32_t> paramMarks_;
  std::uint32_t paramTop_ = 0;
  std::uint32_t nextRow_ = 0;
  std::uint32_t nextPredicate_ = 0;
  std::vector<std::uint8_t> rowBytes_;
  std::uint32_t sinkRow_ = kNoRegister;
  std::uint32_t sinkPredicate_ = kNoPredicate;
  std::map<std::tuple<int, std::uint64_t, std::uint32_t, std::int64_t>, std::uint32_t>
      constantRows_;
  std::unordered_map<std::string, std::uint32_t> labelPc_;
  std::unordered_map<std::string, std::uint32_t> labelIds_;
  std::vector<std::string> labelNames_;
  std::unordered_map<std::string, Prototype> prototypes_;
  Symbol scratch_;
  std::string error_;
  CUresult status_ = CUDA_SUCCESS;
  std::uint32_t line_ = 0;
  bool unsupportedCall_ = false;
};

// Builtins: extern functions without a body that the interpreter provides.
Builtin builtinFor(std::string_view name) {
  if (name == "vprintf") return Builtin::kVprintf;
  if (name == "__assertfail") return Builtin::kAssertFail;
  if (name == "malloc") return Builtin::kMalloc;
  if (name == "free") return Builtin::kFree;
  if (name == "__cuda_syscall_aligned_malloc") return Builtin::kAlignedMalloc;
  if (name == "cudaGraphSetConditional") return Builtin::kGraphSetConditional;
  return Builtin::kNone;
}

class ModuleLowering {
public:
  explicit ModuleLowering(ModuleSyntax& syntax) : syntax_(syntax) {}

  DecodeResult run() {
    DecodeResult result;
    auto program = std::make_unique<Program>();
    program_ = program.get();
    program_->ptxMajor = syntax_.major;
    program_->ptxMinor = syntax_.minor;
    program_->smVersion = syntax_.sm;
    if (!syntax_.unsupported.empty()) {
      return notSupported("the module uses " + syntax_.unsupported);
    }
    if (!declareVariables() || !declareFunctions()) return failure();
    if (!unsupported_.empty()) return notSupported("the module uses " + unsupported_);
    if (!layoutShared() || !layoutGlobals()) return failure();
    for (std::uint32_t i = 0; i < program_->functions.size(); ++i) {
      Function& function = program_->functions[i];
      const FunctionDecl& declaration = functions_[i];
      if (!declaration.defined) continue;
      if (!declaration.unsupported.empty()) {
        refuse(function,
               kind(function) + " " + shown(function.name) + " uses " + declaration.unsupported);
        continue;
      }
      FunctionLowering lowering(*program_, symbols_, functions_, i, localShared_);
      const CUresult status = lowering.lower();
      if (status == CUDA_ERROR_NOT_SUPPORTED) {
        refuse(function, kind(function) + " " + shown(function.name) + ": " + lowering.message() +
                             " at line " + std::to_string(lowering.line()) +
                             " is not executed by the sim's PTX interpreter");
        continue;
      }
      if (status != CUDA_SUCCESS) {
        error_ = "line " + std::to_string(lowering.line()) + ": in " + shown(function.name) + ": " +
                 lowering.message();
        return failure();
      }
    }
    refuseCallersOfTheRefused();
    // As a GPU loads a module whatever its kernels use, the sim loads one with any kernel it can
    // run, and refuses only the launches of the others; one with none is refused at load.
    const Function* firstRefused = nullptr;
    bool anyRunnable = false;
    for (const Function& function : program_->functions) {
      if (!function.isKernel || !function.defined) continue;
      if (function.unsupported.empty()) {
        anyRunnable = true;
      } else if (firstRefused == nullptr) {
        firstRefused = &function;
      }
    }
    if (!anyRunnable && firstRefused != nullptr) return notSupported(firstRefused->unsupported);
    // A function whose address is taken (a function pointer, a vtable) may be reached by an
    // indirect call or a device-side launch from any kernel: the module is refused as a whole if
    // such a function cannot run.
    if (const Function* reachable = refusedFunctionWithItsAddressTaken()) {
      return notSupported(reachable->unsupported);
    }
    for (const Function& function : program_->functions) {
      for (const Instruction& instruction : function.code) {
        if (instruction.flow != Flow::kCall || instruction.op[0] != kNoRegister) continue;
        const Function& callee = program_->functions[instruction.target];
        if (callee.builtin && callee.builtinId == static_cast<std::uint32_t>(Builtin::kVprintf)) {
          program_->usesPrintf = true;
        }
        if (callee.builtin &&
            (callee.builtinId == static_cast<std::uint32_t>(Builtin::kMalloc) ||
             callee.builtinId == static_cast<std::uint32_t>(Builtin::kAlignedMalloc) ||
             callee.builtinId == static_cast<std::uint32_t>(Builtin::kFree))) {
          program_->usesHeap = true;
        }
      }
    }
    if (std::string problem = validateProgram(*program_); !problem.empty()) {
      error_ = "decoded program is inconsistent: " + problem;
      return failure();
    }
    result.program = std::move(program);
    return result;
  }

private:
  static std::string kind(const Function& function) {
    return function.isKernel ? "kernel" : "function";
  }

  // `function` cannot run, for `reason`: it keeps its declaration (parameters, launch bounds) and
  // loses its code.
  static void refuse(Function& function, std::string reason) {
    function.unsupported = std::move(reason);
    function.code.clear();
    function.constants.clear();
    function.callSites.clear();
    function.matrixOperations.clear();
    function.textureOperations.clear();
    function.registerRows = 0;
    function.predicates = 0;
    function.carryRow = kNoRegister;
  }

  // The first function that cannot run and whose address some constant or variable holds, or
  // null.
  const Function* refusedFunctionWithItsAddressTaken() const {
    auto refused = [&](std::uint32_t index) -> const Function* {
      const Function& function = program_->functions[index];
      return function.unsupported.empty() ? nullptr : &function;
    };
    for (const Function& function : program_->functions) {
      for (const Constant& constant : function.constants) {
        if (constant.kind != Constant::Kind::kFunctionAddress) continue;
        if (const Function* found = refused(constant.symbol)) return found;
      }
    }
    for (const Variable& variable : program_->variables) {
      for (const Variable::Relocation& relocation : variable.relocations) {
        if (!relocation.function) continue;
        if (const Function* found = refused(relocation.symbol)) return found;
      }
    }
    return nullptr;
  }

  // A function calling one that cannot run (or an external function the sim does not provide)
  // cannot run either, through any depth of calls.
  void refuseCallersOfTheRefused() {
    for (bool changed = true; changed;) {
      changed = false;
      for (Function& function : program_->functions) {
        if (!function.defined || !function.unsupported.empty()) continue;
        std::string reason;
        for (const Instruction& instruction : function.code) {
          if (instruction.flow != Flow::kCall || instruction.op[0] != kNoRegister) continue;
          const Function& callee = program_->functions[instruction.target];
          if (!callee.unsupported.empty()) {
            reason = kind(function) + " " + shown(function.name) + " calls " + shown(callee.name) +
                     ", which the sim cannot run: " + callee.unsupported;
          } else if (!callee.defined && !callee.builtin) {
            reason = kind(function) + " " + shown(function.name) + " calls the external function " +
                     shown(callee.name) + ", which the sim does not provide";
          }
          if (!reason.empty()) break;
        }
        if (reason.empty()) continue;
        refuse(function, std::move(reason));
        changed = true;
      }
    }
  }

  DecodeResult failure() {
    DecodeResult result;
    result.status = CUDA_ERROR_INVALID_PTX;
    result.message = error_;
    return result;
  }

  DecodeResult notSupported(std::string message) {
    DecodeResult result;
    result.status = CUDA_ERROR_NOT_SUPPORTED;
    result.message = std::move(message);
    return result;
  }

  bool declareVariables() {
    for (VariableDecl& declaration : syntax_.variables) {
      if (declaration.space == Space::kLocal) {
        // Module-scope .local: one per thread, which nvcc does not emit.
        error_ = "module-scope .local variable " + shown(declaration.name);
        return false;
      }
      const auto existing = symbols_.variables.find(declaration.name);
      if (existing != symbols_.variables.end()) {
        Variable& previous = program_->variables[existing->second];
        // A declaration (.extern) and a definition of the same variable.
        if (previous.external && !declaration.external) {
          previous = makeVariable(declaration, existing->second);
          continue;
        }
        if (declaration.external) continue;
        error_ = "line " + std::to_string(declaration.line) + ": duplicate variable " +
                 shown(declaration.name);
        return false;
      }
      symbols_.variables[declaration.name] = static_cast<std::uint32_t>(program_->variables.size());
      program_->variables.push_back(makeVariable(declaration, program_->variables.size()));
    }
    for (const Variable& variable : program_->variables) {
      if (variable.external && variable.space != Space::kShared) {
        unsupported_ = "the external variable " + shown(variable.name) + " (the sim links nothing)";
      }
    }
    return true;
  }

  Variable makeVariable(VariableDecl& declaration, std::size_t index) {
    Variable variable;
    variable.name = declaration.name;
    variable.space = declaration.space;
    variable.bytes = declaration.bytes();
    variable.alignment = std::max(declaration.alignment, declaration.naturalAlignment());
    variable.external =
        declaration.external ||
        (declaration.space == Space::kShared && declaration.unsized && !declaration.hasInitializer);
    variable.managed = declaration.managed;
    std::erase_if(pendingInitializers_, [&](const auto& entry) { return entry.second == index; });
    pendingInitializers_.emplace_back(&declaration, index);
    return variable;
  }

  bool declareFunctions() {
    for (FunctionDecl& declaration : syntax_.functions) {
      const auto existing = symbols_.functions.find(declaration.name);
      if (existing != symbols_.functions.end()) {
        FunctionDecl& previous = functions_[existing->second];
        if (previous.defined && declaration.defined) {
          error_ = "line " + std::to_string(declaration.line) + ": duplicate function " +
                   shown(declaration.name);
          return false;
        }
        if (declaration.defined) {
          if (previous.parameters.size() != declaration.parameters.size() ||
              previous.results.size() != declaration.results.size() ||
              previous.isKernel != declaration.isKernel) {
            error_ = "line " + std::to_string(declaration.line) + ": " + shown(declaration.name) +
                     " defined unlike its declaration";
            return false;
          }
          previous = std::move(declaration);
        }
        continue;
      }
      symbols_.functions[declaration.name] = static_cast<std::uint32_t>(functions_.size());
      functions_.push_back(std::move(declaration));
    }
    if (functions_.size() > 65536) {
      error_ = "too many functions";
      return false;
    }
    program_->functions.resize(functions_.size());
    for (std::size_t i = 0; i < functions_.size(); ++i) {
      const FunctionDecl& declaration = functions_[i];
      Function& function = program_->functions[i];
      function.name = declaration.name;
      function.isKernel = declaration.isKernel;
      function.defined = declaration.defined;
      if (!declaration.defined) {
        const Builtin builtin = builtinFor(declaration.name);
        function.builtin = builtin != Builtin::kNone;
        function.builtinId = static_cast<std::uint32_t>(builtin);
      }
      for (const ParamDecl& parameter : declaration.parameters) {
        if (parameter.isRegister) {
          unsupported_ = "register parameters of " + shown(declaration.name);
        }
      }
      if (declaration.isKernel) {
        std::uint64_t end = 0;
        for (const ParamDecl& parameter : declaration.parameters) {
          const std::uint64_t offset = alignUp(end, parameter.align());
          KernelParameter out;
          out.name = parameter.name;
          out.offset = static_cast<std::uint32_t>(offset);
          out.size = static_cast<std::uint32_t>(parameter.bytes());
          out.alignment = parameter.align();
          end = offset + parameter.bytes();
          if (end > 32764) {
            error_ = "line " + std::to_string(declaration.line) + ": parameters of " +
                     shown(declaration.name) + " exceed 32764 bytes";
            return false;
          }
          function.kernelParameters.push_back(std::move(out));
        }
        function.kernelParameterBytes = static_cast<std::uint32_t>(end);
        std::uint64_t maxThreads = 0;
        if (declaration.maxThreads[0] != 0) {
          maxThreads = std::uint64_t{declaration.maxThreads[0]} * declaration.maxThreads[1] *
                       declaration.maxThreads[2];
        }
        if (declaration.requiredThreads[0] != 0) {
          const std::uint64_t required = std::uint64_t{declaration.requiredThreads[0]} *
                                         declaration.requiredThreads[1] *
                                         declaration.requiredThreads[2];
          maxThreads = maxThreads == 0 ? required : std::min(maxThreads, required);
          for (int d = 0; d < 3; ++d) function.requiredThreads[d] = declaration.requiredThreads[d];
        }
        function.maxThreads =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(maxThreads, 1u << 20));
        function.minBlocksPerSm = declaration.minBlocksPerSm;
        function.maxRegisters = declaration.maxRegisters;
      } else {
        std::uint64_t end = 0;
        for (const ParamDecl& parameter : declaration.parameters) {
          end = alignUp(end, parameter.align());
          function.parameterOffsets.push_back(static_cast<std::uint32_t>(end));
          function.parameterSizes.push_back(static_cast<std::uint32_t>(parameter.bytes()));
          end += parameter.bytes();
        }
        for (const ParamDecl& result : declaration.results) {
          end = alignUp(end, result.align());
          function.resultOffsets.push_back(static_cast<std::uint32_t>(end));
          function.resultSizes.push_back(static_cast<std::uint32_t>(result.bytes()));
          end += result.bytes();
        }
        if (end > kMaxLocalBytesPerFunction) {
          error_ = "parameters of " + shown(declaration.name) + " too large";
          return false;
        }
        function.parameterBytes = static_cast<std::uint32_t>(end);
      }
    }
    return true;
  }

  // One offset per .shared variable for the whole module: module-scope ones and those of
  // functions first, then each kernel's own (kernels overlap: only one runs in a block), then
  // dynamic shared memory, at the same offset for every kernel.
  bool layoutShared() {
    std::uint64_t top = 0;
    std::uint32_t dynamicAlignment = 16;
    auto place = [&](Variable& variable) {
      top = alignUp(top, variable.alignment);
      variable.sharedOffset = top;
      top += variable.bytes;
    };
    for (Variable& variable : program_->variables) {
      if (variable.space != Space::kShared) continue;
      if (variable.external) {
        dynamicAlignment = std::max(dynamicAlignment, variable.alignment);
        continue;
      }
      place(variable);
    }
    localShared_.resize(functions_.size());
    auto declareLocal = [&](std::size_t index, bool kernelPass) {
      for (const Statement& statement : functions_[index].body) {
        if (statement.kind != Statement::Kind::kVariable ||
            statement.variable.space != Space::kShared) {
          continue;
        }
        Variable variable;
        variable.name = statement.variable.name;
        variable.space = Space::kShared;
        variable.bytes = statement.variable.bytes();
        variable.alignment =
            std::max(statement.variable.alignment, statement.variable.naturalAlignment());
        if (statement.variable.unsized || statement.variable.external) {
          variable.external = true;
          dynamicAlignment = std::max(dynamicAlignment, variable.alignment);
        } else if (!kernelPass) {
          place(variable);
        }
        localShared_[index].push_back(static_cast<std::uint32_t>(program_->variables.size()));
        program_->variables.push_back(std::move(variable));
      }
    };
    for (std::size_t i = 0; i < functions_.size(); ++i) {
      if (!functions_[i].isKernel) declareLocal(i, false);
    }
    const std::uint64_t prefix = top;
    std::uint64_t largest = prefix;
    for (std::size_t i = 0; i < functions_.size(); ++i) {
      if (!functions_[i].isKernel) continue;
      declareLocal(i, true);
      std::uint64_t own = prefix;
      for (const std::uint32_t index : localShared_[i]) {
        Variable& variable = program_->variables[index];
        if (variable.external) continue;
        own = alignUp(own, variable.alignment);
        variable.sharedOffset = own;
        own += variable.bytes;
      }
      program_->functions[i].ownSharedBytes =
          static_cast<std::uint32_t>(std::min<std::uint64_t>(own, kMaxSharedBytes + 1));
      largest = std::max(largest, own);
    }
    program_->staticSharedBytes = largest;
    program_->dynamicSharedOffset = alignUp(largest, dynamicAlignment);
    for (Variable& variable : program_->variables) {
      if (variable.space == Space::kShared && variable.external) {
        variable.sharedOffset = program_->dynamicSharedOffset;
      }
    }
    if (largest > kMaxSharedBytes) {
      error_ = "static shared memory exceeds " + std::to_string(kMaxSharedBytes) + " bytes";
      return false;
    }
    return true;
  }

  // .global variables, then .const ones, in one block of device memory.
  bool layoutGlobals() {
    std::uint64_t top = 0;
    program_->globalOffsets.assign(program_->variables.size(), 0);
    for (const Space space : {Space::kGlobal, Space::kConst}) {
      for (std::size_t i = 0; i < program_->variables.size(); ++i) {
        Variable& variable = program_->variables[i];
        if (variable.space != space) continue;
        top = alignUp(top, std::max<std::uint32_t>(variable.alignment, 1));
        program_->globalOffsets[i] = top;
        top += std::max<std::uint64_t>(variable.bytes, 1);
        if (top > kMaxVariableBytes) {
          error_ = "module variables exceed " + std::to_string(kMaxVariableBytes) + " bytes";
          return false;
        }
      }
      if (space == Space::kGlobal) program_->constOffset = alignUp(top, 256);
      if (space == Space::kGlobal) top = program_->constOffset;
    }
    program_->globalBytes = top;
    for (auto& [declaration, index] : pendingInitializers_) {
      if (!initialise(*declaration, program_->variables[index])) return false;
    }
    return true;
  }

  bool initialise(const VariableDecl& declaration, Variable& variable) {
    if (!declaration.hasInitializer) return true;
    if (variable.space == Space::kShared) {
      error_ = "line " + std::to_string(declaration.line) + ": initialised .shared variable";
      return false;
    }
    const unsigned element = typeBytes(declaration.type);
    if (declaration.initializer.size() > declaration.count * declaration.vector) {
      error_ = "line " + std::to_string(declaration.line) + ": too many initial values for " +
               shown(declaration.name);
      return false;
    }
    variable.initializer.assign(variable.bytes, 0);
    for (std::size_t i = 0; i < declaration.initializer.size(); ++i) {
      const InitItem& item = declaration.initializer[i];
      const std::uint64_t offset = i * element;
      std::uint64_t bits = 0;
      switch (item.kind) {
        case InitItem::Kind::kNumber:
          bits = item.bits;
          if (isFloat(declaration.type)) {
            // An integer initializer of a float variable is its value.
            bits = floatValueBits(static_cast<double>(static_cast<std::int64_t>(item.bits)),
                                  declaration.type);
          }
          break;
        case InitItem::Kind::kFloat: {
          const double value = item.floating.single
                                   ? static_cast<double>(std::bit_cast<float>(
                                         static_cast<std::uint32_t>(item.floating.bits)))
                                   : std::bit_cast<double>(item.floating.bits);
          if (item.floating.single && declaration.type != Type::kF64) {
            bits = item.floating.bits;
          } else if (item.floating.hexDouble && declaration.type == Type::kF64) {
            bits = item.floating.bits;
          } else {
            bits = floatValueBits(value, declaration.type);
          }
          break;
        }
        case InitItem::Kind::kSymbol: {
          Variable::Relocation relocation;
          relocation.offset = offset;
          relocation.addend = item.addend;
          relocation.generic = item.generic;
          relocation.bytes = static_cast<std::uint8_t>(element);
          if (item.mask != 0) {
            const int shift = std::countr_zero(item.mask);
            if (item.mask >> shift != 0xff || shift % 8 != 0) {
              error_ = "line " + std::to_string(declaration.line) + ": bad address mask";
              return false;
            }
            relocation.shift = static_cast<std::uint8_t>(shift);
          } else if (element != 8 && element != 4) {
            error_ = "line " + std::to_string(declaration.line) +
                     ": an address in a variable narrower than 32 bits";
            return false;
          }
          if (const auto found = symbols_.variables.find(item.symbol);
              found != symbols_.variables.end()) {
            relocation.symbol = found->second;
          } else if (const auto function = symbols_.functions.find(item.symbol);
                     function != symbols_.functions.end()) {
            relocation.symbol = function->second;
            relocation.function = true;
          } else {
            error_ = "line " + std::to_string(declaration.line) + ": initializer names undefined " +
                     shown(item.symbol);
            return false;
          }
          variable.relocations.push_back(relocation);
          continue;
        }
      }
      std::memcpy(variable.initializer.data() + offset, &bits, std::min<unsigned>(element, 8));
    }
    return true;
  }

  static std::uint64_t floatValueBits(double value, Type type) {
    switch (type) {
      case Type::kF32:
        return std::bit_cast<std::uint32_t>(static_cast<float>(value));
      case Type::kF64:
        return std::bit_cast<std::uint64_t>(value);
      default:
        return static_cast<std::uint64_t>(value);
    }
  }

  ModuleSyntax& syntax_;
  Program* program_ = nullptr;
  ModuleSymbols symbols_;
  std::vector<FunctionDecl> functions_;
  std::vector<std::vector<std::uint32_t>> localShared_;
  std::vector<std::pair<VariableDecl*, std::size_t>> pendingInitializers_;
  std::string error_;
  std::string unsupported_;
};

}  // namespace

DecodeResult decodePtx(std::string_view text) {
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    text = text.substr(0, nul);
  }
  DecodeResult result;
  if (text.size() > kMaxModuleBytes) {
    result.status = CUDA_ERROR_INVALID_PTX;
    result.message = "module larger than " + std::to_string(kMaxModuleBytes) + " bytes";
    return result;
  }
  ModuleSyntax syntax;
  Parser parser(text);
  if (!parser.run(syntax)) {
    result.status = CUDA_ERROR_INVALID_PTX;
    result.message = parser.error();
    return result;
  }
  if (!syntax.sawVersion || !syntax.sawTarget) {
    result.status = CUDA_ERROR_INVALID_PTX;
    result.message = "missing .version or .target";
    return result;
  }
  return ModuleLowering(syntax).run();
}

}  // namespace gpuproxy::server::ptx
