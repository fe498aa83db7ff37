// GELU, optimizer and gradient-norm kernels (the embedding's: embedding.cu).
#include "common.cuh"

#define GELU_C 0.7978845608028654f

// GELU (tanh approximation) and its derivative, for the scalar kernels
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.f + tanhf(GELU_C * (x + 0.044715f * x * x * x))); }

__device__ __forceinline__ float gelu_grad(float x) {
    float u = x * x;
    float t = tanhf(GELU_C * x * (1.f + 0.044715f * u));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
}

extern "C" __global__ void gelu_fwd(const float* __restrict__ h, float* __restrict__ a, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] = gelu(h[i]);
}

// da *= gelu'(h), in place
extern "C" __global__ void gelu_bwd(const float* __restrict__ h, float* __restrict__ da, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    da[i] *= gelu_grad(h[i]);
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

// The optimizer step's decisions, taken on the device so that the host launches AdamW without first
// reading the gradient norm (andrea/optim.py: launch_step). ctrl = [norm, applied, gscale, bc1, bc2, t]
// (andrea/engine/backend.py: CTRL). The norm is grad_norm_final's (same order), over the loss scale;
// a non-finite norm leaves the weights, m, v and t as they are (applied 0); else t += 1, the bias
// corrections are those of the new t, and gscale clips the norm to `clip` and undoes the loss scale.
extern "C" __global__ void step_control(const double* __restrict__ partial, int n, double* __restrict__ ctrl,
                                        double clip, double scale, double beta1, double beta2) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    double s = 0.0;
    for (int i = 0; i < n; i++) s += partial[i];
    double norm = sqrt(s) / scale;
    ctrl[0] = norm;
    bool ok = isfinite(norm);
    ctrl[1] = ok ? 1.0 : 0.0;
    if (!ok) return;
    double t = ctrl[5] + 1.0;
    ctrl[5] = t;
    ctrl[2] = (norm > clip ? clip / norm : 1.0) / scale;
    ctrl[3] = 1.0 - pow(beta1, t);
    ctrl[4] = 1.0 - pow(beta2, t);
}

extern "C" __global__ void grad_scale(float* __restrict__ g, float scale, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) g[i] *= scale;
}

// Fused AdamW over the flat buffers, element i: decoupled decay where decay[i >> decay_shift] = 1 (the
// mask one byte per granule of 2^decay_shift parameters: andrea/model.py coarse_decay_mask), then Adam.
// The gradient is multiplied by gscale first (global clipping, folded in: no separate pass).
// Returns the updated weight.
__device__ __forceinline__ float adamw_update(long i, float* __restrict__ w, const float* __restrict__ g,
                                              float* __restrict__ m, float* __restrict__ v,
                                              const unsigned char* __restrict__ decay, int decay_shift, float gscale,
                                              float lr, float beta1, float beta2, float eps, float wd, float bc1,
                                              float bc2) {
    float gi = g[i] * gscale;
    float mi = beta1 * m[i] + (1.f - beta1) * gi;
    float vi = beta2 * v[i] + (1.f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float wi = w[i];
    wi -= lr * wd * decay[i >> decay_shift] * wi;
    wi -= lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
    w[i] = wi;
    return wi;
}

// ctrl (nullable): step_control's decisions replace gscale, bc1 and bc2, and may skip the update
__device__ __forceinline__ bool controlled(const double* __restrict__ ctrl, float& gscale, float& bc1, float& bc2) {
    if (ctrl == nullptr) return true;
    if (ctrl[1] == 0.0) return false;
    gscale = (float)ctrl[2];
    bc1 = (float)ctrl[3];
    bc2 = (float)ctrl[4];
    return true;
}

extern "C" __global__ void adamw(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, const unsigned char* __restrict__ decay, float gscale,
                                 float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2, long n,
                                 const double* __restrict__ ctrl, int decay_shift) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (!controlled(ctrl, gscale, bc1, bc2)) return;
    if (i < n) adamw_update(i, w, g, m, v, decay, decay_shift, gscale, lr, beta1, beta2, eps, wd, bc1, bc2);
}

