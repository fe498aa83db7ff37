// The fp8 mode's casts (andrea/engine/cupy/fp8.py; the recipe and its NumPy reference: andrea/fp8.py).
//
// A "site" is one tensor role of one product (the activations entering layer 3's q/k/v product, the
// gradient leaving its MLP, ...). Each has, on the device: amax_now (the largest magnitude cast
// since the last update; -1: none), a history of the last FP8_HISTORY amaxes, its scale s (a power
// of two: x·s is cast, the product multiplies by inv = 1/s, kept 16 bytes apart) and counts (values, overflows,
// underflows). fp8_update runs once per pass, before its first cast: it moves each site's
// amax_now into its history and sets the scale from the history's largest (delayed scaling), all
// on the device, so a captured pass replays it. A product whose output is a site's operand (the
// MLP's GELU epilogue, cuBLASLt) reads the scale from lt[8 site] and writes its amax to
// lt[8 site + 4] (both 16-byte aligned, as cuBLASLt needs; -1: none), which fp8_update takes in.
//
// fp8_cast_<in>_<fmt> casts a [rows, cols] matrix (row stride ldx, cols and rows multiples of 8)
// in tiles of 64 x 64, FP8_TILES of them side by side per block (grid: cols / (64 FP8_TILES) by
// rows / 64, rounded up): into q [rows, cols] (row stride ldq) and/or its transpose qt [cols, rows]
// (row stride ldqt), either may be null. Rounding is to nearest even with saturation to ±max
// (cvt.rn.satfinite), as the reference clips then rounds. `record`: the tile's amax joins
// amax_now; `count`: values, overflows (|x·s| > max) and underflows (x ≠ 0 cast to 0) are counted.
// The _gelu versions read h and cast a = gelu(h) rounded to 16 bits, the very value the backward
// pass recomputes (gelu_bwd_recompute_h16x8), so the backward's cast of a is the forward's, bit for
// bit. (They run where the first MLP product's cuBLASLt epilogue cannot make a: that a comes from the
// fp32 product, and the backward's recast differs from it by one e4m3 step in a few values.)
#include "elementwise.cu"
#include "layernorm.cu"

#define FP8_HISTORY 16
#define FP8_TILES 4  // 64 x 64 tiles per block, along the columns: the block's reduction and atomics amortised
#define FP8_INV_STRIDE 4  // inv[site * 4]: cuBLASLt refuses scale pointers that are not 16-byte aligned
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

// what a block's casts saw: the largest magnitude, values, overflows, underflows
struct CastStats {
    float amax = 0.f;
    unsigned values = 0, over = 0, under = 0;
};

