// The texture unit: tex, tld4 and txq on texture objects, suld.b, sust.b and suq on surface
// objects. A handle is the device address of a header in the launching client's memory
// (protocol/texture_header.hpp); each lane reads it through the launch's memory checks, so a
// handle reaches nothing the client's own loads could not.
//
// Sampling follows the CUDA C++ Programming Guide's "Texture Fetching": with normalised
// coordinates u = x * N, else u = x; nearest-point filtering reads texel floor(u); linear
// filtering reads texels floor(u - 0.5) and the next, weighted by the fraction of u - 0.5 held
// in 9-bit fixed point with 8 fractional bits; the address mode maps each texel index into the
// resource (wrap and mirror only with normalised coordinates, clamp otherwise) or, in border
// mode, reads the border colour for an index outside it. Channels of 8 and 16 bits read as
// floats are normalised (unsigned to [0, 1], signed to [-1, 1]); absent channels read as 0, and
// alpha as 1. Linear memory (tex1Dfetch) reads 0 outside it. tld4 returns channel `component` of
// the four texels of the bilinear footprint, counter-clockwise from the lower left.
//
// Layered geometries (.a1d, .a2d) name a layer by index, clamped to the layers there are, and
// sample within it. Cube maps (.cube, .acube) take a direction (x, y, z): the face is that of its
// largest component, and the face's coordinates are the guide's "Cubemap Textures" table's,
// clamped to the face's edges (no filtering across faces). Not modelled, refused at load by name:
// multi-sample geometries, gathers from cube maps, depth comparison, formatted surface stores
// (sust.p), surface reductions (sured).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "protocol/texture_header.hpp"
#include "server/backend/ptx/ptx_bind_support.hpp"
#include "server/backend/ptx/ptx_exec.hpp"
#include "server/backend/ptx/ptx_numeric.hpp"

