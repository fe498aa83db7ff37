// Fused softmax cross-entropy: one block per row of V logits.
#include "common.cuh"

__device__ float block_reduce(float v, bool is_max, float* sh) {
    int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        float u = __shfl_xor_sync(0xffffffff, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    v = (threadIdx.x < nw) ? sh[threadIdx.x] : (is_max ? -INFINITY : 0.f);
    if (wid == 0)
        for (int o = 16; o > 0; o >>= 1) {
            float u = __shfl_xor_sync(0xffffffff, v, o);
            v = is_max ? fmaxf(v, u) : v + u;
        }
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

// logits (in `probs`) -> probabilities in place, and the row's loss.
extern "C" __global__ void softmax_xent_fwd(float* __restrict__ probs, const int* __restrict__ targets,
                                            float* __restrict__ losses, int V) {
    __shared__ float sh[32];
    long off = (long)blockIdx.x * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, probs[off + j]);
    mx = block_reduce(mx, true, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float e = expf(probs[off + j] - mx);
        probs[off + j] = e;
        s += e;
    }
    s = block_reduce(s, false, sh);
    float inv = 1.f / s;
    for (int j = threadIdx.x; j < V; j += blockDim.x) probs[off + j] *= inv;
    __syncthreads();
    if (threadIdx.x == 0) losses[blockIdx.x] = -logf(fmaxf(probs[off + targets[blockIdx.x]], 1.17549435e-38f));
}

// probs -> dlogits = (p - onehot) * scale, in place.
extern "C" __global__ void softmax_xent_bwd(float* __restrict__ probs, const int* __restrict__ targets,
                                            float scale, int V) {
    long off = (long)blockIdx.x * V;
    int t = targets[blockIdx.x];
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float p = probs[off + j];
        probs[off + j] = (p - (j == t ? 1.f : 0.f)) * scale;
    }
}

// 16-bit modes, forward and gradient in one pass over the logits: each row's loss, and the row
// overwritten in place by (softmax - onehot) times the loss scale (fp16 loss scaling; 1 in bf16
// mode; the backward matrix products apply dloss / N as their alpha). Rows have `ld` elements, the
// first V used. No fp32 probabilities.
extern "C" __global__ void softmax_xent_h16(h16* __restrict__ logits, const int* __restrict__ targets,
                                            float* __restrict__ losses, const float* __restrict__ loss_scale, int V,
                                            int ld) {
    __shared__ float sh[32];
    h16* row = logits + (long)blockIdx.x * ld;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, from_h16(row[j]));
    mx = block_reduce(mx, true, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(from_h16(row[j]) - mx);
    s = block_reduce(s, false, sh);
    int t = targets[blockIdx.x];
    float zt = from_h16(row[t]);
    __syncthreads();  // every thread has read row[t] before it is overwritten
    float inv = 1.f / s, ls = loss_scale[0];
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        row[j] = to_h16((expf(from_h16(row[j]) - mx) * inv - (j == t ? 1.f : 0.f)) * ls);
    if (threadIdx.x == 0) losses[blockIdx.x] = mx + logf(s) - zt;
}

// As softmax_xent_h16, with the row held in registers: each thread loads its vectors of 8 values
// (at most XENT_NV of them, 16 bytes a load) once, and the max, the sum and the write all work on
// those registers. The kernel above reads the row three times, 2 bytes a load (1.3 TB/s at
// ANDREA-120M B=32). Rows of `ld` values, ld a multiple of 8 and at most 8 · XENT_NV · blockDim.x;
// blockDim.x a multiple of 32. Values past V (the padding) are left as they are. XENT_NV is given by
// the launch (andrea/engine/cupy/kernels.py XENT_NV, which sizes the block); 8 when compiled alone.
#ifndef XENT_NV
#define XENT_NV 8
#endif
// e^(z − mx) as 2^(z·log2 e − mx·log2 e): one FMA and ex2.approx, where expf costs about ten
// instructions (1.6x faster at ANDREA-120M B=8, dev/cuda/classifier.py). Each term's relative error
// grows by ex2.approx's (~2^-22) and the exponent's rounding (~(|z| + |mx|)·2^-24): below 10^-5 for
// logits within ±100, against the 16-bit rounding of the output (2^-9 in bf16). XENT_EXPF (dev): expf.
__device__ __forceinline__ float xent_exp(float z, float mx, float mx_log2e) {
#ifdef XENT_EXPF
    return expf(z - mx);
#else
    return fast_exp2(fmaf(z, LOG2E, -mx_log2e));
#endif
}

// op folded over the values a thread of softmax_xent_h16_rows holds (those before V), from acc
template <typename Op>
__device__ __forceinline__ float fold_row(const uint4 (&raw)[XENT_NV], int nv, int V, float acc, Op op) {
#pragma unroll
    for (int k = 0; k < XENT_NV; k++) {
        const int j = threadIdx.x + k * blockDim.x;
        if (j < nv) {
            float f[8];
            unpack8(raw[k], f);
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (j * 8 + i < V) acc = op(acc, f[i]);
        }
    }
    return acc;
}

extern "C" __global__ void softmax_xent_h16_rows(h16* __restrict__ logits, const int* __restrict__ targets,
                                                 float* __restrict__ losses, const float* __restrict__ loss_scale,
                                                 int V, int ld) {
    __shared__ float sh[32];
    h16* row = logits + (long)blockIdx.x * ld;
    uint4* vec = reinterpret_cast<uint4*>(row);
    const int nv = ld / 8;
    const int t = targets[blockIdx.x];
    const float zt = from_h16(row[t]);  // read before any thread writes (the block_reduce below syncs)
    uint4 raw[XENT_NV];
#pragma unroll
    for (int k = 0; k < XENT_NV; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < nv) raw[k] = vec[j];
    }
    float mx = fold_row(raw, nv, V, -INFINITY, [](float m, float z) { return fmaxf(m, z); });
    mx = block_reduce(mx, true, sh);
    const float mx_log2e = mx * LOG2E;
    float s = fold_row(raw, nv, V, 0.f, [=](float acc, float z) { return acc + xent_exp(z, mx, mx_log2e); });
    s = block_reduce(s, false, sh);
    const float inv = 1.f / s, ls = loss_scale[0];
#pragma unroll
    for (int k = 0; k < XENT_NV; k++) {
        int j = threadIdx.x + k * blockDim.x;
        if (j < nv && j * 8 < V) {
            float f[8];
            unpack8(raw[k], f);
#pragma unroll
            for (int i = 0; i < 8; i++) f[i] = (xent_exp(f[i], mx, mx_log2e) * inv - (j * 8 + i == t ? 1.f : 0.f)) * ls;
            if (j * 8 + 8 <= V) {
                vec[j] = pack8(f);
            } else {  // the row's last values before the padding
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (j * 8 + i < V) row[j * 8 + i] = to_h16(f[i]);
            }
        }
    }
    if (threadIdx.x == 0) losses[blockIdx.x] = mx + logf(s) - zt;
}