// four floats times s to fp8 (packed, the first in the low byte), counted into st
template <int FMT>
__device__ __forceinline__ unsigned cast4(const float v[4], float s, CastStats& st, bool count) {
    unsigned short b[2];
#pragma unroll
    for (int k = 0; k < 4; k++) st.amax = fmaxf(st.amax, fabsf(v[k]));
    b[0] = cvt2<FMT>(v[0] * s, v[1] * s);
    b[1] = cvt2<FMT>(v[2] * s, v[3] * s);
    const unsigned w = b[0] | ((unsigned)b[1] << 16);
    if (count) {
        st.values += 4;
        // underflows: bytes whose magnitude (low 7 bits) is 0 from values that were not. Adding 0x7F
        // to each magnitude (no carry between bytes: at most 0xFE) sets its top bit unless it was 0.
        const unsigned zero_bytes = ~((w & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & 0x80808080u;
        unsigned nonzero = 0;  // the top bit of byte k: v[k] != 0
#pragma unroll
        for (int k = 0; k < 4; k++) {
            st.over += fabsf(v[k] * s) > Fp8Max<FMT>::value;
            nonzero |= (v[k] != 0.f ? 0x80u : 0u) << (8 * k);
        }
        st.under += __popc(zero_bytes & nonzero);
    }
    return w;
}

// eight values times s to fp8 (packed), counted into st
template <int FMT>
__device__ __forceinline__ uint2 cast8(const float v[8], float s, CastStats& st, bool count) {
    return make_uint2(cast4<FMT>(v, s, st, count), cast4<FMT>(v + 4, s, st, count));
}

// rows r8..r8+7 of column j of a tile of bytes (row stride ld), packed as 8 bytes (row r8 lowest):
// a stretch of a row of the tile's transpose
__device__ __forceinline__ uint2 tile_column8(const unsigned char* __restrict__ tile, int ld, int r8, int j) {
    unsigned lo = 0, hi = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) lo |= (unsigned)tile[(r8 + k) * ld + j] << (8 * k);
#pragma unroll
    for (int k = 0; k < 4; k++) hi |= (unsigned)tile[(r8 + 4 + k) * ld + j] << (8 * k);
    return make_uint2(lo, hi);
}

// a 64 x 64 tile of bytes (tile[r][c]: input row r, column c) to qt [cols, rows] (row stride ldqt)
__device__ __forceinline__ void store_transposed(const unsigned char (*tile)[64 + 8], unsigned char* __restrict__ qt,
                                                 long ldqt, int row0, int col0, int rows, int cols) {
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int c = threadIdx.x + 256 * i, j = c / 8, r8 = (c % 8) * 8;  // output row col0 + j, input rows r8..r8+7
        if (col0 + j < cols && row0 + r8 < rows)
            *reinterpret_cast<uint2*>(qt + (long)(col0 + j) * ldqt + row0 + r8) = tile_column8(tile[0], 64 + 8, r8, j);
    }
}

// the block's stats into the site's amax_now (record) and counts (count); every thread calls it
__device__ __forceinline__ void block_record(CastStats st, int site, float* __restrict__ amax_now,
                                             unsigned long long* __restrict__ counts, int record, int count) {
    __shared__ float wmax[8];
    __shared__ unsigned wcnt[8][3];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o >>= 1) {
        st.amax = fmaxf(st.amax, __shfl_xor_sync(0xffffffff, st.amax, o));
        st.values += __shfl_xor_sync(0xffffffff, st.values, o);
        st.over += __shfl_xor_sync(0xffffffff, st.over, o);
        st.under += __shfl_xor_sync(0xffffffff, st.under, o);
    }
    if (lane == 0) {
        wmax[warp] = st.amax;
        wcnt[warp][0] = st.values;
        wcnt[warp][1] = st.over;
        wcnt[warp][2] = st.under;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) {
            st.amax = fmaxf(st.amax, wmax[w]);
            st.values += wcnt[w][0];
            st.over += wcnt[w][1];
            st.under += wcnt[w][2];
        }
        // magnitudes are >= 0, so their bit patterns order as ints; amax_now starts at -1.0f (negative)
        if (record) atomicMax(reinterpret_cast<int*>(amax_now + site), __float_as_int(st.amax));
        if (count) {
            atomicAdd(counts + 3 * site, (unsigned long long)st.values);
            if (st.over) atomicAdd(counts + 3 * site + 1, (unsigned long long)st.over);
            if (st.under) atomicAdd(counts + 3 * site + 2, (unsigned long long)st.under);
        }
    }
}