namespace gpuproxy::server::ptx {
namespace {

using protocol::TextureHeader;
using protocol::TextureHeaderKind;
using protocol::TextureResource;
using Kind = TextureOperation::Kind;
using Result = TextureOperation::Result;
using Boundary = TextureOperation::Boundary;
using Query = TextureOperation::Query;

// ---- the header ------------------------------------------------------------------------------

bool validHeader(const TextureHeader& header, TextureHeaderKind kind) {
  if (header.magic != protocol::kTextureHeaderMagic || header.kind != kind) return false;
  if (header.dimensions < 1 || header.dimensions > 3 || header.width == 0 || header.height == 0 ||
      header.depth == 0 || protocol::elementBytes(header.format, header.channels) == 0) {
    return false;
  }
  if (header.resource != TextureResource::kArray && header.resource != TextureResource::kLinear &&
      header.resource != TextureResource::kPitch2D) {
    return false;
  }
  for (std::uint32_t mode : header.addressMode) {
    if (mode > CU_TR_ADDRESS_MODE_BORDER) return false;
  }
  return header.filterMode <= CU_TR_FILTER_MODE_LINEAR;
}

// Lane `lane`'s header, or false after recording a fault.
bool readHeader(ExecContext& context, const TextureOperation& operation, std::uint32_t lane,
                TextureHeaderKind kind, TextureHeader& header) {
  const std::uint64_t handle = context.row(operation.handle)[lane];
  const std::byte* where =
      translate(context, Space::kGlobal, handle, sizeof(TextureHeader), 8, lane, false);
  if (where == nullptr) return false;
  std::memcpy(&header, where, sizeof(header));
  if (!validHeader(header, kind)) {
    return raiseFault(context, CUDA_ERROR_ILLEGAL_ADDRESS, handle,
                      std::string(kind == TextureHeaderKind::kTexture ? "texture" : "surface") +
                          " handle names no " +
                          (kind == TextureHeaderKind::kTexture ? "texture" : "surface") +
                          " object");
  }
  return true;
}

std::uint32_t extentOf(const TextureHeader& header, unsigned dimension) {
  return dimension == 0 ? header.width : dimension == 1 ? header.height : header.depth;
}

// The bytes of element (x, y, z), which the caller has placed inside the resource; null after a
// fault.
const std::byte* elementAt(ExecContext& context, const TextureHeader& header, std::uint32_t x,
                           std::uint32_t y, std::uint32_t z, std::uint32_t lane) {
  const std::uint32_t bytes = protocol::elementBytes(header.format, header.channels);
  const std::uint64_t address =
      header.base + z * header.slicePitch + y * header.pitch + std::uint64_t{x} * bytes;
  return translate(context, Space::kGlobal, address, bytes, 1, lane, false);
}

// ---- channels --------------------------------------------------------------------------------

// One channel's raw value: its bits, sign-extended for the signed formats.
std::uint32_t channelBits(const std::byte* element, const TextureHeader& header, unsigned channel) {
  const std::uint32_t bytes = protocol::channelBytes(header.format);
  const std::byte* at = element + channel * bytes;
  switch (header.format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
      return std::to_integer<std::uint8_t>(*at);
    case CU_AD_FORMAT_SIGNED_INT8:
      return static_cast<std::uint32_t>(
          static_cast<std::int32_t>(static_cast<std::int8_t>(std::to_integer<std::uint8_t>(*at))));
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_HALF: {
      std::uint16_t value;
      std::memcpy(&value, at, 2);
      return value;
    }
    case CU_AD_FORMAT_SIGNED_INT16: {
      std::int16_t value;
      std::memcpy(&value, at, 2);
      return static_cast<std::uint32_t>(static_cast<std::int32_t>(value));
    }
    default: {
      std::uint32_t value;
      std::memcpy(&value, at, 4);
      return value;
    }
  }
}

// Whether the texture returns its channels' integers (CU_TRSF_READ_AS_INTEGER, and 32-bit
// integers, which cannot be normalised) rather than floats.
bool readsIntegers(const TextureHeader& header) {
  const bool integerFormat =
      header.format != CU_AD_FORMAT_HALF && header.format != CU_AD_FORMAT_FLOAT;
  return integerFormat && ((header.flags & CU_TRSF_READ_AS_INTEGER) != 0 ||
                           protocol::channelBytes(header.format) == 4);
}

// One channel as a float: the value of a float or half, an 8- or 16-bit integer normalised, a
// 32-bit integer's value.
float channelFloat(std::uint32_t bits, const TextureHeader& header) {
  switch (header.format) {
    case CU_AD_FORMAT_FLOAT:
      return std::bit_cast<float>(bits);
    case CU_AD_FORMAT_HALF:
      return static_cast<float>(fromHalf(static_cast<std::uint16_t>(bits)));
    case CU_AD_FORMAT_UNSIGNED_INT8:
      return static_cast<float>(bits) / 255.0f;
    case CU_AD_FORMAT_UNSIGNED_INT16:
      return static_cast<float>(bits) / 65535.0f;
    case CU_AD_FORMAT_SIGNED_INT8:
      return std::max(static_cast<float>(static_cast<std::int32_t>(bits)) / 127.0f, -1.0f);
    case CU_AD_FORMAT_SIGNED_INT16:
      return std::max(static_cast<float>(static_cast<std::int32_t>(bits)) / 32767.0f, -1.0f);
    case CU_AD_FORMAT_SIGNED_INT32:
      return static_cast<float>(static_cast<std::int32_t>(bits));
    default:
      return static_cast<float>(bits);
  }
}

// What a fetch returns, four lanes of bits (floats as their bits).
using Texel = std::array<std::uint32_t, 4>;
using FloatTexel = std::array<float, 4>;

// Element (x, y, z)'s channels as the texture returns them (absent ones 0, alpha 1).
bool readTexel(ExecContext& context, const TextureHeader& header, std::uint32_t x, std::uint32_t y,
               std::uint32_t z, std::uint32_t lane, bool integers, Texel& texel) {
  const std::byte* element = elementAt(context, header, x, y, z, lane);
  if (element == nullptr) return false;
  for (unsigned channel = 0; channel < 4; ++channel) {
    if (channel < header.channels) {
      const std::uint32_t bits = channelBits(element, header, channel);
      texel[channel] = integers ? bits : std::bit_cast<std::uint32_t>(channelFloat(bits, header));
    } else {
      texel[channel] = channel == 3 ? (integers ? 1u : std::bit_cast<std::uint32_t>(1.0f)) : 0u;
    }
  }
  return true;
}

// ---- addressing ------------------------------------------------------------------------------

// floor(u) as an index, kept far from overflow (NaN reads texel 0).
std::int64_t floorIndex(float u) {
  if (std::isnan(u)) return 0;
  return static_cast<std::int64_t>(std::floor(std::clamp(u, -1.0e12f, 1.0e12f)));
}

// Texel index `index` of a dimension of `size` through `mode`; false for border mode outside.
bool mapIndex(std::int64_t index, std::uint32_t size, std::uint32_t mode, std::uint32_t& mapped) {
  const auto n = static_cast<std::int64_t>(size);
  switch (mode) {
    case CU_TR_ADDRESS_MODE_WRAP:
      mapped = static_cast<std::uint32_t>(((index % n) + n) % n);
      return true;
    case CU_TR_ADDRESS_MODE_MIRROR: {
      std::int64_t m = ((index % (2 * n)) + 2 * n) % (2 * n);
      if (m >= n) m = 2 * n - 1 - m;
      mapped = static_cast<std::uint32_t>(m);
      return true;
    }
    case CU_TR_ADDRESS_MODE_BORDER:
      if (index < 0 || index >= n) return false;
      mapped = static_cast<std::uint32_t>(index);
      return true;
    default:
      mapped = static_cast<std::uint32_t>(std::clamp<std::int64_t>(index, 0, n - 1));
      return true;
  }
}

// Reads the texel at `index` (one per dimension the resource has) through the address modes, or
// the border colour, or (linear memory outside itself) zeros.
bool fetch(ExecContext& context, const TextureHeader& header, const std::int64_t* index,
           std::uint32_t layer, std::uint32_t lane, bool integers, Texel& texel) {
  const bool normalized = (header.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0;
  std::uint32_t at[3] = {0, 0, layer};
  for (unsigned d = 0; d < header.dimensions; ++d) {
    const std::uint32_t size = extentOf(header, d);
    if (header.resource == TextureResource::kLinear) {
      if (index[d] < 0 || index[d] >= static_cast<std::int64_t>(size)) {
        texel = {0, 0, 0, 0};
        return true;
      }
      at[d] = static_cast<std::uint32_t>(index[d]);
      continue;
    }
    std::uint32_t mode = header.addressMode[d];
    if (!normalized && (mode == CU_TR_ADDRESS_MODE_WRAP || mode == CU_TR_ADDRESS_MODE_MIRROR)) {
      mode = CU_TR_ADDRESS_MODE_CLAMP;
    }
    if (!mapIndex(index[d], size, mode, at[d])) {
      for (unsigned channel = 0; channel < 4; ++channel) {
        texel[channel] = integers ? static_cast<std::uint32_t>(header.borderColor[channel])
                                  : std::bit_cast<std::uint32_t>(header.borderColor[channel]);
      }
      return true;
    }
  }
  return readTexel(context, header, at[0], at[1], at[2], lane, integers, texel);
}

// The coordinates of lane `lane`, scaled to texels when the texture normalises them.
void texelCoordinates(ExecContext& context, const TextureOperation& operation,
                      const TextureHeader& header, std::uint32_t lane, float* u) {
  const bool normalized = (header.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0;
  for (unsigned d = 0; d < header.dimensions; ++d) {
    const std::uint64_t bits =
        d < operation.coordinates.size() ? context.row(operation.coordinates[d])[lane] : 0;
    u[d] = operation.integerCoordinates ? static_cast<float>(static_cast<std::int32_t>(bits))
                                        : std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (normalized && !operation.integerCoordinates) {
      u[d] *= static_cast<float>(extentOf(header, d));
    }
  }
}

// The layer a layered fetch names, clamped to the layers the resource has (0 for any other).
std::uint32_t layerOf(ExecContext& context, const TextureOperation& operation,
                      const TextureHeader& header, std::uint32_t lane) {
  if (!operation.layered || header.layered == 0) return 0;
  const auto index = static_cast<std::int32_t>(context.row(operation.layer)[lane]);
  return static_cast<std::uint32_t>(
      std::clamp<std::int64_t>(index, 0, static_cast<std::int64_t>(header.depth) - 1));
}

// Linear filtering's first texel and weight along one dimension.
void footprint(float u, std::int64_t& first, float& weight) {
  const float shifted = u - 0.5f;
  first = floorIndex(shifted);
  const float fraction = std::isnan(shifted) ? 0.0f : shifted - std::floor(shifted);
  weight = std::round(fraction * 256.0f) / 256.0f;  // 8 fractional bits
}

// What one lane's tex or tld4 looks up: its coordinates in texels, its layer, and whether it reads
// the channels' integers (the texture's read mode, or an integer destination) rather than floats.
struct Lookup {
  float u[3] = {0, 0, 0};
  std::uint32_t layer = 0;
  bool integers = false;
};

// A cube-map fetch's face (0 to 5: +x, -x, +y, -y, +z, -z) and coordinates in its texels, from
// the direction (x, y, z): the programming guide's table, s and t over the major axis' magnitude m
// giving u = (s / m + 1) / 2 and v = (t / m + 1) / 2 across the face.
std::uint32_t cubeFace(float x, float y, float z, const TextureHeader& header, float* u) {
  const float ax = std::fabs(x);
  const float ay = std::fabs(y);
  const float az = std::fabs(z);
  std::uint32_t face = 0;
  float m = 0;
  float s = 0;
  float t = 0;
  if (ax >= ay && ax >= az) {
    face = x >= 0 ? 0 : 1;
    m = ax;
    s = x >= 0 ? -z : z;
    t = -y;
  } else if (ay >= az) {
    face = y >= 0 ? 2 : 3;
    m = ay;
    s = x;
    t = y >= 0 ? z : -z;
  } else {
    face = z >= 0 ? 4 : 5;
    m = az;
    s = z >= 0 ? x : -x;
    t = -y;
  }
  const float scale = m > 0 ? 1.0f / m : 0.0f;
  u[0] = (s * scale + 1.0f) * 0.5f * static_cast<float>(header.width);
  u[1] = (t * scale + 1.0f) * 0.5f * static_cast<float>(header.height);
  return face;
}

Lookup lookupOf(ExecContext& context, const TextureOperation& operation,
                const TextureHeader& header, std::uint32_t lane) {
  Lookup lookup;
  lookup.integers = readsIntegers(header) || operation.result != Result::kF32;
  if (operation.cube) {
    float direction[3];
    for (unsigned d = 0; d < 3; ++d) {
      direction[d] = std::bit_cast<float>(
          static_cast<std::uint32_t>(context.row(operation.coordinates[d])[lane]));
    }
    const std::uint32_t face = cubeFace(direction[0], direction[1], direction[2], header, lookup.u);
    std::int64_t cube = 0;
    if (operation.layered) {
      cube = std::clamp<std::int64_t>(static_cast<std::int32_t>(context.row(operation.layer)[lane]),
                                      0, std::max<std::int64_t>(header.depth / 6, 1) - 1);
    }
    lookup.layer = static_cast<std::uint32_t>(
        std::min<std::int64_t>(cube * 6 + face, static_cast<std::int64_t>(header.depth) - 1));
    return lookup;
  }
  lookup.layer = layerOf(context, operation, header, lane);
  texelCoordinates(context, operation, header, lane, lookup.u);
  return lookup;
}

bool sample(ExecContext& context, const TextureOperation& operation, const TextureHeader& header,
            const Lookup& lookup, std::uint32_t lane, Texel& result) {
  const std::uint32_t layer = lookup.layer;
  // Integer coordinates name a texel; so does point filtering, and integers cannot be filtered.
  if (operation.integerCoordinates || header.filterMode == CU_TR_FILTER_MODE_POINT ||
      lookup.integers) {
    std::int64_t index[3] = {0, 0, 0};
    for (unsigned d = 0; d < header.dimensions; ++d) index[d] = floorIndex(lookup.u[d]);
    return fetch(context, header, index, layer, lane, lookup.integers, result);
  }
  std::int64_t first[3] = {0, 0, 0};
  float weight[3] = {0, 0, 0};
  for (unsigned d = 0; d < header.dimensions; ++d) footprint(lookup.u[d], first[d], weight[d]);
  FloatTexel sum = {0, 0, 0, 0};
  const unsigned corners = 1u << header.dimensions;
  for (unsigned corner = 0; corner < corners; ++corner) {
    std::int64_t index[3] = {0, 0, 0};
    float scale = 1.0f;
    for (unsigned d = 0; d < header.dimensions; ++d) {
      const bool next = ((corner >> d) & 1) != 0;
      index[d] = first[d] + (next ? 1 : 0);
      scale *= next ? weight[d] : 1.0f - weight[d];
    }
    Texel texel;
    if (!fetch(context, header, index, layer, lane, false, texel)) return false;
    for (unsigned channel = 0; channel < 4; ++channel) {
      sum[channel] += scale * std::bit_cast<float>(texel[channel]);
    }
  }
  for (unsigned channel = 0; channel < 4; ++channel) {
    result[channel] = std::bit_cast<std::uint32_t>(sum[channel]);
  }
  return true;
}

// tld4: counter-clockwise from the lower left: (i, j+1), (i+1, j+1), (i+1, j), (i, j).
bool gather(ExecContext& context, const TextureOperation& operation, const TextureHeader& header,
            const Lookup& lookup, std::uint32_t lane, Texel& result) {
  std::int64_t first[2] = {0, 0};
  float weight[2] = {0, 0};
  footprint(lookup.u[0], first[0], weight[0]);
  footprint(lookup.u[1], first[1], weight[1]);
  static constexpr int kOffsets[4][2] = {{0, 1}, {1, 1}, {1, 0}, {0, 0}};
  for (unsigned k = 0; k < 4; ++k) {
    const std::int64_t index[3] = {first[0] + kOffsets[k][0], first[1] + kOffsets[k][1], 0};
    Texel texel;
    if (!fetch(context, header, index, lookup.layer, lane, lookup.integers, texel)) return false;
    result[k] = texel[operation.component];
  }
  return true;
}

std::uint32_t queryValue(const TextureHeader& header, Query query) {
  switch (query) {
    case Query::kWidth:
      return header.width;
    case Query::kHeight:
      return header.height;
    case Query::kDepth:
      return header.depth;
    case Query::kNormalizedCoordinates:
      return (header.flags & CU_TRSF_NORMALIZED_COORDINATES) != 0 ? 1 : 0;
    case Query::kFilterMode:
      return header.filterMode;
    case Query::kAddressMode0:
      return header.addressMode[0];
    case Query::kAddressMode1:
      return header.addressMode[1];
    case Query::kAddressMode2:
      return header.addressMode[2];
  }
  return 0;
}

bool textureHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const TextureOperation& operation = context.frame->function->textureOperations[instruction.extra];
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    TextureHeader header;
    if (!readHeader(context, operation, lane, TextureHeaderKind::kTexture, header)) return false;
    if (operation.kind == Kind::kQuery) {
      context.row(operation.values[0])[lane] = queryValue(header, operation.query);
      return true;
    }
    if (operation.cube) {
      // Within a face: its layer of a 2D array, clamped to the face's edges.
      header.dimensions = 2;
      header.addressMode[0] = header.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    }
    const Lookup lookup = lookupOf(context, operation, header, lane);
    Texel result{};
    const bool fetched = operation.kind == Kind::kGather
                             ? gather(context, operation, header, lookup, lane, result)
                             : sample(context, operation, header, lookup, lane, result);
    if (!fetched) return false;
    for (unsigned k = 0; k < 4; ++k) {
      std::uint32_t bits = result[k];
      // Integers read into a float destination are converted to their values.
      if (operation.result == Result::kF32 && lookup.integers) {
        bits = std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(bits)));
      }
      context.row(operation.values[k])[lane] =
          operation.result == Result::kS32 ? static_cast<std::uint64_t>(static_cast<std::int64_t>(
                                                 static_cast<std::int32_t>(bits)))
                                           : bits;
    }
    return true;
  });
}

