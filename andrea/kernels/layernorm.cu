// LayerNorm forward/backward. One warp per row of C channels.
#include "common.cuh"

// The calling warp's row (one row a warp), its lane and the row's first element; false past the last row.
__device__ __forceinline__ bool warp_row(int N, int C, int& row, int& lane, long& off) {
    row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    lane = threadIdx.x % 32;
    off = (long)row * C;
    return row < N;
}

template <typename Out>
__device__ void layernorm_rows(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                               Out* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int N,
                               int C, float eps) {
    int row, lane;
    long off;
    if (!warp_row(N, C, row, lane, off)) return;
    const float* xr = x + off;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) s += xr[c];
    float m = warp_sum(s) / C;
    float v = 0.f;
    for (int c = lane; c < C; c += 32) { float d = xr[c] - m; v += d * d; }
    float r = rsqrtf(warp_sum(v) / C + eps);
    Out* o = out + (long)row * C;
    for (int c = lane; c < C; c += 32) o[c] = to_out<Out>((xr[c] - m) * r * g[c] + b[c]);
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

extern "C" __global__ void layernorm_fwd(const float* __restrict__ x, const float* __restrict__ g,
                                         const float* __restrict__ b, float* __restrict__ out,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         int N, int C, float eps) {
    layernorm_rows(x, g, b, out, mean, rstd, N, C, eps);
}

// out_res = x + f (the residual add), then LayerNorm of it, in one pass: the sum is normalised
// from registers instead of being read back. Output fp32 or 16-bit.
template <typename Out>
__device__ void add_layernorm_rows(const float* __restrict__ x, const float* __restrict__ f, float* __restrict__ res,
                                   const float* __restrict__ g, const float* __restrict__ b, Out* __restrict__ out,
                                   float* __restrict__ mean, float* __restrict__ rstd, int N, int C, float eps) {
    int row, lane;
    long off;
    if (!warp_row(N, C, row, lane, off)) return;
    float s = 0.f;
    for (int c = lane; c < C; c += 32) {
        float v = x[off + c] + f[off + c];
        res[off + c] = v;
        s += v;
    }
    float m = warp_sum(s) / C;
    float v2 = 0.f;
    for (int c = lane; c < C; c += 32) { float d = res[off + c] - m; v2 += d * d; }
    float r = rsqrtf(warp_sum(v2) / C + eps);
    for (int c = lane; c < C; c += 32) out[off + c] = to_out<Out>((res[off + c] - m) * r * g[c] + b[c]);
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

// The kernels `name` (fp32 output) and `name`_h16 (16-bit output, the next matrix product's operand
// in the bf16 and fp16 modes) of a residual-add + LayerNorm row function.
#define ADD_LAYERNORM_KERNELS(name, rows)                                                                        \
    extern "C" __global__ void name(const float* x, const float* f, float* res, const float* g, const float* b,  \
                                    float* out, float* mean, float* rstd, int N, int C, float eps) {             \
        rows(x, f, res, g, b, out, mean, rstd, N, C, eps);                                                       \
    }                                                                                                            \
    extern "C" __global__ void name##_h16(const float* x, const float* f, float* res, const float* g,            \
                                          const float* b, h16* out, float* mean, float* rstd, int N, int C,      \
                                          float eps) {                                                           \
        rows(x, f, res, g, b, out, mean, rstd, N, C, eps);                                                       \
    }

ADD_LAYERNORM_KERNELS(add_layernorm_fwd, add_layernorm_rows)

// the same, output in 16 bits (the next matrix product's operand in the bf16 and fp16 modes)
extern "C" __global__ void layernorm_fwd_h16(const float* __restrict__ x, const float* __restrict__ g,
                                              const float* __restrict__ b, h16* __restrict__ out,
                                              float* __restrict__ mean, float* __restrict__ rstd,
                                              int N, int C, float eps) {
    layernorm_rows(x, g, b, out, mean, rstd, N, C, eps);
}

// LayerNorm backward, input gradient: one warp per row,
//   dx += (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd,  dxhat = dout * g;
// if dx_h16 is given, the updated dx is also written there in 16 bits (the residual branch's
// gradient, the operand of the matrix products that follow: residual_add_bwd, fused).
extern "C" __global__ void layernorm_bwd_dx(const float* __restrict__ dout, const float* __restrict__ x,
                                            const float* __restrict__ mean, const float* __restrict__ rstd,
                                            const float* __restrict__ g, float* __restrict__ dx,
                                            h16* __restrict__ dx_h16, int N, int C) {
    int row, lane;
    long off;
    if (!warp_row(N, C, row, lane, off)) return;
    float m = mean[row], r = rstd[row];
    float s1 = 0.f, s2 = 0.f;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[off + c] - m) * r;
        float dxh = dout[off + c] * g[c];
        s1 += dxh;
        s2 += dxh * xh;
    }
    s1 = warp_sum(s1) / C;
    s2 = warp_sum(s2) / C;
    for (int c = lane; c < C; c += 32) {
        float xh = (x[off + c] - m) * r;
        float v = dx[off + c] + (dout[off + c] * g[c] - s1 - xh * s2) * r;
        dx[off + c] = v;
        if (dx_h16) dx_h16[off + c] = to_h16(v);
    }
}

