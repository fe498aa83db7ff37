// Causal flash attention on Hopper's warp-group tensor cores (wgmma.mma_async, sm_90a), forward and
// backward (flash_fwd; flash_bwd_dq and flash_bwd_dkdv, described at the backward below).
//
// The forward: FlashAttention-3's structure (Shah et al. 2024) on our buffers, with cp.async, not TMA:
//
//   CTA        FWD_WG consumer warp groups (128 threads each); warp group w owns query rows
//              q0 + 64w .. q0 + 64w + 63 of the CTA's FWD_BM = 64·FWD_WG rows. Every thread also loads
//              (no producer warp group: cp.async needs no tensor map, and each thread's copies are few).
//   Q          the CTA's FWD_BM x D tile, loaded once into shared memory (swizzled, below); the A operand
//              of S = Q·Kᵀ through a shared-memory matrix descriptor.
//   K, V       tiles of BN = FWD_BN keys stream through a ring of FWD_STAGES shared-memory stages
//              (cp.async, 16 bytes a thread a copy, zero-filled past T); the tile for iteration j + STAGES − 2
//              is fetched at the top of iteration j: STAGES − 2 iterations of compute hide its latency.
//   S = Q·Kᵀ   per warp group: D/16 instructions wgmma m64nBNk16, A = Q and B = K both from shared memory
//              (K-major: a K tile row is one key's D values), fp32 accumulators in registers.
//   softmax    online (running max m and sum l per row, in log2 units: exp2 on the SFU) on the fp32
//              accumulators; the causal mask only on tiles that cross the warp group's diagonal.
//   O += P·V   BN/16 instructions wgmma m64nDk16 with P in registers as the A operand (the m64n
//              accumulator layout of two neighbouring n8 blocks is the k16 A-fragment layout, as with
//              mma.sync), B = V from shared memory, MN-major (a V tile row is one key = one k row):
//              the instruction's transpose-B bit.
//   overlap    (FWD_OVERLAP, FA-3's intra-warpgroup pipelining) iteration j issues S_j = Q·K_jᵀ and then
//              O += P_{j-1}·V_{j-1} and waits only for the first: the softmax of S_j runs while the
//              tensor cores still do P_{j-1}·V_{j-1}; O is rescaled once that is done (wait_group 0).
//              Without it, each tile's softmax waits for its own scores and its P·V follows (and is
//              waited for before the iteration ends: no wgmma may stay in flight across the loop's
//              branches, or ptxas serializes every wgmma of the kernel).
//   other WGs  the warp groups of the CTA and of the other CTAs on the SM interleave on their own: one's
//              exponentials overlap another's matrix products.
//   epilogue   O / l rounded to 16 bits straight from the accumulators into y; lse = (m + log2 l)·ln 2.
//
// Shared-memory tiles are row-major with one row of D 16-bit values = 2D bytes = one swizzle atom's
// width RB (128-, 64- or 32-byte swizzle for D = 64, 32, 16): the 16-byte chunk c of row r sits at
// chunk c ^ ((r / (128 / RB)) mod (RB / 16)), the hardware's Swizzle<3|2|1, 4, 3> (address bits 4..
// XOR bits 7..), so that the rows of an 8 x 16-byte core matrix fall in different banks; the
// descriptors name the same swizzle. Tile bases are 1024-byte aligned (the 128-byte swizzle repeats
// every 8 rows = 1024 bytes), so the XOR of absolute addresses is the XOR of tile offsets.
//
// Layout (as kernels/attention_mma.cu): q, k, v are [B, T, H, D] views with element strides (sB, sT,
// sH) of the projection's [B, T, 3, H, D] buffer, and so are dq, dk, dv; y and dy are [B, T, H*D];
// lse and delta are [B, H, T], fp32.
// Compiled with -DHEAD_DIM=<D> (16, 32 or 64) for the architecture sm_90a (wgmma exists only there:
// andrea/engine/cupy/attention_wgmma.py compiles it through NVRTC with -arch=sm_90a).
#include "common.cuh"

#ifndef HEAD_DIM
#error "compile with -DHEAD_DIM=<head dim>"
#endif
#define D HEAD_DIM
#if D != 16 && D != 32 && D != 64
#error "HEAD_DIM must be 16, 32 or 64 (a tile row is one swizzle atom of 32, 64 or 128 bytes)"
#endif
#define RB (2 * D)                                  // bytes per tile row
#define SWIZZLE_MODE (RB == 128 ? 1 : RB == 64 ? 2 : 3)  // the descriptor's code for 128-, 64-, 32-byte swizzle

