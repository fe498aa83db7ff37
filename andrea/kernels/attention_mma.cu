// Causal flash attention on tensor cores (h16 operands, fp32 accumulation), forward and backward.
//
// FlashAttention-2's schedule with Hopper's warp-level MMA (inline PTX mma.sync.m16n8k16; NVRTC on
// the device cannot include <mma.h>): a block of 4 warps owns 64 query rows (forward, dQ) or 64 key
// rows (dK/dV), 16 per warp; tiles of 64 keys (or queries) stream through shared memory; the scores
// never leave registers, and the probabilities are re-used from the accumulator registers as the A
// operand of the next product (the m16n8 accumulator layout of two neighbouring tiles is the m16k16
// A layout). No T x T matrix exists anywhere. The forward saves the log-sum-exp of each row; the
// backward recomputes the probabilities. dQ and dK/dV are separate kernels, each accumulating in
// registers in a fixed order, so results are deterministic (no atomics).
//
// Layout: q, k, v are [B, T, H, D] views with element strides (sB, sT, sH) (the projection writes
// one [B, T, 3, H, D] buffer, so q, k and v sit at offsets 0, H*D, 2*H*D of each token's row);
// dq, dk, dv use the same strides; y, dy are [B, T, H*D]; lse, delta are [B, H, T], fp32.
// Compiled with -DHEAD_DIM=<D>, D a multiple of 16, at most 64; strides multiples of 8. Tiles sit
// row-major in shared memory (16-byte vector loads, rows padded so fragment reads hit distinct
// banks); operands needed transposed come through ldmatrix .trans.
#include "common.cuh"

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=<head dim>"
#endif
#define D HEAD_DIM
#if D % 16 != 0 || D > 64
#error "HEAD_DIM must be a multiple of 16, at most 64 (the tiles must fit 48 KB of shared memory)"
#endif
#define TILE 64           // query rows per block, keys per tile (and the transpose for dK/dV)
#define WARPS 4           // 16 rows each
#define PAD 8             // 16-bit elements of padding per shared-memory row: conflict-free fragments
#define LDR (D + PAD)     // row-major tile [TILE][D]
#define NT (TILE / 8)     // n8 tiles of scores per warp row strip
#define KD (D / 16)       // k16 chunks of the head dimension
#define ND (D / 8)        // n8 tiles of the head dimension
#define LN2 0.6931471805599453f


__device__ __forceinline__ void mma(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." H16_PTX "." H16_PTX ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
    h16x2 v = pack_h16x2(lo, hi);  // .x (lo) in the low half: element order
    return *reinterpret_cast<unsigned*>(&v);
}

// Accumulators of score tiles 2j and 2j+1 (16 x 8 each) as the A fragment of a 16 x 16 chunk.
__device__ __forceinline__ void acc_to_a(unsigned a[4], const float lo[4], const float hi[4]) {
    a[0] = pack(lo[0], lo[1]);
    a[1] = pack(lo[2], lo[3]);
    a[2] = pack(hi[0], hi[1]);
    a[3] = pack(hi[2], hi[3]);
}

