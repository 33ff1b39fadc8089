// CUDA arrays, texture objects and surface objects, used as image-processing code and the CUDA
// samples use them. `textures` prints a line per case it checked and ends with
// "textures: PASSED" (exit 0), or a line naming the first wrong value or failing call (exit 1).
// Every value a kernel reads is compared with the same fetch computed on the host, following the
// CUDA Programming Guide's "Texture Fetching" appendix.
//
//   - arrays: cudaMallocArray (float, float2, float4, uchar4; 1D and 2D) and cudaMalloc3DArray,
//     cudaArrayGetInfo, 2D copies host <-> array (whole and a sub-rectangle at an offset), from
//     pitched device memory, array -> array, 3D copies host <-> array through padded host rows;
//   - 2D float textures: point sampling at texel centres and outside the array, bilinear
//     filtering at quarter-texel offsets, normalized coordinates under each address mode (wrap,
//     mirror, clamp, border) with point and linear filtering;
//   - read modes: uchar4 as normalized floats and as uchar4, signed 8-bit (1D array) and 16-bit
//     as normalized floats, half floats as floats (point and linear);
//   - linear memory (tex1Dfetch<float>, tex1Dfetch<int>, past the end reads 0) and pitched
//     memory (cudaMallocPitch) as a 2D texture; a 3D texture, point and trilinear;
//     tex2Dgather on float4 and float arrays;
//   - surfaces: surf2Dread/surf2Dwrite in place, the zero and clamp boundary modes (loads and
//     stores), surf3Dwrite/surf3Dread, surf1Dwrite to a 1D array;
//   - layered arrays (cudaArrayLayered), 2D and 1D: tex2DLayered/tex1DLayered point and bilinear
//     within each layer (never between layers), a layer index past the end clamped, and
//     surf2DLayeredread/surf2DLayeredwrite;
//   - cube maps (cudaArrayCubemap) and a layered cube map: texCubemap/texCubemapLayered at
//     directions on every face (the face of the largest component, the guide's table of face
//     coordinates), point and bilinear within a face; surfCubemapwrite to one face;
//   - a surface over an array made without cudaArraySurfaceLoadStore is refused.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <vector>

#include "checks.cuh"

// --- Kernels: one thread per fetch, the coordinates and results in linear memory. -----------

struct At3 {
  float x, y, z;
};
struct GatherAt {
  float x, y;
  int comp;
};

template <class T>
__global__ void fetch1D(cudaTextureObject_t texture, const float* at, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1D<T>(texture, at[i]);
}

template <class T>
__global__ void fetch2D(cudaTextureObject_t texture, const float2* at, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2D<T>(texture, at[i].x, at[i].y);
}

template <class T>
__global__ void fetch3D(cudaTextureObject_t texture, const At3* at, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex3D<T>(texture, at[i].x, at[i].y, at[i].z);
}

template <class T>
__global__ void fetchLinear(cudaTextureObject_t texture, const int* at, T* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex1Dfetch<T>(texture, at[i]);
}

__global__ void gather2D(cudaTextureObject_t texture, const GatherAt* at, float4* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = tex2Dgather<float4>(texture, at[i].x, at[i].y, at[i].comp);
}

// Surface x coordinates are in bytes: element x is at x * sizeof(element).
__global__ void brighten(cudaSurfaceObject_t surface, int width, int height) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  const int y = blockIdx.y * blockDim.y + threadIdx.y;
  if (x >= width || y >= height) return;
  const float v = surf2Dread<float>(surface, x * sizeof(float), y);
  surf2Dwrite(2.0f * v + 1.0f, surface, x * sizeof(float), y);
}

// at[i] = (x in bytes, y); zero[i] and clamp[i] what each boundary mode reads there.
__global__ void readPastTheEdges(cudaSurfaceObject_t surface, const int2* at, float* zero,
                                 float* clamp, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  zero[i] = surf2Dread<float>(surface, at[i].x, at[i].y, cudaBoundaryModeZero);
  clamp[i] = surf2Dread<float>(surface, at[i].x, at[i].y, cudaBoundaryModeClamp);
}

// Stores outside a width x height float surface: dropped in zero mode, at the edge in clamp mode.
__global__ void writePastTheEdges(cudaSurfaceObject_t surface, int width, int height) {
  surf2Dwrite(99.0f, surface, width * static_cast<int>(sizeof(float)), 3, cudaBoundaryModeZero);
  surf2Dwrite(99.0f, surface, 0, height, cudaBoundaryModeZero);
  surf2Dwrite(99.0f, surface, -static_cast<int>(sizeof(float)), 0, cudaBoundaryModeZero);
  surf2Dwrite(-7.0f, surface, (width + 5) * static_cast<int>(sizeof(float)), 2,
              cudaBoundaryModeClamp);
}

__global__ void fillVolume(cudaSurfaceObject_t surface, int width, int height, int depth) {
  const int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
  if (x >= width || y >= height || z >= depth) return;
  surf3Dwrite(x + 10 * y + 100 * z, surface, x * static_cast<int>(sizeof(int)), y, z);
}

__global__ void readVolume(cudaSurfaceObject_t surface, int* out, int width, int height,
                           int depth) {
  const int x = threadIdx.x, y = threadIdx.y, z = blockIdx.x;
  if (x >= width || y >= height || z >= depth) return;
  out[(z * height + y) * width + x] =
      3 * surf3Dread<int>(surface, x * static_cast<int>(sizeof(int)), y, z);
}

__global__ void fillLine(cudaSurfaceObject_t surface, int width) {
  const int x = blockIdx.x * blockDim.x + threadIdx.x;
  if (x < width) {
    surf1Dwrite(make_float2(x, -0.5f * x), surface, x * static_cast<int>(sizeof(float2)));
  }
}

struct Direction {
  float x, y, z;
  int cube;  // the cube of a layered cube map
};

__global__ void fetchCubemap(cudaTextureObject_t cube, cudaTextureObject_t cubes,
                             const Direction* at, float* single, float* layered, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  single[i] = texCubemap<float>(cube, at[i].x, at[i].y, at[i].z);
  layered[i] = texCubemapLayered<float>(cubes, at[i].x, at[i].y, at[i].z, at[i].cube);
}

// Face `face` of a cube-map surface: element (x, y) becomes -(x + 100 y).
__global__ void markFace(cudaSurfaceObject_t surface, int width, int face) {
  const int x = threadIdx.x, y = blockIdx.x;
  if (x < width && y < width) {
    surfCubemapwrite(-static_cast<float>(x + 100 * y), surface, x * static_cast<int>(sizeof(float)),
                     y, face);
  }
}

