// Shared helpers for ANDREA's kernels (fp32 or 16-bit storage; deterministic reductions: fixed
// order, no atomics).
#pragma once

// The 16-bit type of the fast path: bf16, or fp16 when compiled with -DANDREA_FP16 (the fp16
// mode, with loss scaling). Kernels use h16 and these conversions; H16_PTX names it for mma.sync.
// CUDA names the conversions of both types alike (__float2half_rn, __float2bfloat16_rn, ...):
// H16_FN pastes the type's name (H16_NAME) between the common parts.
#ifdef ANDREA_FP16
#include <cuda_fp16.h>
typedef __half h16;
typedef __half2 h16x2;
#define H16_PTX "f16"
#define H16_NAME half
#else
#include <cuda_bf16.h>
typedef __nv_bfloat16 h16;
typedef __nv_bfloat162 h16x2;
#define H16_PTX "bf16"
#define H16_NAME bfloat16
#endif
#define H16_PASTE(pre, name, post) pre##name##post
#define H16_EXPAND(pre, name, post) H16_PASTE(pre, name, post)
#define H16_FN(pre, post) H16_EXPAND(pre, H16_NAME, post)
__device__ __forceinline__ h16 to_h16(float v) { return H16_FN(__float2, _rn)(v); }
__device__ __forceinline__ float from_h16(h16 v) { return H16_FN(__, 2float)(v); }
__device__ __forceinline__ h16x2 pack_h16x2(float lo, float hi) { return H16_FN(__floats2, 2_rn)(lo, hi); }
__device__ __forceinline__ float2 unpack_h16x2(h16x2 v) { return H16_FN(__, 22float2)(v); }

// 8 16-bit values in 16 bytes (one vector load or store) <-> 8 floats
__device__ __forceinline__ void unpack8(uint4 u, float f[8]) {
    const h16x2* p = reinterpret_cast<const h16x2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 v = unpack_h16x2(p[i]);
        f[2 * i] = v.x;
        f[2 * i + 1] = v.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float f[8]) {
    uint4 u;
    h16x2* p = reinterpret_cast<h16x2*>(&u);
#pragma unroll
    for (int i = 0; i < 4; i++) p[i] = pack_h16x2(f[2 * i], f[2 * i + 1]);
    return u;
}

#ifndef INFINITY  // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

// 2^x on the special-function unit (relative error ~2^-22; exp2(-inf) = 0): e^x as fast_exp2(x·LOG2E)
#define LOG2E 1.4426950408889634f
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

template <typename T> __device__ __forceinline__ T to_out(float v);
template <> __device__ __forceinline__ float to_out<float>(float v) { return v; }
template <> __device__ __forceinline__ h16 to_out<h16>(float v) { return to_h16(v); }
__device__ __forceinline__ float as_float(float v) { return v; }
__device__ __forceinline__ float as_float(h16 v) { return from_h16(v); }

// out[row] = wte[tok[row]] + wpe[pos0 + row % T] for N rows of C: the residual stream's start, fp32 or
// 16-bit (embedding.cu embed_fwd*, decode.cu embed_at*: pos0 the cache's position)
template <typename Out>
__device__ __forceinline__ void embed_rows(const int* __restrict__ tok, const float* __restrict__ wte,
                                           const float* __restrict__ wpe, int pos0, Out* __restrict__ out, int N, int T,
                                           int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * C) return;
    int row = i / C, c = i % C;
    out[i] = to_out<Out>(wte[(long)tok[row] * C + c] + wpe[(long)(pos0 + row % T) * C + c]);
}

// The max and the sum over the four lanes that hold one row of a tensor-core accumulator fragment
// (lanes differing in their two lowest bits: attention_mma.cu and attention_wgmma.cu's softmax rows)
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}
