// Strip attention's row kernels, kept for dev/cuda/attention.py only: production dropped strip attention
// (it was andrea/kernels/attention_strip.cu up to commit 9fdabf6; the flash kernels of attention.cu
// replaced it). The driver, with the strip GEMMs, is strip_fwd / strip_bwd in dev/cuda/attention.py.
//
// Row kernels for strip attention: scores of a strip of queries against all earlier keys come
// from batched GEMMs (cuBLAS, through cupy.matmul here); these kernels do the causal softmax and its gradient on the
// strip. S is [BH][SQ][LD] (row r of batch b at b*SQ*LD + r*LD), only columns j < keys are used.
// Query row r is global position i0 + r; it sees keys j <= i0 + r. One block per (row, bh).
#include "common.cuh"

__device__ float block_max(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : -INFINITY;
    if (threadIdx.x < 32)
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ float block_sum(float v, float* sh) {
    v = warp_sum(v);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    v = threadIdx.x < blockDim.x / 32 ? sh[threadIdx.x] : 0.f;
    if (threadIdx.x < 32) v = warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    float r = sh[0];
    __syncthreads();
    return r;
}

// S (raw q.k) -> P = softmax(scale * S) over j <= i, zeros beyond; lse[bh, i] saved.
extern "C" __global__ void strip_softmax_fwd(float* __restrict__ S, float* __restrict__ lse, int SQ, int LD,
                                             int T, int i0, float scale) {
    __shared__ float sh[32];
    int r = blockIdx.x, bh = blockIdx.y, i = i0 + r;
    float* row = S + ((long)bh * SQ + r) * LD;
    int n = i + 1;
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, row[j] * scale);
    m = block_max(m, sh);
    float s = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) s += expf(row[j] * scale - m);
    s = block_sum(s, sh);
    float inv = 1.f / s;
    for (int j = threadIdx.x; j < LD; j += blockDim.x) row[j] = j < n ? expf(row[j] * scale - m) * inv : 0.f;
    if (threadIdx.x == 0) lse[(long)bh * T + i] = m + logf(s);
}

// S (raw q.k) -> P = exp(scale * S - lse_i) over j <= i, zeros beyond (backward recompute).
extern "C" __global__ void strip_probs(float* __restrict__ S, const float* __restrict__ lse, int SQ, int LD,
                                       int T, int i0, float scale) {
    int r = blockIdx.x, bh = blockIdx.y, i = i0 + r;
    float* row = S + ((long)bh * SQ + r) * LD;
    float l = lse[(long)bh * T + i];
    for (int j = threadIdx.x; j < LD; j += blockDim.x) row[j] = j <= i ? expf(row[j] * scale - l) : 0.f;
}

// dP -> dS = P * (dP - delta_i) * scale, in place (zeros beyond the diagonal follow from P).
extern "C" __global__ void strip_dsoftmax(float* __restrict__ dP, const float* __restrict__ P,
                                          const float* __restrict__ delta, int SQ, int LD, int T, int i0,
                                          float scale) {
    int r = blockIdx.x, bh = blockIdx.y, i = i0 + r;
    long off = ((long)bh * SQ + r) * LD;
    float di = delta[(long)bh * T + i];
    for (int j = threadIdx.x; j < LD; j += blockDim.x) dP[off + j] = P[off + j] * (dP[off + j] - di) * scale;
}
