// The PTX conformance suite's kernels: one per class of instructions, each thread computing a row
// of results from one row of inputs (In). tests/programs/ptx_conformance.cpp holds the CPU
// reference of every slot and compares. Built twice: optimised, and with -G, whose PTX calls
// a function for nearly everything and keeps every value in local memory.
//
// Results that C++ leaves undefined but a GPU defines (INT_MIN / -1, shifts by the width or more)
// are written with inline PTX, so the compiler cannot assume them away.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "conformance_rows.cuh"

#define FBITS(x) static_cast<unsigned long long>(__float_as_uint(x))
#define DBITS(x) static_cast<unsigned long long>(__double_as_longlong(x))

__device__ __forceinline__ unsigned shlAsm(unsigned a, unsigned b) {
  unsigned d;
  asm("shl.b32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned shrUAsm(unsigned a, unsigned b) {
  unsigned d;
  asm("shr.u32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ int shrSAsm(int a, unsigned b) {
  int d;
  asm("shr.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ int divAsm(int a, int b) {
  int d;
  asm("div.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ int remAsm(int a, int b) {
  int d;
  asm("rem.s32 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

extern "C" __global__ void conf_int32(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned ua = static_cast<unsigned>(in[i].a);
  const unsigned ub = static_cast<unsigned>(in[i].b);
  const unsigned uc = static_cast<unsigned>(in[i].c);
  const int a = static_cast<int>(ua);
  const int b = static_cast<int>(ub);
  const int c = static_cast<int>(uc);
  SLOT(0, ua + ub);
  SLOT(1, ua - ub);
  SLOT(2, ua * ub);
  SLOT(3, static_cast<unsigned>(__mulhi(a, b)));
  SLOT(4, __umulhi(ua, ub));
  if (b != 0) {
    SLOT(5, static_cast<unsigned>(divAsm(a, b)));
    SLOT(6, static_cast<unsigned>(remAsm(a, b)));
    SLOT(7, ua / ub);
    SLOT(8, ua % ub);
  }
  SLOT(9, static_cast<unsigned>(min(a, b)));
  SLOT(10, static_cast<unsigned>(max(a, b)));
  SLOT(11, umin(ua, ub));
  SLOT(12, umax(ua, ub));
  int absolute;
  asm("abs.s32 %0, %1;" : "=r"(absolute) : "r"(a));
  SLOT(13, static_cast<unsigned>(absolute));
  SLOT(14, 0u - ua);
  SLOT(15, ~ua);
  SLOT(16, ua & ub);
  SLOT(17, ua | ub);
  SLOT(18, ua ^ ub);
  SLOT(19, ua << (ub & 31));
  SLOT(20, shlAsm(ua, ub));
  SLOT(21, shrUAsm(ua, ub));
  SLOT(22, static_cast<unsigned>(shrSAsm(a, ub)));
  SLOT(23, __popc(ua));
  SLOT(24, __clz(a));
  SLOT(25, __ffs(a));
  SLOT(26, __brev(ua));
  SLOT(27, __byte_perm(ua, ub, uc));
  SLOT(28, __funnelshift_l(ua, ub, uc));
  SLOT(29, __funnelshift_r(ua, ub, uc));
  SLOT(30, __funnelshift_lc(ua, ub, uc));
  SLOT(31, __sad(a, b, uc));
  SLOT(32, static_cast<unsigned>(__mul24(a, b)));
  SLOT(33, __umul24(ua, ub));
  SLOT(34, static_cast<unsigned>(__dp4a(a, b, c)));
  unsigned field;
  asm("bfe.u32 %0, %1, %2, %3;" : "=r"(field) : "r"(ua), "r"(ub), "r"(uc));
  SLOT(35, field);
  int signedField;
  asm("bfe.s32 %0, %1, %2, %3;" : "=r"(signedField) : "r"(a), "r"(ub), "r"(uc));
  SLOT(36, static_cast<unsigned>(signedField));
  unsigned inserted;
  asm("bfi.b32 %0, %1, %2, %3, %4;" : "=r"(inserted) : "r"(ua), "r"(ub), "r"(uc & 63), "r"(uc >> 8));
  SLOT(37, inserted);
  SLOT(38, static_cast<unsigned>(__hadd(a, b)));
  SLOT(39, static_cast<unsigned>(__rhadd(a, b)));
  SLOT(40, (ua & ub) ^ (~uc | ua));
  SLOT(41, ua * ub + uc);
  const unsigned compares = (a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 |
                            (a == b) << 4 | (a != b) << 5 | (ua < ub) << 6 | (ua <= ub) << 7 |
                            (ua > ub) << 8 | (ua >= ub) << 9;
  SLOT(42, compares);
  SLOT(43, static_cast<unsigned>(a > b ? c : a));
  SLOT(44, static_cast<unsigned long long>(static_cast<long long>(a) * b));
  SLOT(45, static_cast<unsigned long long>(ua) * ub);
  int saturated;
  asm("add.sat.s32 %0, %1, %2;" : "=r"(saturated) : "r"(a), "r"(b));
  SLOT(46, static_cast<unsigned>(saturated));
  asm("sub.sat.s32 %0, %1, %2;" : "=r"(saturated) : "r"(a), "r"(b));
  SLOT(47, static_cast<unsigned>(saturated));
  unsigned found;
  asm("bfind.s32 %0, %1;" : "=r"(found) : "r"(a));
  SLOT(48, found);
  asm("bfind.shiftamt.u32 %0, %1;" : "=r"(found) : "r"(ua));
  SLOT(49, found);
  SLOT(50, static_cast<unsigned>(static_cast<int>(static_cast<signed char>(a))));
  SLOT(51, static_cast<unsigned>(static_cast<int>(static_cast<short>(a))));
  SLOT(52, static_cast<unsigned>(static_cast<unsigned char>(a)));
  unsigned notted;
  asm("cnot.b32 %0, %1;" : "=r"(notted) : "r"(ua));
  SLOT(53, notted);
  SLOT(54, __usad(ua, ub, uc));
  unsigned mulhiWide;
  asm("mul24.hi.u32 %0, %1, %2;" : "=r"(mulhiWide) : "r"(ua), "r"(ub));
  SLOT(55, mulhiWide);
  unsigned long long carry;
  asm("{\n\t.reg .u32 lo, hi;\n\t"
      "add.cc.u32 lo, %1, %2;\n\t"
      "addc.u32 hi, 0, 0;\n\t"
      "mov.b64 %0, {lo, hi};\n\t}"
      : "=l"(carry)
      : "r"(ua), "r"(ub));
  SLOT(56, carry);
  unsigned long long borrow;
  asm("{\n\t.reg .u32 lo, hi;\n\t"
      "sub.cc.u32 lo, %1, %2;\n\t"
      "subc.u32 hi, 0, 0;\n\t"
      "mov.b64 %0, {lo, hi};\n\t}"
      : "=l"(borrow)
      : "r"(ua), "r"(ub));
  SLOT(57, borrow);
  unsigned lop;
  asm("lop3.b32 %0, %1, %2, %3, 0x96;" : "=r"(lop) : "r"(ua), "r"(ub), "r"(uc));
  SLOT(58, lop);
  unsigned prmt;
  asm("prmt.b32.f4e %0, %1, %2, %3;" : "=r"(prmt) : "r"(ua), "r"(ub), "r"(uc));
  SLOT(59, prmt);
  asm("prmt.b32.ecl %0, %1, %2, %3;" : "=r"(prmt) : "r"(ua), "r"(ub), "r"(uc));
  SLOT(60, prmt);
  asm("prmt.b32.rc16 %0, %1, %2, %3;" : "=r"(prmt) : "r"(ua), "r"(ub), "r"(uc));
  SLOT(61, prmt);
}

__device__ __forceinline__ unsigned long long shl64Asm(unsigned long long a, unsigned b) {
  unsigned long long d;
  asm("shl.b64 %0, %1, %2;" : "=l"(d) : "l"(a), "r"(b));
  return d;
}
__device__ __forceinline__ long long shr64Asm(long long a, unsigned b) {
  long long d;
  asm("shr.s64 %0, %1, %2;" : "=l"(d) : "l"(a), "r"(b));
  return d;
}
__device__ __forceinline__ long long div64Asm(long long a, long long b) {
  long long d;
  asm("div.s64 %0, %1, %2;" : "=l"(d) : "l"(a), "l"(b));
  return d;
}
__device__ __forceinline__ long long rem64Asm(long long a, long long b) {
  long long d;
  asm("rem.s64 %0, %1, %2;" : "=l"(d) : "l"(a), "l"(b));
  return d;
}

extern "C" __global__ void conf_int64(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned long long ua = in[i].a;
  const unsigned long long ub = in[i].b;
  const long long a = static_cast<long long>(ua);
  const long long b = static_cast<long long>(ub);
  SLOT(0, ua + ub);
  SLOT(1, ua - ub);
  SLOT(2, ua * ub);
  SLOT(3, static_cast<unsigned long long>(__mul64hi(a, b)));
  SLOT(4, __umul64hi(ua, ub));
  if (b != 0) {
    SLOT(5, static_cast<unsigned long long>(div64Asm(a, b)));
    SLOT(6, static_cast<unsigned long long>(rem64Asm(a, b)));
    SLOT(7, ua / ub);
    SLOT(8, ua % ub);
  }
  SLOT(9, static_cast<unsigned long long>(min(a, b)));
  SLOT(10, static_cast<unsigned long long>(max(a, b)));
  SLOT(11, ullmin(ua, ub));
  SLOT(12, ullmax(ua, ub));
  SLOT(13, static_cast<unsigned long long>(llabs(a)));
  SLOT(14, shl64Asm(ua, static_cast<unsigned>(ub)));
  SLOT(15, static_cast<unsigned long long>(shr64Asm(a, static_cast<unsigned>(ub))));
  SLOT(16, __popcll(ua));
  SLOT(17, __clzll(a));
  SLOT(18, __ffsll(a));
  SLOT(19, __brevll(ua));
  SLOT(20, (a < b) | (a == b) << 1 | (ua < ub) << 2 | (ua >= ub) << 3);
  SLOT(21, static_cast<unsigned long long>(static_cast<long long>(static_cast<int>(a))));
  SLOT(22, static_cast<unsigned long long>(static_cast<unsigned>(ua)));
  SLOT(23, ua * 3 + ub);
  SLOT(24, ua >> (ub & 63));
  SLOT(25, static_cast<unsigned long long>(a >> (ub & 63)));
}

// Float inputs are bit patterns: in.a, in.b and in.c as floats (low 32 bits) or doubles.
extern "C" __global__ void conf_f32(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const float a = __uint_as_float(static_cast<unsigned>(in[i].a));
  const float b = __uint_as_float(static_cast<unsigned>(in[i].b));
  const float c = __uint_as_float(static_cast<unsigned>(in[i].c));
  SLOT(0, FBITS(__fadd_rn(a, b)));
  SLOT(1, FBITS(__fsub_rn(a, b)));
  SLOT(2, FBITS(__fmul_rn(a, b)));
  SLOT(3, FBITS(__fdiv_rn(a, b)));
  SLOT(4, FBITS(__fadd_rz(a, b)));
  SLOT(5, FBITS(__fadd_rd(a, b)));
  SLOT(6, FBITS(__fadd_ru(a, b)));
  SLOT(7, FBITS(__fmul_rz(a, b)));
  SLOT(8, FBITS(__fmul_rd(a, b)));
  SLOT(9, FBITS(__fmul_ru(a, b)));
  SLOT(10, FBITS(__fmaf_rn(a, b, c)));
  SLOT(11, FBITS(__fmaf_rz(a, b, c)));
  SLOT(12, FBITS(__fmaf_rd(a, b, c)));
  SLOT(13, FBITS(__fmaf_ru(a, b, c)));
  SLOT(14, FBITS(__fdiv_rz(a, b)));
  SLOT(15, FBITS(__fdiv_ru(a, b)));
  SLOT(16, FBITS(__fsqrt_rn(a)));
  SLOT(17, FBITS(__fsqrt_rz(a)));
  SLOT(18, FBITS(__frcp_rn(a)));
  SLOT(19, FBITS(__frcp_rd(a)));
  SLOT(20, FBITS(fminf(a, b)));
  SLOT(21, FBITS(fmaxf(a, b)));
  SLOT(22, FBITS(fabsf(a)));
  SLOT(23, FBITS(-a));
  SLOT(24, FBITS(copysignf(a, b)));
  SLOT(25, FBITS(floorf(a)));
  SLOT(26, FBITS(ceilf(a)));
  SLOT(27, FBITS(truncf(a)));
  SLOT(28, FBITS(rintf(a)));
  SLOT(29, FBITS(__saturatef(a)));
  const unsigned compares = (a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 |
                            (a == b) << 4 | (a != b) << 5 | isnan(a) << 6 | isinf(a) << 7 |
                            isfinite(a) << 8 | !(a < b) << 9 | !(a >= b) << 10;
  SLOT(30, compares);
  float ftz;
  asm("add.ftz.f32 %0, %1, %2;" : "=f"(ftz) : "f"(a), "f"(b));
  SLOT(31, FBITS(ftz));
  asm("mul.ftz.sat.f32 %0, %1, %2;" : "=f"(ftz) : "f"(a), "f"(b));
  SLOT(32, FBITS(ftz));
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(ftz) : "f"(a), "f"(b));
  SLOT(33, FBITS(ftz));
  SLOT(34, FBITS(__fmaf_ieee_rn(a, b, c)));
  SLOT(35, FBITS(roundf(a)));
  SLOT(36, FBITS(fdimf(a, b)));
  SLOT(37, FBITS(fmodf(a, b)));
  SLOT(38, FBITS(ldexpf(a, static_cast<int>(in[i].c & 63) - 32)));
  SLOT(39, static_cast<unsigned>(signbit(a)));
  // Approximate functions: within the bounds the PTX ISA gives, compared with a tolerance.
  SLOT(40, FBITS(__fdividef(a, b)));
  SLOT(41, FBITS(__sinf(a)));
  SLOT(42, FBITS(__cosf(a)));
  SLOT(43, FBITS(__expf(a)));
  SLOT(44, FBITS(__log2f(a)));
  SLOT(45, FBITS(rsqrtf(a)));
  SLOT(46, FBITS(__frsqrt_rn(a)));
  float tanhApprox;
  asm("tanh.approx.f32 %0, %1;" : "=f"(tanhApprox) : "f"(a));
  SLOT(47, FBITS(tanhApprox));
  // Full-precision library functions (libdevice, inlined as PTX): within a few ulp.
  SLOT(48, FBITS(sinf(a)));
  SLOT(49, FBITS(expf(a)));
  SLOT(50, FBITS(logf(a)));
  SLOT(51, FBITS(powf(a, b)));
  SLOT(52, FBITS(tanhf(a)));
  SLOT(53, FBITS(atan2f(a, b)));
  SLOT(54, FBITS(sqrtf(a)));
  SLOT(55, FBITS(a / b));
  SLOT(56, FBITS(cbrtf(a)));
  SLOT(57, FBITS(erff(a)));
}

extern "C" __global__ void conf_f64(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const double a = __longlong_as_double(static_cast<long long>(in[i].a));
  const double b = __longlong_as_double(static_cast<long long>(in[i].b));
  const double c = __longlong_as_double(static_cast<long long>(in[i].c));
  SLOT(0, DBITS(__dadd_rn(a, b)));
  SLOT(1, DBITS(__dsub_rn(a, b)));
  SLOT(2, DBITS(__dmul_rn(a, b)));
  SLOT(3, DBITS(__ddiv_rn(a, b)));
  SLOT(4, DBITS(__dadd_rz(a, b)));
  SLOT(5, DBITS(__dadd_rd(a, b)));
  SLOT(6, DBITS(__dadd_ru(a, b)));
  SLOT(7, DBITS(__dmul_rz(a, b)));
  SLOT(8, DBITS(__fma_rn(a, b, c)));
  SLOT(9, DBITS(__fma_rz(a, b, c)));
  SLOT(10, DBITS(__ddiv_rz(a, b)));
  SLOT(11, DBITS(__dsqrt_rn(a)));
  SLOT(12, DBITS(__dsqrt_ru(a)));
  SLOT(13, DBITS(__drcp_rn(a)));
  SLOT(14, DBITS(fmin(a, b)));
  SLOT(15, DBITS(fmax(a, b)));
  SLOT(16, DBITS(fabs(a)));
  SLOT(17, DBITS(-a));
  SLOT(18, DBITS(floor(a)));
  SLOT(19, DBITS(ceil(a)));
  SLOT(20, DBITS(trunc(a)));
  SLOT(21, DBITS(rint(a)));
  const unsigned compares = (a < b) | (a <= b) << 1 | (a > b) << 2 | (a >= b) << 3 |
                            (a == b) << 4 | (a != b) << 5 | isnan(a) << 6 | isinf(a) << 7;
  SLOT(22, compares);
  SLOT(23, DBITS(__fma_rd(a, b, c)));
  SLOT(24, DBITS(copysign(a, b)));
  SLOT(25, DBITS(sqrt(a)));
  SLOT(26, DBITS(a / b));
  SLOT(27, DBITS(exp(a)));
  SLOT(28, DBITS(log(a)));
  SLOT(29, DBITS(sin(a)));
  SLOT(30, DBITS(pow(a, b)));
}

extern "C" __global__ void conf_convert(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const float f = __uint_as_float(static_cast<unsigned>(in[i].a));
  const double d = __longlong_as_double(static_cast<long long>(in[i].b));
  const long long l = static_cast<long long>(in[i].c);
  const int k = static_cast<int>(in[i].c);
  SLOT(0, static_cast<unsigned>(__float2int_rn(f)));
  SLOT(1, static_cast<unsigned>(__float2int_rz(f)));
  SLOT(2, static_cast<unsigned>(__float2int_rd(f)));
  SLOT(3, static_cast<unsigned>(__float2int_ru(f)));
  SLOT(4, __float2uint_rz(f));
  SLOT(5, static_cast<unsigned long long>(__float2ll_rz(f)));
  SLOT(6, __float2ull_rn(f));
  SLOT(7, static_cast<unsigned>(__double2int_rz(d)));
  SLOT(8, static_cast<unsigned long long>(__double2ll_rn(d)));
  SLOT(9, __double2uint_ru(d));
  SLOT(10, FBITS(__int2float_rn(k)));
  SLOT(11, FBITS(__int2float_rz(k)));
  SLOT(12, FBITS(__int2float_rd(k)));
  SLOT(13, FBITS(__int2float_ru(k)));
  SLOT(14, FBITS(__uint2float_rn(static_cast<unsigned>(k))));
  SLOT(15, FBITS(__ll2float_rn(l)));
  SLOT(16, FBITS(__ull2float_rz(static_cast<unsigned long long>(l))));
  SLOT(17, DBITS(__ll2double_rn(l)));
  SLOT(18, DBITS(__ll2double_rd(l)));
  SLOT(19, DBITS(__int2double_rn(k)));
  SLOT(20, FBITS(__double2float_rn(d)));
  SLOT(21, FBITS(__double2float_rz(d)));
  SLOT(22, FBITS(__double2float_rd(d)));
  SLOT(23, FBITS(__double2float_ru(d)));
  SLOT(24, DBITS(static_cast<double>(f)));
  SLOT(25, __half_as_ushort(__float2half_rn(f)));
  SLOT(26, __half_as_ushort(__float2half_rz(f)));
  SLOT(27, __half_as_ushort(__float2half_rd(f)));
  SLOT(28, __half_as_ushort(__float2half_ru(f)));
  SLOT(29, FBITS(__half2float(__ushort_as_half(static_cast<unsigned short>(in[i].c)))));
  SLOT(30, __bfloat16_as_ushort(__float2bfloat16_rn(f)));
  SLOT(31, __bfloat16_as_ushort(__float2bfloat16_rz(f)));
  SLOT(32, FBITS(__bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(in[i].c)))));
  SLOT(33, __half_as_ushort(__double2half(d)));
  SLOT(34, __half_as_ushort(__int2half_rn(k)));
  const __half2 pair = __floats2half2_rn(f, static_cast<float>(d));
  SLOT(35, *reinterpret_cast<const unsigned*>(&pair));
  SLOT(36, static_cast<unsigned>(static_cast<int>(f)));
  SLOT(37, static_cast<unsigned>(static_cast<unsigned char>(k)));
  SLOT(38, static_cast<unsigned long long>(static_cast<long long>(static_cast<short>(k))));
  float rounded;
  asm("cvt.rni.f32.f32 %0, %1;" : "=f"(rounded) : "f"(f));
  SLOT(39, FBITS(rounded));
  int saturated;
  asm("cvt.sat.s8.s32 %0, %1;" : "=r"(saturated) : "r"(k));
  SLOT(40, static_cast<unsigned>(saturated));
  unsigned short halfRelu;
  asm("cvt.rn.relu.f16.f32 %0, %1;" : "=h"(halfRelu) : "f"(f));
  SLOT(41, halfRelu);
  SLOT(42, __half_as_ushort(__ushort2half_rn(static_cast<unsigned short>(k))));
}

extern "C" __global__ void conf_half(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const __half a = __ushort_as_half(static_cast<unsigned short>(in[i].a));
  const __half b = __ushort_as_half(static_cast<unsigned short>(in[i].b));
  const __half c = __ushort_as_half(static_cast<unsigned short>(in[i].c));
  SLOT(0, __half_as_ushort(__hadd(a, b)));
  SLOT(1, __half_as_ushort(__hsub(a, b)));
  SLOT(2, __half_as_ushort(__hmul(a, b)));
  SLOT(3, __half_as_ushort(__hfma(a, b, c)));
  SLOT(4, __half_as_ushort(__hneg(a)));
  SLOT(5, __half_as_ushort(__habs(a)));
  SLOT(6, __half_as_ushort(__hmin(a, b)));
  SLOT(7, __half_as_ushort(__hmax(a, b)));
  SLOT(8, __hlt(a, b) | __hle(a, b) << 1 | __hgt(a, b) << 2 | __heq(a, b) << 3 |
              __hne(a, b) << 4 | __hisnan(a) << 5 | __hltu(a, b) << 6);
  SLOT(9, __half_as_ushort(__hadd_sat(a, b)));
  SLOT(10, __half_as_ushort(__hfma_relu(a, b, c)));
  const __half2 x = __halves2half2(a, b);
  const __half2 y = __halves2half2(b, c);
  const __half2 sum = __hadd2(x, y);
  const __half2 product = __hmul2(x, y);
  const __half2 fused = __hfma2(x, y, x);
  SLOT(11, *reinterpret_cast<const unsigned*>(&sum));
  SLOT(12, *reinterpret_cast<const unsigned*>(&product));
  SLOT(13, *reinterpret_cast<const unsigned*>(&fused));
  SLOT(14, __hblt2(x, y) | __hbeq2(x, y) << 1);
  const __nv_bfloat16 p = __ushort_as_bfloat16(static_cast<unsigned short>(in[i].a));
  const __nv_bfloat16 q = __ushort_as_bfloat16(static_cast<unsigned short>(in[i].b));
  SLOT(15, __bfloat16_as_ushort(__hadd(p, q)));
  SLOT(16, __bfloat16_as_ushort(__hmul(p, q)));
  SLOT(17, __half_as_ushort(hsqrt(a)));
}

// ---- Warps --------------------------------------------------------------------------------

// Each thread writes kSlots results about its warp's exchanges; in.a is a per-thread value.
extern "C" __global__ void conf_warp(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned lane = threadIdx.x % 32;
  const unsigned v = static_cast<unsigned>(in[i].a);
  const unsigned full = 0xffffffffu;
  SLOT(0, __shfl_sync(full, v, 7));
  SLOT(1, __shfl_sync(full, v, static_cast<int>(31 - lane)));
  SLOT(2, __shfl_up_sync(full, v, 3));
  SLOT(3, __shfl_down_sync(full, v, 5));
  SLOT(4, __shfl_xor_sync(full, v, 6));
  SLOT(5, __shfl_sync(full, v, 2, 8));
  SLOT(6, __shfl_up_sync(full, v, 1, 16));
  SLOT(7, __shfl_down_sync(full, v, 3, 8));
  SLOT(8, __shfl_xor_sync(full, v, 1, 4));
  SLOT(9, __ballot_sync(full, v & 1));
  SLOT(10, __any_sync(full, v == 5));
  SLOT(11, __all_sync(full, v != 0));
  SLOT(12, __match_any_sync(full, v & 3));
  int pred = 0;
  SLOT(13, __match_all_sync(full, v / 1000, &pred));
  SLOT(14, pred);
  // Diverged halves exchange within themselves, with partial member masks.
  if (lane < 16) {
    SLOT(15, __shfl_sync(0x0000ffffu, v, static_cast<int>(15 - lane)));
    SLOT(16, __ballot_sync(0x0000ffffu, v & 2));
    SLOT(17, __activemask());
  } else {
    SLOT(15, __shfl_down_sync(0xffff0000u, v, 1));
    SLOT(16, __ballot_sync(0xffff0000u, v & 4));
    SLOT(17, __activemask());
  }
  // Odd lanes only.
  if (lane & 1) {
    SLOT(18, __shfl_xor_sync(0xaaaaaaaau, v, 2));
    SLOT(19, __popc(__activemask()));
  }
  __syncwarp();
  // A value published to shared memory by one lane, read after __syncwarp by the others.
  __shared__ unsigned published[32];
  if (lane == 0) published[threadIdx.x / 32] = v * 3;
  __syncwarp();
  SLOT(20, published[threadIdx.x / 32]);
  // A loop of different trip counts per lane, then everyone meets again.
  unsigned total = 0;
  for (unsigned k = 0; k < (v & 7); ++k) total += k * lane;
  SLOT(21, total);
  SLOT(22, __activemask());
  unsigned laneid;
  asm("mov.u32 %0, %%laneid;" : "=r"(laneid));
  SLOT(23, laneid);
  unsigned lt;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(lt));
  SLOT(24, lt);
}

// ---- Blocks: barriers and shared memory ----------------------------------------------------

// One block of blockDim.x threads per launch row; in.a a per-thread value.
extern "C" __global__ void conf_block(const In* in, unsigned long long* results, int n) {
  extern __shared__ unsigned dynamic[];
  __shared__ unsigned long long sum[1024];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned t = threadIdx.x;
  const unsigned v = i < n ? static_cast<unsigned>(in[i].a) : 0;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  // A tree reduction through static shared memory.
  sum[t] = v;
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) sum[t] += sum[t + stride];
    __syncthreads();
  }
  const unsigned long long total = sum[0];
  // Dynamic shared memory: reversed through it.
  dynamic[t] = v;
  __syncthreads();
  const unsigned reversed = dynamic[blockDim.x - 1 - t];
  const int count = __syncthreads_count(v & 1);
  const int all = __syncthreads_and(v != 0);
  const int any = __syncthreads_or(v == 7);
  // A named barrier for the first two warps only.
  unsigned early = 0;
  if (t < 64) {
    __shared__ unsigned flag;
    if (t == 0) flag = 1234;
    asm volatile("bar.sync 1, 64;");
    early = flag;
  }
  if (i >= n) return;
  SLOT(0, total);
  SLOT(1, reversed);
  SLOT(2, count);
  SLOT(3, all);
  SLOT(4, any);
  SLOT(5, early);
  SLOT(6, threadIdx.x + 1000 * blockIdx.x);
  unsigned warp;
  asm("mov.u32 %0, %%warpid;" : "=r"(warp));
  SLOT(7, warp < 32);
  unsigned dynamicBytes;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamicBytes));
  SLOT(8, dynamicBytes);
}

