// The fp8 mode's casts (andrea/engine/cupy/fp8.py; the recipe and its NumPy reference: andrea/fp8.py).
//
// A "site" is one tensor role of one product (the activations entering layer 3's q/k/v product, the
// gradient leaving its MLP, ...). Each has, on the device: amax_now (the largest magnitude cast
// since the last update; -1: none), a history of the last FP8_HISTORY amaxes, its scale s (a power
// of two: x·s is cast, the product multiplies by inv = 1/s) and counts (values, overflows,
// underflows). fp8_update runs once per pass, before its first cast: it moves each site's
// amax_now into its history and sets the scale from the history's largest (delayed scaling), all
// on the device, so a captured pass replays it.
//
// fp8_cast_<in>_<fmt> casts a [rows, cols] matrix (row stride ldx, cols and rows multiples of 8)
// in tiles of 64 x 64: into q [rows, cols] (row stride ldq) and/or its transpose qt [cols, rows]
// (row stride ldqt), either may be null. Rounding is to nearest even with saturation to ±max
// (cvt.rn.satfinite), as the reference clips then rounds. `record`: the tile's amax joins
// amax_now; `count`: values, overflows (|x·s| > max) and underflows (x ≠ 0 cast to 0) are counted.
// The _gelu versions read h and cast a = gelu(h) rounded to 16 bits, the very value the backward
// pass recomputes (gelu_bwd_recompute_h16x8), so the backward's cast of a is the forward's, bit for bit.
#include "elementwise.cu"

#define FP8_HISTORY 16
#define FP8_E4M3 0
#define FP8_E5M2 1

template <int FMT> struct Fp8Max;
template <> struct Fp8Max<FP8_E4M3> { static constexpr float value = 448.f; };
template <> struct Fp8Max<FP8_E5M2> { static constexpr float value = 57344.f; };

// two floats to two fp8 bytes (lo in the low byte), round to nearest even, saturating
template <int FMT> __device__ __forceinline__ unsigned short cvt2(float lo, float hi);
template <> __device__ __forceinline__ unsigned short cvt2<FP8_E4M3>(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ unsigned short cvt2<FP8_E5M2>(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

template <typename In> __device__ __forceinline__ void load8(const In* p, float v[8]);
template <> __device__ __forceinline__ void load8<float>(const float* p, float v[8]) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
template <> __device__ __forceinline__ void load8<h16>(const h16* p, float v[8]) {
    unpack8(*reinterpret_cast<const uint4*>(p), v);
}

__device__ __forceinline__ float gelu_h16(float x) {  // as gelu_fwd_h16x8 and gelu_bwd_recompute_h16x8
    return from_h16(to_h16(0.5f * x * (1.f + tanh_approx(GELU_C * (x + 0.044715f * x * x * x)))));
}

template <typename In, int FMT, bool GELU>
__device__ void cast_tile(const In* __restrict__ x, long ldx, unsigned char* __restrict__ q, long ldq,
                          unsigned char* __restrict__ qt, long ldqt, int rows, int cols, int site,
                          const float* __restrict__ scale, float* __restrict__ amax_now,
                          unsigned long long* __restrict__ counts, int record, int count) {
    __shared__ unsigned char tile[64][64 + 8];
    __shared__ float wmax[8];
    __shared__ unsigned wcnt[8][3];
    const float s = scale[site], fmax = Fp8Max<FMT>::value;
    const int row0 = blockIdx.y * 64, col0 = blockIdx.x * 64;
    float m = 0.f;
    unsigned n_val = 0, n_over = 0, n_under = 0;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = threadIdx.x + 256 * i, r = c / 8, cc = (c % 8) * 8;
        const int row = row0 + r, col = col0 + cc;
        if (row < rows && col < cols) {
            float v[8];
            load8<In>(x + (long)row * ldx + col, v);
            unsigned short b[4];
#pragma unroll
            for (int k = 0; k < 8; k++) {
                if (GELU) v[k] = gelu_h16(v[k]);
                m = fmaxf(m, fabsf(v[k]));
            }
#pragma unroll
            for (int k = 0; k < 4; k++) b[k] = cvt2<FMT>(v[2 * k] * s, v[2 * k + 1] * s);
            if (count) {
                n_val += 8;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    const unsigned char byte = (b[k / 2] >> (8 * (k % 2))) & 0xFF;
                    n_over += fabsf(v[k] * s) > fmax;
                    n_under += v[k] != 0.f && (byte & 0x7F) == 0;
                }
            }
            const uint2 packed = make_uint2(b[0] | ((unsigned)b[1] << 16), b[2] | ((unsigned)b[3] << 16));
            if (q) *reinterpret_cast<uint2*>(q + (long)row * ldq + col) = packed;
            if (qt) *reinterpret_cast<uint2*>(&tile[r][cc]) = packed;
        }
    }
    if (qt) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = threadIdx.x + 256 * i, j = c / 8, r8 = (c % 8) * 8;  // output row col0 + j, input rows r8..r8+7
            if (col0 + j < cols && row0 + r8 < rows) {
                unsigned lo = 0, hi = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) lo |= (unsigned)tile[r8 + k][j] << (8 * k);
#pragma unroll
                for (int k = 0; k < 4; k++) hi |= (unsigned)tile[r8 + 4 + k][j] << (8 * k);
                *reinterpret_cast<uint2*>(qt + (long)(col0 + j) * ldqt + row0 + r8) = make_uint2(lo, hi);
            }
        }
    }
    if (!record && !count) return;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
        n_val += __shfl_xor_sync(0xffffffff, n_val, o);
        n_over += __shfl_xor_sync(0xffffffff, n_over, o);
        n_under += __shfl_xor_sync(0xffffffff, n_under, o);
    }
    if (lane == 0) {
        wmax[warp] = m;
        wcnt[warp][0] = n_val;
        wcnt[warp][1] = n_over;
        wcnt[warp][2] = n_under;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) {
            m = fmaxf(m, wmax[w]);
            n_val += wcnt[w][0];
            n_over += wcnt[w][1];
            n_under += wcnt[w][2];
        }
        // magnitudes are >= 0, so their bit patterns order as ints; amax_now starts at -1.0f (negative)
        if (record) atomicMax(reinterpret_cast<int*>(amax_now + site), __float_as_int(m));
        if (count) {
            atomicAdd(counts + 3 * site, (unsigned long long)n_val);
            if (n_over) atomicAdd(counts + 3 * site + 1, (unsigned long long)n_over);
            if (n_under) atomicAdd(counts + 3 * site + 2, (unsigned long long)n_under);
        }
    }
}