// ---- surfaces --------------------------------------------------------------------------------

bool surfaceHandler(ExecContext& context, const Instruction& instruction, std::uint32_t mask) {
  const TextureOperation& operation = context.frame->function->textureOperations[instruction.extra];
  const auto accessBytes =
      static_cast<std::uint32_t>(operation.elementBytes * operation.values.size());
  return forLanesUntil(mask, [&](std::uint32_t lane) {
    TextureHeader header;
    if (!readHeader(context, operation, lane, TextureHeaderKind::kSurface, header)) return false;
    if (operation.kind == Kind::kSurfaceQuery) {
      context.row(operation.values[0])[lane] = queryValue(header, operation.query);
      return true;
    }
    const std::uint64_t rowBytes =
        std::uint64_t{header.width} * protocol::elementBytes(header.format, header.channels);
    // x counts bytes, y and z elements.
    std::int64_t at[3] = {0, 0, 0};
    std::int64_t last[3] = {static_cast<std::int64_t>(rowBytes) - accessBytes,
                            static_cast<std::int64_t>(header.height) - 1,
                            static_cast<std::int64_t>(header.depth) - 1};
    bool outside = false;
    // Coordinate `d` from register row `row`, clamped and noted when outside the surface.
    auto place = [&](unsigned d, std::uint32_t row) {
      at[d] = static_cast<std::int32_t>(context.row(row)[lane]);
      if (at[d] < 0 || at[d] > last[d]) {
        outside = true;
        at[d] = std::clamp<std::int64_t>(at[d], 0, std::max<std::int64_t>(last[d], 0));
      }
    };
    for (unsigned d = 0; d < operation.dimensions; ++d) place(d, operation.coordinates[d]);
    // A layered access's layer is its slice, outside the surface as any coordinate is.
    if (operation.layered) place(2, operation.layer);
    if (last[0] < 0) outside = true;  // the access is wider than a row
    const bool store = operation.kind == Kind::kSurfaceStore;
    if (outside) {
      if (operation.boundary == Boundary::kTrap || last[0] < 0) {
        return raiseFault(
            context, CUDA_ERROR_ILLEGAL_ADDRESS, context.row(operation.handle)[lane],
            std::string("surface ") + (store ? "store" : "load") + " outside the surface (.trap)");
      }
      if (operation.boundary == Boundary::kZero) {
        if (!store) {
          for (std::uint32_t row : operation.values) context.row(row)[lane] = 0;
        }
        return true;
      }
    }
    const std::uint64_t address =
        header.base + static_cast<std::uint64_t>(at[2]) * header.slicePitch +
        static_cast<std::uint64_t>(at[1]) * header.pitch + static_cast<std::uint64_t>(at[0]);
    std::byte* where = translate(context, Space::kGlobal, address, accessBytes, 1, lane, store);
    if (where == nullptr) return false;
    for (std::size_t k = 0; k < operation.values.size(); ++k) {
      std::byte* part = where + k * operation.elementBytes;
      std::uint64_t& value = context.row(operation.values[k])[lane];
      if (store) {
        std::memcpy(part, &value, operation.elementBytes);  // little-endian: the low bytes
      } else {
        std::uint64_t loaded = 0;
        std::memcpy(&loaded, part, operation.elementBytes);
        value = loaded;
      }
    }
    return true;
  });
}