#ifndef FWD_WG
#define FWD_WG 2  // consumer warp groups per CTA (64 query rows each)
#endif
#ifndef FWD_BN
#define FWD_BN 64  // keys per K/V tile (the N of S = Q·Kᵀ)
#endif
#ifndef FWD_STAGES
#define FWD_STAGES 3  // K/V tiles in shared memory: the one read by P·V, the one read by Q·Kᵀ, the one loading
#endif
#ifndef FWD_OVERLAP
#define FWD_OVERLAP 1
#endif
#ifndef FWD_MINB
#define FWD_MINB (FWD_WG * FWD_BN <= 128 ? 2 : 1)  // CTAs per SM the registers must allow
#endif
#if FWD_STAGES < 3
#error "FWD_STAGES >= 3: a stage is refilled two iterations after its tile was read (P·V may still read it one iteration on)"
#endif
#if FWD_BN != 64 && FWD_BN != 128
#error "FWD_BN must be 64 or 128"
#endif
#define FWD_BM (64 * FWD_WG)   // query rows per CTA
#define FWD_NT (128 * FWD_WG)  // threads per CTA
#define TILE_BYTES (FWD_BN * RB)
// dynamic shared memory of flash_fwd (the launcher asks for the same): 1 KB to align the base, Q, K and V stages
#define FWD_SMEM (1024 + FWD_BM * RB + 2 * FWD_STAGES * TILE_BYTES)
#define LN2 0.6931471805599453f

typedef unsigned long long u64;

// ---------------------------------------------------------------------------------------------
// Shared memory, cp.async

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
    return addr;
}

// byte offset o of a row-major tile (rows of RB bytes, base 1024-aligned) -> its swizzled place: the
// 16-byte chunk bits [4, 4 + log2(RB/16)) XOR the row-group bits above bit 7 (Swizzle<log2(RB/16), 4, 3>)
__device__ __forceinline__ unsigned swz(unsigned o) { return o ^ ((o >> 3) & ((RB / 16 - 1) << 4)); }

// 16 bytes global -> shared (a 32-bit shared address), asynchronously; zero-filled when !valid
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// cp.async writes shared memory through the generic proxy, wgmma reads it through the async proxy:
// each writer orders the two after its copies landed (then a barrier makes them everyone's)
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// rows [r0, r0 + ROWS) of a [*, D] view (row stride sT) into a swizzled tile at shared address dst,
// asynchronously, by the CTA's NT threads; rows >= T are zeros (finite: P = 0 times them stays 0)
template <int ROWS, int NT>
__device__ __forceinline__ void load_tile(unsigned dst, const h16* src, long sT, int r0, int T) {
    constexpr int CH = D / 8, N = ROWS * CH;  // 16-byte chunks per row, in all
#pragma unroll
    for (int i = 0; i < (N + NT - 1) / NT; i++) {
        const int e = threadIdx.x + i * NT;
        if (N % NT == 0 || e < N) {
            const int r = e / CH, c = e % CH;
            const bool ok = r0 + r < T;
            cp_async16(dst + swz(r * RB + c * 16), ok ? src + (long)(r0 + r) * sT + c * 8 : src, ok);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// wgmma: shared-memory matrix descriptors and the instructions

// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
// byte offset >> 4, 62-63 the swizzle mode. With a tile row one swizzle atom wide:
// K-major (Q, K: rows along M/N, the 16 k values of an instruction inside the row): the stride
// between 8-row groups is 8 rows; the leading offset is unused (1, as CUTLASS writes it). The k-th
// 16-column slice starts 32 bytes further (the hardware swizzles the absolute address).
__device__ __forceinline__ u64 desc_k(unsigned addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(8 * RB >> 4) << 32) | ((u64)SWIZZLE_MODE << 62);
}
// MN-major (V as B of P·V: a row is one k, the N = D values along it): the stride between 8-row groups
// along k is 8 rows; the offset between atoms along N never applies (N = D is one atom) and is given
// the same value, so either reading of the two fields is right.
__device__ __forceinline__ u64 desc_mn(unsigned addr) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(8 * RB >> 4) << 16) | ((u64)(8 * RB >> 4) << 32) |
           ((u64)SWIZZLE_MODE << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// keep the compiler from moving reads or writes of wgmma operands across an issue or a wait
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(unsigned (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int k = 0; k < 4; k++) asm volatile("" : "+r"(r[i][k])::"memory");
}

#define WG_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                 "+f"(d[i + 6]), "+f"(d[i + 7])

// d (+)= A·B over one k16 step for the warp group: A [64 x 16] and B [16 x N] from shared memory
// (descriptors a, b; TB = 1: B MN-major); acc = 0 overwrites d. d: the m64nN accumulator fragment,
// N/2 floats a thread: d[4n + i] is row 16·warp + lane/4 + 8·(i/2), column 8n + 2·(lane%4) + i%2.
template <int N, int TB>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], u64 a, u64 b, int acc) {
    if constexpr (N == 16)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7},"
                     " %8, %9, p, 1, 1, 0, %11; }\n"
                     : WG_D8(0)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 32)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
                     " %16, %17, p, 1, 1, 0, %19; }\n"
                     : WG_D8(0), WG_D8(8)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 64)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
                     " %32, %33, p, 1, 1, 0, %35; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 128)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                     " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
                     " %64, %65, p, 1, 1, 0, %67; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB));
}