// ---- 16-bit modes: activations feeding matrix products are stored in bf16 or fp16 (fp32 arithmetic) ----

extern "C" __global__ void gelu_fwd_h16(const h16* __restrict__ h, h16* __restrict__ a, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    a[i] = to_h16(gelu(from_h16(h[i])));
}

// da *= gelu'(h), in place, 16-bit
extern "C" __global__ void gelu_bwd_h16(const h16* __restrict__ h, h16* __restrict__ da, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float d = gelu_grad(from_h16(h[i]));
    da[i] = to_h16(from_h16(da[i]) * d);
}

extern "C" __global__ void cast_h16(const float* __restrict__ x, h16* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = to_h16(x[i]);
}

// the 16-bit copy of the weights has a zero gap of `gap` elements at `gap_at` (the head's padding rows)
__device__ __forceinline__ long gapped(long i, long gap_at, long gap) { return i < gap_at ? i : i + gap; }

extern "C" __global__ void cast_h16_gap(const float* __restrict__ x, h16* __restrict__ y, long n, long gap_at,
                                       long gap) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[gapped(i, gap_at, gap)] = to_h16(x[i]);
}

// AdamW as above, also refreshing the 16-bit copy of the weights that the matrix products read: of
// w[lo, hi) (the copy's gap at gap_at counted from lo; in fp8 the head alone, the rest read as fp8)
extern "C" __global__ void adamw_h16(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m,
                                      float* __restrict__ v, const unsigned char* __restrict__ decay,
                                      h16* __restrict__ wb, long gap_at, long gap, long lo, long hi, float gscale,
                                      float lr, float beta1, float beta2, float eps, float wd, float bc1, float bc2,
                                      long n, const double* __restrict__ ctrl, int decay_shift) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (!controlled(ctrl, gscale, bc1, bc2)) return;
    if (i < n) {
        float nw = adamw_update(i, w, g, m, v, decay, decay_shift, gscale, lr, beta1, beta2, eps, wd, bc1, bc2);
        if (i >= lo && i < hi) wb[gapped(i - lo, gap_at, gap)] = to_h16(nw);
    }
}

// ---- vectorised 16-bit GELU (8 elements per thread; n a multiple of 8), tanh on the SFU: the
// approximation's error (~2^-11 relative) is below the 16-bit rounding of the result.
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

extern "C" __global__ void gelu_fwd_h16x8(const uint4* __restrict__ h, uint4* __restrict__ a, long n8) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float x[8], y[8];
    unpack8(h[i], x);
#pragma unroll
    for (int k = 0; k < 8; k++) y[k] = 0.5f * x[k] * (1.f + tanh_approx(GELU_C * (x[k] + 0.044715f * x[k] * x[k] * x[k])));
    a[i] = pack8(y);
}

extern "C" __global__ void gelu_bwd_h16x8(const uint4* __restrict__ h, uint4* __restrict__ da, long n8) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float x[8], g[8];
    unpack8(h[i], x);
    unpack8(da[i], g);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float u = x[k] * x[k];
        float t = tanh_approx(GELU_C * x[k] * (1.f + 0.044715f * u));
        g[k] *= 0.5f * (1.f + t) + 0.5f * x[k] * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
    }
    da[i] = pack8(g);
}

// The 16-bit modes' MLP backward in one pass over h: a = gelu(h) recomputed (the dW2 product's
// operand: the forward does not keep it) and da *= gelu'(h) in place, sharing the one tanh.
extern "C" __global__ void gelu_bwd_recompute_h16x8(const uint4* __restrict__ h, uint4* __restrict__ da,
                                                    uint4* __restrict__ a, long n8) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n8) return;
    float x[8], g[8], y[8];
    unpack8(h[i], x);
    unpack8(da[i], g);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float u = x[k] * x[k];
        float t = tanh_approx(GELU_C * (x[k] + 0.044715f * x[k] * x[k] * x[k]));  // as gelu_fwd_h16x8
        y[k] = 0.5f * x[k] * (1.f + t);
        g[k] *= 0.5f * (1.f + t) + 0.5f * x[k] * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
    }
    a[i] = pack8(y);
    da[i] = pack8(g);
}