namespace {

// --- The host's texture unit. ----------------------------------------------------------------

// A one-channel image of w x h x d texels as the texture unit sees them (already converted to
// float by the read mode), `dimensions` of which the texture has.
struct Image {
  std::vector<float> texels;
  int width = 1, height = 1, depth = 1, dimensions = 1;
};

struct Sampler {
  cudaTextureAddressMode mode = cudaAddressModeClamp;
  cudaTextureFilterMode filter = cudaFilterModePoint;
  bool normalized = false;
  float border = 0.0f;
};

// The address mode applies to each texel index the fetch uses; false: a border texel.
bool address(int& i, int n, cudaTextureAddressMode mode) {
  switch (mode) {
    case cudaAddressModeClamp:
      i = std::min(std::max(i, 0), n - 1);
      return true;
    case cudaAddressModeWrap:
      i = ((i % n) + n) % n;
      return true;
    case cudaAddressModeMirror: {
      const int m = ((i % (2 * n)) + 2 * n) % (2 * n);
      i = m >= n ? 2 * n - 1 - m : m;
      return true;
    }
    case cudaAddressModeBorder:
      return i >= 0 && i < n;
  }
  return false;
}

float texel(const Image& image, const Sampler& s, int x, int y, int z) {
  if (!address(x, image.width, s.mode) || !address(y, image.height, s.mode) ||
      !address(z, image.depth, s.mode)) {
    return s.border;
  }
  return image.texels[(static_cast<size_t>(z) * image.height + y) * image.width + x];
}

// Point: T[floor(u)]. Linear: with xB = u - 0.5, i = floor(xB), a = xB - i, the weighted sum of
// T[i] and T[i + 1] in each dimension the texture has.
float sample(const Image& image, const Sampler& s, float x, float y = 0.0f, float z = 0.0f) {
  const int size[3] = {image.width, image.height, image.depth};
  const float coord[3] = {x, y, z};
  int first[3] = {0, 0, 0};
  float weight[3] = {0.0f, 0.0f, 0.0f};
  for (int d = 0; d < image.dimensions; ++d) {
    float u = s.normalized ? coord[d] * static_cast<float>(size[d]) : coord[d];
    if (s.filter == cudaFilterModeLinear) u -= 0.5f;
    first[d] = static_cast<int>(std::floor(u));
    if (s.filter == cudaFilterModeLinear) weight[d] = u - static_cast<float>(first[d]);
  }
  float sum = 0.0f;
  for (int corner = 0; corner < 8; ++corner) {
    float w = 1.0f;
    for (int d = 0; d < 3; ++d) w *= (corner >> d & 1) ? weight[d] : 1.0f - weight[d];
    if (w == 0.0f) continue;
    sum += w * texel(image, s, first[0] + (corner & 1), first[1] + (corner >> 1 & 1),
                     first[2] + (corner >> 2 & 1));
  }
  return sum;
}

// Bilinear filtering at (u, v) in texels of a 2D image whose texel (x, y) `texel` reads: with
// xB = u - 0.5, i = floor(xB), a = xB - i (and the same for v), the weighted sum of four texels.
template <class Texel>
float bilinear(float u, float v, Texel texel) {
  const float xb = u - 0.5f, yb = v - 0.5f;
  const int x0 = static_cast<int>(std::floor(xb)), y0 = static_cast<int>(std::floor(yb));
  const float a = xb - x0, b = yb - y0;
  return (1 - a) * (1 - b) * texel(x0, y0) + a * (1 - b) * texel(x0 + 1, y0) +
         (1 - a) * b * texel(x0, y0 + 1) + a * b * texel(x0 + 1, y0 + 1);
}

// Layered textures: layer `layer[i]` at (x[i], y[i]); a 1D layered texture at (x[i]) too.
__global__ void fetchLayered(cudaTextureObject_t texture2D, cudaTextureObject_t texture1D,
                             const float2* at, const int* layer, float* out2D, float* out1D,
                             int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out2D[i] = tex2DLayered<float>(texture2D, at[i].x, at[i].y, layer[i]);
  out1D[i] = tex1DLayered<float>(texture1D, at[i].x, layer[i]);
}

// Each element of each layer of a layered surface: v -> 10 v + layer.
__global__ void scaleLayers(cudaSurfaceObject_t surface, int width, int height, int layers) {
  const int x = threadIdx.x;
  const int y = blockIdx.x;
  if (x >= width || y >= height) return;
  for (int layer = 0; layer < layers; ++layer) {
    float v = 0.0f;
    surf2DLayeredread(&v, surface, x * static_cast<int>(sizeof(float)), y, layer);
    surf2DLayeredwrite(10.0f * v + static_cast<float>(layer), surface,
                       x * static_cast<int>(sizeof(float)), y, layer);
  }
}

bool near(float got, float want) {
  return std::fabs(got - want) <= 1e-5f * std::max(1.0f, std::fabs(want));
}

const char* modeName(cudaTextureAddressMode mode) {
  switch (mode) {
    case cudaAddressModeWrap:
      return "wrap";
    case cudaAddressModeClamp:
      return "clamp";
    case cudaAddressModeMirror:
      return "mirror";
    case cudaAddressModeBorder:
      return "border";
  }
  return "?";
}

// --- Host helpers. ----------------------------------------------------------------------------

cudaResourceDesc arrayResource(cudaArray_t array) {
  cudaResourceDesc resource;
  std::memset(&resource, 0, sizeof(resource));
  resource.resType = cudaResourceTypeArray;
  resource.res.array.array = array;
  return resource;
}

// Copies all of an array of width x height x depth elements (height 1 for a 1D array, depth the
// layers of a layered one) from or to tightly packed host memory.
template <class T>
cudaError_t copyWholeArray(cudaArray_t array, T* host, int width, int height, int depth,
                           cudaMemcpyKind kind) {
  const cudaPitchedPtr packed = make_cudaPitchedPtr(const_cast<std::remove_const_t<T>*>(host),
                                                    width * sizeof(T), width, height);
  cudaMemcpy3DParms copy = {};
  if (kind == cudaMemcpyHostToDevice) {
    copy.srcPtr = packed;
    copy.dstArray = array;
  } else {
    copy.srcArray = array;
    copy.dstPtr = packed;
  }
  copy.extent = make_cudaExtent(width, height, depth);  // in elements: one side is an array
  copy.kind = kind;
  return cudaMemcpy3D(&copy);
}

cudaTextureDesc textureDesc(const Sampler& s, cudaTextureReadMode readMode) {
  cudaTextureDesc desc;
  std::memset(&desc, 0, sizeof(desc));
  for (auto& mode : desc.addressMode) mode = s.mode;
  desc.filterMode = s.filter;
  desc.readMode = readMode;
  desc.normalizedCoords = s.normalized ? 1 : 0;
  for (auto& channel : desc.borderColor) channel = s.border;
  return desc;
}

// Runs `kernel` once over the coordinates `at`, one thread each, and brings back its results.
template <class T, class C>
int runFetch(void (*kernel)(cudaTextureObject_t, const C*, T*, int), cudaTextureObject_t texture,
             const std::vector<C>& at, std::vector<T>& out) {
  const int n = static_cast<int>(at.size());
  C* dAt = nullptr;
  T* dOut = nullptr;
  CHECK(cudaMalloc(&dAt, n * sizeof(C)));
  CHECK(cudaMalloc(&dOut, n * sizeof(T)));
  CHECK(cudaMemcpy(dAt, at.data(), n * sizeof(C), cudaMemcpyHostToDevice));
  kernel<<<(n + 127) / 128, 128>>>(texture, dAt, dOut, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  out.resize(n);
  CHECK(cudaMemcpy(out.data(), dOut, n * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK(cudaFree(dAt));
  CHECK(cudaFree(dOut));
  return 0;
}

// A 2D float array holding `image` (whose dimensions must be 2).
int floatArray(const Image& image, cudaArray_t* array, unsigned flags = 0) {
  const cudaChannelFormatDesc desc = cudaCreateChannelDesc<float>();
  CHECK(cudaMallocArray(array, &desc, image.width, image.height, flags));
  const size_t row = image.width * sizeof(float);
  CHECK(cudaMemcpy2DToArray(*array, 0, 0, image.texels.data(), row, row, image.height,
                            cudaMemcpyHostToDevice));
  return 0;
}

// Fetches `image` through the 2D texture at each coordinate and compares with the host: exactly
// for point sampling, which returns a texel (or the border colour) unchanged.
int check2D(const char* what, const Image& image, const Sampler& s, cudaTextureObject_t texture,
            const std::vector<float2>& at) {
  std::vector<float> got;
  if (runFetch(fetch2D<float>, texture, at, got) != 0) return 1;
  for (size_t i = 0; i < at.size(); ++i) {
    const float want = sample(image, s, at[i].x, at[i].y);
    EXPECT(s.filter == cudaFilterModePoint ? got[i] == want : near(got[i], want),
           "%s: tex2D(%g, %g) = %.7g, expected %.7g", what, at[i].x, at[i].y, got[i], want);
  }
  return 0;
}

// Small values, each unlike its neighbours, whose filtered mixtures (weights multiples of 1/4)
// are exact floats.
Image makeImage(int width, int height, int depth, int dimensions, float scale = 0.5f) {
  Image image;
  image.width = width;
  image.height = height;
  image.depth = depth;
  image.dimensions = dimensions;
  image.texels.resize(static_cast<size_t>(width) * height * depth);
  for (size_t i = 0; i < image.texels.size(); ++i) {
    image.texels[i] = static_cast<float>(static_cast<int>((i * 37 + 11) % 29) - 9) * scale;
  }
  return image;
}

bool sameDesc(const cudaChannelFormatDesc& a, const cudaChannelFormatDesc& b) {
  return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w && a.f == b.f;
}

// --- Arrays and copies. -----------------------------------------------------------------------

int arrays() {
  constexpr int W = 16, H = 8;
  // float2 elements, uploaded from host rows padded to 20 elements.
  constexpr int hostPitch = 20;
  std::vector<float2> source(hostPitch * H, make_float2(-1.0f, -1.0f));
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) source[y * hostPitch + x] = make_float2(x + 0.25f, y * 100.0f + x);
  }
  const cudaChannelFormatDesc pairDesc = cudaCreateChannelDesc<float2>();
  cudaArray_t first = nullptr, second = nullptr;
  CHECK(cudaMallocArray(&first, &pairDesc, W, H));
  CHECK(cudaMallocArray(&second, &pairDesc, W, H));
  CHECK(cudaMemcpy2DToArray(first, 0, 0, source.data(), hostPitch * sizeof(float2),
                            W * sizeof(float2), H, cudaMemcpyHostToDevice));

  // cudaArrayGetInfo gives back what the array was made with (a 2D array's depth is 0).
  cudaChannelFormatDesc desc;
  cudaExtent extent;
  unsigned int flags = 0;
  CHECK(cudaArrayGetInfo(&desc, &extent, &flags, first));
  EXPECT(sameDesc(desc, pairDesc), "float2 array desc %d %d %d %d kind %d", desc.x, desc.y, desc.z,
         desc.w, desc.f);
  EXPECT(extent.width == W && extent.height == H && extent.depth == 0,
         "float2 array extent %zu x %zu x %zu", extent.width, extent.height, extent.depth);

  // Round trip into packed host rows.
  std::vector<float2> back(W * H, make_float2(0.0f, 0.0f));
  CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float2), first, 0, 0, W * sizeof(float2), H,
                              cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      const float2 want = source[y * hostPitch + x], got = back[y * W + x];
      EXPECT(got.x == want.x && got.y == want.y,
             "round trip (%d, %d) = (%g, %g), expected (%g, %g)", x, y, got.x, got.y, want.x,
             want.y);
    }
  }

  // Array to array, whole, then a 6 x 3 block from (2, 1) of `first` over (9, 4) of `second`
  // after `second` was cleared from device memory. Offsets in x are in bytes.
  CHECK(cudaMemcpy2DArrayToArray(second, 0, 0, first, 0, 0, W * sizeof(float2), H,
                                 cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float2), second, 0, 0, W * sizeof(float2), H,
                              cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      EXPECT(back[y * W + x].y == source[y * hostPitch + x].y, "array copy (%d, %d) = %g", x, y,
             back[y * W + x].y);
    }
  }
  float2* zeros = nullptr;
  size_t zerosPitch = 0;
  CHECK(cudaMallocPitch(&zeros, &zerosPitch, W * sizeof(float2), H));
  CHECK(cudaMemset2D(zeros, zerosPitch, 0, W * sizeof(float2), H));
  CHECK(cudaMemcpy2DToArray(second, 0, 0, zeros, zerosPitch, W * sizeof(float2), H,
                            cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2DArrayToArray(second, 9 * sizeof(float2), 4, first, 2 * sizeof(float2), 1,
                                 6 * sizeof(float2), 3, cudaMemcpyDeviceToDevice));
  CHECK(cudaMemcpy2DFromArray(back.data(), W * sizeof(float2), second, 0, 0, W * sizeof(float2), H,
                              cudaMemcpyDeviceToHost));
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      const bool inBlock = x >= 9 && x < 15 && y >= 4 && y < 7;
      const float2 want = inBlock ? source[(y - 3) * hostPitch + (x - 7)] : make_float2(0.0f, 0.0f);
      const float2 got = back[y * W + x];
      EXPECT(got.x == want.x && got.y == want.y,
             "block copy (%d, %d) = (%g, %g), expected (%g, %g)", x, y, got.x, got.y, want.x,
             want.y);
    }
  }
  // A sub-rectangle read back at an offset: rows 5..6, elements 3..12.
  std::vector<float2> part(10 * 2);
  CHECK(cudaMemcpy2DFromArray(part.data(), 10 * sizeof(float2), first, 3 * sizeof(float2), 5,
                              10 * sizeof(float2), 2, cudaMemcpyDeviceToHost));
  for (int y = 0; y < 2; ++y) {
    for (int x = 0; x < 10; ++x) {
      EXPECT(part[y * 10 + x].y == source[(y + 5) * hostPitch + x + 3].y, "part (%d, %d) = %g", x,
             y, part[y * 10 + x].y);
    }
  }
  CHECK(cudaFree(zeros));
  CHECK(cudaFreeArray(first));
  CHECK(cudaFreeArray(second));

  // The channel descriptions of other element types, and a 1D array (height 0).
  const cudaChannelFormatDesc descs[] = {cudaCreateChannelDesc<uchar4>(),
                                         cudaCreateChannelDesc<float4>(),
                                         cudaCreateChannelDescHalf()};
  for (const cudaChannelFormatDesc& made : descs) {
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &made, 24, 0));
    CHECK(cudaArrayGetInfo(&desc, &extent, &flags, array));
    EXPECT(sameDesc(desc, made), "array desc %d %d %d %d kind %d, made %d %d %d %d kind %d", desc.x,
           desc.y, desc.z, desc.w, desc.f, made.x, made.y, made.z, made.w, made.f);
    EXPECT(extent.width == 24 && extent.height == 0 && extent.depth == 0,
           "1D array extent %zu x %zu x %zu", extent.width, extent.height, extent.depth);
    CHECK(cudaFreeArray(array));
  }

  // A 3D array: up through packed host memory, down into host rows padded to 11 elements
  // (whose padding the copy must leave alone).
  constexpr int X = 8, Y = 4, Z = 3, downPitch = 11;
  const Image cube = makeImage(X, Y, Z, 3);
  const cudaChannelFormatDesc floatDesc = cudaCreateChannelDesc<float>();
  cudaArray_t array3D = nullptr;
  CHECK(cudaMalloc3DArray(&array3D, &floatDesc, make_cudaExtent(X, Y, Z)));
  CHECK(cudaArrayGetInfo(&desc, &extent, &flags, array3D));
  EXPECT(sameDesc(desc, floatDesc) && extent.width == X && extent.height == Y && extent.depth == Z,
         "3D array extent %zu x %zu x %zu", extent.width, extent.height, extent.depth);
  CHECK(copyWholeArray(array3D, cube.texels.data(), X, Y, Z, cudaMemcpyHostToDevice));
  std::vector<float> down(downPitch * Y * Z, -1000.0f);
  cudaMemcpy3DParms downParms = {};
  downParms.srcArray = array3D;
  downParms.dstPtr = make_cudaPitchedPtr(down.data(), downPitch * sizeof(float), X, Y);
  downParms.extent = make_cudaExtent(X, Y, Z);
  downParms.kind = cudaMemcpyDeviceToHost;
  CHECK(cudaMemcpy3D(&downParms));
  for (int z = 0; z < Z; ++z) {
    for (int y = 0; y < Y; ++y) {
      for (int x = 0; x < downPitch; ++x) {
        const float want = x < X ? cube.texels[(z * Y + y) * X + x] : -1000.0f;
        const float got = down[(z * Y + y) * downPitch + x];
        EXPECT(got == want, "3D copy (%d, %d, %d) = %g, expected %g", x, y, z, got, want);
      }
    }
  }
  CHECK(cudaFreeArray(array3D));
  std::printf("arrays: 2D, array to array, sub-rectangles, 1D and 3D copies as on the host\n");
  return 0;
}

