// The Metal Shading Language, as far as our kernels (ds4agent/engine/kernels/gpu.py) use it,
// declared for a C++17 parser: tests/test_metal_syntax.py parses the exact source that
// mx.fast.metal_kernel builds after this header, with clang (libclang), no host headers and
// every warning an error. It stands in for what the Metal compiler provides (metal_stdlib) and
// for the prelude MLX puts in front of every custom kernel (mlx/backend/metal/kernels/utils.h,
// which brings metal_stdlib and `using namespace metal`).
//
// It catches what C++ and Metal agree on: syntax, undeclared or misspelt names, wrong types and
// argument counts, pointer arithmetic on the wrong types, and, because the four address spaces
// are distinct clang address spaces below, a pointer of one address space passed or assigned
// where another is expected (a small input that MLX passes as `constant` given to a function
// that takes `device` memory). Anything declared here and missing from Metal would hide an
// error; keep it to names Metal really has. Not modelled: Metal's own type rules beyond these
// (e.g. implicit vector conversions), `threadgroup` variables declared inside a kernel (C++
// allows no address space on a local variable: extend this file when a kernel needs one), and
// everything the Metal compiler does after parsing.
#pragma once

#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread

// Metal has no double (nor long double); a use is an error here too.
#define double __metal_has_no_double_type

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef unsigned long size_t;
typedef long ptrdiff_t;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;  // a distinct 16-bit float type, as in Metal

#define DS4_METAL_VECTORS(T)                                  \
    typedef T T##2 __attribute__((ext_vector_type(2)));      \
    typedef T T##3 __attribute__((ext_vector_type(3)));      \
    typedef T T##4 __attribute__((ext_vector_type(4)));
DS4_METAL_VECTORS(float)
DS4_METAL_VECTORS(half)
DS4_METAL_VECTORS(int)
DS4_METAL_VECTORS(uint)
DS4_METAL_VECTORS(short)
DS4_METAL_VECTORS(ushort)
DS4_METAL_VECTORS(char)
DS4_METAL_VECTORS(uchar)
#undef DS4_METAL_VECTORS

namespace metal {

// as_type<T>(x): reinterpret the bits of x; Metal requires equal sizes.
template <typename T, typename U>
inline T as_type(U x) {
    static_assert(sizeof(T) == sizeof(U), "as_type between types of different sizes");
    return __builtin_bit_cast(T, x);
}

#define DS4_METAL_MATH1(f) float f(float); half f(half); float2 f(float2); float4 f(float4);
#define DS4_METAL_MATH2(f) float f(float, float); half f(half, half); float2 f(float2, float2); float4 f(float4, float4);
DS4_METAL_MATH1(exp) DS4_METAL_MATH1(exp2) DS4_METAL_MATH1(log) DS4_METAL_MATH1(log2) DS4_METAL_MATH1(sqrt)
DS4_METAL_MATH1(rsqrt) DS4_METAL_MATH1(abs) DS4_METAL_MATH1(fabs) DS4_METAL_MATH1(tanh) DS4_METAL_MATH1(floor)
DS4_METAL_MATH1(ceil) DS4_METAL_MATH1(round) DS4_METAL_MATH1(sin) DS4_METAL_MATH1(cos)
DS4_METAL_MATH2(max) DS4_METAL_MATH2(min) DS4_METAL_MATH2(fmax) DS4_METAL_MATH2(fmin) DS4_METAL_MATH2(pow)
float fma(float, float, float);
half fma(half, half, half);
float clamp(float, float, float);
half clamp(half, half, half);
int max(int, int);
int min(int, int);
uint max(uint, uint);
uint min(uint, uint);
int abs(int);
float dot(float2, float2);
float dot(float4, float4);
namespace precise {
DS4_METAL_MATH1(exp) DS4_METAL_MATH1(log) DS4_METAL_MATH1(sqrt) DS4_METAL_MATH1(rsqrt) DS4_METAL_MATH1(tanh)
}
namespace fast {
DS4_METAL_MATH1(exp) DS4_METAL_MATH1(log) DS4_METAL_MATH1(sqrt) DS4_METAL_MATH1(rsqrt) DS4_METAL_MATH1(tanh)
}
#undef DS4_METAL_MATH1
#undef DS4_METAL_MATH2

// SIMD-group functions (32 lanes on Apple GPUs) and barriers.
#define DS4_METAL_SIMD(T)                                                       \
    T simd_sum(T); T simd_max(T); T simd_min(T); T simd_prefix_exclusive_sum(T); \
    T simd_shuffle(T, ushort); T simd_shuffle_down(T, ushort);                  \
    T simd_shuffle_up(T, ushort); T simd_shuffle_xor(T, ushort); T simd_broadcast(T, ushort);
DS4_METAL_SIMD(float)
DS4_METAL_SIMD(half)
DS4_METAL_SIMD(int)
DS4_METAL_SIMD(uint)
#undef DS4_METAL_SIMD
bool simd_all(bool);
bool simd_any(bool);

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

}  // namespace metal

using namespace metal;  // as MLX's prelude does (mlx/backend/metal/kernels/bf16.h)
