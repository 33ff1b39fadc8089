// The PTX conformance suite's kernels for compute capability 9.0
// (tests/programs/ptx_conformance.cpp holds the CPU reference of every slot):
//   conf_simd  the byte and half-word intrinsics (__vadd2, __vabsdiffu4, __vsads4, ...), which
//              nvcc lowers to .s16x2/.u16x2 arithmetic and vabsdiff4 here, and the PTX SIMD video
//              instructions with their operand selectors, lane masks, saturation and secondary
//              accumulate or merge;
//   conf_fp8   cuda_fp8.h's conversions between f32, f16x2 and pairs of E4M3 or E5M2 (cvt
//              .e4m3x2/.e5m2x2 from 8.9 on).

#include <cuda_fp8.h>

#include "conformance_rows.cuh"

// One video instruction, its operands (with selectors or masks) written out in `form`.
#define VIDEO(index, form)                         \
  do {                                             \
    unsigned d_;                                   \
    asm(form : "=r"(d_) : "r"(a), "r"(b), "r"(c)); \
    SLOT(index, d_);                               \
  } while (0)

extern "C" __global__ void conf_simd(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned a = static_cast<unsigned>(in[i].a);
  const unsigned b = static_cast<unsigned>(in[i].b);
  const unsigned c = static_cast<unsigned>(in[i].c);
  SLOT(0, __vabsdiffu4(a, b));
  SLOT(1, __vabsdiffs4(a, b));
  SLOT(2, __vsadu4(a, b));
  SLOT(3, __vsads4(a, b));
  SLOT(4, __vabsdiffu2(a, b));
  SLOT(5, __vabsdiffs2(a, b));
  SLOT(6, __vsadu2(a, b));
  SLOT(7, __vsads2(a, b));
  SLOT(8, __vadd2(a, b));
  SLOT(9, __vaddss2(a, b));
  SLOT(10, __vaddus2(a, b));
  SLOT(11, __vsub2(a, b));
  SLOT(12, __vsubss2(a, b));
  SLOT(13, __vsubus2(a, b));
  SLOT(14, __vmins2(a, b));
  SLOT(15, __vminu2(a, b));
  SLOT(16, __vmaxs2(a, b));
  SLOT(17, __vmaxu2(a, b));
  SLOT(18, __vavgs2(a, b));
  SLOT(19, __vavgu2(a, b));
  SLOT(20, __vhaddu2(a, b));
  SLOT(21, __vadd4(a, b));
  SLOT(22, __vaddss4(a, b));
  SLOT(23, __vaddus4(a, b));
  SLOT(24, __vsub4(a, b));
  SLOT(25, __vsubus4(a, b));
  SLOT(26, __vmins4(a, b));
  SLOT(27, __vmaxu4(a, b));
  SLOT(28, __vavgu4(a, b));
  SLOT(29, __vcmpgtu4(a, b));
  SLOT(30, __vcmpges2(a, b));
  SLOT(31, __vseteq4(a, b));
  SLOT(32, __vneg2(a));
  SLOT(33, __vabsss4(a));
  // The video instructions as inline PTX, forms nvcc does not emit by itself.
  VIDEO(34, "vadd4.u32.u32.u32.sat %0, %1, %2, %3;");
  VIDEO(35, "vsub4.s32.s32.s32.sat %0.b20, %1.b3210, %2.b7654, %3;");
  VIDEO(36, "vabsdiff4.u32.u32.u32.add %0, %1, %2, %3;");
  VIDEO(37, "vavrg4.s32.s32.s32 %0, %1.b0123, %2.b4444, %3;");
  VIDEO(38, "vmin2.s32.s32.s32.add %0, %1, %2, %3;");
  VIDEO(39, "vmax2.u32.u32.u32 %0.h1, %1.h01, %2.h23, %3;");
  VIDEO(40, "vset4.u32.u32.lt %0, %1, %2, %3;");
  VIDEO(41, "vset2.s32.s32.ge.add %0, %1, %2, %3;");
  VIDEO(42, "vavrg2.u32.u32.u32 %0, %1, %2, %3;");
  VIDEO(43, "vadd2.s32.s32.u32.sat %0, %1, %2, %3;");
  VIDEO(44, "vset4.s32.u32.ne %0.b31, %1, %2.b3210, %3;");
  VIDEO(45, "vabsdiff2.s32.s32.s32.sat %0, %1.h32, %2.h10, %3;");
  VIDEO(46, "vmax4.s32.s32.s32.add %0.b310, %1, %2, %3;");
  // Half-word arithmetic with .relu (compute capability 9.0).
  VIDEO(47, "max.relu.s16x2 %0, %1, %2;");
  VIDEO(48, "min.relu.s32 %0, %1, %2;");
}

extern "C" __global__ void conf_fp8(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const float2 floats = make_float2(__uint_as_float(static_cast<unsigned>(in[i].a)),
                                    __uint_as_float(static_cast<unsigned>(in[i].b)));
  __half2_raw halves;
  halves.x = static_cast<unsigned short>(in[i].c);
  halves.y = static_cast<unsigned short>(in[i].c >> 16);
  const auto pair = static_cast<__nv_fp8x2_storage_t>(in[i].c);
  SLOT(0, __nv_cvt_float2_to_fp8x2(floats, __NV_SATFINITE, __NV_E4M3));
  SLOT(1, __nv_cvt_float2_to_fp8x2(floats, __NV_SATFINITE, __NV_E5M2));
  SLOT(2, __nv_cvt_halfraw2_to_fp8x2(halves, __NV_SATFINITE, __NV_E4M3));
  SLOT(3, __nv_cvt_halfraw2_to_fp8x2(halves, __NV_SATFINITE, __NV_E5M2));
  const __half2_raw fromE4m3 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
  const __half2_raw fromE5m2 = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E5M2);
  SLOT(4, fromE4m3.x | static_cast<unsigned>(fromE4m3.y) << 16);
  SLOT(5, fromE5m2.x | static_cast<unsigned>(fromE5m2.y) << 16);
  // .relu: negative values become zero.
  unsigned short relu;
  asm("cvt.rn.satfinite.relu.e4m3x2.f32 %0, %1, %2;" : "=h"(relu) : "f"(floats.y), "f"(floats.x));
  SLOT(6, relu);
}