// --- Textures over arrays. ----------------------------------------------------------------------

int pointAndLinear() {
  const Image image = makeImage(16, 8, 1, 2);
  cudaArray_t array = nullptr;
  if (floatArray(image, &array) != 0) return 1;
  Sampler s;  // clamp, unnormalized
  const cudaResourceDesc resource = arrayResource(array);
  cudaTextureObject_t point = 0, linear = 0;
  cudaTextureDesc desc = textureDesc(s, cudaReadModeElementType);
  CHECK(cudaCreateTextureObject(&point, &resource, &desc, nullptr));

  cudaResourceDesc asked;
  CHECK(cudaGetTextureObjectResourceDesc(&asked, point));
  EXPECT(asked.resType == cudaResourceTypeArray && asked.res.array.array == array,
         "the texture's resource is type %d, array %p", asked.resType,
         static_cast<void*>(asked.res.array.array));

  // Texel centres give exactly the texels; beyond the edges, clamp gives the edge texels.
  std::vector<float2> at;
  for (int y = -2; y < image.height + 2; ++y) {
    for (int x = -2; x < image.width + 2; ++x) at.push_back(make_float2(x + 0.5f, y + 0.5f));
  }
  if (check2D("point", image, s, point, at) != 0) return 1;

  // Bilinear: x + 0.75 and y + 0.25 weigh the neighbours by 1/4 and 3/4.
  s.filter = cudaFilterModeLinear;
  desc = textureDesc(s, cudaReadModeElementType);
  CHECK(cudaCreateTextureObject(&linear, &resource, &desc, nullptr));
  at.clear();
  for (int y = -1; y <= image.height; ++y) {
    for (int x = -1; x <= image.width; ++x) {
      at.push_back(make_float2(x + 0.75f, y + 0.25f));
      at.push_back(make_float2(x + 1.0f, y + 0.5f));
    }
  }
  if (check2D("linear", image, s, linear, at) != 0) return 1;

  CHECK(cudaDestroyTextureObject(point));
  CHECK(cudaDestroyTextureObject(linear));
  CHECK(cudaFreeArray(array));
  std::printf("2D float texture: point and bilinear fetches as on the host\n");
  return 0;
}

