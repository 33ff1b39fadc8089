// Warp-level matrix instructions (wmma: what nvcuda::wmma's load_matrix_sync, mma_sync and
// store_matrix_sync compile to): a warp loads tiles of A, B and C into fragments spread over its
// 32 lanes' registers, multiplies and accumulates, and stores D.
//
// How a fragment's elements lie in the lanes' registers is left to the implementation by CUDA
// (programs may only touch a fragment element by element, all alike: scale it, convert it).
// Here: the tile's elements in row-major order, numbered e = row * columns + column; lane t's
// slot s holds element (t * slots + s) % elements, where a fragment has `slots` elements per lane
// (16 for f16 A and B, as on a GPU, so small tiles repeat; tiles / 32 otherwise), packed
// low-first into 32-bit registers (two f16 or bf16, four s8 or u8) or one per register.
// The product is computed from the warp's fragments as one matrix, in f32 for f16, bf16 and
// tf32 inputs (tf32: the low 13 bits of each f32 ignored, as tensor cores do), in f64 for f64 and
// in 64-bit integers for s8 and u8 (then wrapped or, with .satfinite, clamped to s32).
//
// mma.sync, ldmatrix, stmatrix and movmatrix (what CUTLASS, Triton and hand-written tensor-core
// kernels use) are the same warp-wide operations on fragments whose layout the PTX ISA defines
// ("Matrix Fragments for mma.mMnNkK", "ldmatrix"): programs place and read elements by it, so
// the sim follows it exactly (mmaPosition, matrixElementAt).

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_numeric.hpp"
#include "server/backend/ptx/ptx_ops_common.hpp"