// block (bx, by) of a cast's grid
template <typename In, int FMT, bool GELU>
__device__ void cast_tile(int bx, int by, const In* __restrict__ x, long ldx, unsigned char* __restrict__ q, long ldq,
                          unsigned char* __restrict__ qt, long ldqt, int rows, int cols, int site,
                          const float* __restrict__ scale, float* __restrict__ amax_now,
                          unsigned long long* __restrict__ counts, int record, int count) {
    __shared__ unsigned char tile[64][64 + 8];
    const float s = scale[site];
    const int row0 = by * 64;
    CastStats st;
    for (int ct = 0; ct < FP8_TILES; ct++) {  // block-uniform: every thread reaches the barriers
        const int col0 = (bx * FP8_TILES + ct) * 64;
        if (col0 >= cols) break;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = threadIdx.x + 256 * i, r = c / 8, cc = (c % 8) * 8;
            const int row = row0 + r, col = col0 + cc;
            if (row < rows && col < cols) {
                float v[8];
                load8<In>(x + (long)row * ldx + col, v);
                if (GELU) {
#pragma unroll
                    for (int k = 0; k < 8; k++) v[k] = gelu_h16(v[k]);
                }
                const uint2 packed = cast8<FMT>(v, s, st, count);
                if (q) *reinterpret_cast<uint2*>(q + (long)row * ldq + col) = packed;
                if (qt) *reinterpret_cast<uint2*>(&tile[r][cc]) = packed;
            }
        }
        if (qt) {
            __syncthreads();
            store_transposed(tile, qt, ldqt, row0, col0, rows, cols);
            __syncthreads();  // the tile is written again by the next column tile
        }
    }
    if (record || count) block_record(st, site, amax_now, counts, record, count);
}

#define FP8_CAST(name, In, FMT, GELU)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) name(                                                  \
        const In* __restrict__ x, long ldx, unsigned char* __restrict__ q, long ldq, unsigned char* __restrict__ qt, \
        long ldqt, int rows, int cols, int site, const float* __restrict__ scale, float* __restrict__ amax_now, \
        unsigned long long* __restrict__ counts, int record, int count) {                                   \
        cast_tile<In, FMT, GELU>(blockIdx.x, blockIdx.y, x, ldx, q, ldq, qt, ldqt, rows, cols, site, scale, amax_now, \
                                 counts, record, count);                                                       \
    }
FP8_CAST(fp8_cast_f32_e4m3, float, FP8_E4M3, false)
FP8_CAST(fp8_cast_h16_e4m3, h16, FP8_E4M3, false)
FP8_CAST(fp8_cast_h16_e5m2, h16, FP8_E5M2, false)
FP8_CAST(fp8_cast_h16_e4m3_gelu, h16, FP8_E4M3, true)