// Normalized coordinates well outside [0, 1), so each address mode decides which texel is read.
int addressModes() {
  const Image image = makeImage(8, 4, 1, 2);
  cudaArray_t array = nullptr;
  if (floatArray(image, &array) != 0) return 1;
  const cudaResourceDesc resource = arrayResource(array);
  for (cudaTextureAddressMode mode :
       {cudaAddressModeWrap, cudaAddressModeMirror, cudaAddressModeClamp, cudaAddressModeBorder}) {
    for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
      Sampler s;
      s.mode = mode;
      s.filter = filter;
      s.normalized = true;
      s.border = 0.25f;  // not the default 0, so a border texel is told from a texel of 0
      const cudaTextureDesc desc = textureDesc(s, cudaReadModeElementType);
      cudaTextureObject_t texture = 0;
      CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
      // Point: texel centres; linear: a quarter past them.
      const float offset = filter == cudaFilterModePoint ? 0.5f : 0.25f;
      std::vector<float2> at;
      for (int y = -5; y < 9; ++y) {
        for (int x = -12; x < 20; ++x) {
          at.push_back(make_float2((x + offset) / image.width, (y + 1.0f - offset) / image.height));
        }
      }
      char what[64];
      std::snprintf(what, sizeof(what), "%s, %s", modeName(mode),
                    filter == cudaFilterModePoint ? "point" : "linear");
      if (check2D(what, image, s, texture, at) != 0) return 1;
      CHECK(cudaDestroyTextureObject(texture));
    }
  }
  CHECK(cudaFreeArray(array));
  std::printf("normalized coordinates: wrap, mirror, clamp and border as on the host\n");
  return 0;
}

int readModes() {
  // uchar4: as normalized floats (v / 255) and as the elements themselves.
  {
    constexpr int W = 8, H = 4;
    std::vector<uchar4> texels(W * H);
    for (int i = 0; i < W * H; ++i) {
      texels[i] = make_uchar4(i * 8, 255 - i, (i * 37) % 256, i % 2 == 0 ? 255 : 0);
    }
    const cudaChannelFormatDesc channels = cudaCreateChannelDesc<uchar4>();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &channels, W, H));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, texels.data(), W * sizeof(uchar4), W * sizeof(uchar4), H,
                              cudaMemcpyHostToDevice));
    const cudaResourceDesc resource = arrayResource(array);
    std::vector<float2> at;
    for (int y = 0; y < H; ++y) {
      for (int x = 0; x < W; ++x) at.push_back(make_float2(x + 0.5f, y + 0.5f));
    }
    cudaTextureObject_t asFloat = 0, asBytes = 0;
    cudaTextureDesc desc = textureDesc(Sampler(), cudaReadModeNormalizedFloat);
    CHECK(cudaCreateTextureObject(&asFloat, &resource, &desc, nullptr));
    desc = textureDesc(Sampler(), cudaReadModeElementType);
    CHECK(cudaCreateTextureObject(&asBytes, &resource, &desc, nullptr));
    std::vector<float4> floats;
    std::vector<uchar4> bytes;
    if (runFetch(fetch2D<float4>, asFloat, at, floats) != 0) return 1;
    if (runFetch(fetch2D<uchar4>, asBytes, at, bytes) != 0) return 1;
    for (int i = 0; i < W * H; ++i) {
      const uchar4 t = texels[i];
      const float4 f = floats[i];
      EXPECT(near(f.x, t.x / 255.0f) && near(f.y, t.y / 255.0f) && near(f.z, t.z / 255.0f) &&
                 near(f.w, t.w / 255.0f),
             "uchar4 %d normalized (%g, %g, %g, %g), texel (%d, %d, %d, %d)", i, f.x, f.y, f.z, f.w,
             t.x, t.y, t.z, t.w);
      const uchar4 b = bytes[i];
      EXPECT(b.x == t.x && b.y == t.y && b.z == t.z && b.w == t.w,
             "uchar4 %d read (%d, %d, %d, %d), texel (%d, %d, %d, %d)", i, b.x, b.y, b.z, b.w, t.x,
             t.y, t.z, t.w);
    }
    CHECK(cudaDestroyTextureObject(asFloat));
    CHECK(cudaDestroyTextureObject(asBytes));
    CHECK(cudaFreeArray(array));
  }
  // Signed 8-bit in a 1D array: v / 127, and -128 is -1 like -127.
  {
    const std::vector<signed char> texels = {-128, -127, -64, -1,   0, 1,  63, 64,
                                             100,  126,  127, -100, 5, -5, 42, -42};
    const int n = static_cast<int>(texels.size());
    const cudaChannelFormatDesc channels = cudaCreateChannelDesc<signed char>();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &channels, n));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, texels.data(), n, n, 1, cudaMemcpyHostToDevice));
    const cudaResourceDesc resource = arrayResource(array);
    const cudaTextureDesc desc = textureDesc(Sampler(), cudaReadModeNormalizedFloat);
    cudaTextureObject_t texture = 0;
    CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
    std::vector<float> at, got;
    for (int i = 0; i < n; ++i) at.push_back(i + 0.5f);
    if (runFetch(fetch1D<float>, texture, at, got) != 0) return 1;
    for (int i = 0; i < n; ++i) {
      const float want = std::max(texels[i] / 127.0f, -1.0f);
      EXPECT(near(got[i], want), "signed char %d normalized %.7g, expected %.7g", texels[i], got[i],
             want);
    }
    CHECK(cudaDestroyTextureObject(texture));
    CHECK(cudaFreeArray(array));
  }
  // Signed 16-bit in a 2D array: v / 32767.
  {
    constexpr int W = 4, H = 2;
    const short texels[W * H] = {-32768, -32767, -1000, 0, 1, 1000, 16384, 32767};
    const cudaChannelFormatDesc channels = cudaCreateChannelDesc<short>();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &channels, W, H));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, texels, W * sizeof(short), W * sizeof(short), H,
                              cudaMemcpyHostToDevice));
    const cudaResourceDesc resource = arrayResource(array);
    const cudaTextureDesc desc = textureDesc(Sampler(), cudaReadModeNormalizedFloat);
    cudaTextureObject_t texture = 0;
    CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
    std::vector<float2> at;
    for (int i = 0; i < W * H; ++i) at.push_back(make_float2(i % W + 0.5f, i / W + 0.5f));
    std::vector<float> got;
    if (runFetch(fetch2D<float>, texture, at, got) != 0) return 1;
    for (int i = 0; i < W * H; ++i) {
      const float want = std::max(texels[i] / 32767.0f, -1.0f);
      EXPECT(near(got[i], want), "short %d normalized %.7g, expected %.7g", texels[i], got[i],
             want);
    }
    CHECK(cudaDestroyTextureObject(texture));
    CHECK(cudaFreeArray(array));
  }
  // Half floats are read as floats, point and linear.
  {
    const Image image = makeImage(8, 4, 1, 2, 0.25f);  // exact in half precision
    std::vector<__half> halves;
    for (float v : image.texels) halves.push_back(__float2half(v));
    const cudaChannelFormatDesc channels = cudaCreateChannelDescHalf();
    cudaArray_t array = nullptr;
    CHECK(cudaMallocArray(&array, &channels, image.width, image.height));
    CHECK(cudaMemcpy2DToArray(array, 0, 0, halves.data(), image.width * sizeof(__half),
                              image.width * sizeof(__half), image.height, cudaMemcpyHostToDevice));
    const cudaResourceDesc resource = arrayResource(array);
    for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
      Sampler s;
      s.filter = filter;
      const cudaTextureDesc desc = textureDesc(s, cudaReadModeElementType);
      cudaTextureObject_t texture = 0;
      CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
      std::vector<float2> at;
      for (int y = 0; y < image.height; ++y) {
        for (int x = 0; x < image.width; ++x) at.push_back(make_float2(x + 0.75f, y + 0.25f));
      }
      if (check2D(filter == cudaFilterModePoint ? "half, point" : "half, linear", image, s, texture,
                  at) != 0) {
        return 1;
      }
      CHECK(cudaDestroyTextureObject(texture));
    }
    CHECK(cudaFreeArray(array));
  }
  std::printf("read modes: uchar4, signed char, short and half textures as on the host\n");
  return 0;
}