namespace gpuproxy::server::ptx {
namespace {

using Kind = MatrixOperation::Kind;

struct Tile {
  unsigned rows = 0;
  unsigned columns = 0;
  unsigned elements() const { return rows * columns; }
};

Tile tileOf(const MatrixOperation& operation, char matrix) {
  switch (matrix) {
    case 'a':
      return {operation.m, operation.k};
    case 'b':
      return {operation.k, operation.n};
    default:
      return {operation.m, operation.n};
  }
}

unsigned elementBytes(MatrixElement element) {
  switch (element) {
    case MatrixElement::kS8:
    case MatrixElement::kU8:
      return 1;
    case MatrixElement::kF16:
    case MatrixElement::kBf16:
      return 2;
    case MatrixElement::kF64:
      return 8;
    default:
      return 4;  // f32, tf32 (an f32 in memory), s32
  }
}

// Elements per register: 32-bit registers pack narrow elements.
unsigned elementsPerRegister(MatrixElement element) {
  const unsigned bytes = elementBytes(element);
  return bytes >= 4 ? 1 : 4 / bytes;
}

unsigned slotsPerLane(const MatrixOperation& operation, char matrix, MatrixElement element,
                      Tile tile) {
  if (operation.kind != Kind::kMmaSync && element == MatrixElement::kF16 &&
      (matrix == 'a' || matrix == 'b')) {
    return 16;
  }
  return tile.elements() / kWarpSize;
}

struct Position {
  unsigned row = 0;
  unsigned column = 0;
};

// mma.sync: where element `i` of lane `lane`'s fragment of `matrix` lies in its tile, as the PTX
// ISA lays fragments out ("Matrix Fragments for mma.mMnNkK"): a lane's quad (lane / 4) picks
// rows of A and C and columns of B, its place in the quad (lane % 4) the other coordinate.
Position mmaPosition(const MatrixOperation& operation, char matrix, unsigned lane, unsigned i) {
  const unsigned group = lane >> 2;
  const unsigned member = lane % 4;
  const MatrixElement input = operation.elements[1];
  const bool bytes = input == MatrixElement::kS8 || input == MatrixElement::kU8;
  const bool accumulator = matrix == 'c' || matrix == 'd';
  if (operation.m == 8) {  // m8n8k4 (f64), m8n8k16 (s8, u8)
    if (accumulator) return {group, member * 2 + i};
    const unsigned along = bytes ? member * 4 + i : member;
    return matrix == 'a' ? Position{group, along} : Position{along, group};
  }
  // m16n8k*: C and D alike for every input type.
  if (accumulator) return {group + 8 * (i >> 1), member * 2 + (i & 1)};
  if (input == MatrixElement::kTf32) {
    if (matrix == 'a') {
      return operation.k == 4 ? Position{group + 8 * i, member}
                              : Position{group + 8 * (i & 1), member + 4 * (i >> 1)};
    }
    return {member + 4 * i, group};  // k4: i is 0
  }
  if (bytes) {
    if (matrix == 'a') {
      return operation.k == 16
                 ? Position{group + 8 * (i >> 2), member * 4 + (i & 3)}
                 : Position{group + 8 * ((i >> 2) & 1), member * 4 + (i & 3) + 16 * (i >> 3)};
    }
    return {member * 4 + (i & 3) + 16 * (i >> 2), group};  // k16: i < 4
  }
  // f16, bf16
  if (matrix == 'a') {
    return operation.k == 8
               ? Position{group + 8 * (i >> 1), member * 2 + (i & 1)}
               : Position{group + 8 * ((i >> 1) & 1), member * 2 + (i & 1) + 8 * (i >> 2)};
  }
  return {member * 2 + (i & 1) + 8 * (i >> 1), group};  // k8: i < 2
}

// Where element `index` (row-major in its tile) of `matrix` lies among the warp's fragments.
Position slotOf(const MatrixOperation& operation, char matrix, unsigned slots, unsigned lane,
                unsigned slot, Tile tile) {
  if (operation.kind == Kind::kMmaSync) return mmaPosition(operation, matrix, lane, slot);
  const unsigned index = (lane * slots + slot) % tile.elements();
  return {index / tile.columns, index % tile.columns};
}

// The bits of slot `slot` of lane `lane`'s fragment.
std::uint64_t readSlot(ExecContext& context, const std::vector<std::uint32_t>& fragment,
                       MatrixElement element, std::uint32_t lane, unsigned slot) {
  const unsigned perRegister = elementsPerRegister(element);
  const std::uint64_t value = context.row(fragment[slot / perRegister])[lane];
  if (perRegister == 1) return elementBytes(element) == 8 ? value : value & 0xffffffffu;
  const unsigned bits = 32 / perRegister;
  return (value >> ((slot % perRegister) * bits)) & ((1u << bits) - 1);
}

void writeSlot(ExecContext& context, const std::vector<std::uint32_t>& fragment,
               MatrixElement element, std::uint32_t lane, unsigned slot, std::uint64_t bits) {
  const unsigned perRegister = elementsPerRegister(element);
  std::uint64_t& value = context.row(fragment[slot / perRegister])[lane];
  if (perRegister == 1) {
    value = elementBytes(element) == 8 ? bits : bits & 0xffffffffu;
    return;
  }
  const unsigned width = 32 / perRegister;
  const unsigned shift = (slot % perRegister) * width;
  const std::uint64_t mask = ((std::uint64_t{1} << width) - 1) << shift;
  value = ((value & ~mask) | ((bits << shift) & mask)) & 0xffffffffu;
}

// An element's value for the product: floating types as a double, integers exactly.
double asReal(MatrixElement element, std::uint64_t bits) {
  switch (element) {
    case MatrixElement::kF16:
      return fromHalf(static_cast<std::uint16_t>(bits));
    case MatrixElement::kBf16:
      return fromBfloat16(static_cast<std::uint16_t>(bits));
    case MatrixElement::kTf32:
      return std::bit_cast<float>(static_cast<std::uint32_t>(bits) & ~0x1fffu);
    case MatrixElement::kF32:
      return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    case MatrixElement::kF64:
      return std::bit_cast<double>(bits);
    default:
      return 0;
  }
}

std::int64_t asInteger(MatrixElement element, std::uint64_t bits) {
  switch (element) {
    case MatrixElement::kS8:
      return static_cast<std::int8_t>(bits);
    case MatrixElement::kU8:
      return static_cast<std::uint8_t>(bits);
    default:
      return static_cast<std::int32_t>(bits);
  }
}

bool isInteger(MatrixElement element) {
  return element == MatrixElement::kS8 || element == MatrixElement::kU8 ||
         element == MatrixElement::kS32;
}

// Where the fragment's element (row, column) lies, in elements from the tile's start.
std::uint64_t elementOffset(const MatrixOperation& operation, std::uint64_t stride, unsigned row,
                            unsigned column) {
  return operation.rowMajor ? row * stride + column : column * stride + row;
}

template <Kind K>
bool matrixMemoryHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const MatrixOperation& operation = context.frame->function->matrixOperations[instruction.extra];
  const Tile tile = tileOf(operation, operation.matrix);
  const MatrixElement element = operation.elements[0];
  const unsigned bytes = elementBytes(element);
  const unsigned slots = slotsPerLane(operation, operation.matrix, element, tile);
  const auto space = static_cast<Space>(instruction.space);
  const std::uint64_t* base = context.row(instruction.op[4]);
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    const std::uint64_t start = addressOf(instruction, base, lane);
    const std::uint64_t stride =
        operation.stride != kNoRegister
            ? static_cast<std::uint32_t>(context.row(operation.stride)[lane])
            : (operation.rowMajor ? tile.columns : tile.rows);
    for (unsigned slot = 0; slot < slots; ++slot) {
      const unsigned index = (lane * slots + slot) % tile.elements();
      const std::uint64_t address =
          start +
          elementOffset(operation, stride, index / tile.columns, index % tile.columns) * bytes;
      std::byte* where = translate(context, space, address, bytes, bytes, lane, K == Kind::kStore);
      if (where == nullptr) return false;
      std::uint64_t bits = 0;
      if constexpr (K == Kind::kLoad) {
        std::memcpy(&bits, where, bytes);  // little-endian: the low bytes
        writeSlot(context, operation.fragments[0], element, lane, slot, bits);
      } else {
        bits = readSlot(context, operation.fragments[0], element, lane, slot);
        std::memcpy(where, &bits, bytes);
      }
    }
    return true;
  });
}

