// Causal scaled dot-product attention, flash style: tiled over keys/queries in shared memory,
// online softmax, fp32 on CUDA cores. No T x T matrix is ever stored: the forward pass saves
// only the log-sum-exp of each query row, and the backward kernels recompute the probabilities.
// Layouts: q, k, v [B, H, T, D] (three slices of qkv [3, B, H, T, D]); y, dy [B, T, H*D];
// lse, delta [B, H, T]. Compiled with -DHEAD_DIM=<D>. One thread owns one query (or key) row,
// so results never depend on thread scheduling: deterministic, no atomics.
#include "common.cuh"

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=<head dim>"
#endif
#define D HEAD_DIM
#define BQ 64   // queries per block (= threads) in the forward and dQ kernels
#define BK 32   // keys per shared-memory tile
#define BKEYS 64  // keys per block (= threads) in the dK and dV kernels
#define BQT 32  // queries per shared-memory tile in the dK and dV kernels

// Shared loader of a key/value tile for the query-side kernels (forward and dQ).
__device__ void load_key_tile(const float* k, const float* v, float (*Ks)[D], float (*Vs)[D], long base,
                              int T, int j0) {
    for (int e = threadIdx.x; e < BK * D; e += BQ) {
        int jj = e / D, d = e % D, j = j0 + jj;
        Ks[jj][d] = j < T ? k[base + (long)j * D + d] : 0.f;
        Vs[jj][d] = j < T ? v[base + (long)j * D + d] : 0.f;
    }
}

extern "C" __global__ void attn_fwd(const float* __restrict__ q, const float* __restrict__ k,
                                    const float* __restrict__ v, float* __restrict__ y,
                                    float* __restrict__ lse, int H, int T, float scale) {
    __shared__ float Ks[BK][D];
    __shared__ float Vs[BK][D];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    long base = (long)bh * T * D;
    int i = blockIdx.x * BQ + threadIdx.x;
    bool active = i < T;
    float qr[D], acc[D];
#pragma unroll
    for (int d = 0; d < D; d++) { qr[d] = active ? q[base + (long)i * D + d] * scale : 0.f; acc[d] = 0.f; }
    float m = -INFINITY, l = 0.f;
    int kmax = min(T, (blockIdx.x + 1) * BQ);
    for (int j0 = 0; j0 < kmax; j0 += BK) {
        load_key_tile(k, v, Ks, Vs, base, T, j0);
        __syncthreads();
        if (active && j0 <= i) {
            float sc[BK];
            float tmax = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < BK; jj++) {
                float s = -INFINITY;
                if (j0 + jj <= i) {
                    s = 0.f;
#pragma unroll
                    for (int d = 0; d < D; d++) s += qr[d] * Ks[jj][d];
                }
                sc[jj] = s;
                tmax = fmaxf(tmax, s);
            }
            float mn = fmaxf(m, tmax);
            float corr = expf(m - mn);  // 0 on the first tile (m = -inf)
            l *= corr;
#pragma unroll
            for (int d = 0; d < D; d++) acc[d] *= corr;
#pragma unroll
            for (int jj = 0; jj < BK; jj++) {
                float p = expf(sc[jj] - mn);  // 0 for masked keys
                l += p;
#pragma unroll
                for (int d = 0; d < D; d++) acc[d] += p * Vs[jj][d];
            }
            m = mn;
        }
        __syncthreads();
    }
    if (active) {
        long yo = ((long)b * T + i) * H * D + (long)h * D;
        float inv = 1.f / l;
#pragma unroll
        for (int d = 0; d < D; d++) y[yo + d] = acc[d] * inv;
        lse[(long)bh * T + i] = m + logf(l);
    }
}

// delta_i = sum_d dy_i,d * y_i,d  (= sum_j dP_ij P_ij), one thread per query row
extern "C" __global__ void attn_delta(const float* __restrict__ dy, const float* __restrict__ y,
                                      float* __restrict__ delta, int B, int H, int T) {
    long r = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= (long)B * H * T) return;
    int i = r % T, bh = r / T, b = bh / H, h = bh % H;
    long o = ((long)b * T + i) * H * D + (long)h * D;
    float s = 0.f;
#pragma unroll
    for (int d = 0; d < D; d++) s += dy[o + d] * y[o + d];
    delta[r] = s;
}

// dq_i = scale * sum_{j<=i} P_ij (dP_ij - delta_i) k_j, with P recomputed from lse
extern "C" __global__ void attn_bwd_dq(const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ v, const float* __restrict__ dy,
                                       const float* __restrict__ lse, const float* __restrict__ delta,
                                       float* __restrict__ dq, int H, int T, float scale) {
    __shared__ float Ks[BK][D];
    __shared__ float Vs[BK][D];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    long base = (long)bh * T * D;
    int i = blockIdx.x * BQ + threadIdx.x;
    bool active = i < T;
    float qr[D], dyr[D], acc[D];
    long yo = ((long)b * T + (active ? i : 0)) * H * D + (long)h * D;
#pragma unroll
    for (int d = 0; d < D; d++) {
        qr[d] = active ? q[base + (long)i * D + d] * scale : 0.f;
        dyr[d] = active ? dy[yo + d] : 0.f;
        acc[d] = 0.f;
    }
    float li = active ? lse[(long)bh * T + i] : 0.f, di = active ? delta[(long)bh * T + i] : 0.f;
    int kmax = min(T, (blockIdx.x + 1) * BQ);
    for (int j0 = 0; j0 < kmax; j0 += BK) {
        load_key_tile(k, v, Ks, Vs, base, T, j0);
        __syncthreads();
        if (active) {
            for (int jj = 0; jj < BK && j0 + jj <= i; jj++) {
                float s = 0.f, dp = 0.f;
#pragma unroll
                for (int d = 0; d < D; d++) { s += qr[d] * Ks[jj][d]; dp += dyr[d] * Vs[jj][d]; }
                float ds = expf(s - li) * (dp - di);
#pragma unroll
                for (int d = 0; d < D; d++) acc[d] += ds * Ks[jj][d];
            }
        }
        __syncthreads();
    }
    if (active) {
#pragma unroll
        for (int d = 0; d < D; d++) dq[base + (long)i * D + d] = acc[d] * scale;
    }
}

