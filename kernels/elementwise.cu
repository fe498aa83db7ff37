// Embedding, GELU, optimizer and gradient-norm kernels.
#include "common.cuh"

#define GELU_C 0.7978845608028654f

extern "C" __global__ void embed_fwd(const int* __restrict__ tok, const float* __restrict__ wte,
                                     const float* __restrict__ wpe, float* __restrict__ out,
                                     int N, int T, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * C) return;
    int row = i / C, c = i % C;
    out[i] = wte[(long)tok[row] * C + c] + wpe[(long)(row % T) * C + c];
}

// dwte[u] += sum of dout rows whose token is u, in sorted (stable) order: one thread per
// (unique token, channel). `order` sorts positions by token; [start[k], start[k+1]) are the
// positions of unique token uniq[k]. Deterministic, no atomics.
extern "C" __global__ void embed_bwd_wte(const float* __restrict__ dout, const long long* __restrict__ order,
                                         const long long* __restrict__ uniq, const long long* __restrict__ start,
                                         float* __restrict__ dwte, int n_uniq, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)n_uniq * C) return;
    int k = i / C, c = i % C;
    float s = 0.f;
    for (long p = start[k]; p < start[k + 1]; p++) s += dout[order[p] * C + c];
    dwte[uniq[k] * C + c] += s;
}

extern "C" __global__ void gelu_fwd(const float* __restrict__ h, float* __restrict__ a, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = h[i];
    a[i] = 0.5f * x * (1.f + tanhf(GELU_C * (x + 0.044715f * x * x * x)));
}

// da *= gelu'(h), in place
extern "C" __global__ void gelu_bwd(const float* __restrict__ h, float* __restrict__ da, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = h[i];
    float u = x * x;
    float t = tanhf(GELU_C * x * (1.f + 0.044715f * u));
    float d = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
    da[i] *= d;
}

// Stage 1 of global clipping: one partial sum of squares per block of `block` elements.
extern "C" __global__ void grad_norm_partial(const float* __restrict__ g, double* __restrict__ partial,
                                             long n, long block) {
    __shared__ double sh[256];
    long b0 = (long)blockIdx.x * block, b1 = min(n, b0 + block);
    double s = 0.0;
    for (long i = b0 + threadIdx.x; i < b1; i += blockDim.x) { double v = g[i]; s += v * v; }
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = sh[0];
}

// Stage 2: reduce the partials (fixed order) and take the square root, on the device.
extern "C" __global__ void grad_norm_final(const double* __restrict__ partial, int n, double* __restrict__ out) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    out[0] = sqrt(s);
}

extern "C" __global__ void grad_scale(float* __restrict__ g, float scale, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] *= scale;
}

// Fused AdamW over the flat buffers: decoupled decay where decay[i] = 1, then Adam.
extern "C" __global__ void adamw(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, const float* __restrict__ decay, float lr, float beta1,
                                 float beta2, float eps, float wd, float bc1, float bc2, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    float mi = beta1 * m[i] + (1.f - beta1) * gi;
    float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float wi = w[i];
    wi -= lr * wd * decay[i] * wi;
    wi -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    w[i] = wi;
}

// ---- bf16 mode: activations feeding matrix products are stored in bf16 (fp32 arithmetic) ----

extern "C" __global__ void gelu_fwd_bf16(const __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ a, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = __bfloat162float(h[i]);
    a[i] = __float2bfloat16_rn(0.5f * x * (1.f + tanhf(GELU_C * (x + 0.044715f * x * x * x))));
}

// da *= gelu'(h), in place, bf16
extern "C" __global__ void gelu_bwd_bf16(const __nv_bfloat16* __restrict__ h, __nv_bfloat16* __restrict__ da, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = __bfloat162float(h[i]);
    float u = x * x;
    float t = tanhf(GELU_C * x * (1.f + 0.044715f * u));
    float d = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
    da[i] = __float2bfloat16_rn(__bfloat162float(da[i]) * d);
}

extern "C" __global__ void to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// AdamW as above, also refreshing the bf16 copy of the weights that the matrix products read
extern "C" __global__ void adamw_bf16(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                      float* __restrict__ v, const float* __restrict__ decay,
                                      __nv_bfloat16* __restrict__ wb, float lr, float beta1, float beta2, float eps,
                                      float wd, float bc1, float bc2, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = g[i];
    float mi = beta1 * m[i] + (1.f - beta1) * gi;
    float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float wi = w[i];
    wi -= lr * wd * decay[i] * wi;
    wi -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    w[i] = wi;
    wb[i] = __float2bfloat16_rn(wi);
}