// --- Textures over linear and pitched memory, 3D, gather. -------------------------------------

int linearMemory() {
  // The texture covers the first n elements of a larger allocation: its own size bounds the
  // fetches, so index n reads 0 though memory follows.
  constexpr int n = 100;
  std::vector<float> floats(2 * n);
  std::vector<int> ints(2 * n);
  for (int i = 0; i < 2 * n; ++i) {
    floats[i] = i * 1.5f - 20.0f;
    ints[i] = i * i - 777;
  }
  float* dFloats = nullptr;
  int* dInts = nullptr;
  CHECK(cudaMalloc(&dFloats, 2 * n * sizeof(float)));
  CHECK(cudaMalloc(&dInts, 2 * n * sizeof(int)));
  CHECK(cudaMemcpy(dFloats, floats.data(), 2 * n * sizeof(float), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(dInts, ints.data(), 2 * n * sizeof(int), cudaMemcpyHostToDevice));

  cudaResourceDesc resource;
  std::memset(&resource, 0, sizeof(resource));
  resource.resType = cudaResourceTypeLinear;
  resource.res.linear.devPtr = dFloats;
  resource.res.linear.desc = cudaCreateChannelDesc<float>();
  resource.res.linear.sizeInBytes = n * sizeof(float);
  const cudaTextureDesc desc = textureDesc(Sampler(), cudaReadModeElementType);
  cudaTextureObject_t floatTexture = 0, intTexture = 0;
  CHECK(cudaCreateTextureObject(&floatTexture, &resource, &desc, nullptr));
  resource.res.linear.devPtr = dInts;
  resource.res.linear.desc = cudaCreateChannelDesc<int>();
  resource.res.linear.sizeInBytes = n * sizeof(int);
  CHECK(cudaCreateTextureObject(&intTexture, &resource, &desc, nullptr));

  cudaResourceDesc asked;
  CHECK(cudaGetTextureObjectResourceDesc(&asked, intTexture));
  EXPECT(asked.resType == cudaResourceTypeLinear && asked.res.linear.devPtr == dInts &&
             asked.res.linear.sizeInBytes == n * sizeof(int),
         "the linear texture's resource is type %d, %p, %zu bytes", asked.resType,
         asked.res.linear.devPtr, asked.res.linear.sizeInBytes);

  std::vector<int> at;
  for (int i = 0; i < n + 4; ++i) at.push_back((i * 7) % (n + 4));
  std::vector<float> gotFloats;
  std::vector<int> gotInts;
  if (runFetch(fetchLinear<float>, floatTexture, at, gotFloats) != 0) return 1;
  if (runFetch(fetchLinear<int>, intTexture, at, gotInts) != 0) return 1;
  for (size_t i = 0; i < at.size(); ++i) {
    const int index = at[i];
    const float wantFloat = index < n ? floats[index] : 0.0f;
    const int wantInt = index < n ? ints[index] : 0;
    EXPECT(gotFloats[i] == wantFloat, "tex1Dfetch<float>(%d) = %g, expected %g", index,
           gotFloats[i], wantFloat);
    EXPECT(gotInts[i] == wantInt, "tex1Dfetch<int>(%d) = %d, expected %d", index, gotInts[i],
           wantInt);
  }
  CHECK(cudaDestroyTextureObject(floatTexture));
  CHECK(cudaDestroyTextureObject(intTexture));
  CHECK(cudaFree(dFloats));
  CHECK(cudaFree(dInts));
  std::printf("linear memory: tex1Dfetch<float> and <int>, 0 past the end\n");
  return 0;
}

int pitched() {
  const Image image = makeImage(12, 6, 1, 2);
  float* rows = nullptr;
  size_t pitch = 0;
  CHECK(cudaMallocPitch(&rows, &pitch, image.width * sizeof(float), image.height));
  CHECK(cudaMemcpy2D(rows, pitch, image.texels.data(), image.width * sizeof(float),
                     image.width * sizeof(float), image.height, cudaMemcpyHostToDevice));
  cudaResourceDesc resource;
  std::memset(&resource, 0, sizeof(resource));
  resource.resType = cudaResourceTypePitch2D;
  resource.res.pitch2D.devPtr = rows;
  resource.res.pitch2D.desc = cudaCreateChannelDesc<float>();
  resource.res.pitch2D.width = image.width;
  resource.res.pitch2D.height = image.height;
  resource.res.pitch2D.pitchInBytes = pitch;
  for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
    Sampler s;
    s.filter = filter;
    const cudaTextureDesc desc = textureDesc(s, cudaReadModeElementType);
    cudaTextureObject_t texture = 0;
    CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
    std::vector<float2> at;
    for (int y = -1; y <= image.height; ++y) {
      for (int x = -1; x <= image.width; ++x) at.push_back(make_float2(x + 0.25f, y + 0.75f));
    }
    if (check2D(filter == cudaFilterModePoint ? "pitch2D, point" : "pitch2D, linear", image, s,
                texture, at) != 0) {
      return 1;
    }
    CHECK(cudaDestroyTextureObject(texture));
  }
  CHECK(cudaFree(rows));
  std::printf("pitched memory (pitch %zu bytes): point and bilinear fetches as on the host\n",
              pitch);
  return 0;
}

int volume() {
  const Image image = makeImage(8, 4, 3, 3);
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<float>();
  cudaArray_t array = nullptr;
  CHECK(cudaMalloc3DArray(&array, &channels,
                          make_cudaExtent(image.width, image.height, image.depth)));
  CHECK(copyWholeArray(array, image.texels.data(), image.width, image.height, image.depth,
                       cudaMemcpyHostToDevice));
  const cudaResourceDesc resource = arrayResource(array);
  for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
    Sampler s;
    s.filter = filter;
    const cudaTextureDesc desc = textureDesc(s, cudaReadModeElementType);
    cudaTextureObject_t texture = 0;
    CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
    // Point: every texel centre and one beyond each face; linear: quarter-texel offsets.
    const float ox = filter == cudaFilterModePoint ? 0.5f : 0.75f;
    const float oy = filter == cudaFilterModePoint ? 0.5f : 0.25f;
    std::vector<At3> at;
    for (int z = -1; z <= image.depth; ++z) {
      for (int y = -1; y <= image.height; ++y) {
        for (int x = -1; x <= image.width; ++x) at.push_back({x + ox, y + oy, z + ox});
      }
    }
    std::vector<float> got;
    if (runFetch(fetch3D<float>, texture, at, got) != 0) return 1;
    for (size_t i = 0; i < at.size(); ++i) {
      const float want = sample(image, s, at[i].x, at[i].y, at[i].z);
      EXPECT(near(got[i], want), "tex3D %s (%g, %g, %g) = %.7g, expected %.7g",
             filter == cudaFilterModePoint ? "point" : "linear", at[i].x, at[i].y, at[i].z, got[i],
             want);
    }
    CHECK(cudaDestroyTextureObject(texture));
  }
  CHECK(cudaFreeArray(array));
  std::printf("3D texture: point and trilinear fetches as on the host\n");
  return 0;
}