// Shared loader of a query tile for the key-side kernels: q (scaled), dy, lse, delta.
__device__ void load_query_tile(const float* q, const float* dy, const float* lse, const float* delta,
                                float (*Qs)[D], float (*dYs)[D], float* ls, float* ds_, long base,
                                int b, int h, int H, int T, int i0, float scale) {
    for (int e = threadIdx.x; e < BQT * D; e += BKEYS) {
        int ii = e / D, d = e % D, i = i0 + ii;
        bool ok = i < T;
        Qs[ii][d] = ok ? q[base + (long)i * D + d] * scale : 0.f;
        dYs[ii][d] = ok ? dy[((long)b * T + i) * H * D + (long)h * D + d] : 0.f;
    }
    for (int ii = threadIdx.x; ii < BQT; ii += BKEYS) {
        int i = i0 + ii;
        ls[ii] = i < T ? lse[(long)(b * H + h) * T + i] : 0.f;
        ds_[ii] = i < T ? delta[(long)(b * H + h) * T + i] : 0.f;
    }
}

// The key-side kernels, one thread per key row j, over the query tiles from j's own on:
//   dK:  dk_j = scale * sum_{i>=j} P_ij (dP_ij - delta_i) q_i    (GRAD_K)
//   dV:  dv_j = sum_{i>=j} P_ij dy_i                              (v is not read)
template <bool GRAD_K>
__device__ __forceinline__ void attn_bwd_keys(const float* __restrict__ q, const float* __restrict__ k,
                                              const float* __restrict__ v, const float* __restrict__ dy,
                                              const float* __restrict__ lse, const float* __restrict__ delta,
                                              float* __restrict__ out, int H, int T, float scale) {
    __shared__ float Qs[BQT][D];
    __shared__ float dYs[BQT][D];
    __shared__ float ls[BQT], dls[BQT];
    int bh = blockIdx.y, b = bh / H, h = bh % H;
    long base = (long)bh * T * D;
    int j = blockIdx.x * BKEYS + threadIdx.x;
    bool active = j < T;
    float kr[D], vr[GRAD_K ? D : 1], acc[D];
#pragma unroll
    for (int d = 0; d < D; d++) {
        kr[d] = active ? k[base + (long)j * D + d] : 0.f;
        if constexpr (GRAD_K) vr[d] = active ? v[base + (long)j * D + d] : 0.f;
        acc[d] = 0.f;
    }
    int i_start = (blockIdx.x * BKEYS / BQT) * BQT;
    for (int i0 = i_start; i0 < T; i0 += BQT) {
        load_query_tile(q, dy, lse, delta, Qs, dYs, ls, dls, base, b, h, H, T, i0, scale);
        __syncthreads();
        if (active) {
            for (int ii = 0; ii < BQT; ii++) {
                int i = i0 + ii;
                if (i < j || i >= T) continue;
                if constexpr (GRAD_K) {
                    float s = 0.f, dp = 0.f;
#pragma unroll
                    for (int d = 0; d < D; d++) { s += Qs[ii][d] * kr[d]; dp += dYs[ii][d] * vr[d]; }
                    float ds = expf(s - ls[ii]) * (dp - dls[ii]);
#pragma unroll
                    for (int d = 0; d < D; d++) acc[d] += ds * Qs[ii][d];  // Qs holds q * scale
                } else {
                    float s = 0.f;
#pragma unroll
                    for (int d = 0; d < D; d++) s += Qs[ii][d] * kr[d];
                    float p = expf(s - ls[ii]);
#pragma unroll
                    for (int d = 0; d < D; d++) acc[d] += p * dYs[ii][d];
                }
            }
        }
        __syncthreads();
    }
    if (active) {
#pragma unroll
        for (int d = 0; d < D; d++) out[base + (long)j * D + d] = acc[d];
    }
}

extern "C" __global__ void attn_bwd_dk(const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ v, const float* __restrict__ dy,
                                       const float* __restrict__ lse, const float* __restrict__ delta,
                                       float* __restrict__ dk, int H, int T, float scale) {
    attn_bwd_keys<true>(q, k, v, dy, lse, delta, dk, H, T, scale);
}

extern "C" __global__ void attn_bwd_dv(const float* __restrict__ q, const float* __restrict__ k,
                                       const float* __restrict__ dy, const float* __restrict__ lse,
                                       const float* __restrict__ delta, float* __restrict__ dv,
                                       int H, int T, float scale) {
    attn_bwd_keys<false>(q, k, nullptr, dy, lse, delta, dv, H, T, scale);
}