bool matrixMultiplyHandler(ExecContext& context, const Instruction& instruction,
                           std::uint32_t mask) {
  const MatrixOperation& operation = context.frame->function->matrixOperations[instruction.extra];
  const char names[4] = {'d', 'a', 'b', 'c'};
  // The warp's tiles, row-major, gathered from the lanes' fragments (wmma: from the first lane
  // holding each element).
  auto gather = [&](int which, auto convert) {
    const Tile tile = tileOf(operation, names[which]);
    const MatrixElement element = operation.elements[which];
    const unsigned slots = slotsPerLane(operation, names[which], element, tile);
    std::vector<decltype(convert(element, std::uint64_t{0}))> values(tile.elements());
    if (operation.kind == Kind::kMmaSync) {
      for (unsigned lane = 0; lane < kWarpSize; ++lane) {
        for (unsigned slot = 0; slot < slots; ++slot) {
          const Position at = mmaPosition(operation, names[which], lane, slot);
          values[at.row * tile.columns + at.column] =
              convert(element, readSlot(context, operation.fragments[which], element, lane, slot));
        }
      }
      return values;
    }
    for (unsigned index = 0; index < tile.elements(); ++index) {
      values[index] = convert(element, readSlot(context, operation.fragments[which], element,
                                                index / slots, index % slots));
    }
    return values;
  };
  const unsigned m = operation.m, n = operation.n, k = operation.k;
  const MatrixElement result = operation.elements[0];
  const Tile tileD = tileOf(operation, 'd');
  std::vector<std::uint64_t> d(tileD.elements());
  if (isInteger(operation.elements[1])) {
    const auto a = gather(1, asInteger), b = gather(2, asInteger), c = gather(3, asInteger);
    for (unsigned row = 0; row < m; ++row) {
      for (unsigned column = 0; column < n; ++column) {
        std::int64_t sum = c[row * n + column];
        for (unsigned i = 0; i < k; ++i) sum += a[row * k + i] * b[i * n + column];
        if (operation.saturate) {
          sum = std::clamp<std::int64_t>(sum, std::numeric_limits<std::int32_t>::min(),
                                         std::numeric_limits<std::int32_t>::max());
        }
        d[row * n + column] = static_cast<std::uint32_t>(sum);
      }
    }
  } else if (result == MatrixElement::kF64) {
    const auto a = gather(1, asReal), b = gather(2, asReal), c = gather(3, asReal);
    for (unsigned row = 0; row < m; ++row) {
      for (unsigned column = 0; column < n; ++column) {
        double sum = c[row * n + column];
        for (unsigned i = 0; i < k; ++i) sum = std::fma(a[row * k + i], b[i * n + column], sum);
        d[row * n + column] = std::bit_cast<std::uint64_t>(sum);
      }
    }
  } else {
    const auto a = gather(1, asReal), b = gather(2, asReal), c = gather(3, asReal);
    for (unsigned row = 0; row < m; ++row) {
      for (unsigned column = 0; column < n; ++column) {
        auto sum = static_cast<float>(c[row * n + column]);
        for (unsigned i = 0; i < k; ++i) {
          sum += static_cast<float>(a[row * k + i]) * static_cast<float>(b[i * n + column]);
        }
        if (result == MatrixElement::kF16) {
          d[row * n + column] = toHalf(sum, Rounding::kNearest, operation.saturate);
        } else {
          if (operation.saturate && std::isinf(sum)) {
            sum = std::copysign(std::numeric_limits<float>::max(), sum);
          }
          d[row * n + column] = std::bit_cast<std::uint32_t>(sum);
        }
      }
    }
  }
  const unsigned slots = slotsPerLane(operation, 'd', result, tileD);
  forLanes(mask, [&](std::uint32_t lane) {
    for (unsigned slot = 0; slot < slots; ++slot) {
      const Position at = slotOf(operation, 'd', slots, lane, slot, tileD);
      writeSlot(context, operation.fragments[0], result, lane, slot,
                d[at.row * tileD.columns + at.column]);
    }
  });
  return true;
}

