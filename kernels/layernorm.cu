// LayerNorm forward/backward. One warp per row of C channels.
#include "common.cuh"

template <typename Out>
__device__ void layernorm_rows(const float* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                               Out* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int N,
                               int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    const float* xr = x + (long)row * C;
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
// from registers instead of being read back. Output fp32 or bf16.
template <typename Out>
__device__ void add_layernorm_rows(const float* __restrict__ x, const float* __restrict__ f, float* __restrict__ res,
                                   const float* __restrict__ g, const float* __restrict__ b, Out* __restrict__ out,
                                   float* __restrict__ mean, float* __restrict__ rstd, int N, int C, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
    long off = (long)row * C;
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

extern "C" __global__ void add_layernorm_fwd(const float* x, const float* f, float* res, const float* g, const float* b,
                                             float* out, float* mean, float* rstd, int N, int C, float eps) {
    add_layernorm_rows(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

extern "C" __global__ void add_layernorm_fwd_bf16(const float* x, const float* f, float* res, const float* g,
                                                  const float* b, __nv_bfloat16* out, float* mean, float* rstd, int N,
                                                  int C, float eps) {
    add_layernorm_rows(x, f, res, g, b, out, mean, rstd, N, C, eps);
}

// the same, output in bf16 (the next matrix product's operand in bf16 mode)
extern "C" __global__ void layernorm_fwd_bf16(const float* __restrict__ x, const float* __restrict__ g,
                                              const float* __restrict__ b, __nv_bfloat16* __restrict__ out,
                                              float* __restrict__ mean, float* __restrict__ rstd,
                                              int N, int C, float eps) {
    layernorm_rows(x, g, b, out, mean, rstd, N, C, eps);
}

// LayerNorm backward: dx += (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd with
// dxhat = dout * g, and the parameter gradients reduced on the way: a block of WARPS warps takes
// `rows` consecutive rows; each warp accumulates dout * xhat and dout for its rows in its own
// shared-memory slice; the block then writes one partial per column (warps added in order), and
// ln_partials_final adds the blocks' partials in order. No N x C temporary, deterministic.
// dx += ...; if dx_bf16 is given, the updated dx is also written there in bf16 (the residual
// branch's gradient, the operand of the matrix products that follow).
extern "C" __global__ void layernorm_bwd_fused(const float* __restrict__ dout, const float* __restrict__ x,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               const float* __restrict__ g, float* __restrict__ dx,
                                               __nv_bfloat16* __restrict__ dx_bf16, float* __restrict__ partial,
                                               int N, int C, int rows) {
    extern __shared__ float acc[];  // [warps][2][C]
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
    float* mine = acc + warp * 2 * C;
    for (int c = lane; c < 2 * C; c += 32) mine[c] = 0.f;
    int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    for (int row = r0 + warp; row < r1; row += nw) {
        long off = (long)row * C;
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
            float d = dout[off + c];
            float v = dx[off + c] + (d * g[c] - s1 - xh * s2) * r;
            dx[off + c] = v;
            if (dx_bf16) dx_bf16[off + c] = __float2bfloat16_rn(v);
            mine[c] += d * xh;
            mine[C + c] += d;
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < 2 * C; c += blockDim.x) {
        float s = 0.f;
        for (int w = 0; w < nw; w++) s += acc[w * 2 * C + c];
        partial[(long)blockIdx.x * 2 * C + c] = s;
    }
}

extern "C" __global__ void ln_partials_final(const float* __restrict__ partial, float* __restrict__ dg,
                                             float* __restrict__ db, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= 2 * C) return;
    float s = 0.f;
    for (int k = 0; k < chunks; k++) s += partial[(long)k * 2 * C + c];
    if (c < C) dg[c] += s;
    else db[c - C] += s;
}