// the same with A in registers: a[4] the k16 A fragment of the thread (mma.sync's m16k16 layout per warp)
template <int N, int TB>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const unsigned (&a)[4], u64 b, int acc) {
    if constexpr (N == 16)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %13, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7},"
                     " {%8, %9, %10, %11}, %12, p, 1, 1, %14; }\n"
                     : WG_D8(0)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 32)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
                     " {%16, %17, %18, %19}, %20, p, 1, 1, %22; }\n"
                     : WG_D8(0), WG_D8(8)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 64)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
                     " {%32, %33, %34, %35}, %36, p, 1, 1, %38; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
    else if constexpr (N == 128)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %69, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                     " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
                     " {%64, %65, %66, %67}, %68, p, 1, 1, %70; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc), "n"(TB));
}

// ---------------------------------------------------------------------------------------------
// The two products of every kernel here, for one warp group; issued, not waited for

// s = A·Bᵀ (N columns): A the warp group's 64 rows of D values at shared address a, B a tile of N rows
// of D values at b (both K-major: Q·Kᵀ, dO·Vᵀ, K·Qᵀ, V·dOᵀ), D/16 instructions along the head dimension
template <int N>
__device__ __forceinline__ void issue_scores(float (&s)[N / 2], unsigned a, unsigned b) {
    reg_fence(s);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) wgmma_ss<N, 0>(s, desc_k(a + kc * 32), desc_k(b + kc * 32), kc > 0);
    wg_commit();
    reg_fence(s);
}

// o += P·B: P as K/16 A fragments in registers (K = the keys or queries summed over), B a tile of K rows
// of D values at b (MN-major: V, dO, Q, K as the right operand), K/16 instructions
template <int K>
__device__ __forceinline__ void issue_accumulate(float (&o)[D / 2], unsigned (&p)[K / 16][4], unsigned b) {
    reg_fence(o);
    reg_fence(p);
    wg_fence();
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) wgmma_rs<D, 1>(o, p[kc], desc_mn(b + kc * 16 * RB), 1);
    wg_commit();
    reg_fence(o);
    reg_fence(p);
}

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffff, v, 1);
    return v + __shfl_xor_sync(0xffffffff, v, 2);
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
    h16x2 v = pack_h16x2(lo, hi);  // .x (lo) in the low half: element order
    return *reinterpret_cast<unsigned*>(&v);
}