// Every fp32 weight cast of a pass in one launch (fp8_cast_f32_e4m3 per weight, recorded and
// counted, is 72 launches of a few dozen blocks at ANDREA-120M: 0.74 ms a step). Job j casts
// x_j [rows, cols] into q_j and qt_j: ptr[6 j ..] = x, ldx, q, ldq, qt, ldqt (pointers and row
// strides in elements), job[5 j ..] = rows, cols, site, its first block, its blocks along the
// columns; jobs in the order of their first blocks, block b takes the last job starting at or
// before it.
extern "C" __global__ void __launch_bounds__(256) fp8_cast_f32_e4m3_jobs(
    const long long* __restrict__ ptr, const int* __restrict__ job, int n_jobs, const float* __restrict__ scale,
    float* __restrict__ amax_now, unsigned long long* __restrict__ counts) {
    int lo = 0, hi = n_jobs - 1;  // binary search: the last job whose first block is <= blockIdx.x
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (job[5 * mid + 3] <= (int)blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    const int* J = job + 5 * lo;
    const long long* P = ptr + 6 * lo;
    const int local = blockIdx.x - J[3];
    cast_tile<float, FP8_E4M3, false>(local % J[4], local / J[4], reinterpret_cast<const float*>(P[0]), P[1],
                                      reinterpret_cast<unsigned char*>(P[2]), P[3],
                                      reinterpret_cast<unsigned char*>(P[4]), P[5], J[0], J[1], J[2], scale,
                                      amax_now, counts, 1, 1);
}

// The fp8 MLP backward's one pass over h and da (a's gradient, [rows, cols] contiguous, 16-bit):
// dh = da·gelu'(h) cast to e5m2 into dq and its transpose dqt (site_d: recorded and counted, as
// any gradient's cast), and a = gelu(h) in 16 bits (the cast pass's forward operand; within an e4m3
// step of the epilogue's) cast again to e4m3 at its site's scale into aqt, transposed (the dW2
// product's operand; not recorded, and counted only with count_a: where the forward's cast was the
// product's epilogue, which cannot count).
// dh goes to fp8 from fp32, never stored in 16 bits. Null outputs are skipped (a first cast
// records the amax alone). TILES tiles of 64 x 64 side by side per block (grid: cols / (64 TILES)
// by rows / 64, rounded up): fp8_gelu_bwd_cast one (24,576 blocks at ANDREA-120M B=32, each
// with its reduction and three atomics on the site's counters), fp8_gelu_bwd_cast_tiles FP8_TILES.
template <int TILES>
__device__ void gelu_bwd_cast(const h16* __restrict__ da, const h16* __restrict__ h, int rows, int cols,
                              unsigned char* __restrict__ dq, unsigned char* __restrict__ dqt, int site_d,
                              unsigned char* __restrict__ aqt, int site_a, const float* __restrict__ scale,
                              float* __restrict__ amax_now, unsigned long long* __restrict__ counts, int record,
                              int count, int count_a) {
    __shared__ unsigned char tile_d[64][64 + 8], tile_a[64][64 + 8];
    const float sd = scale[site_d], sa = scale[site_a];
    const int row0 = blockIdx.y * 64;
    CastStats st, st_a;
    for (int ct = 0; ct < TILES; ct++) {  // block-uniform: every thread reaches the barriers
        const int col0 = (blockIdx.x * TILES + ct) * 64;
        if (col0 >= cols) break;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int c = threadIdx.x + 256 * i, r = c / 8, cc = (c % 8) * 8;
            const int row = row0 + r, col = col0 + cc;
            if (row < rows && col < cols) {
                float g[8], x[8], a[8];
                load8<h16>(da + (long)row * cols + col, g);
                load8<h16>(h + (long)row * cols + col, x);
#pragma unroll
                for (int k = 0; k < 8; k++) {  // as gelu_bwd_recompute_h16x8
                    const float u = x[k] * x[k];
                    const float t = tanh_approx(GELU_C * (x[k] + 0.044715f * x[k] * x[k] * x[k]));
                    a[k] = from_h16(to_h16(0.5f * x[k] * (1.f + t)));
                    g[k] *= 0.5f * (1.f + t) + 0.5f * x[k] * (1.f - t * t) * GELU_C * (1.f + 3.f * 0.044715f * u);
                }
                const uint2 pd = cast8<FP8_E5M2>(g, sd, st, count);
                const uint2 pa = cast8<FP8_E4M3>(a, sa, st_a, count_a);
                if (dq) *reinterpret_cast<uint2*>(dq + (long)row * cols + col) = pd;
                *reinterpret_cast<uint2*>(&tile_d[r][cc]) = pd;
                *reinterpret_cast<uint2*>(&tile_a[r][cc]) = pa;
            }
        }
        __syncthreads();
        if (dqt) store_transposed(tile_d, dqt, rows, row0, col0, rows, cols);
        if (aqt) store_transposed(tile_a, aqt, rows, row0, col0, rows, cols);
        __syncthreads();  // the tiles are written again by the next column tile
    }
    if (record || count) block_record(st, site_d, amax_now, counts, record, count);
    if (count_a) {
        __syncthreads();  // block_record's shared sums are read by thread 0 before they are written again
        block_record(st_a, site_a, amax_now, counts, 0, 1);
    }
}

#define FP8_GELU_BWD_CAST(name, TILES)                                                                         \
    extern "C" __global__ void __launch_bounds__(256) name(                                                  \
        const h16* __restrict__ da, const h16* __restrict__ h, int rows, int cols, unsigned char* __restrict__ dq, \
        unsigned char* __restrict__ dqt, int site_d, unsigned char* __restrict__ aqt, int site_a,              \
        const float* __restrict__ scale, float* __restrict__ amax_now, unsigned long long* __restrict__ counts, \
        int record, int count, int count_a) {                                                                 \
        gelu_bwd_cast<TILES>(da, h, rows, cols, dq, dqt, site_d, aqt, site_a, scale, amax_now, counts, record, count, \
                             count_a);                                                                        \
    }