// Threads that return early still let the others pass later barriers.
extern "C" __global__ void conf_early_exit(const In* in, unsigned long long* results, int n) {
  __shared__ unsigned values[1024];
  const unsigned t = threadIdx.x;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n || (in[i].a & 1) != 0) return;
  values[t] = static_cast<unsigned>(in[i].a);
  __syncthreads();
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  unsigned seen = 0;
  for (unsigned k = 0; k < blockDim.x; ++k) seen += (values[k] == static_cast<unsigned>(in[blockIdx.x * blockDim.x + k].a) && (in[blockIdx.x * blockDim.x + k].a & 1) == 0);
  SLOT(0, seen);
}

// 2-D and 3-D blocks and grids: every thread writes its indices.
extern "C" __global__ void conf_indices(const In*, unsigned long long* results, int n) {
  const unsigned threadsPerBlock = blockDim.x * blockDim.y * blockDim.z;
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int i = static_cast<int>(block * threadsPerBlock + thread);
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  SLOT(0, threadIdx.x | threadIdx.y << 10 | static_cast<unsigned long long>(threadIdx.z) << 20);
  SLOT(1, blockIdx.x | blockIdx.y << 10 | static_cast<unsigned long long>(blockIdx.z) << 20);
  SLOT(2, blockDim.x | blockDim.y << 10 | static_cast<unsigned long long>(blockDim.z) << 20);
  SLOT(3, gridDim.x | gridDim.y << 10 | static_cast<unsigned long long>(gridDim.z) << 20);
}

