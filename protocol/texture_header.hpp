#pragma once
// Texture and surface objects as the sim backend's texture unit reads them: a header in the
// client's own device memory, whose device address is the CUtexObject / CUsurfObject handle the
// program passes to its kernels. The stub writes it (cuTexObjectCreate, cuSurfObjectCreate, from
// the resource and sampler descriptions); the PTX interpreter reads it at each tex, tld4, txq,
// suld, sust and suq (server/backend/ptx/ptx_ops_texture.cpp), as a GPU reads its texture
// headers from memory. Because the header and the texels are ordinary memory of the client's,
// a kernel reaches through a handle only what the launch may touch anyway; a handle that names
// no header of the client's memory faults like any wild load.
//
// The header is read as hostile: the interpreter checks the magic, the kind, every enum and that
// the sizes are not zero, and every texel address goes through the launch's memory checks.
//
// Layout of a resource: element (x, y, z) of `elementBytes(format, channels)` bytes starts at
// base + z * slicePitch + y * pitch + x * elementBytes. Channels are consecutive, each of the
// format's size (a CUDA array's elements, CUarray_format).

#include <cuda.h>

#include <cstdint>

namespace gpuproxy::protocol {

inline constexpr std::uint32_t kTextureHeaderMagic = 0x58545047;  // "GPTX", little-endian

enum class TextureHeaderKind : std::uint32_t {
  kTexture = 1,  // tex, tld4, txq
  kSurface = 2,  // suld, sust, suq
};

// What the resource is, which decides how a fetch with integer coordinates behaves.
enum class TextureResource : std::uint32_t {
  kArray = 1,    // a CUDA array (1, 2 or 3 dimensions)
  kLinear = 2,   // linear memory (tex1Dfetch): integer coordinates, out of range reads zero
  kPitch2D = 3,  // pitched linear memory, sampled like a 2D array
};

struct TextureHeader {
  std::uint32_t magic = kTextureHeaderMagic;
  TextureHeaderKind kind = TextureHeaderKind::kTexture;
  std::uint64_t base = 0;        // device address of element (0, 0, 0)
  std::uint64_t pitch = 0;       // bytes from one row to the next
  std::uint64_t slicePitch = 0;  // bytes from one slice to the next
  std::uint32_t width = 1;       // elements; 1 for a dimension the resource does not have
  std::uint32_t height = 1;
  std::uint32_t depth = 1;
  std::uint32_t dimensions = 1;  // 1, 2 or 3
  TextureResource resource = TextureResource::kArray;
  std::uint32_t format = CU_AD_FORMAT_FLOAT;  // CUarray_format of each channel
  std::uint32_t channels = 1;                 // 1, 2 or 4
  // The sampler (textures only): CUaddress_mode per dimension, CUfilter_mode, CU_TRSF_* flags,
  // and the colour a border-mode fetch outside the resource returns.
  std::uint32_t addressMode[3] = {CU_TR_ADDRESS_MODE_CLAMP, CU_TR_ADDRESS_MODE_CLAMP,
                                  CU_TR_ADDRESS_MODE_CLAMP};
  std::uint32_t filterMode = CU_TR_FILTER_MODE_POINT;
  std::uint32_t flags = 0;
  float borderColor[4] = {0, 0, 0, 0};
  // A layered array (1D or 2D, `dimensions`): its layers are its `depth` slices, and a fetch names
  // one by index (tex.a1d/a2d, suld/sust .a1d/.a2d) without filtering between them. 0: not layered.
  std::uint32_t layered = 0;
  // A cube map (or, layered too, an array of them): a layered 2D array of square layers, six per
  // cube (+x, -x, +y, -y, +z, -z), which tex.cube and tex.acube address by direction. 0: not one.
  std::uint32_t cubemap = 0;
};
static_assert(sizeof(TextureHeader) == 104, "the header's layout is shared with the interpreter");

// Bytes of one channel of `format`, or 0 for a format the texture unit does not read (the
// packed, compressed and video formats).
constexpr std::uint32_t channelBytes(std::uint32_t format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 0;
  }
}

// Bytes of one element, or 0 when the format or the channel count (1, 2 or 4) is not one the
// texture unit reads.
constexpr std::uint32_t elementBytes(std::uint32_t format, std::uint32_t channels) {
  if (channels != 1 && channels != 2 && channels != 4) return 0;
  return channelBytes(format) * channels;
}

}  // namespace gpuproxy::protocol