// ldmatrix, stmatrix and movmatrix work on 8 x 8 matrices of 16-bit elements; in a warp's
// fragment of one, lane l holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 (low half first).
using Matrix8x8 = std::array<std::array<std::uint16_t, 8>, 8>;

// The element a lane's register holds in its low (`high` false) or high half: of the matrix, or
// of its transpose.
std::uint16_t& matrixElementAt(Matrix8x8& matrix, unsigned lane, bool high, bool transpose) {
  const unsigned row = lane / 4;
  const unsigned column = 2 * (lane % 4) + (high ? 1 : 0);
  return transpose ? matrix[column][row] : matrix[row][column];
}

// ldmatrix (Store false) and stmatrix (Store true): lanes 8j to 8j + 7 give the addresses of
// matrix j's eight rows, 16 bytes each; each lane's register j holds its part of matrix j.
template <bool Store>
bool matricesHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const MatrixOperation& operation = context.frame->function->matrixOperations[instruction.extra];
  const auto space = static_cast<Space>(instruction.space);
  const std::uint64_t* base = context.row(instruction.op[4]);
  std::array<Matrix8x8, 4> matrices{};
  if constexpr (Store) {
    forLanes(mask, [&](std::uint32_t lane) {
      for (unsigned j = 0; j < operation.matrices; ++j) {
        const auto value = static_cast<std::uint32_t>(context.row(operation.fragments[0][j])[lane]);
        matrixElementAt(matrices[j], lane, false, operation.transpose) =
            static_cast<std::uint16_t>(value);
        matrixElementAt(matrices[j], lane, true, operation.transpose) =
            static_cast<std::uint16_t>(value >> 16);
      }
    });
  }
  for (unsigned j = 0; j < operation.matrices; ++j) {
    for (unsigned row = 0; row < 8; ++row) {
      const unsigned lane = j * 8 + row;
      // A row whose lane is not executing (it exited) has no address: its elements read as 0.
      if (((mask >> lane) & 1) == 0) continue;
      const std::uint64_t address = addressOf(instruction, base, lane);
      std::byte* where = translate(context, space, address, 16, 16, lane, Store);
      if (where == nullptr) return false;
      if constexpr (Store) {
        std::memcpy(where, matrices[j][row].data(), 16);
      } else {
        std::memcpy(matrices[j][row].data(), where, 16);
      }
    }
  }
  if constexpr (!Store) {
    forLanes(mask, [&](std::uint32_t lane) {
      for (unsigned j = 0; j < operation.matrices; ++j) {
        const std::uint32_t low = matrixElementAt(matrices[j], lane, false, operation.transpose);
        const std::uint32_t high = matrixElementAt(matrices[j], lane, true, operation.transpose);
        context.row(operation.fragments[0][j])[lane] = low | (high << 16);
      }
    });
  }
  return true;
}

// movmatrix.trans: the warp's 8 x 8 matrix in fragments[1], transposed into fragments[0].
bool transposeMatrixHandler(ExecContext& context, const Instruction& instruction,
                            std::uint32_t mask) {
  const MatrixOperation& operation = context.frame->function->matrixOperations[instruction.extra];
  Matrix8x8 matrix{};
  const std::uint64_t* source = context.row(operation.fragments[1][0]);
  for (unsigned lane = 0; lane < kWarpSize; ++lane) {
    const auto value = static_cast<std::uint32_t>(source[lane]);
    matrixElementAt(matrix, lane, false, false) = static_cast<std::uint16_t>(value);
    matrixElementAt(matrix, lane, true, false) = static_cast<std::uint16_t>(value >> 16);
  }
  std::uint64_t* result = context.row(operation.fragments[0][0]);
  forLanes(mask, [&](std::uint32_t lane) {
    const std::uint32_t low = matrixElementAt(matrix, lane, false, true);
    const std::uint32_t high = matrixElementAt(matrix, lane, true, true);
    result[lane] = low | (high << 16);
  });
  return true;
}

