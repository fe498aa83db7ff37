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

// the same, output in bf16 (the next matrix product's operand in bf16 mode)
extern "C" __global__ void layernorm_fwd_bf16(const float* __restrict__ x, const float* __restrict__ g,
                                              const float* __restrict__ b, __nv_bfloat16* __restrict__ out,
                                              float* __restrict__ mean, float* __restrict__ rstd,
                                              int N, int C, float eps) {
    layernorm_rows(x, g, b, out, mean, rstd, N, C, eps);
}

// dx += (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) * rstd, with dxhat = dout * g.
// Also writes dout * xhat into `dgx` (N x C) so that dγ is a deterministic column sum.
extern "C" __global__ void layernorm_bwd(const float* __restrict__ dout, const float* __restrict__ x,
                                         const float* __restrict__ mean, const float* __restrict__ rstd,
                                         const float* __restrict__ g, float* __restrict__ dx,
                                         float* __restrict__ dgx, int N, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= N) return;
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
        float dxh = dout[off + c] * g[c];
        dx[off + c] += (dxh - s1 - xh * s2) * r;
        dgx[off + c] = dout[off + c] * xh;
    }
}

// out[c] += sum over rows of in[row, c], rows summed in order in chunks: stage 1 writes one
// partial per (chunk, column), stage 2 adds the partials in chunk order. Deterministic.
extern "C" __global__ void colsum_partial(const float* __restrict__ in, float* __restrict__ partial,
                                          int N, int C, int rows_per_chunk) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int chunk = blockIdx.y;
    if (c >= C) return;
    int r0 = chunk * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float s = 0.f;
    for (int r = r0; r < r1; r++) s += in[(long)r * C + c];
    partial[(long)chunk * C + c] = s;
}

extern "C" __global__ void colsum_final_add(const float* __restrict__ partial, float* __restrict__ out,
                                            int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int k = 0; k < chunks; k++) s += partial[(long)k * C + c];
    out[c] += s;
}