// LayerNorm backward, parameter gradients: partial[chunk][c] = sum of dout * xhat over the chunk's
// rows, partial[chunk][C + c] = sum of dout (rows in order; one thread per column, xhat recomputed
// from x, mean, rstd). ln_partials_final adds the chunks in order: deterministic, no N x C temporary.
extern "C" __global__ void layernorm_bwd_params(const float* __restrict__ dout, const float* __restrict__ x,
                                                const float* __restrict__ mean, const float* __restrict__ rstd,
                                                float* __restrict__ partial, int N, int C, int rows) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    float sg = 0.f, sb = 0.f;
    for (int r = r0; r < r1; r++) {
        long o = (long)r * C + c;
        float d = dout[o];
        sg += d * (x[o] - mean[r]) * rstd[r];
        sb += d;
    }
    partial[(long)blockIdx.y * 2 * C + c] = sg;
    partial[(long)blockIdx.y * 2 * C + C + c] = sb;
}

// Blocks of 32 x 8 threads: column blockIdx.x * 32 + threadIdx.x; thread row y adds chunks y, y + 8,
// ... in order, then the 8 sums are added in order (a fixed tree: deterministic, 8 loads in flight
// per column instead of one chain through every chunk).
extern "C" __global__ void ln_partials_final(const float* __restrict__ partial, float* __restrict__ dg,
                                             float* __restrict__ db, int chunks, int C) {
    __shared__ float part[8][32];
    const int c = blockIdx.x * 32 + threadIdx.x, y = threadIdx.y;
    float s = 0.f;
    if (c < 2 * C)
        for (int k = y; k < chunks; k += 8) s += partial[(long)k * 2 * C + c];
    part[y][threadIdx.x] = s;
    __syncthreads();
    if (y != 0 || c >= 2 * C) return;
    s = part[0][threadIdx.x];
    for (int i = 1; i < 8; i++) s += part[i][threadIdx.x];
    if (c < C) dg[c] += s;
    else db[c - C] += s;
}