FP8_GELU_BWD_CAST(fp8_gelu_bwd_cast, 1)
FP8_GELU_BWD_CAST(fp8_gelu_bwd_cast_tiles, FP8_TILES)

// A LayerNorm whose output feeds an fp8 product (andrea/engine/cupy/fp8.py layernorm_fwd): res = x + f
// (f 16-bit; null: none, and res null: not written) and LayerNorm(res), computed as
// add_layernorm_vec does (the same sums, the same 16-bit rounding of the output), then cast to e4m3
// at the site's scale as fp8_cast_h16_e4m3 casts that 16-bit output: into q [N, C] (the forward
// product's operand; null: not written) and its transpose qt [C, N] (the weight gradient's, kept
// for the backward pass instead of the 16-bit output; null: not written), recorded and counted as
// a cast. The 16-bit output is never stored. A block of 8 warps takes LN_FP8_ROWS rows (a warp a
// row at a time, in registers) into a shared tile of bytes, then writes the tile's columns as rows
// of qt (LN_FP8_ROWS bytes each: whole 32-byte sectors). C a multiple of 4, at most 128 NV; N a
// multiple of 8 (qt's stores are 8 rows at a time; the host checks).
#define LN_FP8_ROWS 32

template <int NV, typename X = float>
__device__ void add_layernorm_fp8(const X* __restrict__ x, const h16* __restrict__ f, X* __restrict__ res,
                                  const float* __restrict__ g, const float* __restrict__ b,
                                  unsigned char* __restrict__ q, unsigned char* __restrict__ qt,
                                  float* __restrict__ mean, float* __restrict__ rstd, int N, int C, float eps,
                                  int site, const float* __restrict__ scale, float* __restrict__ amax_now,
                                  unsigned long long* __restrict__ counts, int record, int count) {
    extern __shared__ __align__(16) unsigned char tile[];  // [LN_FP8_ROWS][C + 4]: rows 4 bytes apart in banks
    const int ld = C + 4;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int row0 = blockIdx.x * LN_FP8_ROWS;
    const float s = scale[site];
    CastStats st;
    for (int rr = warp; rr < LN_FP8_ROWS && row0 + rr < N; rr += 8) {
        const int row = row0 + rr;
        const long off = (long)row * C;
        float4 v[NV];
        float m, r;
        add_ln_row<NV, h16, X>(x, f, res, off, C, eps, lane, v, m, r);
#pragma unroll
        for (int k = 0; k < NV; k++) {
            const int c = (lane + 32 * k) * 4;
            if (c < C) {
                const float4 o = as_stored<h16>(ln_out4(v[k], m, r, g, b, c));
                const float o16[4] = {o.x, o.y, o.z, o.w};  // the 16-bit output, as the bf16 path stores it
                const unsigned packed = cast4<FP8_E4M3>(o16, s, st, count);
                if (q) *reinterpret_cast<unsigned*>(q + off + c) = packed;
                *reinterpret_cast<unsigned*>(tile + rr * ld + c) = packed;
            }
        }
        if (lane == 0) {
            mean[row] = m;
            rstd[row] = r;
        }
    }
    __syncthreads();
    if (qt) {  // column j of the tile, rows r8..r8+7, as 8 bytes of qt's row j
        for (int i = threadIdx.x; i < C * (LN_FP8_ROWS / 8); i += blockDim.x) {
            const int j = i / (LN_FP8_ROWS / 8), r8 = (i % (LN_FP8_ROWS / 8)) * 8;
            if (row0 + r8 < N) *reinterpret_cast<uint2*>(qt + (long)j * N + row0 + r8) = tile_column8(tile, ld, r8, j);
        }
    }
    if (record || count) block_record(st, site, amax_now, counts, record, count);
}

