// Generation with a key/value cache, in the 16-bit modes: the kernels of one decoding step, which
// read the position from device memory so that the step can be captured once as a CUDA graph and
// replayed for every new token (andrea/engine/cupy/decode.py).
//
// Layouts: qkv [B, n, 3, H, D] (the q/k/v projection's output), caches [B, H, T_max, D], y [B, n, H·D],
// all 16-bit; pos: one int32 on the device, the position of the chunk's first token.
#include "common.cuh"

// out[b, t] = wte[tok[b, t]] + wpe[pos + t] (fp32: the residual stream)
extern "C" __global__ void embed_at(const int* __restrict__ tok, const float* __restrict__ wte,
                                    const float* __restrict__ wpe, const int* __restrict__ pos,
                                    float* __restrict__ out, int N, int T, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)N * C) return;
    int row = i / C, c = i % C;
    out[i] = wte[(long)tok[row] * C + c] + wpe[(long)(pos[0] + row % T) * C + c];
}

// the chunk's keys and values into the caches at [pos, pos + n)
extern "C" __global__ void kv_store(const h16* __restrict__ qkv, h16* __restrict__ kc, h16* __restrict__ vc,
                                    const int* __restrict__ pos, int B, int n, int H, int D, int T_max) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)B * n * H * D) return;
    int d = i % D, h = (i / D) % H, t = (i / ((long)D * H)) % n, b = i / ((long)D * H * n);
    const h16* src = qkv + (((long)b * n + t) * 3 * H + h) * D + d;  // the k part; v is H·D further on
    long dst = (((long)b * H + h) * T_max + pos[0] + t) * D + d;
    kc[dst] = src[(long)H * D];
    vc[dst] = src[2L * H * D];
}

// the position after this step's tokens
extern "C" __global__ void advance(int* pos, int n) {
    if (blockIdx.x == 0 && threadIdx.x == 0) pos[0] += n;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    return v;
}

// One new query per row (n = 1) at position pos, attending over the cached keys 0..pos (its own
// key stored already by kv_store). One block per (b, h). Each thread scores whole keys (D/8 16-byte
// loads in flight: a key's latency is paid once per round of blockDim keys, not once per element),
// the scores stay in shared memory, and `parts` groups of D threads split the keys for the
// weighted sum of the values (consecutive threads read consecutive elements of a value row).
// Dynamic shared memory: (D + T_max + parts·D) floats. D a multiple of 8. Every sum runs in a
// fixed order: deterministic.
extern "C" __global__ void attn_decode(const h16* __restrict__ qkv, const h16* __restrict__ kc,
                                       const h16* __restrict__ vc, h16* __restrict__ y,
                                       const int* __restrict__ pos_p, int H, int D, int T_max, int parts,
                                       float scale) {
    extern __shared__ float sm[];
    float* q = sm;                // [D], scaled
    float* s = sm + D;            // [T_max]: scores, then probabilities
    float* part = s + T_max;      // [parts, D]
    __shared__ float red[32];
    __shared__ float total[2];
    const int b = blockIdx.x / H, h = blockIdx.x % H, pos = pos_p[0];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const h16* K = kc + ((long)b * H + h) * T_max * D;
    const h16* V = vc + ((long)b * H + h) * T_max * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) q[d] = from_h16(qkv[(long)b * 3 * H * D + h * D + d]) * scale;
    __syncthreads();
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= pos; j += blockDim.x) {
        const uint4* kj = reinterpret_cast<const uint4*>(K + (long)j * D);
        float acc = 0.f;
        for (int c = 0; c < D / 8; c++) {
            uint4 u = kj[c];
            const h16x2* hv = reinterpret_cast<const h16x2*>(&u);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float2 f = unpack_h16x2(hv[e]);
                acc += q[c * 8 + 2 * e] * f.x + q[c * 8 + 2 * e + 1] * f.y;
            }
        }
        s[j] = acc;
        mx = fmaxf(mx, acc);
    }
    mx = warp_max(mx);
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = red[0];
        for (int w = 1; w < warps; w++) m = fmaxf(m, red[w]);
        total[0] = m;
    }
    __syncthreads();
    const float m = total[0];
    float sum = 0.f;
    for (int j = threadIdx.x; j <= pos; j += blockDim.x) {
        float p = __expf(s[j] - m);
        s[j] = p;
        sum += p;
    }
    sum = warp_sum(sum);
    __syncthreads();  // every warp has read red[] (the maximum) before it is reused
    if (lane == 0) red[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int w = 0; w < warps; w++) t += red[w];
        total[1] = t;
    }
    __syncthreads();
    const int d = threadIdx.x % D, k = threadIdx.x / D;
    if (k < parts) {
        float acc = 0.f;
#pragma unroll 8
        for (int j = k; j <= pos; j += parts) acc += s[j] * from_h16(V[(long)j * D + d]);
        part[k * D + d] = acc;
    }
    __syncthreads();
    if (threadIdx.x < D) {
        float acc = 0.f;
        for (int p = 0; p < parts; p++) acc += part[p * D + threadIdx.x];
        y[(long)b * H * D + h * D + threadIdx.x] = to_h16(acc / total[1]);
    }
}