// ---- binding ---------------------------------------------------------------------------------

// `cube`: whether the instruction takes cube-map geometries (tex does; surfaces address a cube
// map as the layered 2D array it is).
bool takeGeometry(Qualifiers& qualifiers, OperandResolver& resolver, bool& unsupported, bool cube,
                  TextureOperation& operation) {
  if (cube) {
    const std::string_view cubeGeometry = qualifiers.takeAny({"cube", "acube"});
    if (!cubeGeometry.empty()) {
      operation.cube = true;
      operation.layered = cubeGeometry == "acube";
      operation.dimensions = 3;  // the direction
      return true;
    }
  }
  const std::string_view geometry = qualifiers.takeAny({"1d", "2d", "3d", "a1d", "a2d"});
  if (geometry.empty()) {
    if (!qualifiers.takeAny({"2dms", "a2dms"}).empty()) {
      return unsupportedBinding(resolver, unsupported, "multi-sample textures and surfaces");
    }
    if (!qualifiers.takeAny({"cube", "acube"}).empty()) {
      return unsupportedBinding(resolver, unsupported,
                                std::string(qualifiers.base()) + " of a cube map");
    }
    return bindError(resolver, "texture or surface instruction without a geometry");
  }
  operation.layered = geometry[0] == 'a';
  operation.dimensions = static_cast<std::uint8_t>(geometry[operation.layered ? 1 : 0] - '0');
  return true;
}