std::optional<MatrixElement> matrixElement(std::string_view word) {
  static constexpr std::pair<std::string_view, MatrixElement> kNames[] = {
      {"f16", MatrixElement::kF16}, {"bf16", MatrixElement::kBf16}, {"tf32", MatrixElement::kTf32},
      {"f32", MatrixElement::kF32}, {"f64", MatrixElement::kF64},   {"s8", MatrixElement::kS8},
      {"u8", MatrixElement::kU8},   {"s32", MatrixElement::kS32}};
  for (const auto& [name, element] : kNames) {
    if (word == name) return element;
  }
  return std::nullopt;
}

// The shapes and input types tensor cores offer through wmma (sub-byte types excepted).
bool shapeFits(unsigned m, unsigned n, unsigned k, MatrixElement input) {
  const bool halfShapes = (m == 16 && n == 16 && k == 16) || (m == 32 && n == 8 && k == 16) ||
                          (m == 8 && n == 32 && k == 16);
  switch (input) {
    case MatrixElement::kF16:
    case MatrixElement::kBf16:
    case MatrixElement::kS8:
    case MatrixElement::kU8:
      return halfShapes;
    case MatrixElement::kTf32:
      return m == 16 && n == 16 && k == 8;
    case MatrixElement::kF64:
      return m == 8 && n == 8 && k == 4;
    default:
      return false;
  }
}

// Whether `accumulator` is a C or D type tensor cores pair with `input` (A and B).
bool accumulatorFits(MatrixElement input, MatrixElement accumulator) {
  switch (input) {
    case MatrixElement::kF16:
      return accumulator == MatrixElement::kF16 || accumulator == MatrixElement::kF32;
    case MatrixElement::kBf16:
    case MatrixElement::kTf32:
      return accumulator == MatrixElement::kF32;
    case MatrixElement::kS8:
    case MatrixElement::kU8:
      return accumulator == MatrixElement::kS32;
    case MatrixElement::kF64:
      return accumulator == MatrixElement::kF64;
    default:
      return false;
  }
}

bool bindFragment(const Operand& operand, MatrixOperation& operation, int which, char matrix,
                  bool written, OperandResolver& resolver) {
  const Tile tile = tileOf(operation, matrix);
  const MatrixElement element = operation.elements[which];
  const unsigned registers =
      slotsPerLane(operation, matrix, element, tile) / elementsPerRegister(element);
  if (operand.kind != Operand::Kind::kVector || operand.elements.size() != registers) {
    return bindError(resolver, std::string("the ") + matrix + " fragment takes " +
                                   std::to_string(registers) + " registers");
  }
  const Type type = elementBytes(element) == 8 ? Type::kB64 : Type::kB32;
  for (const Operand& each : operand.elements) {
    const std::uint32_t row =
        written ? resolver.destination(each, type) : resolver.source(each, type);
    if (row == kNoRegister) return false;
    operation.fragments[which].push_back(row);
  }
  return true;
}

// A warp instruction: it waits for every lane of the warp, as .aligned requires.
bool finishWarpMatrix(OperandResolver& resolver, Instruction& instruction,
                      MatrixOperation operation) {
  instruction.flow = Flow::kWarpSync;
  instruction.op[0] = resolver.constant(0xffffffffu);
  instruction.target = 0;
  instruction.extra = resolver.matrixOperation(std::move(operation));
  return true;
}

// The words of an opcode after its base: "mma.sync.aligned.m16n8k16" -> sync, aligned, m16n8k16.
std::vector<std::string_view> opcodeWords(const std::string& opcode) {
  std::vector<std::string_view> words;
  for (std::size_t dot = opcode.find('.'); dot != std::string::npos;) {
    const std::size_t next = opcode.find('.', dot + 1);
    words.push_back(std::string_view(opcode).substr(
        dot + 1, next == std::string::npos ? next : next - dot - 1));
    dot = next;
  }
  return words;
}