// One tile's online softmax on the scores s (raw q·k) of the thread's rows i0 and i0 + 8 against keys
// j0 ..: the causal mask where `diag`, the running maxima m (log2 units) and partial sums l updated,
// s replaced by p = 2^(s·sl2 − m); returns the factors c0, c1 by which O's rows must shrink.
template <int BN>
__device__ __forceinline__ void online_softmax(float (&s)[BN / 2], float& m0, float& m1, float& l0, float& l1, float& c0,
                                               float& c1, int i0, int j0, bool diag, float sl2, int t) {
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
        if (diag) {
            const int j = j0 + n * 8 + 2 * t;
            if (j > i0) s[4 * n + 0] = -INFINITY;
            if (j + 1 > i0) s[4 * n + 1] = -INFINITY;
            if (j > i0 + 8) s[4 * n + 2] = -INFINITY;
            if (j + 1 > i0 + 8) s[4 * n + 3] = -INFINITY;
        }
        mx0 = fmaxf(mx0, fmaxf(s[4 * n + 0], s[4 * n + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    // every row saw key 0 on its first tile, so m is finite from then on (no −inf − −inf)
    const float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
    c0 = fast_exp2(m0 - mn0);  // 0 on the first tile (m = −inf)
    c1 = fast_exp2(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int n = 0; n < BN / 8; n++) {
        s[4 * n + 0] = fast_exp2(fmaf(s[4 * n + 0], sl2, -mn0));
        s[4 * n + 1] = fast_exp2(fmaf(s[4 * n + 1], sl2, -mn0));
        s[4 * n + 2] = fast_exp2(fmaf(s[4 * n + 2], sl2, -mn1));
        s[4 * n + 3] = fast_exp2(fmaf(s[4 * n + 3], sl2, -mn1));
        ps0 += s[4 * n + 0] + s[4 * n + 1];
        ps1 += s[4 * n + 2] + s[4 * n + 3];
    }
    l0 = l0 * c0 + ps0;  // the thread's part of the row sums; the quad's are added at the end
    l1 = l1 * c1 + ps1;
}

// accumulators (16-bit) as A fragments: n8 blocks 2kc and 2kc + 1 of s -> the k16 fragment kc
template <int K>
__device__ __forceinline__ void to_frags(unsigned (&p)[K / 16][4], const float (&s)[K / 2]) {
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) {
        p[kc][0] = pack(s[8 * kc + 0], s[8 * kc + 1]);
        p[kc][1] = pack(s[8 * kc + 2], s[8 * kc + 3]);
        p[kc][2] = pack(s[8 * kc + 4], s[8 * kc + 5]);
        p[kc][3] = pack(s[8 * kc + 6], s[8 * kc + 7]);
    }
}

// O's rows shrink by c0, c1; P (16-bit) from the probabilities: n8 blocks 2kc and 2kc + 1 -> k16 fragment kc
template <int BN>
__device__ __forceinline__ void rescale_and_pack(float (&o)[D / 2], unsigned (&p)[BN / 16][4], const float (&s)[BN / 2],
                                                 float c0, float c1) {
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        o[4 * n + 0] *= c0;
        o[4 * n + 1] *= c0;
        o[4 * n + 2] *= c1;
        o[4 * n + 3] *= c1;
    }
    to_frags<BN>(p, s);
}

// the thread's rows i0 and i0 + 8 of a warp group's 64 x D accumulators, times mul0 and mul1, rounded to
// 16 bits into a [*, D] view with row stride sT (rows >= T not written)
__device__ __forceinline__ void store_rows(h16* dst, long sT, const float (&acc)[D / 2], int i0, int T, float mul0,
                                           float mul1, int t) {
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        const int c = n * 8 + 2 * t;
        if (i0 < T) *reinterpret_cast<unsigned*>(dst + i0 * sT + c) = pack(acc[4 * n + 0] * mul0, acc[4 * n + 1] * mul0);
        if (i0 + 8 < T) *reinterpret_cast<unsigned*>(dst + (i0 + 8) * sT + c) = pack(acc[4 * n + 2] * mul1, acc[4 * n + 3] * mul1);
    }
}

// O = softmax(scale q·kᵀ, causal)·v for the CTA's FWD_BM query rows; lse saved. Grid (ceil(T / FWD_BM),
// B·H), FWD_NT threads, FWD_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(FWD_NT, FWD_MINB)
flash_fwd(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v, h16* __restrict__ y,
          float* __restrict__ lse, int H, int T, long sB, long sT, long sH, float scale) {
    extern __shared__ unsigned char smem_raw[];
    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < FWD_SMEM) __trap();  // a launcher that asked for less than the tiles need
    }
    const unsigned base = (smem_addr(smem_raw) + 1023) & ~1023u;
    const unsigned Qs = base, Ks = Qs + FWD_BM * RB, Vs = Ks + FWD_STAGES * TILE_BYTES;

    const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long off = b * sB + h * sH;
    const h16 *kb = k + off, *vb = v + off;
    const int q0 = qb * FWD_BM, w0 = q0 + 64 * wg;  // the CTA's and the warp group's first rows
    const int n_tiles = (min(q0 + FWD_BM, T) - 1) / FWD_BN + 1;  // key tiles up to the CTA's last row
    const int n_wg = w0 < T ? (min(w0 + 63, T - 1)) / FWD_BN + 1 : 0;  // ... up to the warp group's last row
    const int i0 = w0 + 16 * warp + g;  // the thread's rows: i0 and i0 + 8
    const float sl2 = scale * LOG2E;  // scores in log2 units: exp2 instead of exp

    load_tile<FWD_BM, FWD_NT>(Qs, q + off, sT, q0, T);