// [handle, {coordinates}]: the handle register and as many coordinates as the geometry has (a 3D
// texture's tuple has a fourth, ignored element).
bool bindTextureAddress(const Operand& address, Type coordinateType, bool withCoordinates,
                        OperandResolver& resolver, bool& unsupported, TextureOperation& operation) {
  if (address.kind != Operand::Kind::kAddress) {
    return bindError(resolver, "expected [handle, {coordinates}]");
  }
  if (!address.baseIsRegister) {
    return unsupportedBinding(resolver, unsupported,
                              "texture and surface references (.texref, .surfref); only objects");
  }
  Operand handle;
  handle.kind = Operand::Kind::kRegister;
  handle.name = address.name;
  operation.handle = resolver.source(handle, Type::kB64);
  if (operation.handle == kNoRegister) return false;
  if (!withCoordinates) {
    return address.elements.empty() ? true : bindError(resolver, "unexpected coordinates");
  }
  // {x}, {x, y}, {x, y, z, _}; layered: {layer, x}, {layer, x, y, _}.
  const std::size_t used = operation.dimensions + (operation.layered ? 1 : 0);
  const std::size_t expected = used == 3 ? 4 : used;
  if (address.elements.size() != expected && address.elements.size() != used) {
    return bindError(resolver, "expected " + std::to_string(expected) + " coordinates");
  }
  std::size_t next = 0;
  if (operation.layered) {
    operation.layer = resolver.source(address.elements[next++], Type::kB32);
    if (operation.layer == kNoRegister) return false;
  }
  for (unsigned d = 0; d < operation.dimensions; ++d) {
    const std::uint32_t row = resolver.source(address.elements[next++], coordinateType);
    if (row == kNoRegister) return false;
    operation.coordinates.push_back(row);
  }
  return true;
}