// tex2Dgather: component `comp` of the four texels bilinear filtering at (x, y) would weigh,
// as (T[j1][i0], T[j1][i1], T[j0][i1], T[j0][i0]).
int gather() {
  constexpr int W = 16, H = 8;
  std::vector<float4> texels(W * H);
  for (int i = 0; i < W * H; ++i) {
    texels[i] = make_float4(i, 1000.0f + i, -0.5f * i, (i * 13) % 7 - 3.0f);
  }
  std::vector<float> red(W * H);  // the one-channel array's texels
  for (int i = 0; i < W * H; ++i) red[i] = texels[i].x + 0.125f;
  const cudaChannelFormatDesc four = cudaCreateChannelDesc<float4>();
  const cudaChannelFormatDesc one = cudaCreateChannelDesc<float>();
  cudaArray_t quads = nullptr, singles = nullptr;
  CHECK(cudaMallocArray(&quads, &four, W, H, cudaArrayTextureGather));
  CHECK(cudaMallocArray(&singles, &one, W, H, cudaArrayTextureGather));
  CHECK(cudaMemcpy2DToArray(quads, 0, 0, texels.data(), W * sizeof(float4), W * sizeof(float4), H,
                            cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy2DToArray(singles, 0, 0, red.data(), W * sizeof(float), W * sizeof(float), H,
                            cudaMemcpyHostToDevice));

  // Coordinates a quarter texel either side of centres and edges, inside and past the edges
  // (clamp), each asking for another component.
  std::vector<GatherAt> at;
  const float fractions[] = {0.25f, 0.5f, 0.75f, 1.0f};
  for (int y = -1; y <= H; ++y) {
    for (int x = -1; x <= W; ++x) {
      at.push_back({x + fractions[(x + 1) % 4], y + fractions[(y + 3) % 4], (x + 2 * y + 4) % 4});
    }
  }
  for (int pass = 0; pass < 2; ++pass) {
    const bool quad = pass == 0;
    const cudaResourceDesc resource = arrayResource(quad ? quads : singles);
    const cudaTextureDesc desc = textureDesc(Sampler(), cudaReadModeElementType);
    cudaTextureObject_t texture = 0;
    CHECK(cudaCreateTextureObject(&texture, &resource, &desc, nullptr));
    std::vector<GatherAt> asked = at;
    if (!quad) {
      for (auto& a : asked) a.comp = 0;
    }
    std::vector<float4> got;
    if (runFetch(gather2D, texture, asked, got) != 0) return 1;
    for (size_t k = 0; k < asked.size(); ++k) {
      const int i0 = static_cast<int>(std::floor(asked[k].x - 0.5f));
      const int j0 = static_cast<int>(std::floor(asked[k].y - 0.5f));
      auto component = [&](int i, int j) {
        i = std::min(std::max(i, 0), W - 1);
        j = std::min(std::max(j, 0), H - 1);
        if (!quad) return red[j * W + i];
        const float4 t = texels[j * W + i];
        const float c[4] = {t.x, t.y, t.z, t.w};
        return c[asked[k].comp];
      };
      const float4 want = make_float4(component(i0, j0 + 1), component(i0 + 1, j0 + 1),
                                      component(i0 + 1, j0), component(i0, j0));
      const float4 g = got[k];
      EXPECT(g.x == want.x && g.y == want.y && g.z == want.z && g.w == want.w,
             "%s gather(%g, %g, comp %d) = (%g, %g, %g, %g), expected (%g, %g, %g, %g)",
             quad ? "float4" : "float", asked[k].x, asked[k].y, asked[k].comp, g.x, g.y, g.z, g.w,
             want.x, want.y, want.z, want.w);
    }
    CHECK(cudaDestroyTextureObject(texture));
  }
  CHECK(cudaFreeArray(quads));
  CHECK(cudaFreeArray(singles));
  std::printf("tex2Dgather on float4 and float arrays as on the host\n");
  return 0;
}

// --- Surfaces. -----------------------------------------------------------------------------------

int surfaces2D() {
  const Image image = makeImage(16, 8, 1, 2);
  const int W = image.width, H = image.height;
  cudaArray_t array = nullptr;
  if (floatArray(image, &array, cudaArraySurfaceLoadStore) != 0) return 1;
  cudaChannelFormatDesc desc;
  cudaExtent extent;
  unsigned int flags = 0;
  CHECK(cudaArrayGetInfo(&desc, &extent, &flags, array));
  EXPECT((flags & cudaArraySurfaceLoadStore) != 0, "array flags %#x", flags);
  const cudaResourceDesc resource = arrayResource(array);
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &resource));

  // In place: each element v becomes 2v + 1.
  brighten<<<dim3(W / 8, H / 4), dim3(8, 4)>>>(surface, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> expected(image.texels);
  for (float& v : expected) v = 2.0f * v + 1.0f;

  // Reads past the edges (x in bytes): zero mode gives 0, clamp mode the nearest edge element.
  struct Probe {
    int x, y;  // elements
  };
  const Probe probes[] = {{W, 0},  {W + 3, 2},  {-1, 3}, {0, H},        {5, -1},
                          {-2, H}, {W + 1, -4}, {3, 2},  {W - 1, H - 1}};
  std::vector<int2> at;
  for (const Probe& p : probes) at.push_back(make_int2(p.x * static_cast<int>(sizeof(float)), p.y));
  const int n = static_cast<int>(at.size());
  int2* dAt = nullptr;
  float *dZero = nullptr, *dClamp = nullptr;
  CHECK(cudaMalloc(&dAt, n * sizeof(int2)));
  CHECK(cudaMalloc(&dZero, n * sizeof(float)));
  CHECK(cudaMalloc(&dClamp, n * sizeof(float)));
  CHECK(cudaMemcpy(dAt, at.data(), n * sizeof(int2), cudaMemcpyHostToDevice));
  readPastTheEdges<<<1, 32>>>(surface, dAt, dZero, dClamp, n);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> zero(n), clamp(n);
  CHECK(cudaMemcpy(zero.data(), dZero, n * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(clamp.data(), dClamp, n * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < n; ++i) {
    const int x = probes[i].x, y = probes[i].y;
    const bool inside = x >= 0 && x < W && y >= 0 && y < H;
    const float wantZero = inside ? expected[y * W + x] : 0.0f;
    const int cx = std::min(std::max(x, 0), W - 1), cy = std::min(std::max(y, 0), H - 1);
    const float wantClamp = expected[cy * W + cx];
    EXPECT(zero[i] == wantZero, "zero-mode read at element (%d, %d) = %g, expected %g", x, y,
           zero[i], wantZero);
    EXPECT(clamp[i] == wantClamp, "clamp-mode read at element (%d, %d) = %g, expected %g", x, y,
           clamp[i], wantClamp);
  }

  // Stores past the edges: dropped in zero mode; in clamp mode at the edge element of the row.
  writePastTheEdges<<<1, 1>>>(surface, W, H);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  expected[2 * W + W - 1] = -7.0f;
  std::vector<float> got(W * H);
  CHECK(cudaMemcpy2DFromArray(got.data(), W * sizeof(float), array, 0, 0, W * sizeof(float), H,
                              cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H; ++i) {
    EXPECT(got[i] == expected[i], "surface element (%d, %d) = %g, expected %g", i % W, i / W,
           got[i], expected[i]);
  }
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaFree(dAt));
  CHECK(cudaFree(dZero));
  CHECK(cudaFree(dClamp));
  CHECK(cudaFreeArray(array));
  std::printf("2D surface: read-modify-write, zero and clamp boundary modes as on the host\n");
  return 0;
}

int surfaces3D() {
  constexpr int X = 8, Y = 4, Z = 3;
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<int>();
  cudaArray_t array = nullptr;
  CHECK(cudaMalloc3DArray(&array, &channels, make_cudaExtent(X, Y, Z), cudaArraySurfaceLoadStore));
  const cudaResourceDesc resource = arrayResource(array);
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &resource));
  fillVolume<<<Z, dim3(X, Y)>>>(surface, X, Y, Z);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  int* tripled = nullptr;
  CHECK(cudaMalloc(&tripled, X * Y * Z * sizeof(int)));
  readVolume<<<Z, dim3(X, Y)>>>(surface, tripled, X, Y, Z);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());

  std::vector<int> fromKernel(X * Y * Z), fromArray(X * Y * Z);
  CHECK(cudaMemcpy(fromKernel.data(), tripled, fromKernel.size() * sizeof(int),
                   cudaMemcpyDeviceToHost));
  CHECK(copyWholeArray(array, fromArray.data(), X, Y, Z, cudaMemcpyDeviceToHost));
  for (int z = 0; z < Z; ++z) {
    for (int y = 0; y < Y; ++y) {
      for (int x = 0; x < X; ++x) {
        const int i = (z * Y + y) * X + x, want = x + 10 * y + 100 * z;
        EXPECT(fromArray[i] == want, "surf3Dwrite (%d, %d, %d): array holds %d, expected %d", x, y,
               z, fromArray[i], want);
        EXPECT(fromKernel[i] == 3 * want, "surf3Dread (%d, %d, %d) * 3 = %d, expected %d", x, y, z,
               fromKernel[i], 3 * want);
      }
    }
  }
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaFree(tripled));
  CHECK(cudaFreeArray(array));
  std::printf("3D surface: surf3Dwrite and surf3Dread as on the host\n");
  return 0;
}