// ---- vectorised row kernels (C a multiple of 4, at most 4 * 32 * LN_MAXV): a warp per row keeps
// the row in registers as float4s, so it is read from memory once.
#define LN_MAXV 12

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// Four values as stored, loaded now and converted later (a float4, or a uint2 of 16-bit values: half
// the registers), and four values packed into 16 bits (rounded to nearest)
__device__ __forceinline__ float4 raw4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ uint2 raw4(const h16* p) { return *reinterpret_cast<const uint2*>(p); }
__device__ __forceinline__ float4 f4(float4 v) { return v; }
__device__ __forceinline__ float4 f4(uint2 u) {
    const float2 lo = unpack_h16x2(*reinterpret_cast<h16x2*>(&u.x)), hi = unpack_h16x2(*reinterpret_cast<h16x2*>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
__device__ __forceinline__ uint2 packed4(float4 v) {
    h16x2 lo = pack_h16x2(v.x, v.y), hi = pack_h16x2(v.z, v.w);
    return make_uint2(*reinterpret_cast<unsigned*>(&lo), *reinterpret_cast<unsigned*>(&hi));
}

// four values loaded as floats, or stored in the pointer's type
template <typename T> __device__ __forceinline__ float4 load4(const T* p) { return f4(raw4(p)); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void store4(h16* p, float4 v) { *reinterpret_cast<uint2*>(p) = packed4(v); }

// v as the residual stream of type X stores it: itself (fp32), or rounded to 16 bits (the bf16
// residual stream of the bf16 and fp8 modes, where the LayerNorm normalises the rounded sum, so that
// the backward's x̂, recomputed from the stored stream, is the forward's)
template <typename X> __device__ __forceinline__ float4 as_stored(float4 v);
template <> __device__ __forceinline__ float4 as_stored<float>(float4 v) { return v; }
template <> __device__ __forceinline__ float4 as_stored<h16>(float4 v) { return f4(packed4(v)); }

// One row's residual add and LayerNorm statistics in a warp's registers: v[k] = x + f (f nullable; also
// stored into res where given) for the lane's float4s, and the row's mean m and rstd r. X: the
// residual stream's type (x and res), fp32 or 16-bit.
template <int NV, typename F, typename X = float>
__device__ __forceinline__ void add_ln_row(const X* __restrict__ x, const F* __restrict__ f, X* __restrict__ res,
                                           long off, int C, float eps, int lane, float4 (&v)[NV], float& m, float& r) {
    const int nv = C / 4;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        int c = (lane + 32 * k) * 4;
        if (c < C) {
            float4 a = f ? as_stored<X>(add4(load4(x + off + c), load4(f + off + c))) : load4(x + off + c);
            v[k] = a;
            if (res) store4(res + off + c, a);
            s += a.x + a.y + a.z + a.w;
        }
    }
    m = warp_sum(s) / C;
    float q = 0.f;
#pragma unroll
    for (int k = 0; k < NV; k++)
        if ((lane + 32 * k) < nv) {
            float4 a = v[k];
            q += (a.x - m) * (a.x - m) + (a.y - m) * (a.y - m) + (a.z - m) * (a.z - m) + (a.w - m) * (a.w - m);
        }
    r = rsqrtf(warp_sum(q) / C + eps);
}

// four values of a row normalised: (a − m)·r·γ + β, with γ and β already loaded (gg, bb)
__device__ __forceinline__ float4 ln_apply4(float4 a, float m, float r, float4 gg, float4 bb) {
    return make_float4((a.x - m) * r * gg.x + bb.x, (a.y - m) * r * gg.y + bb.y, (a.z - m) * r * gg.z + bb.z,
                       (a.w - m) * r * gg.w + bb.w);
}

// columns c..c+3 of a row normalised, γ and β loaded here
__device__ __forceinline__ float4 ln_out4(float4 a, float m, float r, const float* __restrict__ g,
                                          const float* __restrict__ b, int c) {
    return ln_apply4(a, m, r, *reinterpret_cast<const float4*>(g + c), *reinterpret_cast<const float4*>(b + c));
}

// res = x + f; out = LayerNorm(res) (f fp32, or the 16-bit branch output of the 16-bit modes; x and
// res: the residual stream, fp32 or 16-bit)
template <typename Out, typename F = float, typename X = float>
__device__ void add_layernorm_vec(const X* __restrict__ x, const F* __restrict__ f, X* __restrict__ res,
                                  const float* __restrict__ g, const float* __restrict__ b, Out* __restrict__ out,
                                  float* __restrict__ mean, float* __restrict__ rstd, int N, int C, float eps) {
    int row, lane;
    long off;
    if (!warp_row(N, C, row, lane, off)) return;
    float4 v[LN_MAXV];
    float m, r;
    add_ln_row<LN_MAXV, F, X>(x, f, res, off, C, eps, lane, v, m, r);
#pragma unroll
    for (int k = 0; k < LN_MAXV; k++) {
        int c = (lane + 32 * k) * 4;
        if (c < C) store4(out + off + c, ln_out4(v[k], m, r, g, b, c));
    }
    if (lane == 0) { mean[row] = m; rstd[row] = r; }
}

ADD_LAYERNORM_KERNELS(add_layernorm_fwd_vec, add_layernorm_vec)

// the 16-bit modes' residual add: the branch (the attention output or MLP product) arrives in 16
// bits, as the matrix product wrote it, into an fp32 residual stream (ANDREA_RESIDUAL=fp32, and fp16);
// the statistics are fp32
extern "C" __global__ void add_h16_layernorm_fwd_vec_h16(const float* x, const h16* f, float* res, const float* g,
                                                         const float* b, h16* out, float* mean, float* rstd, int N,
                                                         int C, float eps) {
    add_layernorm_vec<h16, h16>(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// the same over a 16-bit residual stream (the bf16 and fp8 modes: andrea/engine/cupy residual_from_env),
// a warp a row: 8 bytes a value moved instead of 12 (dev: production runs add_layernorm_r16_<NV>)
extern "C" __global__ void add_h16_layernorm_fwd_vec_h16_r16(const h16* x, const h16* f, h16* res, const float* g,
                                                             const float* b, h16* out, float* mean, float* rstd, int N,
                                                             int C, float eps) {
    add_layernorm_vec<h16, h16, h16>(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// Production's LayerNorm forward over the 16-bit stream (above 64 rows; f and res null: the first
// LayerNorm, of the embeddings): add_h16_layernorm_fwd_vec_h16_r16 with LN_R16_ROWS rows a warp
// (production: 2) and NV float4s a lane (C <= 128 NV). Every load of the warp's rows is issued before
// any of their sums, the rounded stream is kept packed in 16 bits (2 registers for 4 values), the
// rows' reductions are interleaved, and γ, β are loaded once for all of them. The single-row kernel
// waited on memory once per row with 3 KB in flight a warp: 2.8 TB/s at ANDREA-120M B=32
// (bench/kernel_profile.py). The same sums in the same order as the single-row kernel.
#ifndef LN_R16_ROWS
#define LN_R16_ROWS 2
#endif
template <int NV>
__device__ void add_layernorm_r16_rows(const h16* __restrict__ x, const h16* __restrict__ f, h16* __restrict__ res,
                                       const float* __restrict__ g, const float* __restrict__ b, h16* __restrict__ out,
                                       float* __restrict__ mean, float* __restrict__ rstd, int N, int C, float eps) {
    constexpr int R = LN_R16_ROWS;
    const int lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * R;
    if (row0 >= N) return;
    uint2 xr[R][NV], fr[R][NV];
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (row0 + i < N && c < C) {
                xr[i][k] = raw4(x + (long)(row0 + i) * C + c);
                if (f) fr[i][k] = raw4(f + (long)(row0 + i) * C + c);
            }
        }
    float s[R];
#pragma unroll
    for (int i = 0; i < R; i++) {
        s[i] = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (row0 + i < N && c < C) {
                const float4 a = f ? as_stored<h16>(add4(f4(xr[i][k]), f4(fr[i][k]))) : f4(xr[i][k]);
                xr[i][k] = packed4(a);  // exact: a is already a 16-bit value
                if (res) *reinterpret_cast<uint2*>(res + (long)(row0 + i) * C + c) = xr[i][k];
                s[i] += a.x + a.y + a.z + a.w;
            }
        }
    }
    float m[R], q[R];
#pragma unroll
    for (int i = 0; i < R; i++) m[i] = warp_sum(s[i]) / C;
#pragma unroll
    for (int i = 0; i < R; i++) {
        q[i] = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++)
            if ((lane + 32 * k) * 4 < C) {
                const float4 a = f4(xr[i][k]);
                q[i] += (a.x - m[i]) * (a.x - m[i]) + (a.y - m[i]) * (a.y - m[i]) + (a.z - m[i]) * (a.z - m[i]) +
                        (a.w - m[i]) * (a.w - m[i]);
            }
    }
    float r[R];
#pragma unroll
    for (int i = 0; i < R; i++) r[i] = rsqrtf(warp_sum(q[i]) / C + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = (lane + 32 * k) * 4;
        if (c < C) {
            const float4 gg = *reinterpret_cast<const float4*>(g + c), bb = *reinterpret_cast<const float4*>(b + c);
#pragma unroll
            for (int i = 0; i < R; i++)
                if (row0 + i < N) {
                    const float4 a = f4(xr[i][k]);
                    store4(out + (long)(row0 + i) * C + c, ln_apply4(a, m[i], r[i], gg, bb));
                }
        }
    }
    if (lane == 0)
#pragma unroll
        for (int i = 0; i < R; i++)
            if (row0 + i < N) {
                mean[row0 + i] = m[i];
                rstd[row0 + i] = r[i];
            }
}

#define ADD_LN_R16(name, NV)                                                                                    \
    extern "C" __global__ void name(const h16* x, const h16* f, h16* res, const float* g, const float* b, h16* out, \
                                    float* mean, float* rstd, int N, int C, float eps) {                          \
        add_layernorm_r16_rows<NV>(x, f, res, g, b, out, mean, rstd, N, C, eps);                                \
    }
ADD_LN_R16(add_layernorm_r16_1, 1)
ADD_LN_R16(add_layernorm_r16_2, 2)
ADD_LN_R16(add_layernorm_r16_3, 3)
ADD_LN_R16(add_layernorm_r16_4, 4)
ADD_LN_R16(add_layernorm_r16_6, 6)
ADD_LN_R16(add_layernorm_r16_8, 8)
ADD_LN_R16(add_layernorm_r16_12, 12)
// dev: at NV = 12 (C = 1536, ANDREA-480M) the kernel above takes 133 registers a thread (NVRTC 13.0),
// one 256-thread block an SM; asked for two (at most 128 registers: 125)
extern "C" __global__ void __launch_bounds__(256, 2) add_layernorm_r16_12b2(const h16* x, const h16* f, h16* res,
                                                                            const float* g, const float* b, h16* out,
                                                                            float* mean, float* rstd, int N, int C,
                                                                            float eps) {
    add_layernorm_r16_rows<12>(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// add_h16_layernorm_fwd_vec_h16 for a few rows (generation's one-token step, where the kernel's
// latency is its time): a block per row, a float4 of the row per thread (C / 4 threads, rounded up
// to whole warps), γ and β loaded with it, so that the block waits on memory once; the warps' sums
// added in warp order through shared memory. The vec kernel's warp per row waited twice (γ and β
// after the reductions) over 6 float4s a lane: 4.7 us a call at ANDREA-120M, one row
// (bench/decode_profile.py). Sums in another order than the vec kernel's: the same to fp32 rounding.
template <typename X>
__device__ void add_h16_layernorm_block(const X* __restrict__ x, const h16* __restrict__ f, X* __restrict__ res,
                                        const float* __restrict__ g, const float* __restrict__ b, h16* __restrict__ out, float* __restrict__ mean,
                                        float* __restrict__ rstd, int N, int C, float eps) {
    __shared__ float red[32];
    const int row = blockIdx.x, t = threadIdx.x, warp = t / 32, lane = t % 32, warps = blockDim.x / 32;
    const long off = (long)row * C;
    const int c = 4 * t;
    const bool on = c < C;
    float4 a = make_float4(0.f, 0.f, 0.f, 0.f), gg = a, bb = a;
    if (on) {
        gg = *reinterpret_cast<const float4*>(g + c);
        bb = *reinterpret_cast<const float4*>(b + c);
        a = as_stored<X>(add4(load4(x + off + c), load4(f + off + c)));
        store4(res + off + c, a);
    }
    float s = warp_sum(a.x + a.y + a.z + a.w);
    if (lane == 0) red[warp] = s;
    __syncthreads();
    s = 0.f;
    for (int w = 0; w < warps; w++) s += red[w];
    const float m = s / C;
    __syncthreads();  // every thread has read red[] before it is reused
    float q = on ? (a.x - m) * (a.x - m) + (a.y - m) * (a.y - m) + (a.z - m) * (a.z - m) + (a.w - m) * (a.w - m) : 0.f;
    q = warp_sum(q);
    if (lane == 0) red[warp] = q;
    __syncthreads();
    q = 0.f;
    for (int w = 0; w < warps; w++) q += red[w];
    const float r = rsqrtf(q / C + eps);
    if (on)
        store4(out + off + c, ln_apply4(a, m, r, gg, bb));
    if (t == 0) { mean[row] = m; rstd[row] = r; }
}

extern "C" __global__ void add_h16_layernorm_fwd_block_h16(const float* x, const h16* f, float* res, const float* g,
                                                           const float* b, h16* out, float* mean, float* rstd, int N,
                                                           int C, float eps) {
    add_h16_layernorm_block<float>(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// the same over a 16-bit residual stream
extern "C" __global__ void add_h16_layernorm_fwd_block_h16_r16(const h16* x, const h16* f, h16* res, const float* g,
                                                               const float* b, h16* out, float* mean, float* rstd,
                                                               int N, int C, float eps) {
    add_h16_layernorm_block<h16>(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// layernorm_bwd_dx with the row's dout and x held in registers
extern "C" __global__ void layernorm_bwd_dx_vec(const float* __restrict__ dout, const float* __restrict__ x,
                                                const float* __restrict__ mean, const float* __restrict__ rstd,
                                                const float* __restrict__ g, float* __restrict__ dx,
                                                h16* __restrict__ dx_h16, int N, int C) {
    int row, lane;
    long off;
    if (!warp_row(N, C, row, lane, off)) return;
    float m = mean[row], r = rstd[row];
    float4 xh[LN_MAXV], dh[LN_MAXV];  // xhat, dout * g
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int k = 0; k < LN_MAXV; k++) {
        int c = (lane + 32 * k) * 4;
        if (c < C) {
            float4 xv = *reinterpret_cast<const float4*>(x + off + c), dv = *reinterpret_cast<const float4*>(dout + off + c);
            float4 gg = *reinterpret_cast<const float4*>(g + c);
            xh[k] = make_float4((xv.x - m) * r, (xv.y - m) * r, (xv.z - m) * r, (xv.w - m) * r);
            dh[k] = make_float4(dv.x * gg.x, dv.y * gg.y, dv.z * gg.z, dv.w * gg.w);
            s1 += dh[k].x + dh[k].y + dh[k].z + dh[k].w;
            s2 += dh[k].x * xh[k].x + dh[k].y * xh[k].y + dh[k].z * xh[k].z + dh[k].w * xh[k].w;
        }
    }
    s1 = warp_sum(s1) / C;
    s2 = warp_sum(s2) / C;
#pragma unroll
    for (int k = 0; k < LN_MAXV; k++) {
        int c = (lane + 32 * k) * 4;
        if (c < C) {
            float4 o = *reinterpret_cast<const float4*>(dx + off + c);
            o.x += (dh[k].x - s1 - xh[k].x * s2) * r;
            o.y += (dh[k].y - s1 - xh[k].y * s2) * r;
            o.z += (dh[k].z - s1 - xh[k].z * s2) * r;
            o.w += (dh[k].w - s1 - xh[k].w * s2) * r;
            store4(dx + off + c, o);
            if (dx_h16) store4(dx_h16 + off + c, o);
        }
    }
}

// The whole LayerNorm backward in one pass (C a multiple of 4, NV = C / 128 rounded up float4s per
// lane): dx += the input gradient (and its 16-bit copy, as layernorm_bwd_dx_vec), and the block's
// partial sums of dγ (dout · xhat) and dβ (dout) over its `rows` rows into partial[block] ([2C]:
// dγ, then dβ), so dout and x are read from memory once instead of twice. A warp takes rows warp,
// warp + 8, ... of the block's and keeps its running sums of dγ and dβ in its own [2C] stretch of
// shared memory (dynamic: 8 · 2C floats); the 8 warps' sums are added in warp order;
// ln_partials_final adds the blocks' partials in block order: deterministic. The row's old dx is
// loaded beside x and dout, before the row's reduction, so that a warp has all three in flight at
// once: 129 instead of 157 us at ANDREA-120M B=32 (3.1 TB/s; bench/ln_bwd_variants.py), the same
// bits as the version that kept the sums in registers (layernorm_bwd_fused_reg below), whose
// 4·NV extra float4 registers a thread left room for fewer warps.
#define LN_WARPS 8

// What the one-pass backward does with each updated float4 of dx besides storing it (`emit.row(row -
// r0, row offset, column, value)`), and once the block's rows are done and its threads synchronised
// (`emit.finish(r0, r1, N, C)`): here the 16-bit copy (dx_h16 nullable); fp8.cu's casts it to e5m2.
struct H16Copy {
    h16* __restrict__ dx_h16;
    __device__ __forceinline__ void row(int, long off, int c, float4 v) {
        if (dx_h16) store4(dx_h16 + off + c, v);
    }
    __device__ __forceinline__ void finish(int, int, int, int) {}
};

// How a lane keeps its row between the reduction and the update: as floats (x̂, dout and the old dx,
// float4s), or with Compact as loaded (16-bit values in a uint2: half the registers; x̂ recomputed
// from x, the same operations, so the same bits). At C = 1536 (ANDREA-480M, NV = 12) the float4s
// take 231 registers a thread (NVRTC 13.0, sm_90), one 256-thread block an SM; compact 128 (119
// asked for two blocks an SM): dev variants (layernorm_bwd_fused_h16_r16_c12, _c12b2) to time at that width.
template <bool Compact, typename T> struct KeptRow { using type = float4; };
template <typename T> struct KeptRow<true, T> { using type = decltype(raw4(static_cast<const T*>(nullptr))); };
template <bool Compact, typename T>
__device__ __forceinline__ typename KeptRow<Compact, T>::type keep4(const T* p) {
    if constexpr (Compact) return raw4(p);
    else return load4(p);
}

template <int NV, typename DOut, typename Emit, typename X = float, bool Compact = false>
__device__ void layernorm_bwd_fused(const DOut* __restrict__ dout, const X* __restrict__ x,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    const float* __restrict__ g, X* __restrict__ dx, Emit& emit,
                                    float* __restrict__ partial, int N, int C, int rows) {
    extern __shared__ __align__(16) float acc[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    const int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    float* ag = acc + (long)warp * 2 * C;  // this warp's dγ sums; its dβ sums follow
    float* ab = ag + C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
        const int c = (lane + 32 * k) * 4;
        if (c < C) {
            store4(ag + c, make_float4(0.f, 0.f, 0.f, 0.f));
            store4(ab + c, make_float4(0.f, 0.f, 0.f, 0.f));
        }
    }
    for (int row = r0 + warp; row < r1; row += nw) {
        const long off = (long)row * C;
        const float m = mean[row], r = rstd[row];
        // compact: x, dout and the old dx as loaded; else x̂, dout and the old dx as floats
        typename KeptRow<Compact, X>::type xk[NV];
        typename KeptRow<Compact, DOut>::type dk[NV];
        typename KeptRow<Compact, X>::type o[NV];
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (c < C) {
                xk[k] = keep4<Compact>(x + off + c);
                float4 gg = *reinterpret_cast<const float4*>(g + c);
                dk[k] = keep4<Compact>(dout + off + c);
                o[k] = keep4<Compact>(static_cast<const X*>(dx) + off + c);
                const float4 xv = f4(xk[k]), dv = f4(dk[k]);
                const float4 xh = make_float4((xv.x - m) * r, (xv.y - m) * r, (xv.z - m) * r, (xv.w - m) * r);
                if constexpr (!Compact) xk[k] = xh;
                s1 += dv.x * gg.x + dv.y * gg.y + dv.z * gg.z + dv.w * gg.w;
                s2 += dv.x * gg.x * xh.x + dv.y * gg.y * xh.y + dv.z * gg.z * xh.z + dv.w * gg.w * xh.w;
                float4 a = *reinterpret_cast<float4*>(ag + c);
                a.x += dv.x * xh.x;
                a.y += dv.y * xh.y;
                a.z += dv.z * xh.z;
                a.w += dv.w * xh.w;
                store4(ag + c, a);
                store4(ab + c, add4(*reinterpret_cast<float4*>(ab + c), dv));
            }
        }
        s1 = warp_sum(s1) / C;
        s2 = warp_sum(s2) / C;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (c < C) {
                float4 gg = *reinterpret_cast<const float4*>(g + c);
                float4 ov = f4(o[k]);
                const float4 dv = f4(dk[k]);
                float4 xh;
                if constexpr (Compact) {
                    const float4 xv = f4(xk[k]);
                    xh = make_float4((xv.x - m) * r, (xv.y - m) * r, (xv.z - m) * r, (xv.w - m) * r);
                } else {
                    xh = xk[k];
                }
                ov.x += (dv.x * gg.x - s1 - xh.x * s2) * r;
                ov.y += (dv.y * gg.y - s1 - xh.y * s2) * r;
                ov.z += (dv.z * gg.z - s1 - xh.z * s2) * r;
                ov.w += (dv.w * gg.w - s1 - xh.w * s2) * r;
                ov = as_stored<X>(ov);  // a 16-bit dx: the branch's gradient is the stored value
                store4(dx + off + c, ov);
                emit.row(row - r0, off, c, ov);
            }
        }
    }
    __syncthreads();
    // the warps' sums, added in warp order
    float* dst = partial + (long)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float v = acc[c];
        for (int w = 1; w < nw; w++) v += acc[(long)w * 2 * C + c];
        dst[c] = v;
    }
    emit.finish(r0, r1, N, C);
}

// the kernels layernorm_bwd_fused_<NV> (fp32 dout) and layernorm_bwd_fused_h16_<NV> (the 16-bit
// modes: dout as the matrix product wrote it) for each row width the models use (C <= 128 NV)
#define LN_BWD_FUSED(name, NV, DOUT)                                                                             \
    extern "C" __global__ void __launch_bounds__(LN_WARPS * 32) name(const DOUT* dout, const float* x,            \
                                                                     const float* mean, const float* rstd,       \
                                                                     const float* g, float* dx, h16* dx_h16,     \
                                                                     float* partial, int N, int C, int rows) {   \
        H16Copy emit{dx_h16};                                                                                    \
        layernorm_bwd_fused<NV, DOUT>(dout, x, mean, rstd, g, dx, emit, partial, N, C, rows);                    \
    }
LN_BWD_FUSED(layernorm_bwd_fused_1, 1, float)
LN_BWD_FUSED(layernorm_bwd_fused_2, 2, float)
LN_BWD_FUSED(layernorm_bwd_fused_3, 3, float)
LN_BWD_FUSED(layernorm_bwd_fused_4, 4, float)
LN_BWD_FUSED(layernorm_bwd_fused_6, 6, float)
LN_BWD_FUSED(layernorm_bwd_fused_8, 8, float)
LN_BWD_FUSED(layernorm_bwd_fused_12, 12, float)
LN_BWD_FUSED(layernorm_bwd_fused_h16_1, 1, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_2, 2, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_3, 3, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_4, 4, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_6, 6, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_8, 8, h16)
LN_BWD_FUSED(layernorm_bwd_fused_h16_12, 12, h16)

// the 16-bit modes over a 16-bit residual stream (andrea/engine/cupy residual_from_env): x and dx (the
// stream's gradient, updated in place) in 16 bits; dx is then the branch's gradient too, so there is
// no copy: 8 bytes a value moved instead of 16
#define LN_BWD_FUSED_R16(name, NV)                                                                               \
    extern "C" __global__ void __launch_bounds__(LN_WARPS * 32) name(const h16* dout, const h16* x,               \
                                                                     const float* mean, const float* rstd,       \
                                                                     const float* g, h16* dx, float* partial,    \
                                                                     int N, int C, int rows) {                   \
        H16Copy emit{nullptr};                                                                                   \
        layernorm_bwd_fused<NV, h16, H16Copy, h16>(dout, x, mean, rstd, g, dx, emit, partial, N, C, rows);      \
    }
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_1, 1)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_2, 2)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_3, 3)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_4, 4)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_6, 6)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_8, 8)
LN_BWD_FUSED_R16(layernorm_bwd_fused_h16_r16_12, 12)