// The shape word mMnNkK among `words` (taken), or false.
bool takeShape(const std::vector<std::string_view>& words, Qualifiers& qualifiers,
               MatrixOperation& operation) {
  for (std::string_view word : words) {
    unsigned m = 0, n = 0, k = 0;
    char tail = 0;
    if (std::sscanf(std::string(word).c_str(), "m%un%uk%u%c", &m, &n, &k, &tail) == 3 && m <= 64 &&
        n <= 64 && k <= 64) {
      operation.m = static_cast<std::uint8_t>(m);
      operation.n = static_cast<std::uint8_t>(n);
      operation.k = static_cast<std::uint8_t>(k);
      qualifiers.take(word);
      return true;
    }
  }
  return false;
}

// The instruction's matrix element types, in the order written (taken).
std::vector<MatrixElement> takeElements(const std::vector<std::string_view>& words,
                                        Qualifiers& qualifiers) {
  std::vector<MatrixElement> found;
  for (std::string_view word : words) {
    if (const std::optional<MatrixElement> element = matrixElement(word)) {
      found.push_back(*element);
      qualifiers.take(word);
    }
  }
  return found;
}

// The shapes and types mma.sync has on compute capability 8.x and 9.0 (besides the sub-byte,
// fp8, sparse and Volta-only m8n8k4 .f16 forms, which are refused).
bool mmaShapeFits(const MatrixOperation& operation) {
  const MatrixElement input = operation.elements[1];
  const MatrixElement other = operation.elements[2];
  const unsigned m = operation.m, n = operation.n, k = operation.k;
  const bool m16n8 = m == 16 && n == 8;
  switch (input) {
    case MatrixElement::kF16:
    case MatrixElement::kBf16:
      return other == input && m16n8 && (k == 8 || k == 16);
    case MatrixElement::kTf32:
      return other == input && m16n8 && (k == 4 || k == 8);
    case MatrixElement::kS8:
    case MatrixElement::kU8:
      return (other == MatrixElement::kS8 || other == MatrixElement::kU8) &&
             ((m16n8 && (k == 16 || k == 32)) || (m == 8 && n == 8 && k == 16));
    case MatrixElement::kF64:
      return other == input && m == 8 && n == 8 && k == 4;
    default:
      return false;
  }
}

// mma.sync.aligned.shape.row.col{.satfinite}.dtype.atype.btype.ctype d, a, b, c.
bool bindMmaSync(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported) {
  MatrixOperation operation;
  operation.kind = Kind::kMmaSync;
  if (qualifiers.take("sp")) {
    return unsupportedBinding(resolver, unsupported, "sparse tensor-core instructions (mma.sp)");
  }
  if (!qualifiers.take("sync") || !qualifiers.take("aligned")) {
    return bindError(resolver, "mma needs .sync.aligned");
  }
  const std::vector<std::string_view> words = opcodeWords(parsed.opcode);
  for (std::string_view word : words) {
    if (word == "s4" || word == "u4" || word == "b1") {
      return unsupportedBinding(resolver, unsupported,
                                "tensor-core instructions of sub-byte types");
    }
    if (word == "e4m3" || word == "e5m2" || word == "e3m2" || word == "e2m3" || word == "e2m1") {
      return unsupportedBinding(resolver, unsupported, "tensor-core instructions of fp8 types");
    }
  }
  if (!takeShape(words, qualifiers, operation)) return bindError(resolver, "mma without a shape");
  const bool rowCol = qualifiers.take("row") && qualifiers.take("col");
  operation.saturate = qualifiers.take("satfinite");
  qualifiers.take("rn");  // f64: the only rounding it has is the default
  const std::vector<MatrixElement> types = takeElements(words, qualifiers);
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (types.size() != 4) {
    return unsupportedBinding(resolver, unsupported, "tensor-core instructions of these types");
  }
  std::copy(types.begin(), types.end(), operation.elements);
  const MatrixElement input = operation.elements[1];
  if (!mmaShapeFits(operation) || !accumulatorFits(input, operation.elements[0]) ||
      !accumulatorFits(input, operation.elements[3])) {
    return unsupportedBinding(resolver, unsupported,
                              "tensor-core instructions of this shape and these types");
  }
  if (!rowCol) return bindError(resolver, "mma of this shape needs .row.col");
  if (operation.saturate && !isInteger(input)) {
    return bindError(resolver, ".satfinite needs integer inputs");
  }
  if (!expectOperands(parsed, 4, resolver)) return false;
  const char matrices[4] = {'d', 'a', 'b', 'c'};
  for (int which = 0; which < 4; ++which) {
    if (!bindFragment(parsed.operands[static_cast<std::size_t>(which)], operation, which,
                      matrices[which], which == 0, resolver)) {
      return false;
    }
  }
  instruction.handler = &matrixMultiplyHandler;
  return finishWarpMatrix(resolver, instruction, std::move(operation));
}

