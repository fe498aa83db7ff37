// Generation with a key/value cache, in the 16-bit modes: the kernels of one decoding step, which
// read the position from device memory so that the step can be captured once as a CUDA graph and
// replayed for every new token (andrea/engine/cupy/decode.py).
//
// Layouts: qkv [B, n, 3, H, D] (the q/k/v projection's output), caches [B, H, T_max, D], y [B, n, H·D],
// all 16-bit; pos: one int32 on the device, the position of the chunk's first token.
#include "common.cuh"

// out[b, t] = wte[tok[b, t]] + wpe[pos + t]: the residual stream, fp32 (embed_at) or 16-bit (embed_at_h16)
extern "C" __global__ void embed_at(const int* tok, const float* wte, const float* wpe, const int* pos, float* out, int N,
                                    int T, int C) {
    embed_rows(tok, wte, wpe, pos[0], out, N, T, C);
}

extern "C" __global__ void embed_at_h16(const int* tok, const float* wte, const float* wpe, const int* pos, h16* out,
                                        int N, int T, int C) {
    embed_rows(tok, wte, wpe, pos[0], out, N, T, C);
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

// attn_decode with the key/value store fused in and the keys split across warps: one block of
// DEC_WARPS warps per (b, h). The new key and value are read from qkv (and stored into the caches
// here, so kv_store is not launched); warp w takes the keys in groups of DEC_KEYS consecutive ones,
// w·DEC_KEYS, w·DEC_KEYS + DEC_WARPS·DEC_KEYS, ..., with their loads in flight together, lane l
// holding elements l·E .. l·E + E − 1 of each (D = 32·E), and keeps an online softmax (its running
// maximum, sum and weighted values). The warps' partials are then combined in warp order. No
// scores in shared memory (any context length), no atomics: deterministic. attn_decode, whose
// block runs one chain of loads and reductions over all the keys, took 10 us a call at ANDREA-120M
// with one row (bench/decode_profile.py).
#define DEC_WARPS 16
#define DEC_KEYS 8

template <int E>
__device__ __forceinline__ void load_e(const h16* __restrict__ p, float (&out)[E]) {
    if constexpr (E == 1) {
        out[0] = from_h16(p[0]);
    } else if constexpr (E == 2) {
        float2 f = unpack_h16x2(*reinterpret_cast<const h16x2*>(p));
        out[0] = f.x;
        out[1] = f.y;
    } else {
        uint2 u = *reinterpret_cast<const uint2*>(p);  // E == 4: 8 bytes
        const h16x2* hv = reinterpret_cast<const h16x2*>(&u);
        float2 a = unpack_h16x2(hv[0]), c = unpack_h16x2(hv[1]);
        out[0] = a.x; out[1] = a.y; out[2] = c.x; out[3] = c.y;
    }
}

template <int E>
__device__ void attn_decode_warps(const h16* __restrict__ qkv, h16* __restrict__ kc, h16* __restrict__ vc,
                                  h16* __restrict__ y, const int* __restrict__ pos_p, int H, int T_max, float scale) {
    constexpr int D = 32 * E;
    __shared__ float wm[DEC_WARPS], wl[DEC_WARPS];
    __shared__ float wacc[DEC_WARPS][D];
    const int b = blockIdx.x / H, h = blockIdx.x % H, pos = pos_p[0];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const h16* qn = qkv + (long)b * 3 * H * D + h * D;  // qkv [B, 1, 3, H, D]
    const h16* kn = qn + (long)H * D;
    const h16* vn = kn + (long)H * D;
    h16* K = kc + ((long)b * H + h) * T_max * D;
    h16* V = vc + ((long)b * H + h) * T_max * D;
    if (threadIdx.x < D) {  // the new key and value into the caches (read below from qkv, not from there)
        K[(long)pos * D + threadIdx.x] = kn[threadIdx.x];
        V[(long)pos * D + threadIdx.x] = vn[threadIdx.x];
    }
    float q[E];
    load_e<E>(qn + lane * E, q);
#pragma unroll
    for (int e = 0; e < E; e++) q[e] *= scale;
    float m = -INFINITY, l = 0.f, acc[E];
#pragma unroll
    for (int e = 0; e < E; e++) acc[e] = 0.f;
    for (int j0 = warp * DEC_KEYS; j0 <= pos; j0 += DEC_WARPS * DEC_KEYS) {
        float s[DEC_KEYS], v[DEC_KEYS][E];
#pragma unroll
        for (int u = 0; u < DEC_KEYS; u++) {
            const int j = j0 + u;
            float k[E];
            if (j <= pos) {
                load_e<E>((j == pos ? kn : K + (long)j * D) + lane * E, k);
                load_e<E>((j == pos ? vn : V + (long)j * D) + lane * E, v[u]);
            } else {
#pragma unroll
                for (int e = 0; e < E; e++) k[e] = v[u][e] = 0.f;
            }
            float dot = 0.f;
#pragma unroll
            for (int e = 0; e < E; e++) dot += q[e] * k[e];
            s[u] = dot;
        }
        float top = m;
#pragma unroll
        for (int u = 0; u < DEC_KEYS; u++) {
            s[u] = warp_sum(s[u]);
            if (j0 + u <= pos) top = fmaxf(top, s[u]);
        }
        const float c = __expf(m - top);  // 0 on the first group (m = −inf; top is finite: key j0 exists)
        l *= c;
#pragma unroll
        for (int e = 0; e < E; e++) acc[e] *= c;
#pragma unroll
        for (int u = 0; u < DEC_KEYS; u++) {
            if (j0 + u <= pos) {
                const float p = __expf(s[u] - top);
                l += p;
#pragma unroll
                for (int e = 0; e < E; e++) acc[e] += p * v[u][e];
            }
        }
        m = top;
    }
#pragma unroll
    for (int e = 0; e < E; e++) wacc[warp][lane * E + e] = acc[e];
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    if (threadIdx.x < D) {
        float top = wm[0];  // warp 0 always has key 0
        for (int w = 1; w < DEC_WARPS; w++) top = fmaxf(top, wm[w]);
        float num = 0.f, den = 0.f;
        for (int w = 0; w < DEC_WARPS; w++) {  // a warp without keys: m = −inf, its weight 0
            const float c = __expf(wm[w] - top);
            num += c * wacc[w][threadIdx.x];
            den += c * wl[w];
        }
        y[(long)b * H * D + h * D + threadIdx.x] = to_h16(num / den);
    }
}

// grid B·H, block 32·DEC_WARPS; head size 32·E
extern "C" __global__ void attn_decode_store_e1(const h16* qkv, h16* kc, h16* vc, h16* y, const int* pos, int H,
                                                int T_max, float scale) {
    attn_decode_warps<1>(qkv, kc, vc, y, pos, H, T_max, scale);
}
extern "C" __global__ void attn_decode_store_e2(const h16* qkv, h16* kc, h16* vc, h16* y, const int* pos, int H,
                                                int T_max, float scale) {
    attn_decode_warps<2>(qkv, kc, vc, y, pos, H, T_max, scale);
}
extern "C" __global__ void attn_decode_store_e4(const h16* qkv, h16* kc, h16* vc, h16* y, const int* pos, int H,
                                                int T_max, float scale) {
    attn_decode_warps<4>(qkv, kc, vc, y, pos, H, T_max, scale);
}