// dev (dev/cuda/layernorm.py, at C = 1536 with --models ANDREA-480M:8): the same with the row kept
// compact (KeptRow above), at ANDREA-120M's and 480M's widths
#define LN_BWD_FUSED_R16_COMPACT(name, NV, MIN_BLOCKS)                                                           \
    extern "C" __global__ void __launch_bounds__(LN_WARPS * 32, MIN_BLOCKS) name(                                \
        const h16* dout, const h16* x, const float* mean, const float* rstd, const float* g, h16* dx,            \
        float* partial, int N, int C, int rows) {                                                                \
        H16Copy emit{nullptr};                                                                                   \
        layernorm_bwd_fused<NV, h16, H16Copy, h16, true>(dout, x, mean, rstd, g, dx, emit, partial, N, C, rows); \
    }
LN_BWD_FUSED_R16_COMPACT(layernorm_bwd_fused_h16_r16_c6, 6, 1)
LN_BWD_FUSED_R16_COMPACT(layernorm_bwd_fused_h16_r16_c12, 12, 1)
LN_BWD_FUSED_R16_COMPACT(layernorm_bwd_fused_h16_r16_c12b2, 12, 2)

// For comparison (bench/ln_bwd_variants.py): the previous production kernel, the warps' sums in
// registers and the old dx loaded after the row's reduction.
template <int NV, typename DOut>
__device__ void layernorm_bwd_fused_reg(const DOut* __restrict__ dout, const float* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        const float* __restrict__ g, float* __restrict__ dx, h16* __restrict__ dx_h16,
                                        float* __restrict__ partial, int N, int C, int rows) {
    __shared__ __align__(16) float red[2 * 4 * 32 * 12];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    float4 ag[NV], ab[NV];
#pragma unroll
    for (int k = 0; k < NV; k++) ag[k] = ab[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int row = r0 + warp; row < r1; row += LN_WARPS) {
        const long off = (long)row * C;
        const float m = mean[row], r = rstd[row];
        float4 xh[NV], dv[NV];
        float s1 = 0.f, s2 = 0.f;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (c < C) {
                float4 xv = *reinterpret_cast<const float4*>(x + off + c);
                float4 gg = *reinterpret_cast<const float4*>(g + c);
                dv[k] = load4(dout + off + c);
                xh[k] = make_float4((xv.x - m) * r, (xv.y - m) * r, (xv.z - m) * r, (xv.w - m) * r);
                s1 += dv[k].x * gg.x + dv[k].y * gg.y + dv[k].z * gg.z + dv[k].w * gg.w;
                s2 += dv[k].x * gg.x * xh[k].x + dv[k].y * gg.y * xh[k].y + dv[k].z * gg.z * xh[k].z +
                      dv[k].w * gg.w * xh[k].w;
                ag[k].x += dv[k].x * xh[k].x;
                ag[k].y += dv[k].y * xh[k].y;
                ag[k].z += dv[k].z * xh[k].z;
                ag[k].w += dv[k].w * xh[k].w;
                ab[k] = add4(ab[k], dv[k]);
            }
        }
        s1 = warp_sum(s1) / C;
        s2 = warp_sum(s2) / C;
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (c < C) {
                float4 gg = *reinterpret_cast<const float4*>(g + c);
                float4 o = *reinterpret_cast<const float4*>(dx + off + c);
                o.x += (dv[k].x * gg.x - s1 - xh[k].x * s2) * r;
                o.y += (dv[k].y * gg.y - s1 - xh[k].y * s2) * r;
                o.z += (dv[k].z * gg.z - s1 - xh[k].z * s2) * r;
                o.w += (dv[k].w * gg.w - s1 - xh[k].w * s2) * r;
                store4(dx + off + c, o);
                if (dx_h16) store4(dx_h16 + off + c, o);
            }
        }
    }
    // the warps' sums into shared memory, in warp order
    for (int w = 0; w < LN_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int k = 0; k < NV; k++) {
                const int c = (lane + 32 * k) * 4;
                if (c < C) {
                    float4* pg = reinterpret_cast<float4*>(red + c);
                    float4* pb = reinterpret_cast<float4*>(red + C + c);
                    *pg = w ? add4(*pg, ag[k]) : ag[k];
                    *pb = w ? add4(*pb, ab[k]) : ab[k];
                }
            }
        }
        __syncthreads();
    }
    float* dst = partial + (long)blockIdx.x * 2 * C;
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) dst[c] = red[c];
}

#define LN_BWD_FUSED_REG(name, NV)                                                                               \
    extern "C" __global__ void __launch_bounds__(LN_WARPS * 32) name(const h16* dout, const float* x,             \
                                                                     const float* mean, const float* rstd,       \
                                                                     const float* g, float* dx, h16* dx_h16,     \
                                                                     float* partial, int N, int C, int rows) {   \
        layernorm_bwd_fused_reg<NV, h16>(dout, x, mean, rstd, g, dx, dx_h16, partial, N, C, rows);               \
    }
LN_BWD_FUSED_REG(layernorm_bwd_fused_reg_h16_3, 3)
LN_BWD_FUSED_REG(layernorm_bwd_fused_reg_h16_6, 6)
LN_BWD_FUSED_REG(layernorm_bwd_fused_reg_h16_12, 12)