bool finishTexture(OperandResolver& resolver, Instruction& instruction, TextureOperation operation,
                   Handler handler) {
  instruction.flow = Flow::kMemory;
  instruction.handler = handler;
  instruction.extra = resolver.textureOperation(std::move(operation));
  return true;
}

// tex{.base,.level,.grad}.geom.v4.dtype.ctype d, [a, c]{, lod | dPdx, dPdy}; tld4.comp.2d.v4...
bool bindSample(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                Instruction& instruction, bool& unsupported) {
  TextureOperation operation;
  if (qualifiers.base() == "tld4") {
    operation.kind = Kind::kGather;
    const std::string_view component = qualifiers.takeAny({"r", "g", "b", "a"});
    if (component.empty()) return bindError(resolver, "tld4 needs .r, .g, .b or .a");
    operation.component = component == "r" ? 0 : component == "g" ? 1 : component == "b" ? 2 : 3;
  }
  // A resource without mip levels has one: level-of-detail and gradients choose it whatever they
  // are.
  const std::string_view level = qualifiers.takeAny({"base", "level", "grad"});
  if (!takeGeometry(qualifiers, resolver, unsupported, operation.kind == Kind::kSample,
                    operation)) {
    return false;
  }
  if (operation.kind == Kind::kGather && operation.dimensions != 2) {
    return bindError(resolver, "tld4 needs .2d");
  }
  if (qualifiers.takeVector() != 4) return bindError(resolver, "tex and tld4 need .v4");
  const std::vector<Type> types = qualifiers.takeTypes();
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (types.size() != 2 || (types[1] != Type::kF32 && types[1] != Type::kS32)) {
    return bindError(resolver, "expected .dtype.ctype");
  }
  switch (types[0]) {
    case Type::kF32:
      operation.result = Result::kF32;
      break;
    case Type::kS32:
      operation.result = Result::kS32;
      break;
    case Type::kU32:
      operation.result = Result::kU32;
      break;
    default:
      return unsupportedBinding(resolver, unsupported, "texture fetches into .f16 registers");
  }
  operation.integerCoordinates = types[1] == Type::kS32;
  if (operation.cube && operation.integerCoordinates) {
    return bindError(resolver, "a cube-map fetch takes .f32 coordinates");
  }
  const std::size_t extra = level == "level" ? 1 : level == "grad" ? 2 : 0;
  if (parsed.operands.size() != 2 + extra) {
    return bindError(resolver, "expected " + std::to_string(2 + extra) + " operands");
  }
  if (parsed.operands[0].pairedPredicate) {
    return unsupportedBinding(resolver, unsupported, "texture residency predicates (sparse)");
  }
  if (!bindRegisterList(parsed.operands[0], 4, types[0], true, resolver, operation.values) ||
      !bindTextureAddress(parsed.operands[1], types[1], true, resolver, unsupported, operation)) {
    return false;
  }
  return finishTexture(resolver, instruction, std::move(operation), &textureHandler);
}