#define LN_FP8(name, NV)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256) name(                                                    \
        const float* x, const h16* f, float* res, const float* g, const float* b, unsigned char* q,           \
        unsigned char* qt, float* mean, float* rstd, int N, int C, float eps, int site, const float* scale,      \
        float* amax_now, unsigned long long* counts, int record, int count) {                                 \
        add_layernorm_fp8<NV>(x, f, res, g, b, q, qt, mean, rstd, N, C, eps, site, scale, amax_now, counts,    \
                              record, count);                                                                 \
    }
LN_FP8(add_layernorm_fp8_1, 1)
LN_FP8(add_layernorm_fp8_2, 2)
LN_FP8(add_layernorm_fp8_3, 3)
LN_FP8(add_layernorm_fp8_4, 4)
LN_FP8(add_layernorm_fp8_6, 6)
LN_FP8(add_layernorm_fp8_8, 8)
LN_FP8(add_layernorm_fp8_12, 12)

// the same over a 16-bit residual stream (x and res 16-bit; andrea/engine/cupy residual_from_env)
#define LN_FP8_R16(name, NV)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) name(                                                    \
        const h16* x, const h16* f, h16* res, const float* g, const float* b, unsigned char* q,               \
        unsigned char* qt, float* mean, float* rstd, int N, int C, float eps, int site, const float* scale,      \
        float* amax_now, unsigned long long* counts, int record, int count) {                                 \
        add_layernorm_fp8<NV, h16>(x, f, res, g, b, q, qt, mean, rstd, N, C, eps, site, scale, amax_now, counts, \
                                   record, count);                                                            \
    }
LN_FP8_R16(add_layernorm_fp8_r16_1, 1)
LN_FP8_R16(add_layernorm_fp8_r16_2, 2)
LN_FP8_R16(add_layernorm_fp8_r16_3, 3)
LN_FP8_R16(add_layernorm_fp8_r16_4, 4)
LN_FP8_R16(add_layernorm_fp8_r16_6, 6)
LN_FP8_R16(add_layernorm_fp8_r16_8, 8)
LN_FP8_R16(add_layernorm_fp8_r16_12, 12)

// The one-pass LayerNorm backward (layernorm.cu layernorm_bwd_fused) whose 16-bit copy of dx is the
// gradient an fp8 product reads (the residual branch's: the attention output's and the second MLP
// product's): instead of that copy, dx rounded to 16 bits is cast to e5m2 at the site's scale (as
// fp8_cast_h16_e5m2 casts the copy) into q [N, C] and, through a tile of bytes in shared memory
// after the warps' sums, its transpose qt [C, N]; recorded and counted as a gradient's cast. The
// 16-bit copy is never stored.
struct Fp8GradCast {
    unsigned char* __restrict__ q;
    unsigned char* __restrict__ qt;
    unsigned char* __restrict__ tile;  // [rows][C + 4]
    int ld;
    float s;
    int count;
    CastStats st;
    __device__ __forceinline__ void row(int local, long off, int c, float4 v) {
        const float4 r = as_stored<h16>(v);
        const float v16[4] = {r.x, r.y, r.z, r.w};
        const unsigned packed = cast4<FP8_E5M2>(v16, s, st, count);
        if (q) *reinterpret_cast<unsigned*>(q + off + c) = packed;
        *reinterpret_cast<unsigned*>(tile + local * ld + c) = packed;
    }
    __device__ __forceinline__ void finish(int r0, int r1, int N, int C) {  // rows r0..r1: whole 8s
        const int chunks = (r1 - r0) / 8;
        if (qt)
            for (int i = threadIdx.x; i < C * chunks; i += blockDim.x) {
                const int j = i / chunks, r8 = (i % chunks) * 8;
                *reinterpret_cast<uint2*>(qt + (long)j * N + r0 + r8) = tile_column8(tile, ld, r8, j);
            }
    }
};