#pragma unroll
    for (int st = 0; st < FWD_STAGES - 2; st++) {
        if (st < n_tiles) {
            load_tile<FWD_BN, FWD_NT>(Ks + st * TILE_BYTES, kb, sT, st * FWD_BN, T);
            load_tile<FWD_BN, FWD_NT>(Vs + st * TILE_BYTES, vb, sT, st * FWD_BN, T);
        }
        cp_async_commit();  // one group per tile (Q rides with tile 0), empty ones included: the waits count them
    }

    float o[D / 2], s[FWD_BN / 2];
    unsigned p[FWD_BN / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<FWD_STAGES - 3>();  // this thread's copies of tile j (and Q) have landed
        fence_proxy_async();
        __syncthreads();  // everyone's have; and every warp group is done with tile j - 2 (waited last iteration)
        const int jn = j + FWD_STAGES - 2;  // refill tile j − 2's stage
        if (jn < n_tiles) {
            load_tile<FWD_BN, FWD_NT>(Ks + (jn % FWD_STAGES) * TILE_BYTES, kb, sT, jn * FWD_BN, T);
            load_tile<FWD_BN, FWD_NT>(Vs + (jn % FWD_STAGES) * TILE_BYTES, vb, sT, jn * FWD_BN, T);
        }
        cp_async_commit();
        if (j >= n_wg) continue;  // every key of the tile after the warp group's rows (warp-group uniform)

        const int j0 = j * FWD_BN;
        const unsigned kt = Ks + (j % FWD_STAGES) * TILE_BYTES, vt = Vs + (j % FWD_STAGES) * TILE_BYTES;
        const bool diag = j0 + FWD_BN - 1 > w0;  // some key of the tile after some row of the warp group
        float c0, c1;
        issue_scores<FWD_BN>(s, Qs + 64 * wg * RB, kt);
#if FWD_OVERLAP
        if (j > 0) {
            issue_accumulate<FWD_BN>(o, p, Vs + ((j - 1) % FWD_STAGES) * TILE_BYTES);  // the previous tile's P·V ...
            wg_wait<1>();  // ... still running: only S_j is waited for
        } else {
            wg_wait<0>();
        }
        reg_fence(s);
        online_softmax<FWD_BN>(s, m0, m1, l0, l1, c0, c1, i0, j0, diag, sl2, t);
        wg_wait<0>();  // P_{j-1}·V_{j-1} done: O and P may change
        reg_fence(o);
        reg_fence(p);
        rescale_and_pack<FWD_BN>(o, p, s, c0, c1);
        if (j == n_wg - 1) {  // the warp group's last tile: its P·V now (its stage is refilled two iterations on)
            issue_accumulate<FWD_BN>(o, p, vt);
            wg_wait<0>();
        }
#else
        wg_wait<0>();
        reg_fence(s);
        online_softmax<FWD_BN>(s, m0, m1, l0, l1, c0, c1, i0, j0, diag, sl2, t);
        rescale_and_pack<FWD_BN>(o, p, s, c0, c1);
        issue_accumulate<FWD_BN>(o, p, vt);
        wg_wait<0>();  // within the iteration: a wgmma in flight across the loop's branches makes ptxas serialize them all
#endif
    }
    cp_async_wait<0>();  // no copy outlives the CTA (the last groups are empty, but are still groups)
    if (n_wg == 0) return;
    reg_fence(o);

    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
    const float r0 = 1.f / l0, r1 = 1.f / l1;
    const long yT = (long)H * D;
    store_rows(y + (long)b * T * yT + h * D, yT, o, i0, T, r0, r1, t);
    if (t == 0) {
        if (i0 < T) lse[(long)bh * T + i0] = (m0 + log2f(l0)) * LN2;
        if (i0 + 8 < T) lse[(long)bh * T + i0 + 8] = (m1 + log2f(l1)) * LN2;
    }
}