// One b32 register per matrix, written {r0, ...} or as a lone register.
bool bindMatrixRegisters(const Operand& operand, unsigned count, bool written,
                         std::vector<std::uint32_t>& rows, OperandResolver& resolver) {
  return bindRegisterList(operand, count, Type::kB32, written, resolver, rows);
}

// ldmatrix/stmatrix.sync.aligned.m8n8.xN{.trans}{.shared{::cta}}.b16, and
// movmatrix.sync.aligned.m8n8.trans.b16.
bool bindMatrices(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                  OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  MatrixOperation operation;
  operation.kind = base == "ldmatrix"   ? Kind::kLoadMatrices
                   : base == "stmatrix" ? Kind::kStoreMatrices
                                        : Kind::kTransposeMatrix;
  if (!qualifiers.take("sync") || !qualifiers.take("aligned")) {
    return bindError(resolver, std::string(base) + " needs .sync.aligned");
  }
  if (!qualifiers.take("m8n8") || !qualifiers.take("b16")) {
    return unsupportedBinding(resolver, unsupported,
                              std::string(base) + " of other than 8 x 8 matrices of .b16");
  }
  operation.transpose = qualifiers.take("trans");
  if (operation.kind == Kind::kTransposeMatrix) {
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (!operation.transpose) return bindError(resolver, "movmatrix needs .trans");
    if (!expectOperands(parsed, 2, resolver)) return false;
    if (!bindMatrixRegisters(parsed.operands[0], 1, true, operation.fragments[0], resolver) ||
        !bindMatrixRegisters(parsed.operands[1], 1, false, operation.fragments[1], resolver)) {
      return false;
    }
    instruction.handler = &transposeMatrixHandler;
    return finishWarpMatrix(resolver, instruction, std::move(operation));
  }
  const std::string_view count = qualifiers.takeAny({"x1", "x2", "x4"});
  if (count.empty()) return bindError(resolver, std::string(base) + " needs .x1, .x2 or .x4");
  operation.matrices = static_cast<std::uint8_t>(count[1] - '0');
  const Space space = qualifiers.takeSpace();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (space != Space::kShared && space != Space::kGeneric) {
    return bindError(resolver, std::string(base) + " reads and writes shared memory");
  }
  if (!expectOperands(parsed, 2, resolver)) return false;
  const bool load = operation.kind == Kind::kLoadMatrices;
  const Operand& registers = load ? parsed.operands[0] : parsed.operands[1];
  const Operand& address = load ? parsed.operands[1] : parsed.operands[0];
  if (!bindMatrixRegisters(registers, operation.matrices, load, operation.fragments[0], resolver)) {
    return false;
  }
  if (!bindAddress(instruction, address, space, resolver)) return false;
  instruction.space = static_cast<std::uint8_t>(space);
  instruction.handler = load ? &matricesHandler<false> : &matricesHandler<true>;
  return finishWarpMatrix(resolver, instruction, std::move(operation));
}