bool takeQuery(Qualifiers& qualifiers, bool surface, TextureOperation& operation) {
  const std::string_view query =
      surface ? qualifiers.takeAny({"width", "height", "depth"})
              : qualifiers.takeAny({"width", "height", "depth", "normalized_coords", "filter_mode",
                                    "addr_mode_0", "addr_mode_1", "addr_mode_2"});
  static constexpr std::pair<std::string_view, Query> kQueries[] = {
      {"width", Query::kWidth},
      {"height", Query::kHeight},
      {"depth", Query::kDepth},
      {"normalized_coords", Query::kNormalizedCoordinates},
      {"filter_mode", Query::kFilterMode},
      {"addr_mode_0", Query::kAddressMode0},
      {"addr_mode_1", Query::kAddressMode1},
      {"addr_mode_2", Query::kAddressMode2}};
  for (const auto& [name, value] : kQueries) {
    if (query == name) {
      operation.query = value;
      return true;
    }
  }
  return false;
}

// txq.query.b32 d, [a]; suq.query.b32 d, [a].
bool bindQuery(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
               Instruction& instruction, bool& unsupported) {
  const bool surface = qualifiers.base() == "suq";
  TextureOperation operation;
  operation.kind = surface ? Kind::kSurfaceQuery : Kind::kQuery;
  if (!surface && qualifiers.take("level")) {
    return unsupportedBinding(resolver, unsupported, "txq of a mip level");
  }
  if (!takeQuery(qualifiers, surface, operation)) {
    return unsupportedBinding(resolver, unsupported,
                              std::string(qualifiers.base()) + " of that attribute");
  }
  if (!qualifiers.take("b32")) return bindError(resolver, "expected .b32");
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (!expectOperands(parsed, 2, resolver)) return false;
  if (!bindRegisterList(parsed.operands[0], 1, Type::kB32, true, resolver, operation.values) ||
      !bindTextureAddress(parsed.operands[1], Type::kB32, false, resolver, unsupported,
                          operation)) {
    return false;
  }
  return finishTexture(resolver, instruction, std::move(operation),
                       surface ? &surfaceHandler : &textureHandler);
}