// dynamic shared memory: the warps' sums (LN_WARPS · 2C floats), then the tile (`rows` x (C + 4) bytes)
#define LN_BWD_FP8(name, NV, X)                                                                               \
    extern "C" __global__ void __launch_bounds__(LN_WARPS * 32) name(                                          \
        const h16* dout, const X* x, const float* mean, const float* rstd, const float* g, X* dx,               \
        unsigned char* q, unsigned char* qt, float* partial, int N, int C, int rows, int site,                 \
        const float* scale, float* amax_now, unsigned long long* counts, int record, int count) {             \
        extern __shared__ __align__(16) float lnb_smem[];                                                      \
        Fp8GradCast emit{q, qt, reinterpret_cast<unsigned char*>(lnb_smem + LN_WARPS * 2 * C), C + 4,          \
                         scale[site], count, CastStats()};                                                    \
        layernorm_bwd_fused<NV, h16>(dout, x, mean, rstd, g, dx, emit, partial, N, C, rows);                   \
        if (record || count) block_record(emit.st, site, amax_now, counts, record, count);                    \
    }
LN_BWD_FP8(layernorm_bwd_fused_fp8_1, 1, float)
LN_BWD_FP8(layernorm_bwd_fused_fp8_2, 2, float)
LN_BWD_FP8(layernorm_bwd_fused_fp8_3, 3, float)
LN_BWD_FP8(layernorm_bwd_fused_fp8_4, 4, float)
LN_BWD_FP8(layernorm_bwd_fused_fp8_6, 6, float)
LN_BWD_FP8(layernorm_bwd_fused_fp8_8, 8, float)
// over a 16-bit residual stream: x and dx (the stream's gradient) 16-bit
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_1, 1, h16)
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_2, 2, h16)
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_3, 3, h16)
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_4, 4, h16)
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_6, 6, h16)
LN_BWD_FP8(layernorm_bwd_fused_fp8_r16_8, 8, h16)

// the scale from an amax (a power of two: amax·s <= max < amax·2s); 1 when there is nothing to go on
__device__ __forceinline__ float scale_for(float amax, float fmax) {
    if (!(amax > 0.f) || isinf(amax)) return 1.f;
    return (float)exp2(floor(log2((double)fmax / (double)amax)));
}

// once per pass, before its casts: amax_now (and a product's, lt[8 s + 4]) into the history (sites
// cast since the last update), the scale from the history's largest amax
extern "C" __global__ void fp8_update(float* __restrict__ amax_now, float* __restrict__ hist, float* __restrict__ scale,
                                      float* __restrict__ inv, float* __restrict__ lt, const float* __restrict__ fmax,
                                      int n_sites) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n_sites) return;
    float* h = hist + (long)s * FP8_HISTORY;
    const float a = fmaxf(amax_now[s], lt[2 * FP8_INV_STRIDE * s + FP8_INV_STRIDE]);  // -1: neither
    lt[2 * FP8_INV_STRIDE * s + FP8_INV_STRIDE] = -1.f;
    if (a >= 0.f) {
        if (!isinf(a)) {  // as the reference: a non-finite amax (a step that overflowed) is not recorded
            for (int i = 0; i + 1 < FP8_HISTORY; i++) h[i] = h[i + 1];
            h[FP8_HISTORY - 1] = a;
        }
        amax_now[s] = -1.f;
    }
    float m = 0.f;
    for (int i = 0; i < FP8_HISTORY; i++) m = fmaxf(m, h[i]);
    const float sc = scale_for(m, fmax[s]);
    scale[s] = sc;
    inv[FP8_INV_STRIDE * s] = 1.f / sc;
    lt[2 * FP8_INV_STRIDE * s] = sc;
}

// a site's first cast, which has no history yet: the scale from its own amax (just recorded by a
// cast with record only), as the reference does
extern "C" __global__ void fp8_scale_from_now(const float* __restrict__ amax_now, float* __restrict__ scale,
                                              float* __restrict__ inv, float* __restrict__ lt,
                                              const float* __restrict__ fmax, int site) {
    const float sc = scale_for(amax_now[site], fmax[site]);
    scale[site] = sc;
    inv[FP8_INV_STRIDE * site] = 1.f / sc;
    lt[2 * FP8_INV_STRIDE * site] = sc;
}