// Four 8 x 8 h16 matrices from shared memory, transposed on the way (ldmatrix .trans): with lane
// l pointing at row (l % 8) of matrix l / 8, register i holds the B fragment half of matrix i.
__device__ __forceinline__ void ldsm_x4_t(unsigned r[4], const h16* p) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// acc[ND] += P · tile: P given as score accumulators [N] (16 rows x 8N columns), tile row-major
// [8N][D] in shared memory (its rows are the k dimension, so the B fragments come through ldmatrix
// .trans)
template <int N = NT>
__device__ __forceinline__ void accumulate(float acc[ND][4], const float p[N][4], const h16* tile, int lane) {
    const int kr = ((lane / 8) & 1) * 8 + lane % 8, nc = (lane / 16) * 8;
#pragma unroll
    for (int kc = 0; kc < N / 2; kc++) {
        unsigned a[4];
        acc_to_a(a, p[2 * kc], p[2 * kc + 1]);
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
            unsigned b[4];
            ldsm_x4_t(b, tile + (kc * 16 + kr) * LDR + n * 8 + nc);
            mma(acc[n], a, b[0], b[1]);
            mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// write a warp's 16 x D accumulator rows (times `mul`) as h16 into a [*, D] view with row stride sT
__device__ __forceinline__ void store_rows(h16* dst, long sT, const float acc[ND][4], int r0, int T, float mul0,
                                           float mul1, int g, int t) {
#pragma unroll
    for (int n = 0; n < ND; n++) {
        int c = n * 8 + 2 * t;
        if (r0 + g < T) *reinterpret_cast<unsigned*>(dst + (r0 + g) * sT + c) = pack(acc[n][0] * mul0, acc[n][1] * mul0);
        if (r0 + g + 8 < T)
            *reinterpret_cast<unsigned*>(dst + (r0 + g + 8) * sT + c) = pack(acc[n][2] * mul1, acc[n][3] * mul1);
    }
}

// delta[b, h, i] = sum_d dy[b, i, h, d] * y[b, i, h, d]: one warp per row, fp32 sums
extern "C" __global__ void flash_delta(const h16* __restrict__ dy, const h16* __restrict__ y,
                                       float* __restrict__ delta, int B, int H, int T) {
    long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // over (b, i, h)
    int lane = threadIdx.x % 32;
    if (row >= (long)B * T * H) return;
    int h = row % H;
    long bi = row / H;
    int i = bi % T, b = bi / T;
    const h16* a = dy + row * D;
    const h16* c = y + row * D;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s += from_h16(a[d]) * from_h16(c[d]);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    if (lane == 0) delta[((long)b * H + h) * T + i] = s;
}

// ---------------------------------------------------------------------------------------------
// Pipelining: the next tile is fetched with cp.async into a second shared-memory buffer while the
// tensor cores work on the current one (global-memory latency hidden even at two or three blocks
// per SM); the block's own rows (q and dy, or k and v) go straight from global memory into their
// fragment registers; B fragments of the score products come through ldmatrix, exponentials from
// ex2.approx, and masks are evaluated on edge tiles only. (The first version of these kernels,
// with synchronous tile loads, is kept for comparison in dev/cuda/attention_mma_sync.cu.)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
    return addr;
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (src is then not read)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Scores of this warp's 16 rows against a tile (s = A · tileᵀ, A given as fragments), the B
// fragments of two n8 tiles fetched by one ldmatrix (x4): a quarter of the shared-memory
// instructions of four 32-bit reads per product.
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const h16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// (N n8 tiles: the first 8N rows of `tile`)
template <int N = NT>
__device__ __forceinline__ void scores_ldsm(float s[N][4], const unsigned a[KD][4], const h16* tile, int lane) {
    const int row = (lane / 16) * 8 + lane % 8, col = ((lane / 8) & 1) * 8;
#pragma unroll
    for (int n = 0; n < N; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KD; kc++)
#pragma unroll
        for (int n = 0; n < N; n += 2) {
            unsigned b[4];
            ldsm_x4(b, tile + (n * 8 + row) * LDR + kc * 16 + col);
            mma(s[n], a[kc], b[0], b[1]);
            mma(s[n + 1], a[kc], b[2], b[3]);
        }
}

// rows [r0, r0 + TILE) of a [*, D] view into a row-major tile, asynchronously (rows >= T: zeros), by
// the block's THREADS threads. When they split a row's 16-byte chunks evenly, each thread copies
// the same chunk of every STEP-th row: one 64-bit address product per call, not one per chunk
// (the integer pipe was the kernels' busiest).
template <int THREADS>
__device__ __forceinline__ void async_rows(h16* s, const h16* src, long sT, int r0, int T) {
    constexpr int per_row = D / 8;
    if constexpr (THREADS % per_row == 0 && TILE % (THREADS / per_row) == 0) {
        constexpr int STEP = THREADS / per_row;
        const int r = threadIdx.x / per_row, c = (threadIdx.x % per_row) * 8;
        const h16* p = src + (long)(r0 + r) * sT + c;
        h16* d = s + r * LDR + c;
        const long ps = (long)STEP * sT;
        if (r0 + TILE <= T) {
#pragma unroll
            for (int i = 0; i < TILE / STEP; i++) cp_async16(d + i * STEP * LDR, p + i * ps, true);
        } else {
#pragma unroll
            for (int i = 0; i < TILE / STEP; i++) {
                bool ok = r0 + r + i * STEP < T;
                cp_async16(d + i * STEP * LDR, ok ? p + i * ps : src, ok);
            }
        }
    } else {
        for (int e = threadIdx.x; e < TILE * per_row; e += THREADS) {
            int r = e / per_row, c = (e % per_row) * 8;
            bool ok = r0 + r < T;
            cp_async16(s + r * LDR + c, src + (ok ? (r0 + r) * sT + c : 0), ok);
        }
    }
}

// the A fragments of a warp's 16 rows straight from global memory (rows >= T: zeros)
__device__ __forceinline__ void global_a(unsigned a[KD][4], const h16* src, long sT, int r0, int T, int g, int t) {
    const unsigned* p0 = reinterpret_cast<const unsigned*>(src + (r0 + g) * sT);
    const unsigned* p1 = reinterpret_cast<const unsigned*>(src + (r0 + g + 8) * sT);
    bool ok0 = r0 + g < T, ok1 = r0 + g + 8 < T;
#pragma unroll
    for (int kc = 0; kc < KD; kc++) {
        a[kc][0] = ok0 ? p0[kc * 8 + t] : 0u;
        a[kc][1] = ok1 ? p1[kc * 8 + t] : 0u;
        a[kc][2] = ok0 ? p0[kc * 8 + 4 + t] : 0u;
        a[kc][3] = ok1 ? p1[kc * 8 + 4 + t] : 0u;
    }
}

#ifndef FLASH_MINB
#define FLASH_MINB 1  // blocks per SM the forward kernel must fit (registers capped to match)
#endif
// The backward kernels score a 64-wide tile in column parts (DQ_SPLIT, DKDV_SPLIT of them), one
// after the other: only one part's scores and score gradients live in registers at a time, so
// fewer registers are needed and DQ_MINB (DKDV_MINB) blocks share an SM (asked of the compiler).
#ifndef DQ_SPLIT
#define DQ_SPLIT 4
#endif
#ifndef DQ_MINB
#define DQ_MINB 4
#endif
#ifndef DKDV_SPLIT
#define DKDV_SPLIT (D >= 64 ? 2 : 4)  // measured on the H200: 2 at D = 64 (-4 %), 4 at D = 32 (-4 %)
#endif
#ifndef DKDV_MINB
#define DKDV_MINB 3
#endif
#ifndef BWD_UNROLL
#define BWD_UNROLL 1  // parts one after the other (unrolled, the compiler interleaves them: more registers)
#endif
constexpr int kBwdUnroll = BWD_UNROLL;
#define DQ_NP (NT / DQ_SPLIT)      // n8 tiles of one part
#define DKDV_NP (NT / DKDV_SPLIT)
#if (NT / DQ_SPLIT) % 2 != 0 || (NT / DKDV_SPLIT) % 2 != 0 || NT % DQ_SPLIT != 0 || NT % DKDV_SPLIT != 0
#error "DQ_SPLIT and DKDV_SPLIT must divide the tile's n8 tiles into parts of an even number"
#endif

// The key and value tiles of the query-side kernels (forward, dQ), double-buffered: kv_first starts
// tile 0; kv_wait, before tile j0 (buffer cur) is used, starts the next one into the other buffer
// and waits for this one.
typedef h16 Tiles[2][TILE * LDR];

template <int THREADS = WARPS * 32>
__device__ __forceinline__ void kv_first(Tiles& Ks, Tiles& Vs, const h16* k, const h16* v, long sT, int T) {
    async_rows<THREADS>(Ks[0], k, sT, 0, T);
    async_rows<THREADS>(Vs[0], v, sT, 0, T);
    cp_async_commit();
}

// (last: the block's last key tile starts at or before it)
template <int THREADS = WARPS * 32>
__device__ __forceinline__ void kv_wait(Tiles& Ks, Tiles& Vs, const h16* k, const h16* v, long sT, int T, int j0,
                                        int last, int cur) {
    if (j0 + TILE <= last) {  // fetch the next tile while this one is used
        async_rows<THREADS>(Ks[cur ^ 1], k, sT, j0 + TILE, T);
        async_rows<THREADS>(Vs[cur ^ 1], v, sT, j0 + TILE, T);
        cp_async_commit();
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
    __syncthreads();
}

// O = softmax(scale q·kᵀ, causal)·v for the block's FWD_ROWS query rows (16 per warp); saves each
// row's log-sum-exp. A warp skips the key tiles wholly after its rows (with FWD_WARPS > 4 the last
// tiles of a block are not every warp's).
#ifndef FWD_WARPS
#define FWD_WARPS 4
#endif
#define FWD_ROWS (FWD_WARPS * 16)
extern "C" __global__ void __launch_bounds__(FWD_WARPS * 32, FLASH_MINB)
flash_fwd(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v, h16* __restrict__ y,
           float* __restrict__ lse, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) Tiles Ks;
    __shared__ __align__(16) Tiles Vs;
    const int qb = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int q0 = qb * FWD_ROWS, r0 = warp * 16;
    const int last = min(q0 + FWD_ROWS, T) - 1;  // the block's last query row: key tiles up to it
    const float sl2 = scale * LOG2E;  // scores in log2 units: exp2 instead of exp

    kv_first<FWD_WARPS * 32>(Ks, Vs, k + base, v + base, sT, T);
    unsigned qf[KD][4];
    global_a(qf, q + base, sT, q0 + r0, T, g, t);

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8
    const int i0 = q0 + r0 + g, i1 = i0 + 8;

    for (int j0 = 0, it = 0; j0 <= last; j0 += TILE, it++) {
        const int cur = it & 1;
        kv_wait<FWD_WARPS * 32>(Ks, Vs, k + base, v + base, sT, T, j0, last, cur);
        if (j0 > q0 + r0 + 15) {  // every key of the tile after this warp's rows
            __syncthreads();
            continue;
        }
        float s[NT][4];
        scores_ldsm(s, qf, Ks[cur], lane);
        float mx0 = -INFINITY, mx1 = -INFINITY;
        const bool diag = j0 + TILE - 1 > q0 + r0;  // some key of the tile after some row of the warp
#pragma unroll
        for (int n = 0; n < NT; n++) {  // masks on the diagonal tile only; the maxima of the raw scores
            if (diag) {
                int j = j0 + n * 8 + 2 * t;
                if (j > i0) s[n][0] = -INFINITY;
                if (j + 1 > i0) s[n][1] = -INFINITY;
                if (j > i1) s[n][2] = -INFINITY;
                if (j + 1 > i1) s[n][3] = -INFINITY;
            }
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        // in log2 units (scale > 0 keeps the order): p = 2^(s·sl2 − m), one FFMA and one ex2 per score
        float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
        float c0 = fast_exp2(m0 - mn0), c1 = fast_exp2(m1 - mn1);  // 0 on the first tile
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            s[n][0] = fast_exp2(fmaf(s[n][0], sl2, -mn0));
            s[n][1] = fast_exp2(fmaf(s[n][1], sl2, -mn0));
            s[n][2] = fast_exp2(fmaf(s[n][2], sl2, -mn1));
            s[n][3] = fast_exp2(fmaf(s[n][3], sl2, -mn1));
            ps0 += s[n][0] + s[n][1];
            ps1 += s[n][2] + s[n][3];
        }
        l0 = l0 * c0 + ps0;  // per-thread partial row sums; the quad's are added at the end
        l1 = l1 * c1 + ps1;
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= c0;
            o[n][1] *= c0;
            o[n][2] *= c1;
            o[n][3] *= c1;
        }
        accumulate(o, s, Vs[cur], lane);
        __syncthreads();  // everyone is done with this buffer before it is refilled
    }
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    const long yT = (long)H * D;
    store_rows(y + (long)b * T * yT + h * D, yT, o, q0 + r0, T, 1.f / l0, 1.f / l1, g, t);
    if (t == 0) {
        if (i0 < T) lse[(long)bh * T + i0] = (m0 + log2f(l0)) * LN2;
        if (i1 < T) lse[(long)bh * T + i1] = (m1 + log2f(l1)) * LN2;
    }
}

// dq_i = scale * sum_{j <= i} P_ij (dP_ij - delta_i) k_j,  dP = dy · vᵀ, P = exp(scale q·k - lse)
extern "C" __global__ void __launch_bounds__(WARPS * 32, DQ_MINB)
flash_bwd_dq(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
              const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
              h16* __restrict__ dq, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) Tiles Ks;
    __shared__ __align__(16) Tiles Vs;
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int q0 = qb * TILE, r0 = warp * 16;
    const float sl2 = scale * LOG2E;
    const long yT = (long)H * D;

    kv_first(Ks, Vs, k + base, v + base, sT, T);
    unsigned qf[KD][4], df[KD][4];
    global_a(qf, q + base, sT, q0 + r0, T, g, t);
    global_a(df, dy + (long)b * T * yT + h * D, yT, q0 + r0, T, g, t);
    const int i0 = q0 + r0 + g, i1 = i0 + 8;
    const float L0 = i0 < T ? lse[(long)bh * T + i0] * LOG2E : 0.f, L1 = i1 < T ? lse[(long)bh * T + i1] * LOG2E : 0.f;
    const float d0 = i0 < T ? delta[(long)bh * T + i0] : 0.f, d1 = i1 < T ? delta[(long)bh * T + i1] : 0.f;
    float acc[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    for (int j0 = 0, it = 0; j0 <= q0; j0 += TILE, it++) {
        const int cur = it & 1;
        kv_wait(Ks, Vs, k + base, v + base, sT, T, j0, q0, cur);
        const bool diag = j0 == q0;
#pragma unroll kBwdUnroll
        for (int part = 0; part < DQ_SPLIT; part++) {
            const h16* kt = Ks[cur] + part * DQ_NP * 8 * LDR;
            float s[DQ_NP][4], dp[DQ_NP][4];
            scores_ldsm<DQ_NP>(s, qf, kt, lane);
            scores_ldsm<DQ_NP>(dp, df, Vs[cur] + part * DQ_NP * 8 * LDR, lane);
#pragma unroll
            for (int n = 0; n < DQ_NP; n++) {
                int j = j0 + (part * DQ_NP + n) * 8 + 2 * t;
                float p0 = (!diag || j <= i0) ? fast_exp2(fmaf(s[n][0], sl2, -L0)) : 0.f;
                float p1 = (!diag || j + 1 <= i0) ? fast_exp2(fmaf(s[n][1], sl2, -L0)) : 0.f;
                float p2 = (!diag || j <= i1) ? fast_exp2(fmaf(s[n][2], sl2, -L1)) : 0.f;
                float p3 = (!diag || j + 1 <= i1) ? fast_exp2(fmaf(s[n][3], sl2, -L1)) : 0.f;
                s[n][0] = p0 * (dp[n][0] - d0);
                s[n][1] = p1 * (dp[n][1] - d0);
                s[n][2] = p2 * (dp[n][2] - d1);
                s[n][3] = p3 * (dp[n][3] - d1);
            }
            accumulate<DQ_NP>(acc, s, kt, lane);
        }
        __syncthreads();
    }
    store_rows(dq + base, sT, acc, q0 + r0, T, scale, scale, g, t);
}

// For the 64 keys of a block: dv_j = sum_{i >= j} P_ij dy_i, dk_j = scale * sum_{i >= j} dS_ij q_i,
// computed transposed (keys as rows): Sᵀ = k · qᵀ, dPᵀ = v · dyᵀ.
extern "C" __global__ void __launch_bounds__(WARPS * 32, DKDV_MINB)
flash_bwd_dkdv(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
                const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
                h16* __restrict__ dk, h16* __restrict__ dv, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) h16 Qs[2][TILE * LDR];
    __shared__ __align__(16) h16 Ds[2][TILE * LDR];
    __shared__ float Ls[2][TILE], Es[2][TILE];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int k0 = blockIdx.x * TILE, r0 = warp * 16;  // the first keys see the most queries: launched first
    const float sl2 = scale * LOG2E;
    const long yT = (long)H * D;
    const h16* dyb = dy + (long)b * T * yT + h * D;
    const float* lseb = lse + (long)bh * T;
    const float* deltab = delta + (long)bh * T;

    auto fetch = [&](int buf, int i0) {
        async_rows<WARPS * 32>(Qs[buf], q + base, sT, i0, T);
        async_rows<WARPS * 32>(Ds[buf], dyb, yT, i0, T);
        for (int e = threadIdx.x; e < TILE; e += WARPS * 32) {
            bool ok = i0 + e < T;
            cp_async4(&Ls[buf][e], lseb + (ok ? i0 + e : 0), ok);
            cp_async4(&Es[buf][e], deltab + (ok ? i0 + e : 0), ok);
        }
        cp_async_commit();
    };
    fetch(0, k0);
    unsigned kf[KD][4], vf[KD][4];
    global_a(kf, k + base, sT, k0 + r0, T, g, t);
    global_a(vf, v + base, sT, k0 + r0, T, g, t);
    const int j0k = k0 + r0 + g, j1k = j0k + 8;
    float dka[ND][4], dva[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) {
        dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
        dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
    }

    for (int i0 = k0, it = 0; i0 < T; i0 += TILE, it++) {
        const int cur = it & 1;
        if (i0 + TILE < T) {
            fetch(cur ^ 1, i0 + TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const float* L = Ls[cur];
        const float* E = Es[cur];
        const bool edge = i0 == k0 || i0 + TILE > T;  // the diagonal tile, or queries past T
#pragma unroll kBwdUnroll
        for (int part = 0; part < DKDV_SPLIT; part++) {
            const int c0 = part * DKDV_NP * 8;  // the part's first query column
            const h16* qt = Qs[cur] + c0 * LDR;
            const h16* dt = Ds[cur] + c0 * LDR;
            float s[DKDV_NP][4], dp[DKDV_NP][4];
            scores_ldsm<DKDV_NP>(s, kf, qt, lane);
            scores_ldsm<DKDV_NP>(dp, vf, dt, lane);
#pragma unroll
            for (int n = 0; n < DKDV_NP; n++) {
                int c = c0 + n * 8 + 2 * t, i = i0 + c;  // query columns c, c + 1
                bool ok00 = !edge || (i >= j0k && i < T), ok01 = !edge || (i + 1 >= j0k && i + 1 < T);
                bool ok10 = !edge || (i >= j1k && i < T), ok11 = !edge || (i + 1 >= j1k && i + 1 < T);
                const float l0 = L[c] * LOG2E, l1 = L[c + 1] * LOG2E;
                s[n][0] = ok00 ? fast_exp2(fmaf(s[n][0], sl2, -l0)) : 0.f;
                s[n][1] = ok01 ? fast_exp2(fmaf(s[n][1], sl2, -l1)) : 0.f;
                s[n][2] = ok10 ? fast_exp2(fmaf(s[n][2], sl2, -l0)) : 0.f;
                s[n][3] = ok11 ? fast_exp2(fmaf(s[n][3], sl2, -l1)) : 0.f;
                dp[n][0] = s[n][0] * (dp[n][0] - E[c]);
                dp[n][1] = s[n][1] * (dp[n][1] - E[c + 1]);
                dp[n][2] = s[n][2] * (dp[n][2] - E[c]);
                dp[n][3] = s[n][3] * (dp[n][3] - E[c + 1]);
            }
            accumulate<DKDV_NP>(dva, s, dt, lane);
            accumulate<DKDV_NP>(dka, dp, qt, lane);
        }
        __syncthreads();
    }
    store_rows(dk + base, sT, dka, k0 + r0, T, scale, scale, g, t);
    store_rows(dv + base, sT, dva, k0 + r0, T, 1.f, 1.f, g, t);
}