// ---- Atomics ------------------------------------------------------------------------------

// counters[0..15]: updated by every thread; results: the old values some atomics returned.
extern "C" __global__ void conf_atomic(const In* in, unsigned long long* results, int n,
                                       unsigned long long* counters) {
  __shared__ unsigned sharedCount;
  __shared__ int sharedMax;
  __shared__ float sharedSum;
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0) {
    sharedCount = 0;
    sharedMax = -2147483647 - 1;
    sharedSum = 0;
  }
  __syncthreads();
  if (i < n) {
    unsigned long long* out = results + static_cast<long long>(i) * kSlots;
    const unsigned v = static_cast<unsigned>(in[i].a);
    unsigned* words = reinterpret_cast<unsigned*>(counters);
    SLOT(0, atomicAdd(&words[0], 1u));  // a ticket: every value 0..n-1 once
    atomicAdd(&words[1], v);
    atomicMin(reinterpret_cast<int*>(&words[2]), static_cast<int>(v));
    atomicMax(&words[3], v);
    atomicAnd(&words[4], v | 0xf0f0f0f0u);
    atomicOr(&words[5], v & 0x01010101u);
    atomicXor(&words[6], v);
    atomicInc(&words[7], 9u);
    atomicDec(&words[8], 9u);
    atomicAdd(reinterpret_cast<float*>(&words[9]), static_cast<float>(v & 0xff));
    atomicAdd(&counters[5], static_cast<unsigned long long>(v) << 20);
    atomicAdd(reinterpret_cast<double*>(&counters[6]), static_cast<double>(v & 0xffff));
    atomicMax(reinterpret_cast<long long*>(&counters[7]), static_cast<long long>(v) - 100000);
    // A lock-free maximum through compare-and-swap.
    unsigned old = words[16];
    for (;;) {
      const unsigned seen = atomicCAS(&words[16], old, max(old, v));
      if (seen == old) break;
      old = seen;
    }
    SLOT(1, atomicExch(&words[17], v) != 0xffffffffu);
    SLOT(2, atomicAdd(&sharedCount, 1u) < blockDim.x);
    atomicMax(&sharedMax, static_cast<int>(v));
    atomicAdd(&sharedSum, 1.0f);
    unsigned long long expected = 0;
    atomicCAS(&counters[9], expected, 77ull);
  }
  __syncthreads();
  if (i < n) {
    unsigned long long* out = results + static_cast<long long>(i) * kSlots;
    SLOT(3, sharedCount);
    SLOT(4, static_cast<unsigned>(sharedMax));
    SLOT(5, FBITS(sharedSum));
  }
}