int surface1D() {
  constexpr int W = 40;
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<float2>();
  cudaArray_t array = nullptr;
  CHECK(cudaMallocArray(&array, &channels, W, 0, cudaArraySurfaceLoadStore));
  const cudaResourceDesc resource = arrayResource(array);
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &resource));
  fillLine<<<2, 32>>>(surface, W);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float2> got(W);
  CHECK(cudaMemcpy2DFromArray(got.data(), W * sizeof(float2), array, 0, 0, W * sizeof(float2), 1,
                              cudaMemcpyDeviceToHost));
  for (int x = 0; x < W; ++x) {
    EXPECT(got[x].x == x && got[x].y == -0.5f * x, "surf1Dwrite element %d = (%g, %g)", x, got[x].x,
           got[x].y);
  }
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaFreeArray(array));
  std::printf("1D surface: surf1Dwrite of float2 elements as on the host\n");
  return 0;
}

// Surfaces need arrays made for them; without cudaArraySurfaceLoadStore the runtime refuses.
int surfaceWithoutTheFlag() {
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<float>();
  cudaArray_t array = nullptr;
  CHECK(cudaMallocArray(&array, &channels, 8, 8));
  const cudaResourceDesc resource = arrayResource(array);
  cudaSurfaceObject_t surface = 0;
  const cudaError_t refused = cudaCreateSurfaceObject(&surface, &resource);
  EXPECT(refused != cudaSuccess, "a surface over an array without cudaArraySurfaceLoadStore");
  cudaGetLastError();  // clears it: the error is not sticky
  CHECK(cudaGetLastError());
  CHECK(cudaFreeArray(array));
  std::printf("a surface over an array without cudaArraySurfaceLoadStore: %s\n",
              cudaGetErrorName(refused));
  return 0;
}

}  // namespace