#define FP8_CAST(name, In, FMT, GELU)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) name(                                                  \
        const In* __restrict__ x, long ldx, unsigned char* __restrict__ q, long ldq, unsigned char* __restrict__ qt, \
        long ldqt, int rows, int cols, int site, const float* __restrict__ scale, float* __restrict__ amax_now, \
        unsigned long long* __restrict__ counts, int record, int count) {                                   \
        cast_tile<In, FMT, GELU>(x, ldx, q, ldq, qt, ldqt, rows, cols, site, scale, amax_now, counts, record, count); \
    }
FP8_CAST(fp8_cast_f32_e4m3, float, FP8_E4M3, false)
FP8_CAST(fp8_cast_h16_e4m3, h16, FP8_E4M3, false)
FP8_CAST(fp8_cast_h16_e5m2, h16, FP8_E5M2, false)
FP8_CAST(fp8_cast_h16_e4m3_gelu, h16, FP8_E4M3, true)

// the scale from an amax (a power of two: amax·s <= max < amax·2s); 1 when there is nothing to go on
__device__ __forceinline__ float scale_for(float amax, float fmax) {
    if (!(amax > 0.f) || isinf(amax)) return 1.f;
    return (float)exp2(floor(log2((double)fmax / (double)amax)));
}

// once per pass, before its casts: amax_now into the history (sites cast since the last update),
// the scale from the history's largest amax
extern "C" __global__ void fp8_update(float* __restrict__ amax_now, float* __restrict__ hist, float* __restrict__ scale,
                                      float* __restrict__ inv, const float* __restrict__ fmax, int n_sites) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_sites) return;
    float* h = hist + (long)s * FP8_HISTORY;
    const float a = amax_now[s];
    if (a >= 0.f) {
        for (int i = 0; i + 1 < FP8_HISTORY; i++) h[i] = h[i + 1];
        h[FP8_HISTORY - 1] = a;
        amax_now[s] = -1.f;
    }
    float m = 0.f;
    for (int i = 0; i < FP8_HISTORY; i++) m = fmaxf(m, h[i]);
    const float sc = scale_for(m, fmax[s]);
    scale[s] = sc;
    inv[s] = 1.f / sc;
}

// a site's first cast, which has no history yet: the scale from its own amax (just recorded by a
// cast with record only), as the reference does
extern "C" __global__ void fp8_scale_from_now(const float* __restrict__ amax_now, float* __restrict__ scale,
                                              float* __restrict__ inv, const float* __restrict__ fmax, int site) {
    const float sc = scale_for(amax_now[site], fmax[site]);
    scale[site] = sc;
    inv[site] = 1.f / sc;
}