// ---- Memory spaces --------------------------------------------------------------------------

__constant__ int kTable[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
__constant__ double kCoefficients[4] = {0.5, -1.25, 2.0, 1e-3};
__device__ int gCounter = 41;
__device__ unsigned long long gWords[4] = {1ull, 2ull << 40, 3ull, 0xffffffffffffffffull};
__device__ const char gMessage[] = "constant bytes";

struct Pair {
  int first;
  double second;
  char tag[3];
};

__device__ __noinline__ unsigned sumThrough(const unsigned* values, int count) {
  unsigned total = 0;
  for (int k = 0; k < count; ++k) total += values[k];
  return total;
}

extern "C" __global__ void conf_memory(const In* in, unsigned long long* results, int n, Pair pair,
                                       const float4* vectors, short2* narrow) {
  __shared__ unsigned tile[64];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned v = static_cast<unsigned>(in[i].a);
  // A local array indexed by data: local memory.
  unsigned local[16];
  for (int k = 0; k < 16; ++k) local[k] = v * k + 1;
  SLOT(0, local[v & 15]);
  SLOT(1, kTable[v & 15]);
  SLOT(2, DBITS(kCoefficients[v & 3] * 2.0));
  SLOT(3, gCounter);
  SLOT(4, gWords[v & 3]);
  SLOT(5, gMessage[v % 14]);
  SLOT(6, pair.first);
  SLOT(7, DBITS(pair.second));
  SLOT(8, pair.tag[v % 3]);
  const float4 vector = vectors[i];
  SLOT(9, FBITS(vector.x + vector.y * 2 + vector.z * 4 + vector.w * 8));
  const short2 s = narrow[i];
  SLOT(10, static_cast<unsigned>(static_cast<int>(s.x)));
  SLOT(11, static_cast<unsigned>(static_cast<int>(s.y)));
  narrow[i] = make_short2(static_cast<short>(-s.y), static_cast<short>(s.x));
  // Shared memory reached through a generic pointer, in a function of its own.
  tile[threadIdx.x % 64] = v;
  __syncthreads();
  SLOT(12, sumThrough(&tile[(threadIdx.x / 8) * 8], 8));
  SLOT(13, sumThrough(local, 4));
  unsigned char bytes[8];
  for (int k = 0; k < 8; ++k) bytes[k] = static_cast<unsigned char>(v >> (k * 4));
  SLOT(14, bytes[(v >> 3) & 7]);
  volatile unsigned* through = &tile[threadIdx.x % 64];
  *through = v + 1;
  SLOT(15, *through);
}

// ---- Control flow ---------------------------------------------------------------------------

__device__ __noinline__ unsigned fib(unsigned k) { return k < 2 ? k : fib(k - 1) + fib(k - 2); }

__device__ __noinline__ unsigned twice(unsigned x) { return 2 * x; }
__device__ __noinline__ unsigned square(unsigned x) { return x * x; }
__device__ __noinline__ unsigned negate(unsigned x) { return 0u - x; }
typedef unsigned (*Operation)(unsigned);
__device__ Operation gOperations[3] = {twice, square, negate};

struct Shape {
  __device__ virtual unsigned area(unsigned x) const { return x; }
  __device__ virtual ~Shape() {}
};
struct Square : Shape {
  __device__ unsigned area(unsigned x) const override { return x * x; }
};
struct Triangle : Shape {
  __device__ unsigned area(unsigned x) const override { return x * x / 2; }
};

__device__ __noinline__ unsigned describe(const Shape& shape, unsigned x) { return shape.area(x); }

extern "C" __global__ void conf_control(const In* in, unsigned long long* results, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned long long* out = results + static_cast<long long>(i) * kSlots;
  const unsigned v = static_cast<unsigned>(in[i].a);
  SLOT(0, fib(v % 16));  // recursion, diverging by lane
  SLOT(1, gOperations[v % 3](v));
  unsigned switched = 0;
  switch (v % 7) {
    case 0: switched = 10; break;
    case 1: switched = v * 3; break;
    case 2: switched = v ^ 0x55; break;
    case 3: switched = 99; break;
    case 4: switched = v >> 1; break;
    case 5: switched = v + 5; break;
    default: switched = 7; break;
  }
  SLOT(2, switched);
  unsigned steps = 0;
  unsigned x = v % 1000 + 1;
  while (x != 1) {  // Collatz: different trip counts per lane
    x = (x & 1) ? 3 * x + 1 : x / 2;
    if (++steps > 1000) break;
    if (x == 4) continue;
  }
  SLOT(3, steps);
  Square square;
  Triangle triangle;
  const Shape& shape = (v & 1) ? static_cast<const Shape&>(square) : triangle;
  SLOT(4, describe(shape, v % 100));
  unsigned long long clock0 = clock64();
  unsigned long long timer0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(timer0));
  unsigned long long clock1 = clock64();
  SLOT(5, clock1 >= clock0);
  SLOT(6, timer0 != 0);
  unsigned sm;
  unsigned sms;
  asm("mov.u32 %0, %%smid;" : "=r"(sm));
  asm("mov.u32 %0, %%nsmid;" : "=r"(sms));
  SLOT(7, sm < sms);
}