bool bindWmma(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
              Instruction& instruction, bool& unsupported) {
  const std::vector<Operand>& operands = parsed.operands;
  MatrixOperation operation;
  if (qualifiers.take("load")) {
    operation.kind = Kind::kLoad;
  } else if (qualifiers.take("store")) {
    operation.kind = Kind::kStore;
  } else if (qualifiers.take("mma")) {
    operation.kind = Kind::kMultiplyAccumulate;
  } else {
    return unsupportedBinding(resolver, unsupported, "tensor-core instructions");
  }
  if (!qualifiers.take("sync") || !qualifiers.take("aligned")) {
    return bindError(resolver, "wmma needs .sync.aligned");
  }
  // The opcode's words, for the shape (mMnNkK) and the types in the order written.
  const std::vector<std::string_view> words = opcodeWords(parsed.opcode);
  for (std::string_view word : words) {
    if (word == "s4" || word == "u4" || word == "b1") {
      return unsupportedBinding(resolver, unsupported,
                                "tensor-core instructions of sub-byte types");
    }
  }
  if (!takeShape(words, qualifiers, operation)) return bindError(resolver, "wmma without a shape");

  if (operation.kind == Kind::kMultiplyAccumulate) {
    const std::string_view a = qualifiers.takeAny({"row", "col"});
    const std::string_view b = qualifiers.takeAny({"row", "col"});
    if (a.empty() || b.empty()) return bindError(resolver, "wmma.mma needs two layouts");
    operation.saturate = qualifiers.take("satfinite");
    qualifiers.take("rn");  // f64: the only rounding it has is the default
    const std::vector<MatrixElement> types = takeElements(words, qualifiers);
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (types.size() == 2) {  // .dtype.ctype: f16 inputs
      operation.elements[0] = types[0];
      operation.elements[1] = operation.elements[2] = MatrixElement::kF16;
      operation.elements[3] = types[1];
    } else if (types.size() == 4) {
      std::copy(types.begin(), types.end(), operation.elements);
    } else {
      return unsupportedBinding(resolver, unsupported, "tensor-core instructions of these types");
    }
    const MatrixElement input = operation.elements[1];
    if (operation.elements[2] != input ||
        !shapeFits(operation.m, operation.n, operation.k, input) ||
        !accumulatorFits(input, operation.elements[0]) ||
        !accumulatorFits(input, operation.elements[3])) {
      return unsupportedBinding(resolver, unsupported,
                                "tensor-core instructions of this shape and these types");
    }
    if (!expectOperands(parsed, 4, resolver)) return false;
    const char matrices[4] = {'d', 'a', 'b', 'c'};
    for (int which = 0; which < 4; ++which) {
      if (!bindFragment(operands[static_cast<std::size_t>(which)], operation, which,
                        matrices[which], which == 0, resolver)) {
        return false;
      }
    }
    instruction.handler = &matrixMultiplyHandler;
  } else {
    const bool load = operation.kind == Kind::kLoad;
    const std::string_view matrix =
        load ? qualifiers.takeAny({"a", "b", "c"}) : (qualifiers.take("d") ? "d" : "");
    if (matrix.empty()) return bindError(resolver, "wmma.load/store names no matrix");
    operation.matrix = matrix[0];
    const std::string_view layout = qualifiers.takeAny({"row", "col"});
    if (layout.empty()) return bindError(resolver, "wmma.load/store needs a layout");
    operation.rowMajor = layout == "row";
    const Space space = qualifiers.takeSpace();
    const std::vector<MatrixElement> types = takeElements(words, qualifiers);
    if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
    if (types.size() != 1) {
      return unsupportedBinding(resolver, unsupported, "tensor-core instructions of this type");
    }
    operation.elements[0] = types[0];
    const bool accumulator = operation.matrix == 'c' || operation.matrix == 'd';
    const bool fits =
        accumulator ? (types[0] == MatrixElement::kF16 || types[0] == MatrixElement::kF32 ||
                       types[0] == MatrixElement::kS32 || types[0] == MatrixElement::kF64) &&
                          (shapeFits(operation.m, operation.n, operation.k, MatrixElement::kF16) ||
                           shapeFits(operation.m, operation.n, operation.k, MatrixElement::kTf32) ||
                           shapeFits(operation.m, operation.n, operation.k, MatrixElement::kF64))
                    : shapeFits(operation.m, operation.n, operation.k, types[0]);
    if (!fits) {
      return unsupportedBinding(resolver, unsupported,
                                "tensor-core instructions of this shape and type");
    }
    if (operands.size() != 2 && operands.size() != 3) {
      return bindError(resolver, "wmma.load/store takes a fragment, an address and a stride");
    }
    const Operand& fragment = load ? operands[0] : operands[1];
    const Operand& address = load ? operands[1] : operands[0];
    if (!bindFragment(fragment, operation, 0, operation.matrix, load, resolver)) return false;
    if (!bindAddress(instruction, address, space, resolver)) return false;
    instruction.space = static_cast<std::uint8_t>(space);
    if (operands.size() == 3) {
      operation.stride = resolver.source(operands[2], Type::kU32);
      if (operation.stride == kNoRegister) return false;
    }
    instruction.handler =
        load ? &matrixMemoryHandler<Kind::kLoad> : &matrixMemoryHandler<Kind::kStore>;
  }
  return finishWarpMatrix(resolver, instruction, std::move(operation));
}

}  // namespace

bool bindMatrix(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  if (base == "mma") return bindMmaSync(parsed, qualifiers, resolver, instruction, unsupported);
  if (base == "wmma") return bindWmma(parsed, qualifiers, resolver, instruction, unsupported);
  return bindMatrices(parsed, qualifiers, resolver, instruction, unsupported);
}

}  // namespace gpuproxy::server::ptx