// ---------------------------------------------------------------------------------------------
// Backward: dQ and dK/dV in two kernels, each summing in registers in a fixed order (no atomics: the
// same bits every run, as attention_mma's). delta = Σ_d dO·O per row comes first, from attention_mma.cu's
// flash_delta (the same [B, H, T] fp32 buffer); the probabilities are recomputed from lse.
//   dQ     a CTA of DQ_WG warp groups owns 64·DQ_WG query rows, as the forward, and streams K and V
//          tiles (DQ_BN keys) through the same cp.async ring: S = Q·Kᵀ and dP = dO·Vᵀ (both operands in
//          shared memory), dS = P ∘ (dP − delta) in registers as the A operand of dQ += dS·K (K MN-major).
//   dK/dV  a CTA of KV_WG warp groups owns 64·KV_WG keys (K and V in shared memory once) and streams
//          tiles of KV_BM queries (Q, dO, and their lse and delta) from its first key on, transposed:
//          Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ, dSᵀ in registers.
// Every wgmma is waited for within its iteration (no in-flight product crosses the loop's branches).

#ifndef DQ_WG
#define DQ_WG 2
#endif
#ifndef DQ_BN
#define DQ_BN 64
#endif
#ifndef DQ_STAGES
#define DQ_STAGES 3
#endif
#ifndef DQ_MINB
#define DQ_MINB 1
#endif
#ifndef KV_WG
#define KV_WG 2
#endif
#ifndef KV_BM
#define KV_BM 64
#endif
#ifndef KV_STAGES
#define KV_STAGES 3
#endif
#ifndef KV_MINB
#define KV_MINB 1
#endif
#if DQ_STAGES < 3 || KV_STAGES < 3
#error "DQ_STAGES, KV_STAGES >= 3 (a stage is refilled two iterations after its tile was read)"
#endif
#if (DQ_BN != 64 && DQ_BN != 128) || (KV_BM != 64 && KV_BM != 128)
#error "DQ_BN and KV_BM must be 64 or 128"
#endif
#define DQ_BM (64 * DQ_WG)
#define DQ_NT (128 * DQ_WG)
#define DQ_TILE (DQ_BN * RB)
#define DQ_SMEM (1024 + 2 * DQ_BM * RB + 2 * DQ_STAGES * DQ_TILE)  // Q, dO; K and V stages
#define KV_BN (64 * KV_WG)
#define KV_NT (128 * KV_WG)
#define KV_TILE (KV_BM * RB)
#define KV_SMEM (1024 + 2 * KV_BN * RB + 2 * KV_STAGES * KV_TILE + 2 * KV_STAGES * KV_BM * 4)  // K, V; Q, dO, lse, delta stages

// 4 bytes global -> shared, asynchronously; zero-filled when !valid
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

__device__ __forceinline__ unsigned dynamic_smem_base(const unsigned char* raw, unsigned need) {
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < need) __trap();  // a launcher that asked for less than the tiles need
    return (smem_addr(raw) + 1023) & ~1023u;
}