// Layered arrays: each layer a texture of its own, sampled without blending layers.
int layered() {
  constexpr int W = 8, H = 4, L = 3;
  std::vector<float> texels(W * H * L);
  for (int i = 0; i < W * H * L; ++i) texels[i] = static_cast<float>((i * 37) % 101) * 0.5f;
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<float>();
  cudaArray_t array2D = nullptr;
  CHECK(cudaMalloc3DArray(&array2D, &channels, make_cudaExtent(W, H, L),
                          cudaArrayLayered | cudaArraySurfaceLoadStore));
  cudaArray_t array1D = nullptr;  // L layers of W elements: the first row of each 2D layer
  CHECK(cudaMalloc3DArray(&array1D, &channels, make_cudaExtent(W, 0, L), cudaArrayLayered));
  CHECK(copyWholeArray(array2D, texels.data(), W, H, L, cudaMemcpyHostToDevice));
  std::vector<float> rows(W * L);
  for (int layer = 0; layer < L; ++layer) {
    std::copy_n(texels.begin() + layer * W * H, W, rows.begin() + layer * W);
  }
  CHECK(copyWholeArray(array1D, rows.data(), W, 1, L, cudaMemcpyHostToDevice));
  cudaExtent extent = {};
  unsigned flags = 0;
  CHECK(cudaArrayGetInfo(nullptr, &extent, &flags, array2D));
  EXPECT(extent.width == W && extent.height == H && extent.depth == L &&
             (flags & cudaArrayLayered) != 0,
         "layered array info %zux%zux%zu flags %u", extent.width, extent.height, extent.depth,
         flags);

  // Host reference: texel (x, y) of `layer`, clamped; bilinear within the layer.
  auto texel = [&](int x, int y, int layer) {
    x = std::min(std::max(x, 0), W - 1);
    y = std::min(std::max(y, 0), H - 1);
    return texels[(layer * H + y) * W + x];
  };
  for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
    std::vector<float2> at;
    std::vector<int> layers;
    for (int layer = -1; layer <= L; ++layer) {  // -1 and L: clamped to the first and last
      for (int y = 0; y < H; ++y) {
        for (int x = -1; x <= W; ++x) {
          at.push_back(make_float2(x + 0.75f, y + 0.25f));
          layers.push_back(layer);
        }
      }
    }
    const int n = static_cast<int>(at.size());
    const cudaResourceDesc resource2D = arrayResource(array2D);
    const cudaResourceDesc resource1D = arrayResource(array1D);
    cudaTextureDesc description = {};
    description.addressMode[0] = description.addressMode[1] = cudaAddressModeClamp;
    description.filterMode = filter;
    description.readMode = cudaReadModeElementType;
    cudaTextureObject_t texture2D = 0;
    CHECK(cudaCreateTextureObject(&texture2D, &resource2D, &description, nullptr));
    cudaTextureObject_t texture1D = 0;
    CHECK(cudaCreateTextureObject(&texture1D, &resource1D, &description, nullptr));
    float2* onDevice = nullptr;
    int* layersOnDevice = nullptr;
    float* out2D = nullptr;
    float* out1D = nullptr;
    CHECK(cudaMalloc(&onDevice, n * sizeof(float2)));
    CHECK(cudaMalloc(&layersOnDevice, n * sizeof(int)));
    CHECK(cudaMalloc(&out2D, n * sizeof(float)));
    CHECK(cudaMalloc(&out1D, n * sizeof(float)));
    CHECK(cudaMemcpy(onDevice, at.data(), n * sizeof(float2), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(layersOnDevice, layers.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    fetchLayered<<<(n + 127) / 128, 128>>>(texture2D, texture1D, onDevice, layersOnDevice, out2D,
                                           out1D, n);
    CHECK(cudaGetLastError());
    std::vector<float> got2D(n), got1D(n);
    CHECK(cudaMemcpy(got2D.data(), out2D, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(got1D.data(), out1D, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
      const int layer = std::min(std::max(layers[i], 0), L - 1);
      float want2D = 0.0f;
      float want1D = 0.0f;
      if (filter == cudaFilterModePoint) {
        want2D = texel(static_cast<int>(std::floor(at[i].x)), static_cast<int>(std::floor(at[i].y)),
                       layer);
        want1D = texel(static_cast<int>(std::floor(at[i].x)), 0, layer);
      } else {
        want2D = bilinear(at[i].x, at[i].y, [&](int x, int y) { return texel(x, y, layer); });
        want1D = bilinear(at[i].x, 0.5f, [&](int x, int) { return texel(x, 0, layer); });
      }
      EXPECT(near(got2D[i], want2D), "tex2DLayered %s (%g, %g) layer %d = %.7g, expected %.7g",
             filter == cudaFilterModePoint ? "point" : "linear", at[i].x, at[i].y, layers[i],
             got2D[i], want2D);
      EXPECT(near(got1D[i], want1D), "tex1DLayered %s (%g) layer %d = %.7g, expected %.7g",
             filter == cudaFilterModePoint ? "point" : "linear", at[i].x, layers[i], got1D[i],
             want1D);
    }
    CHECK(cudaDestroyTextureObject(texture2D));
    CHECK(cudaDestroyTextureObject(texture1D));
    CHECK(cudaFree(onDevice));
    CHECK(cudaFree(layersOnDevice));
    CHECK(cudaFree(out2D));
    CHECK(cudaFree(out1D));
  }

  // A layered surface: every layer's elements rewritten in place, then read back whole.
  const cudaResourceDesc surfaceResource = arrayResource(array2D);
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &surfaceResource));
  scaleLayers<<<H, W>>>(surface, W, H, L);
  CHECK(cudaGetLastError());
  std::vector<float> back(W * H * L, -1.0f);
  CHECK(copyWholeArray(array2D, back.data(), W, H, L, cudaMemcpyDeviceToHost));
  for (int i = 0; i < W * H * L; ++i) {
    const float want = 10.0f * texels[i] + static_cast<float>(i / (W * H));
    EXPECT(back[i] == want, "layered surface element %d is %g, expected %g", i, back[i], want);
  }
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaFreeArray(array2D));
  CHECK(cudaFreeArray(array1D));
  std::printf("layered textures and surfaces: each layer sampled and written as on the host\n");
  return 0;
}

// Cube maps: a W x W face per direction, six per cube; texel (x, y) of face f of cube c holds
// 1000 c + 100 f + 10 y + x.
int cubemaps() {
  constexpr int W = 4, Cubes = 2;
  std::vector<float> texels(W * W * 6 * Cubes);
  for (int c = 0; c < Cubes; ++c) {
    for (int f = 0; f < 6; ++f) {
      for (int y = 0; y < W; ++y) {
        for (int x = 0; x < W; ++x) {
          texels[((c * 6 + f) * W + y) * W + x] = 1000.0f * c + 100.0f * f + 10.0f * y + x;
        }
      }
    }
  }
  const cudaChannelFormatDesc channels = cudaCreateChannelDesc<float>();
  cudaArray_t cube = nullptr;
  CHECK(cudaMalloc3DArray(&cube, &channels, make_cudaExtent(W, W, 6),
                          cudaArrayCubemap | cudaArraySurfaceLoadStore));
  cudaArray_t cubes = nullptr;
  CHECK(cudaMalloc3DArray(&cubes, &channels, make_cudaExtent(W, W, 6 * Cubes),
                          cudaArrayCubemap | cudaArrayLayered));
  cudaArray_t notSquare = nullptr;
  const cudaError_t refused =
      cudaMalloc3DArray(&notSquare, &channels, make_cudaExtent(W, W + 1, 6), cudaArrayCubemap);
  EXPECT(refused == cudaErrorInvalidValue, "a cube map of %dx%d faces: %s", W, W + 1,
         cudaGetErrorName(refused));
  cudaGetLastError();
  CHECK(copyWholeArray(cube, texels.data(), W, W, 6, cudaMemcpyHostToDevice));
  CHECK(copyWholeArray(cubes, texels.data(), W, W, 6 * Cubes, cudaMemcpyHostToDevice));
  // The host's cube-map unit: the face of the direction's largest component and its (s, t), as
  // the programming guide's table gives them, then (u, v) = ((s / m + 1) / 2, (t / m + 1) / 2)
  // across the face, clamped to its edges.
  auto texel = [&](int c, int f, int x, int y) {
    x = std::min(std::max(x, 0), W - 1);
    y = std::min(std::max(y, 0), W - 1);
    return texels[((c * 6 + f) * W + y) * W + x];
  };
  auto reference = [&](const Direction& d, bool linear) {
    const float ax = std::fabs(d.x), ay = std::fabs(d.y), az = std::fabs(d.z);
    int face;
    float m, s, t;
    if (ax >= ay && ax >= az) {
      face = d.x >= 0 ? 0 : 1;
      m = ax;
      s = d.x >= 0 ? -d.z : d.z;
      t = -d.y;
    } else if (ay >= az) {
      face = d.y >= 0 ? 2 : 3;
      m = ay;
      s = d.x;
      t = d.y >= 0 ? d.z : -d.z;
    } else {
      face = d.z >= 0 ? 4 : 5;
      m = az;
      s = d.z >= 0 ? d.x : -d.x;
      t = -d.y;
    }
    const float u = (s / m + 1.0f) * 0.5f * W, v = (t / m + 1.0f) * 0.5f * W;
    const int c = std::min(std::max(d.cube, 0), Cubes - 1);
    if (!linear) {
      return texel(c, face, static_cast<int>(std::floor(u)), static_cast<int>(std::floor(v)));
    }
    return bilinear(u, v, [&](int x, int y) { return texel(c, face, x, y); });
  };
  // Directions towards every face, at points across it (never on an edge between two faces),
  // scaled by powers of two and landing on quarter texels, so that s / m and the filter's weights
  // are exact.
  std::vector<Direction> at;
  const float across[] = {-0.875f, -0.5f, -0.125f, 0.125f, 0.625f, 0.875f};
  for (int c = -1; c <= Cubes; ++c) {  // -1 and Cubes: clamped to the first and last cube
    for (float p : across) {
      for (float q : across) {
        at.push_back({1.0f, p, q, c});
        at.push_back({-2.0f, 2 * p, 2 * q, c});
        at.push_back({p, 1.0f, q, c});
        at.push_back({0.5f * p, -0.5f, 0.5f * q, c});
        at.push_back({4 * p, 4 * q, 4.0f, c});
        at.push_back({p, q, -1.0f, c});
      }
    }
  }
  const int n = static_cast<int>(at.size());
  Direction* onDevice = nullptr;
  float* single = nullptr;
  float* layered = nullptr;
  CHECK(cudaMalloc(&onDevice, n * sizeof(Direction)));
  CHECK(cudaMalloc(&single, n * sizeof(float)));
  CHECK(cudaMalloc(&layered, n * sizeof(float)));
  CHECK(cudaMemcpy(onDevice, at.data(), n * sizeof(Direction), cudaMemcpyHostToDevice));
  for (cudaTextureFilterMode filter : {cudaFilterModePoint, cudaFilterModeLinear}) {
    const cudaResourceDesc cubeResource = arrayResource(cube);
    const cudaResourceDesc cubesResource = arrayResource(cubes);
    cudaTextureDesc description = {};
    description.filterMode = filter;
    description.readMode = cudaReadModeElementType;
    description.normalizedCoords = 1;
    cudaTextureObject_t cubeTexture = 0;
    CHECK(cudaCreateTextureObject(&cubeTexture, &cubeResource, &description, nullptr));
    cudaTextureObject_t cubesTexture = 0;
    CHECK(cudaCreateTextureObject(&cubesTexture, &cubesResource, &description, nullptr));
    fetchCubemap<<<(n + 127) / 128, 128>>>(cubeTexture, cubesTexture, onDevice, single, layered, n);
    CHECK(cudaGetLastError());
    std::vector<float> gotSingle(n), gotLayered(n);
    CHECK(cudaMemcpy(gotSingle.data(), single, n * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(gotLayered.data(), layered, n * sizeof(float), cudaMemcpyDeviceToHost));
    const bool linear = filter == cudaFilterModeLinear;
    for (int i = 0; i < n; ++i) {
      Direction first = at[i];
      first.cube = 0;
      const float wantSingle = reference(first, linear);
      const float wantLayered = reference(at[i], linear);
      EXPECT(near(gotSingle[i], wantSingle), "texCubemap %s (%g, %g, %g) = %.7g, expected %.7g",
             linear ? "linear" : "point", at[i].x, at[i].y, at[i].z, gotSingle[i], wantSingle);
      EXPECT(near(gotLayered[i], wantLayered),
             "texCubemapLayered %s (%g, %g, %g) cube %d = %.7g, expected %.7g",
             linear ? "linear" : "point", at[i].x, at[i].y, at[i].z, at[i].cube, gotLayered[i],
             wantLayered);
    }
    CHECK(cudaDestroyTextureObject(cubeTexture));
    CHECK(cudaDestroyTextureObject(cubesTexture));
  }
  // A surface over the cube map: face 3 rewritten, the others as they were.
  const cudaResourceDesc surfaceResource = arrayResource(cube);
  cudaSurfaceObject_t surface = 0;
  CHECK(cudaCreateSurfaceObject(&surface, &surfaceResource));
  markFace<<<W, W>>>(surface, W, 3);
  CHECK(cudaGetLastError());
  std::vector<float> back(W * W * 6, 0.0f);
  CHECK(copyWholeArray(cube, back.data(), W, W, 6, cudaMemcpyDeviceToHost));
  for (int f = 0; f < 6; ++f) {
    for (int y = 0; y < W; ++y) {
      for (int x = 0; x < W; ++x) {
        const float want = f == 3 ? -static_cast<float>(x + 100 * y) : texel(0, f, x, y);
        const float got = back[(f * W + y) * W + x];
        EXPECT(got == want, "cube-map surface face %d (%d, %d) = %g, expected %g", f, x, y, got,
               want);
      }
    }
  }
  CHECK(cudaDestroySurfaceObject(surface));
  CHECK(cudaFree(onDevice));
  CHECK(cudaFree(single));
  CHECK(cudaFree(layered));
  CHECK(cudaFreeArray(cube));
  CHECK(cudaFreeArray(cubes));
  std::printf("cube maps: %d directions on every face, point and bilinear, single and layered\n",
              n);
  return 0;
}

int main() {
  if (arrays() != 0) return 1;
  if (pointAndLinear() != 0) return 1;
  if (addressModes() != 0) return 1;
  if (readModes() != 0) return 1;
  if (linearMemory() != 0) return 1;
  if (pitched() != 0) return 1;
  if (volume() != 0) return 1;
  if (gather() != 0) return 1;
  if (surfaces2D() != 0) return 1;
  if (surfaces3D() != 0) return 1;
  if (surface1D() != 0) return 1;
  if (layered() != 0) return 1;
  if (cubemaps() != 0) return 1;
  if (surfaceWithoutTheFlag() != 0) return 1;
  CHECK(cudaDeviceSynchronize());
  std::printf("textures: PASSED\n");
  return 0;
}