// suld.b.geom{.cop}.vec.dtype.clamp d, [a, b]; sust.b.geom{.cop}.vec.ctype.clamp [a, b], c.
bool bindSurfaceAccess(const ParsedInstruction& parsed, Qualifiers& qualifiers,
                       OperandResolver& resolver, Instruction& instruction, bool& unsupported) {
  const bool store = qualifiers.base() == "sust";
  TextureOperation operation;
  operation.kind = store ? Kind::kSurfaceStore : Kind::kSurfaceLoad;
  if (!qualifiers.take("b")) {
    return qualifiers.take("p")
               ? unsupportedBinding(resolver, unsupported, "formatted surface stores (sust.p)")
               : bindError(resolver, "expected .b");
  }
  if (!takeGeometry(qualifiers, resolver, unsupported, false, operation)) return false;
  qualifiers.takeAny({"ca", "cg", "cs", "cv", "wb", "wt"});  // caching: no effect on the sim
  const unsigned vector = qualifiers.takeVector();
  const std::vector<Type> types = qualifiers.takeTypes();
  const std::string_view boundary = qualifiers.takeAny({"trap", "clamp", "zero"});
  if (!finishQualifiers(qualifiers, resolver, unsupported)) return false;
  if (types.size() != 1 || (types[0] != Type::kB8 && types[0] != Type::kB16 &&
                            types[0] != Type::kB32 && types[0] != Type::kB64)) {
    return bindError(resolver, "expected .b8, .b16, .b32 or .b64");
  }
  operation.elementBytes = static_cast<std::uint8_t>(typeBytes(types[0]));
  operation.boundary = boundary == "clamp"  ? Boundary::kClamp
                       : boundary == "zero" ? Boundary::kZero
                                            : Boundary::kTrap;
  if (!expectOperands(parsed, 2, resolver)) return false;
  const Operand& values = store ? parsed.operands[1] : parsed.operands[0];
  const Operand& address = store ? parsed.operands[0] : parsed.operands[1];
  // 8-bit values live in 16-bit registers.
  const Type registerType = types[0] == Type::kB8 ? Type::kB16 : types[0];
  if (!bindRegisterList(values, vector, registerType, !store, resolver, operation.values) ||
      !bindTextureAddress(address, Type::kB32, true, resolver, unsupported, operation)) {
    return false;
  }
  return finishTexture(resolver, instruction, std::move(operation), &surfaceHandler);
}

}  // namespace

bool isTextureOpcode(std::string_view base) {
  return base == "tex" || base == "tld4" || base == "txq" || base == "suld" || base == "sust" ||
         base == "suq";
}

bool bindTexture(const ParsedInstruction& parsed, Qualifiers& qualifiers, OperandResolver& resolver,
                 Instruction& instruction, bool& unsupported) {
  const std::string_view base = qualifiers.base();
  if (base == "tex" || base == "tld4") {
    return bindSample(parsed, qualifiers, resolver, instruction, unsupported);
  }
  if (base == "txq" || base == "suq") {
    return bindQuery(parsed, qualifiers, resolver, instruction, unsupported);
  }
  return bindSurfaceAccess(parsed, qualifiers, resolver, instruction, unsupported);
}

}  // namespace gpuproxy::server::ptx