// dq_i = scale Σ_{j ≤ i} P_ij (dP_ij − delta_i) k_j,  dP = dO·Vᵀ, P = exp(scale q·k − lse). Grid
// (ceil(T / DQ_BM), B·H), DQ_NT threads, DQ_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(DQ_NT, DQ_MINB)
flash_bwd_dq(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
             const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
             h16* __restrict__ dq, int H, int T, long sB, long sT, long sH, float scale) {
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = dynamic_smem_base(smem_raw, DQ_SMEM);
    const unsigned Qs = base, dOs = Qs + DQ_BM * RB, Ks = dOs + DQ_BM * RB, Vs = Ks + DQ_STAGES * DQ_TILE;

    const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long off = b * sB + h * sH, yT = (long)H * D;
    const h16 *kb = k + off, *vb = v + off;
    const int q0 = qb * DQ_BM, w0 = q0 + 64 * wg;
    const int n_tiles = (min(q0 + DQ_BM, T) - 1) / DQ_BN + 1;
    const int n_wg = w0 < T ? (min(w0 + 63, T - 1)) / DQ_BN + 1 : 0;
    const int i0 = w0 + 16 * warp + g;
    const float sl2 = scale * LOG2E;

    load_tile<DQ_BM, DQ_NT>(Qs, q + off, sT, q0, T);
    load_tile<DQ_BM, DQ_NT>(dOs, dy + (long)b * T * yT + h * D, yT, q0, T);
#pragma unroll
    for (int st = 0; st < DQ_STAGES - 2; st++) {
        if (st < n_tiles) {
            load_tile<DQ_BN, DQ_NT>(Ks + st * DQ_TILE, kb, sT, st * DQ_BN, T);
            load_tile<DQ_BN, DQ_NT>(Vs + st * DQ_TILE, vb, sT, st * DQ_BN, T);
        }
        cp_async_commit();
    }
    // the rows' log-sum-exp (log2 units) and delta; rows >= T: 0 (their dS is 0: dO's rows are zeros)
    const float L0 = i0 < T ? lse[(long)bh * T + i0] * LOG2E : 0.f, L1 = i0 + 8 < T ? lse[(long)bh * T + i0 + 8] * LOG2E : 0.f;
    const float e0 = i0 < T ? delta[(long)bh * T + i0] : 0.f, e1 = i0 + 8 < T ? delta[(long)bh * T + i0 + 8] : 0.f;

    float acc[D / 2], s[DQ_BN / 2], dp[DQ_BN / 2];
    unsigned f[DQ_BN / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) acc[i] = 0.f;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<DQ_STAGES - 3>();
        fence_proxy_async();
        __syncthreads();
        const int jn = j + DQ_STAGES - 2;
        if (jn < n_tiles) {
            load_tile<DQ_BN, DQ_NT>(Ks + (jn % DQ_STAGES) * DQ_TILE, kb, sT, jn * DQ_BN, T);
            load_tile<DQ_BN, DQ_NT>(Vs + (jn % DQ_STAGES) * DQ_TILE, vb, sT, jn * DQ_BN, T);
        }
        cp_async_commit();
        if (j >= n_wg) continue;

        const int j0 = j * DQ_BN;
        const unsigned kt = Ks + (j % DQ_STAGES) * DQ_TILE, vt = Vs + (j % DQ_STAGES) * DQ_TILE;
        const bool diag = j0 + DQ_BN - 1 > w0;
        issue_scores<DQ_BN>(s, Qs + 64 * wg * RB, kt);
        issue_scores<DQ_BN>(dp, dOs + 64 * wg * RB, vt);
        wg_wait<0>();
        reg_fence(s);
        reg_fence(dp);
#pragma unroll
        for (int n = 0; n < DQ_BN / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = j0 + n * 8 + 2 * t + (e & 1), row = i0 + 8 * (e / 2);
                const float p = (!diag || key <= row) ? fast_exp2(fmaf(s[4 * n + e], sl2, -(e < 2 ? L0 : L1))) : 0.f;
                s[4 * n + e] = p * (dp[4 * n + e] - (e < 2 ? e0 : e1));  // dS (without the scale: applied once at the end)
            }
        }
        to_frags<DQ_BN>(f, s);
        issue_accumulate<DQ_BN>(acc, f, kt);
        wg_wait<0>();
    }
    cp_async_wait<0>();
    if (n_wg == 0) return;
    reg_fence(acc);
    store_rows(dq + off, sT, acc, i0, T, scale, scale, t);
}

// For the CTA's 64·KV_WG keys: dv_j = Σ_{i ≥ j} P_ij dO_i, dk_j = scale Σ_{i ≥ j} dS_ij q_i, computed
// transposed (keys as rows). Grid (ceil(T / KV_BN), B·H) (the first keys see the most queries: launched
// first), KV_NT threads, KV_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(KV_NT, KV_MINB)
flash_bwd_dkdv(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
               const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
               h16* __restrict__ dk, h16* __restrict__ dv, int H, int T, long sB, long sT, long sH, float scale) {
    extern __shared__ unsigned char smem_raw[];
    const unsigned base = dynamic_smem_base(smem_raw, KV_SMEM);
    const unsigned Ks = base, Vs = Ks + KV_BN * RB, Qs = Vs + KV_BN * RB, dOs = Qs + KV_STAGES * KV_TILE;
    const unsigned LEs = dOs + KV_STAGES * KV_TILE;  // per stage: KV_BM lse values, then KV_BM deltas (fp32)
    const float* LE = reinterpret_cast<const float*>(smem_raw + (LEs - smem_addr(smem_raw)));

    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long off = b * sB + h * sH, yT = (long)H * D;
    const h16 *qb = q + off, *dyb = dy + (long)b * T * yT + h * D;
    const float *lseb = lse + (long)bh * T, *deltab = delta + (long)bh * T;
    const int k0 = blockIdx.x * KV_BN, w0 = k0 + 64 * wg;  // the CTA's and the warp group's first keys
    const int n_tiles = (T - k0 + KV_BM - 1) / KV_BM;  // query tiles from the first key on
    const int m_wg = w0 < T ? (w0 - k0) / KV_BM : n_tiles;  // the warp group's first tile with a query >= its keys
    const int j0 = w0 + 16 * warp + g;  // the thread's keys: j0 and j0 + 8
    const float sl2 = scale * LOG2E;

    auto fetch = [&](int m) {  // query tile m (Q, dO, lse, delta) into stage m % KV_STAGES
        const int st = m % KV_STAGES, i0 = k0 + m * KV_BM;
        load_tile<KV_BM, KV_NT>(Qs + st * KV_TILE, qb, sT, i0, T);
        load_tile<KV_BM, KV_NT>(dOs + st * KV_TILE, dyb, yT, i0, T);
        for (int e = threadIdx.x; e < 2 * KV_BM; e += KV_NT) {
            const int i = i0 + e % KV_BM;
            const float* src = e < KV_BM ? lseb : deltab;
            cp_async4(LEs + (st * 2 * KV_BM + e) * 4, i < T ? src + i : src, i < T);
        }
    };
    load_tile<KV_BN, KV_NT>(Ks, k + off, sT, k0, T);
    load_tile<KV_BN, KV_NT>(Vs, v + off, sT, k0, T);
#pragma unroll
    for (int m = 0; m < KV_STAGES - 2; m++) {
        if (m < n_tiles) fetch(m);
        cp_async_commit();
    }

    float dka[D / 2], dva[D / 2], s[KV_BM / 2], dp[KV_BM / 2];
    unsigned pf[KV_BM / 16][4], df[KV_BM / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.f;

    for (int m = 0; m < n_tiles; m++) {
        cp_async_wait<KV_STAGES - 3>();
        fence_proxy_async();
        __syncthreads();
        if (m + KV_STAGES - 2 < n_tiles) fetch(m + KV_STAGES - 2);
        cp_async_commit();
        if (m < m_wg) continue;  // every query of the tile before the warp group's keys

        const int st = m % KV_STAGES, i0 = k0 + m * KV_BM;
        const unsigned qt = Qs + st * KV_TILE, dot = dOs + st * KV_TILE;
        const float *L = LE + st * 2 * KV_BM, *E = L + KV_BM;
        const bool edge = i0 < w0 + 63 || i0 + KV_BM > T;  // some query before some key, or past T
        issue_scores<KV_BM>(s, Ks + 64 * wg * RB, qt);   // Sᵀ = K·Qᵀ
        issue_scores<KV_BM>(dp, Vs + 64 * wg * RB, dot);  // dPᵀ = V·dOᵀ
        wg_wait<0>();
        reg_fence(s);
        reg_fence(dp);
#pragma unroll
        for (int n = 0; n < KV_BM / 8; n++) {
            const int c = n * 8 + 2 * t;  // the query columns c, c + 1
            const float2 l = *reinterpret_cast<const float2*>(L + c), d = *reinterpret_cast<const float2*>(E + c);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = i0 + c + (e & 1), key = j0 + 8 * (e / 2);
                const float li = (e & 1) ? l.y : l.x, di = (e & 1) ? d.y : d.x;
                const float p = (!edge || (i >= key && i < T)) ? fast_exp2(fmaf(s[4 * n + e], sl2, -li * LOG2E)) : 0.f;
                s[4 * n + e] = p;
                dp[4 * n + e] = p * (dp[4 * n + e] - di);  // dSᵀ (without the scale: applied once at the end)
            }
        }
        to_frags<KV_BM>(pf, s);
        to_frags<KV_BM>(df, dp);
        issue_accumulate<KV_BM>(dva, pf, dot);  // dV += Pᵀ·dO
        issue_accumulate<KV_BM>(dka, df, qt);   // dK += dSᵀ·Q
        wg_wait<0>();
    }
    cp_async_wait<0>();
    if (w0 >= T) return;
    reg_fence(dka);
    reg_fence(dva);
    store_rows(dk + off, sT, dka, j0, T, scale, scale, t);
    store_rows(dv + off, sT, dva, j0, T, 1.f, 1.f, t);
}
