// Causal flash attention on Hopper's warp-group tensor cores (wgmma.mma_async, sm_90a), forward and
// backward (flash_fwd; flash_bwd_dq and flash_bwd_dkdv, or flash_bwd_fused, described at the backward below).
//
// The forward: FlashAttention-3's structure (Shah et al. 2024) on our buffers, in two builds.
// By default (FWD_WS=0) with cp.async, every thread a loader:
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
//              accumulators; the causal mask only on tiles that cross the warp group's diagonal. With
//              FWD_SKIP_RESCALE a warp whose rows all kept their maxima skips O's rescaling (a factor
//              of exactly 1: the same bits, fewer multiplies once the maxima settle).
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
// With FWD_WS=1, warp-specialized as FlashAttention-3: a producer warp group (one thread of it issues
// everything, the others leave) moves Q and the K/V tiles with the tensor-memory accelerator
// (cp.async.bulk.tensor, one instruction a tile, from tensor maps the host encodes over the [B, T, 3,
// H, D] buffer, rows past T zero-filled, written in the very swizzle the descriptors name), each
// stage guarded by a pair of mbarriers (full: the copy's bytes landed; empty: every consumer thread
// is done with it); the consumer warp groups only compute. setmaxnreg moves registers from the
// producer to the consumers. The CTA walks work tiles (a query block of one head) longest first,
// blockIdx.x, blockIdx.x + gridDim.x, ...: one tile a CTA, or (the launcher's FWD_PERSIST) as many as
// the SMs hold, each CTA looping, its producer loading the next tile's Q and K/V while the consumers
// finish the last. FWD_PINGPONG orders the consumers' matrix products round-robin (FA-3's scheduler
// barriers: named barriers 1..FWD_WG), so one warp group's softmax runs while another's products do.
//
// Shared-memory tiles are row-major with one row of D 16-bit values = 2D bytes = one swizzle atom's
// width RB (128-, 64- or 32-byte swizzle for D = 64, 32, 16): the 16-byte chunk c of row r sits at
// chunk c ^ ((r / (128 / RB)) mod (RB / 16)), the hardware's Swizzle<3|2|1, 4, 3> (address bits 4..
// XOR bits 7..), so that the rows of an 8 x 16-byte core matrix fall in different banks; the
// descriptors name the same swizzle, and so do the tensor maps. Tile bases are 1024-byte aligned (the
// 128-byte swizzle repeats every 8 rows = 1024 bytes), so the XOR of absolute addresses is the XOR of
// tile offsets.
//
// Layout (as kernels/attention_mma.cu): q, k, v are [B, T, H, D] views with element strides (sB, sT,
// sH) of the projection's [B, T, 3, H, D] buffer, and so are dq, dk, dv; y and dy are [B, T, H*D];
// lse and delta are [B, H, T], fp32.
// Compiled with -DHEAD_DIM=<D> (16, 32 or 64) for the architecture sm_90a (wgmma exists only there:
// andrea/engine/cupy/attention_wgmma.py compiles it through NVRTC with -arch=sm_90a). WG_KERNELS (a bit
// mask, all by default) picks the kernels a build holds: 1 flash_fwd, 2 flash_bwd_dq, 4 flash_bwd_dkdv,
// 8 flash_bwd_fused, 16 flash_bwd_prep and flash_bwd_dq_convert (the launcher builds each direction
// alone: half the compile time a variant).
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
#ifndef WG_KERNELS
#define WG_KERNELS 31
#endif

#ifndef FWD_WS
#define FWD_WS 0  // 1: the warp-specialized forward (a TMA producer warp group, mbarrier stages)
#endif
#ifndef FWD_WG
#define FWD_WG 2  // consumer warp groups per CTA (64 query rows each)
#endif
#ifndef FWD_BN
#define FWD_BN 64  // keys per K/V tile (the N of S = Q·Kᵀ)
#endif
#ifndef FWD_STAGES
#define FWD_STAGES 3  // K/V tiles in shared memory
#endif
#ifndef FWD_OVERLAP
#define FWD_OVERLAP 1
#endif
#ifndef FWD_PINGPONG
#define FWD_PINGPONG 0
#endif
#ifndef FWD_SKIP_RESCALE
#define FWD_SKIP_RESCALE 0
#endif
#ifndef FWD_MINB
#define FWD_MINB (FWD_WS ? 1 : FWD_WG * FWD_BN <= 128 ? 2 : 1)  // CTAs per SM the registers must allow
#endif
#if !FWD_WS && FWD_STAGES < 3
#error "FWD_STAGES >= 3: a stage is refilled two iterations after its tile was read (P·V may still read it one iteration on)"
#endif
#if FWD_WS && FWD_STAGES < 2
#error "FWD_STAGES >= 2 with FWD_WS (a warp group may hold one stage while it passes over the tiles after its rows)"
#endif
#if FWD_BN != 64 && FWD_BN != 128
#error "FWD_BN must be 64 or 128"
#endif
#if FWD_WG < 1 || FWD_WG > 3 || (FWD_PINGPONG && (FWD_WG < 2 || !FWD_WS))
#error "FWD_WG is 1, 2 or 3; FWD_PINGPONG needs FWD_WS and 2 or 3 consumer warp groups"
#endif
#define FWD_BM (64 * FWD_WG)   // query rows per CTA
#if FWD_WS
#define FWD_NT (128 * FWD_WG + 128)  // threads per CTA: the consumers and the producer warp group
#else
#define FWD_NT (128 * FWD_WG)  // threads per CTA
#endif
#define TILE_BYTES (FWD_BN * RB)
// dynamic shared memory of flash_fwd (the launcher asks for the same): 1 KB to align the base, Q, K and V
// stages (and with FWD_WS the mbarriers: full and empty per stage, Q's full and empty)
#define FWD_SMEM (1024 + FWD_BM * RB + 2 * FWD_STAGES * TILE_BYTES + (FWD_WS ? 8 * (2 * FWD_STAGES + 2) : 0))
#define LN2 0.6931471805599453f

typedef unsigned long long u64;

// ---------------------------------------------------------------------------------------------
// Shared memory, cp.async

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    unsigned addr;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(addr) : "l"(p));
    return addr;
}

extern __shared__ unsigned char smem_raw[];  // every kernel's dynamic shared memory

__device__ __forceinline__ unsigned dynamic_smem_base(const unsigned char* raw, unsigned need) {
    unsigned dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < need) __trap();  // a launcher that asked for less than the tiles need
    return (smem_addr(raw) + 1023) & ~1023u;
}

// byte offset o of a row-major tile (rows of ROWB bytes, base 1024-aligned) -> its swizzled place: the
// 16-byte chunk bits [4, 4 + log2(ROWB/16)) XOR the row-group bits above bit 7 (Swizzle<log2(ROWB/16), 4, 3>)
template <int ROWB>
__device__ __forceinline__ unsigned swz_rb(unsigned o) { return o ^ ((o >> 3) & ((ROWB / 16 - 1) << 4)); }
__device__ __forceinline__ unsigned swz(unsigned o) { return swz_rb<RB>(o); }

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
    if constexpr (N % NT == 0 && NT % CH == 0) {
        // each thread the same chunk c of rows r, r + NT/CH, ...: one address product a tile, and the
        // same swizzle on every row (NT/CH rows are NT·16 bytes, a multiple of the 1024-byte pattern)
        constexpr int STEP = NT / CH;
        const int r = threadIdx.x / CH, c = threadIdx.x % CH;
        const h16* p = src + (long)(r0 + r) * sT + c * 8;
        const long step = STEP * sT;
        const unsigned d = dst + swz(r * RB + c * 16);
        const bool full = r0 + ROWS <= T;  // no row past T (every tile but a ragged last one)
#pragma unroll
        for (int i = 0; i < N / NT; i++, p += step) {
            const bool ok = full || r0 + r + i * STEP < T;
            cp_async16(d + i * STEP * RB, ok ? p : src, ok);
        }
    } else {
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
}

// ---------------------------------------------------------------------------------------------
// mbarriers, the tensor-memory accelerator, named barriers, register reallocation (FWD_WS)

// a spin that outlasts this many polls is a deadlock: trap (a launch error) rather than hang the device
#define WATCHDOG_POLLS (1u << 22)

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// the initialised barriers visible to the async proxy (the tensor-memory accelerator signals them)
__device__ __forceinline__ void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// the producer's arrival, announcing `bytes` that copies will complete on the barrier
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// until the phase of the given parity has completed (a fresh barrier counts the phase before its
// first, parity 1, as completed: the producer's first pass over the empty barriers does not wait)
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    for (unsigned n = 0;; n++) {
        unsigned done;
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
                     : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        if (done) return;
        if (n == WATCHDOG_POLLS) __trap();
    }
}

// a tensor map the host wrote into global memory, before the accelerator reads it (the CUDA guide's
// acquire of the tensormap proxy)
__device__ __forceinline__ void fence_tensormap(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
}
// a box of the 5-D map (D, H, 3, T, B) at (0, h, which, t0, b) into shared memory at dst, completing
// its bytes on the mbarrier bar
__device__ __forceinline__ void tma_load(unsigned dst, const void* map, int h, int which, int t0, int b, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n"
                 ::"r"(dst), "l"(map), "r"(0), "r"(h), "r"(which), "r"(t0), "r"(b), "r"(bar) : "memory");
}

// named barriers (ids known at compile time: ptxas then reserves only those)
template <int ID, int THREADS>
__device__ __forceinline__ void bar_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory"); }
template <int ID, int THREADS>
__device__ __forceinline__ void bar_arrive() { asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory"); }
template <int REGS>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

// ---------------------------------------------------------------------------------------------
// wgmma: shared-memory matrix descriptors and the instructions

// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
// byte offset >> 4, 62-63 the swizzle mode. With a tile row one swizzle atom wide (ROWB bytes):
// K-major (Q, K: rows along M/N, the 16 k values of an instruction inside the row): the stride
// between 8-row groups is 8 rows; the leading offset is unused (1, as CUTLASS writes it). The k-th
// 16-column slice starts 32 bytes further (the hardware swizzles the absolute address).
// A slice o bytes (a multiple of 16) past a tile's start has the tile's low word plus o >> 4 (the start
// address field, which no shared-memory address here carries out of) and the same high word (a
// constant): one add a product, and one 32-bit value kept per operand across a loop of products.
template <int ROWB>
__device__ __forceinline__ constexpr unsigned desc_hi() {
    return (8 * ROWB >> 4) | ((ROWB == 128 ? 1u : ROWB == 64 ? 2u : 3u) << 30);  // stride offset; swizzle mode
}
__device__ __forceinline__ u64 desc_make(unsigned lo, unsigned hi) { return ((u64)hi << 32) | lo; }
template <int ROWB>
__device__ __forceinline__ unsigned desc_k_lo(unsigned addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
template <int ROWB>
__device__ __forceinline__ u64 desc_k_rb(unsigned addr) { return desc_make(desc_k_lo<ROWB>(addr), desc_hi<ROWB>()); }
// MN-major (V as B of P·V: a row is one k, the N = D values along it): the stride between 8-row groups
// along k is 8 rows; the offset between atoms along N never applies (N = D is one atom) and is given
// the same value, so either reading of the two fields is right. (The backward's dS tile is read so as
// the A operand of dQ = dS·K, M = its 64 queries along a 128-byte row, with the transpose-A bit.)
template <int ROWB>
__device__ __forceinline__ unsigned desc_mn_lo(unsigned addr) { return ((addr & 0x3FFFF) >> 4) | ((8u * ROWB >> 4) << 16); }
template <int ROWB>
__device__ __forceinline__ u64 desc_mn_rb(unsigned addr) { return desc_make(desc_mn_lo<ROWB>(addr), desc_hi<ROWB>()); }
__device__ __forceinline__ u64 desc_k(unsigned addr) { return desc_k_rb<RB>(addr); }
__device__ __forceinline__ u64 desc_mn(unsigned addr) { return desc_mn_rb<RB>(addr); }

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
// (descriptors a, b; TB = 1: B MN-major; TA = 1: A MN-major); acc = 0 overwrites d. d: the m64nN
// accumulator fragment, N/2 floats a thread: d[4n + i] is row 16·warp + lane/4 + 8·(i/2), column
// 8n + 2·(lane%4) + i%2.
template <int N, int TB, int TA = 0>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], u64 a, u64 b, int acc) {
    if constexpr (N == 16)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7},"
                     " %8, %9, p, 1, 1, %12, %11; }\n"
                     : WG_D8(0)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB), "n"(TA));
    else if constexpr (N == 32)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15},"
                     " %16, %17, p, 1, 1, %20, %19; }\n"
                     : WG_D8(0), WG_D8(8)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB), "n"(TA));
    else if constexpr (N == 64)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31},"
                     " %32, %33, p, 1, 1, %36, %35; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB), "n"(TA));
    else if constexpr (N == 128)
        asm volatile("{ .reg .pred p; setp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k16.f32." H16_PTX "." H16_PTX
                     " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
                     " %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
                     " %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
                     " %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63},"
                     " %64, %65, p, 1, 1, %68, %67; }\n"
                     : WG_D8(0), WG_D8(8), WG_D8(16), WG_D8(24), WG_D8(32), WG_D8(40), WG_D8(48), WG_D8(56)
                     : "l"(a), "l"(b), "r"(acc), "n"(TB), "n"(TA));
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
    const unsigned la = desc_k_lo<RB>(a), lb = desc_k_lo<RB>(b);  // the k-th slice: 32 bytes on, 2 in the field
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++)
        wgmma_ss<N, 0>(s, desc_make(la + kc * 2, desc_hi<RB>()), desc_make(lb + kc * 2, desc_hi<RB>()), kc > 0);
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
    const unsigned lb = desc_mn_lo<RB>(b);
#pragma unroll
    for (int kc = 0; kc < K / 16; kc++) wgmma_rs<D, 1>(o, p[kc], desc_make(lb + kc * (16 * RB >> 4), desc_hi<RB>()), 1);
    wg_commit();
    reg_fence(o);
    reg_fence(p);
}

__device__ __forceinline__ unsigned pack(float lo, float hi) {
    h16x2 v = pack_h16x2(lo, hi);  // .x (lo) in the low half: element order
    return *reinterpret_cast<unsigned*>(&v);
}

// One tile's online softmax on the scores s (raw q·k) of the thread's rows i0 and i0 + 8 against keys
// j0 ..: the causal mask where `diag`, the running maxima m (log2 units) and partial sums l updated,
// s replaced by p = 2^(s·sl2 − m) (the scale and the max in one FFMA before ex2); returns the factors
// c0, c1 by which O's rows must shrink.
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
    // every row saw key 0 on its first tile, so m is finite from then on (no −inf − −inf); a tile all
    // past a row (FWD_WS: a warp group passing the CTA's last tiles) leaves its max as it was
    const float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
#if FWD_SKIP_RESCALE
    c0 = mn0 == m0 ? 1.f : fast_exp2(m0 - mn0);  // exactly 1 where the max stayed (0 on the first tile)
    c1 = mn1 == m1 ? 1.f : fast_exp2(m1 - mn1);
#else
    c0 = fast_exp2(m0 - mn0);  // 0 on the first tile (m = −inf)
    c1 = fast_exp2(m1 - mn1);
#endif
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

// O's rows shrink by c0, c1; P (16-bit) from the probabilities: n8 blocks 2kc and 2kc + 1 -> k16 fragment kc.
// With FWD_SKIP_RESCALE a warp whose factors are all exactly 1 leaves O alone (warp-uniform branch)
template <int BN>
__device__ __forceinline__ void rescale_and_pack(float (&o)[D / 2], unsigned (&p)[BN / 16][4], const float (&s)[BN / 2],
                                                 float c0, float c1) {
#if FWD_SKIP_RESCALE
    if (__any_sync(0xffffffff, c0 != 1.f || c1 != 1.f))
#endif
    {
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            o[4 * n + 0] *= c0;
            o[4 * n + 1] *= c0;
            o[4 * n + 2] *= c1;
            o[4 * n + 3] *= c1;
        }
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

#if WG_KERNELS & 1
#if !FWD_WS
// O = softmax(scale q·kᵀ, causal)·v for the CTA's FWD_BM query rows; lse saved. Grid (ceil(T / FWD_BM),
// B·H), FWD_NT threads, FWD_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(FWD_NT, FWD_MINB)
flash_fwd(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v, h16* __restrict__ y,
          float* __restrict__ lse, int H, int T, long sB, long sT, long sH, float scale) {
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

#else  // FWD_WS: the warp-specialized forward

// registers: at entry every thread holds the launch bound's share (WS_CAP); the producer warp group gives
// most of its share back and the consumers take it (setmaxnreg: the sums must fit the CTA's allocation)
#define WS_CAP_RAW (65536 / FWD_MINB / FWD_NT)
#define WS_CAP ((WS_CAP_RAW > 255 ? 255 : WS_CAP_RAW) / 8 * 8)
#define WS_PRODUCER_REGS (FWD_MINB > 1 ? 24 : FWD_WG == 3 ? 32 : 40)
#define WS_CONSUMER_RAW ((WS_CAP * (FWD_WG + 1) - WS_PRODUCER_REGS) / FWD_WG / 8 * 8)
#define WS_CONSUMER_REGS (WS_CONSUMER_RAW > 256 ? 256 : WS_CONSUMER_RAW)
#define WS_REALLOC (FWD_WG > 1 || FWD_MINB > 1)  // one warp group alone at one CTA an SM has all it can use

// FA-3's scheduler barriers: consumer warp group w issues its products only after warp group w − 1 (mod
// FWD_WG) has issued its own and seen its scores arrive: named barrier 1 + w counts w's 128 waiting
// threads and the predecessor's 128. (The turn passes after the wait, not right after the issue as in
// FA-3: a bar.arrive between a wgmma's issue and its wait makes ptxas serialize every wgmma. The ids
// are values, so ptxas reserves all 16 barriers; these kernels run one CTA an SM anyway.)
__device__ __forceinline__ void sched_wait(int wg) {
#if FWD_PINGPONG
    asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory");
#endif
}
__device__ __forceinline__ void sched_pass(int wg) {
#if FWD_PINGPONG
    asm volatile("bar.arrive %0, 256;\n" ::"r"(wg == FWD_WG - 1 ? 1 : wg + 2) : "memory");
#endif
}

// O = softmax(scale q·kᵀ, causal)·v, lse saved, for work tiles (query block, head) blockIdx.x,
// blockIdx.x + gridDim.x, ... of the ceil(T / FWD_BM)·BH, longest first. maps: two CUtensorMaps of the
// [B, T, 3, H, D] buffer seen as (D, H, 3, T, B), boxes of FWD_BM and of FWD_BN rows (128 bytes each,
// 64-byte aligned, in global memory). FWD_NT threads, FWD_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(FWD_NT, FWD_MINB)
flash_fwd(const u64* __restrict__ maps, h16* __restrict__ y, float* __restrict__ lse, int H, int T, int BH, float scale) {
    const unsigned base = dynamic_smem_base(smem_raw, FWD_SMEM);
    const unsigned Qs = base, Ks = Qs + FWD_BM * RB, Vs = Ks + FWD_STAGES * TILE_BYTES;
    const unsigned bars = Vs + FWD_STAGES * TILE_BYTES;  // full[FWD_STAGES], empty[FWD_STAGES], Q full, Q empty
    const unsigned q_full = bars + 16 * FWD_STAGES, q_empty = q_full + 8;
    const int n_qb = (T + FWD_BM - 1) / FWD_BM, n_work = n_qb * BH;
    if (threadIdx.x == 0) {
        for (int st = 0; st < FWD_STAGES; st++) {
            mbar_init(bars + 8 * st, 1);                             // the producer's arrival (and the bytes)
            mbar_init(bars + 8 * (FWD_STAGES + st), 128 * FWD_WG);  // every consumer thread's
        }
        mbar_init(q_full, 1);
        mbar_init(q_empty, 128 * FWD_WG);
        fence_mbar_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // the producer warp group: thread 0 issues every copy
#if WS_REALLOC
        regs_dec<WS_PRODUCER_REGS>();
#endif
        if (threadIdx.x == 0) {
            const u64 *map_q = maps, *map_kv = maps + 16;
            fence_tensormap(map_q);
            fence_tensormap(map_kv);
            int it = 0, n = 0;  // K/V tiles issued, work tiles begun
            for (int w = blockIdx.x; w < n_work; w += gridDim.x, n++) {
                const int qb = n_qb - 1 - w / BH, bh = w % BH, b = bh / H, h = bh % H;
                const int q0 = qb * FWD_BM, n_tiles = (min(q0 + FWD_BM, T) - 1) / FWD_BN + 1;
                if (n > 0) mbar_wait(q_empty, (n - 1) & 1);  // the previous tile's Q·Kᵀ all done
                mbar_expect_tx(q_full, FWD_BM * RB);
                tma_load(Qs, map_q, h, 0, q0, b, q_full);
                for (int j = 0; j < n_tiles; j++, it++) {
                    const int st = it % FWD_STAGES;
                    mbar_wait(bars + 8 * (FWD_STAGES + st), ((it / FWD_STAGES) & 1) ^ 1);  // its last tile consumed
                    mbar_expect_tx(bars + 8 * st, 2 * TILE_BYTES);
                    tma_load(Ks + st * TILE_BYTES, map_kv, h, 1, j * FWD_BN, b, bars + 8 * st);
                    tma_load(Vs + st * TILE_BYTES, map_kv, h, 2, j * FWD_BN, b, bars + 8 * st);
                }
            }
        }
    } else {  // the consumer warp groups
#if WS_REALLOC
        regs_inc<WS_CONSUMER_REGS>();
#endif
        const int wg = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
        const float sl2 = scale * LOG2E;  // scores in log2 units: exp2 instead of exp
        const long yT = (long)H * D;
        float o[D / 2], s[FWD_BN / 2];
        unsigned p[FWD_BN / 16][4];
#if FWD_PINGPONG
        if (wg == 0) bar_arrive<1, 256>();  // the first turn is warp group 0's
#endif
        int it = 0, n = 0;
        for (int w = blockIdx.x; w < n_work; w += gridDim.x, n++) {
            const int qb = n_qb - 1 - w / BH, bh = w % BH, b = bh / H, h = bh % H;
            const int q0 = qb * FWD_BM, w0 = q0 + 64 * wg;  // the CTA's and the warp group's first rows
            const int n_tiles = (min(q0 + FWD_BM, T) - 1) / FWD_BN + 1;
            const int n_wg = w0 < T ? (min(w0 + 63, T - 1)) / FWD_BN + 1 : 0;
            // the tiles the warp group computes; with ping-pong all (the turns must match; a tile all past
            // its rows is masked whole and changes nothing)
            const int n_use = FWD_PINGPONG ? n_tiles : n_wg;
            const int i0 = w0 + 16 * warp + g;  // the thread's rows: i0 and i0 + 8
#pragma unroll
            for (int i = 0; i < D / 2; i++) o[i] = 0.f;
            float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
#if FWD_OVERLAP
            int pst = 0;  // the previous tile's stage (its P·V runs in this iteration)
#endif
            mbar_wait(q_full, n & 1);
            for (int j = 0; j < n_tiles; j++, it++) {
                const int st = it % FWD_STAGES;
                const unsigned empty = bars + 8 * (FWD_STAGES + st);
                mbar_wait(bars + 8 * st, (it / FWD_STAGES) & 1);  // tile j landed
                if (j >= n_use) {  // every key of the tile after the warp group's rows: pass the stage on
                    mbar_arrive(empty);
                    continue;
                }
                const int j0 = j * FWD_BN;
                const unsigned kt = Ks + st * TILE_BYTES, vt = Vs + st * TILE_BYTES;
                const bool diag = j0 + FWD_BN - 1 > w0;
                float c0, c1;
#if FWD_OVERLAP
                sched_wait(wg);
                issue_scores<FWD_BN>(s, Qs + 64 * wg * RB, kt);
                if (j > 0) issue_accumulate<FWD_BN>(o, p, Vs + pst * TILE_BYTES);  // the previous tile's P·V ...
                if (j > 0) wg_wait<1>();  // ... still running: only S_j is waited for
                else wg_wait<0>();
                sched_pass(wg);
                reg_fence(s);
                online_softmax<FWD_BN>(s, m0, m1, l0, l1, c0, c1, i0, j0, diag, sl2, t);
                wg_wait<0>();  // P_{j-1}·V_{j-1} done: O and P may change, its stage is free
                reg_fence(o);
                reg_fence(p);
                if (j > 0) mbar_arrive(bars + 8 * (FWD_STAGES + pst));
                rescale_and_pack<FWD_BN>(o, p, s, c0, c1);
                if (j == n_use - 1) {  // the warp group's last tile: its P·V now
                    sched_wait(wg);
                    issue_accumulate<FWD_BN>(o, p, vt);
                    wg_wait<0>();
                    sched_pass(wg);
                    reg_fence(o);
                    mbar_arrive(empty);
                }
                pst = st;
#else
                sched_wait(wg);
                issue_scores<FWD_BN>(s, Qs + 64 * wg * RB, kt);
                wg_wait<0>();
                sched_pass(wg);
                reg_fence(s);
                online_softmax<FWD_BN>(s, m0, m1, l0, l1, c0, c1, i0, j0, diag, sl2, t);
                rescale_and_pack<FWD_BN>(o, p, s, c0, c1);
                sched_wait(wg);
                issue_accumulate<FWD_BN>(o, p, vt);
                wg_wait<0>();
                sched_pass(wg);
                reg_fence(o);
                mbar_arrive(empty);
#endif
            }
            mbar_arrive(q_empty);  // Q free for the producer's next tile, while this one's epilogue runs
            reg_fence(o);
            l0 = quad_sum(l0);
            l1 = quad_sum(l1);
            store_rows(y + (long)b * T * yT + h * D, yT, o, i0, T, 1.f / l0, 1.f / l1, t);
            if (t == 0) {
                if (i0 < T) lse[(long)bh * T + i0] = (m0 + log2f(l0)) * LN2;
                if (i0 + 8 < T) lse[(long)bh * T + i0 + 8] = (m1 + log2f(l1)) * LN2;
            }
        }
    }
}
#endif  // FWD_WS
#endif  // WG_KERNELS & 1


// ---------------------------------------------------------------------------------------------
// Backward. delta = Σ_d dO·O per row comes first (flash_bwd_prep below, for both paths); the probabilities
// are recomputed from lse.
//   dQ     flash_bwd_dq: a CTA of DQ_WG warp groups owns 64·DQ_WG query rows, as the forward, and
//          streams K and V tiles (DQ_BN keys) through the same cp.async ring: S = Q·Kᵀ and dP = dO·Vᵀ
//          (both operands in shared memory), dS = P ∘ (dP − delta) in registers as the A operand of
//          dQ += dS·K (K MN-major).
//   dK/dV  flash_bwd_dkdv: a CTA of KV_WG warp groups owns 64·KV_WG keys (K and V in shared memory once)
//          and streams tiles of KV_BM queries (Q, dO, and their lse and delta) from its first key on,
//          transposed: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, then dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ, dSᵀ in registers.
//          The two kernels sum in registers in a fixed order: the same bits every run, no atomics.
//   overlap (KV_OVERLAP) the dV, dK (and dQ) products of query tile m − 1 are issued after tile m's Sᵀ and
//          dPᵀ and run while tile m's probabilities and dSᵀ are computed (the forward's intra-warpgroup
//          pipelining): Pᵀ, dSᵀ of m − 1 stay in registers one iteration longer.
//   fused  flash_bwd_fused (FlashAttention-2/3's single pass): the dK/dV kernel also writes dSᵀ (16-bit)
//          to shared memory and computes each query tile's dQ part over its keys, dS·K (A = dS MN-major
//          through the transpose-A bit, B = K MN-major), into an fp32 accumulator dq_acc [B·H, T/64
//          tiles, 64·D] kept in fragment order (each thread's float4s contiguous across the warp group:
//          coalesced 16-byte reductions; flash_bwd_dq_convert or the last writer un-permutes). With two
//          warp groups the two halves of the CTA's sum meet in shared memory first (one reduction per
//          element per 128 keys). Two ways to add the key blocks' parts:
//            ordered = 0: red.global.add.v4.f32 into dq_acc zeroed by flash_bwd_prep, then
//                         flash_bwd_dq_convert (× scale, 16-bit) into dq: fast, but the order of the
//                         fp32 additions changes from run to run (not deterministic);
//            ordered = 1: FA-3's deterministic order: a semaphore per (head, query tile) lets the key
//                         blocks add in a fixed order, the diagonal one first (it stores), key block 0
//                         last (it adds the sum to its part in registers and writes dq, 16-bit: no
//                         convert pass, no zeroing). The grid runs the shortest key blocks (the last) first
//                         so every block waits only on blocks launched before it (no deadlock: the GPU
//                         starts CTAs in launch order), and a waiting block idles only when its
//                         predecessor has not yet reached the same query tile.
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
#ifndef KV_OVERLAP
#define KV_OVERLAP 0
#endif
#if DQ_STAGES < 3 || KV_STAGES < 3
#error "DQ_STAGES, KV_STAGES >= 3 (a stage is refilled two iterations after its tile was read)"
#endif
#if (DQ_BN != 64 && DQ_BN != 128) || (KV_BM != 64 && KV_BM != 128)
#error "DQ_BN and KV_BM must be 64 or 128"
#endif
#if (WG_KERNELS & 8) && KV_WG > 2
#error "flash_bwd_fused takes 1 or 2 warp groups"
#endif
#define DQ_BM (64 * DQ_WG)
#define DQ_NT (128 * DQ_WG)
#define DQ_TILE (DQ_BN * RB)
#define DQ_SMEM (1024 + 2 * DQ_BM * RB + 2 * DQ_STAGES * DQ_TILE)  // Q, dO; K and V stages
#define KV_BN (64 * KV_WG)
#define KV_NT (128 * KV_WG)
#define KV_TILE (KV_BM * RB)
#define KV_SMEM (1024 + 2 * KV_BN * RB + 2 * KV_STAGES * KV_TILE + 2 * KV_STAGES * KV_BM * 4)  // K, V; Q, dO, lse, delta stages
// the fused pass's exchange: half of each warp group's dQ part, for the other
#define KV_XCHG (KV_WG == 2 ? 64 * D * 4 : 0)
// flash_bwd_fused streams tiles of 64 queries whatever KV_BM (a row of dSᵀ is one 128-byte swizzle atom)
#define KV_SMEM_FUSED (1024 + 2 * KV_BN * RB + 2 * KV_STAGES * 64 * RB + 2 * KV_STAGES * 64 * 4 + KV_BN * 128 + KV_XCHG)

// 4 bytes global -> shared, asynchronously; zero-filled when !valid
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

#if WG_KERNELS & 2
// dS = P ∘ (dP − delta) (without the scale: applied once at the end) of the thread's rows i0, i0 + 8 against
// the tile's keys j0 ..: P = 2^(s·sl2 − L), the exponent −∞ for a key after the row (MASK: the diagonal
// tiles; see probs_and_ds)
template <bool MASK>
__device__ __forceinline__ void dq_ds(float (&s)[DQ_BN / 2], const float (&dp)[DQ_BN / 2], int j0, int i0, int t, float sl2,
                                      float L0, float L1, float e0, float e1) {
#pragma unroll
    for (int n = 0; n < DQ_BN / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = j0 + n * 8 + 2 * t + (e & 1), row = i0 + 8 * (e / 2);
            const float p = fast_exp2(fmaf(s[4 * n + e], sl2, MASK && key > row ? -INFINITY : -(e < 2 ? L0 : L1)));
            s[4 * n + e] = p * (dp[4 * n + e] - (e < 2 ? e0 : e1));
        }
    }
}
#endif

#if WG_KERNELS & 2
// dq_i = scale Σ_{j ≤ i} P_ij (dP_ij − delta_i) k_j,  dP = dO·Vᵀ, P = exp(scale q·k − lse). Grid
// (ceil(T / DQ_BM), B·H), DQ_NT threads, DQ_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(DQ_NT, DQ_MINB)
flash_bwd_dq(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
             const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
             h16* __restrict__ dq, int H, int T, long sB, long sT, long sH, float scale) {
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
        if (diag) dq_ds<true>(s, dp, j0, i0, t, sl2, L0, L1, e0, e1);
        else dq_ds<false>(s, dp, j0, i0, t, sl2, L0, L1, e0, e1);
        to_frags<DQ_BN>(f, s);
        issue_accumulate<DQ_BN>(acc, f, kt);
        wg_wait<0>();
    }
    cp_async_wait<0>();
    if (n_wg == 0) return;
    reg_fence(acc);
    store_rows(dq + off, sT, acc, i0, T, scale, scale, t);
}
#endif  // WG_KERNELS & 2

#if WG_KERNELS & (4 | 8)
// Pᵀ and dSᵀ of one query tile in the transposed accumulators: s (Sᵀ = K·Qᵀ, raw) becomes Pᵀ = 2^(s·sl2 −
// lse·log2 e), dp (dPᵀ) becomes dSᵀ = Pᵀ ∘ (dPᵀ − delta) (without the scale: applied once at the end);
// zero where a query precedes the key or lies past T (EDGE builds, where `edge`; the caller picks the
// build once a tile). L, E: the tile's lse and delta in shared memory; the thread's keys j0 and j0 + 8, the tile's
// first query i0. A masked score gets the exponent −∞, whose ex2 is exactly the 0 a mask writes (the same
// bits for any finite score; a masked ±inf or NaN score, which only a diverged model makes, gives NaN).
// Written as a choice between ex2 and 0, it made ptxas branch around every exponential and keep each
// score's predicate in a register bit (the H200's profile: integer and branch instructions a third of
// the fused backward's).
template <int BM, bool EDGE>
__device__ __forceinline__ void probs_and_ds(float (&s)[BM / 2], float (&dp)[BM / 2], const float* L, const float* E,
                                             int i0, int j0, bool edge, float sl2, int t, int T) {
#pragma unroll
    for (int n = 0; n < BM / 8; n++) {
        const int c = n * 8 + 2 * t;  // the query columns c, c + 1
        const float2 l = *reinterpret_cast<const float2*>(L + c), d = *reinterpret_cast<const float2*>(E + c);
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = i0 + c + (e & 1), key = j0 + 8 * (e / 2);
            const float li = (e & 1) ? l.y : l.x, di = (e & 1) ? d.y : d.x;
            const float p = fast_exp2(fmaf(s[4 * n + e], sl2, EDGE && edge && !(i >= key && i < T) ? -INFINITY : -li * LOG2E));
            s[4 * n + e] = p;
            dp[4 * n + e] = p * (dp[4 * n + e] - di);
        }
    }
}
template <int BM>
__device__ __forceinline__ void probs_and_ds(float (&s)[BM / 2], float (&dp)[BM / 2], const float* L, const float* E,
                                             int i0, int j0, bool edge, float sl2, int t, int T) {
    if constexpr (BM > 64)  // one build, masks chosen per score: two of 128-query tiles spill at D = 32
        probs_and_ds<BM, true>(s, dp, L, E, i0, j0, edge, sl2, t, T);
    else if (edge)
        probs_and_ds<BM, true>(s, dp, L, E, i0, j0, true, sl2, t, T);
    else
        probs_and_ds<BM, false>(s, dp, L, E, i0, j0, false, sl2, t, T);
}

// flash_bwd_fused's semaphores: spin until *p == want (acquire: the earlier key blocks' sums are visible);
// publish the next value once this block's sums are written (release, after a CTA barrier: every thread's)
__device__ __forceinline__ void wait_value(const int* p, int want) {
    for (unsigned n = 0;; n++) {
        int v;
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
        if (v == want) return;
        if (n == WATCHDOG_POLLS) __trap();
        __nanosleep(64);
    }
}
__device__ __forceinline__ void release_value(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void red_add4(float* p, float a, float b, float c, float d) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// dSᵀ of the warp group's 64 keys (df: its k16 A fragments over the 64 queries) into the region of 64
// rows of 128 bytes at ds (one key a row, swizzled as 128-byte atoms: the stores of a warp hit 32 banks)
__device__ __forceinline__ void store_ds(unsigned ds, const unsigned (&df)[4][4], int warp, int g, int t) {
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
#pragma unroll
        for (int f = 0; f < 4; f++) {
            const int r = 16 * warp + g + 8 * (f & 1), c = 16 * kc + 8 * (f >> 1) + 2 * t;
            asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(ds + swz_rb<128>(r * 128 + c * 2)), "r"(df[kc][f]) : "memory");
        }
}

// dq = dS·K over the warp group's 64 keys: A = dSᵀ at ds read MN-major (M = the 64 queries along a row),
// B = the keys' K rows at kr, MN-major (N = D); 4 k16 steps, issued, not waited for
__device__ __forceinline__ void issue_dq(float (&dq)[D / 2], unsigned ds, unsigned kr) {
    reg_fence(dq);
    wg_fence();
    const unsigned la = desc_mn_lo<128>(ds), lb = desc_mn_lo<RB>(kr);
#pragma unroll
    for (int kc = 0; kc < 4; kc++)
        wgmma_ss<D, 1, 1>(dq, desc_make(la + kc * (16 * 128 >> 4), desc_hi<128>()), desc_make(lb + kc * (16 * RB >> 4), desc_hi<RB>()),
                          kc > 0);
    wg_commit();
    reg_fence(dq);
}

// dq_out's pieces, for the float4s F0 .. F0 + D/8/KV_WG − 1 of the thread's fragment (compile-time
// indices: a run-time one would put the fragment in local memory)
template <int W>  // KV_WG == 2, warp group W: its part of the other's float4s out (before a barrier) ...
__device__ __forceinline__ void dq_put(const float (&dq)[D / 2], unsigned Xs, int x) {
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        const int f = (1 - W) * (D / 16) + n;
        asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(Xs + (f * 128 + x) * 16), "f"(dq[4 * f]),
                     "f"(dq[4 * f + 1]), "f"(dq[4 * f + 2]), "f"(dq[4 * f + 3]) : "memory");
    }
}
template <int W>  // ... and the other's part of its own float4s in, added (after it)
__device__ __forceinline__ void dq_get(float (&dq)[D / 2], unsigned Xs, int x) {
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        const int f = W * (D / 16) + n;
        float a, b, c, d;
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(a), "=f"(b), "=f"(c), "=f"(d) : "r"(Xs + (f * 128 + x) * 16) : "memory");
        dq[4 * f] += a;
        dq[4 * f + 1] += b;
        dq[4 * f + 2] += c;
        dq[4 * f + 3] += d;
    }
}
template <int F0>
__device__ __forceinline__ void dq_red(const float (&dq)[D / 2], float* chunk, int x) {
#pragma unroll
    for (int n = 0; n < D / 8 / KV_WG; n++) {
        const int f = F0 + n;
        red_add4(chunk + (f * 128 + x) * 4, dq[4 * f], dq[4 * f + 1], dq[4 * f + 2], dq[4 * f + 3]);
    }
}
// the ordered sums: the first key block stores, the middle ones add, key block 0 (the last) adds the
// sum to its part and writes dq (× scale, 16-bit) at the fragment's rows and columns
template <int F0>
__device__ __forceinline__ void dq_ordered(const float (&dq)[D / 2], float* chunk, int x, int kb, int kb_last, int qt, int T,
                                           h16* dqb, long sT, float scale) {
    const int warp = x / 32, lane = x % 32;
#pragma unroll
    for (int n = 0; n < D / 8 / KV_WG; n++) {
        const int f = F0 + n;
        float* a = chunk + (f * 128 + x) * 4;
        if (kb == 0) {
            float v0 = 0.f, v1 = 0.f, v2 = 0.f, v3 = 0.f;
            if (kb < kb_last)
                asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v0), "=f"(v1), "=f"(v2), "=f"(v3) : "l"(a) : "memory");
            const int r = 16 * warp + lane / 4, c = 8 * f + 2 * (lane % 4), i = qt * 64 + r;
            if (i < T) *reinterpret_cast<unsigned*>(dqb + i * sT + c) = pack((v0 + dq[4 * f]) * scale, (v1 + dq[4 * f + 1]) * scale);
            if (i + 8 < T)
                *reinterpret_cast<unsigned*>(dqb + (i + 8) * sT + c) = pack((v2 + dq[4 * f + 2]) * scale, (v3 + dq[4 * f + 3]) * scale);
        } else if (kb == kb_last) {  // the first: stored, so dq_acc needs no zeroing
            asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(a), "f"(dq[4 * f]), "f"(dq[4 * f + 1]),
                         "f"(dq[4 * f + 2]), "f"(dq[4 * f + 3]) : "memory");
        } else {
            red_add4(a, dq[4 * f], dq[4 * f + 1], dq[4 * f + 2], dq[4 * f + 3]);
        }
    }
}

// The CTA's dQ part of query tile qt (each warp group's in acc, the m64nD fragment, where `have`) added to
// the others'.
// In dq_acc the tile's 64·D floats are in fragment order: float4 n of thread x (of 128) at (n·128 + x)·4.
// With two warp groups, warp group w adds the float4s n of its half (w·D/16 .. ) of both parts.
__device__ __forceinline__ void dq_out(const float (&acc)[D / 2], bool have, int qt, int kb, int n_qt, int T, float* dq_acc,
                                       int* sem, h16* dqb, long sT, float scale, int ordered, unsigned Xs, int bh) {
    constexpr int GH = D / 8 / KV_WG;  // the float4s of the thread's fragment its warp group adds
    const int x = threadIdx.x % 128, wg = threadIdx.x / 128;
    float dq[D / 2];  // the warp group's part, or zeros where it had none (a copy: the accumulators are
                      // left to the products, else ptxas serializes them)
#pragma unroll
    for (int i = 0; i < D / 2; i++) dq[i] = have ? acc[i] : 0.f;
    float* chunk = dq_acc + ((long)bh * n_qt + qt) * 64 * D;
#if KV_WG == 2
    __syncthreads();  // the exchange buffer's readers of the last tile are done
    if (wg == 0) dq_put<0>(dq, Xs, x);
    else dq_put<1>(dq, Xs, x);
    __syncthreads();
    if (wg == 0) dq_get<0>(dq, Xs, x);
    else dq_get<1>(dq, Xs, x);
    if (!ordered) {
        if (wg == 0) dq_red<0>(dq, chunk, x);
        else dq_red<GH>(dq, chunk, x);
        return;
    }
#else
    if (!ordered) {
        dq_red<0>(dq, chunk, x);
        return;
    }
#endif
    const int kb_last = min(qt * 64 + 63, T - 1) / KV_BN;  // the diagonal key block: the first to add
    int* s = sem + (long)bh * n_qt + qt;
    if (threadIdx.x == 0 && kb < kb_last) wait_value(s, kb_last - kb);  // key blocks kb_last .. kb + 1 have added
    __syncthreads();
    if (KV_WG == 1 || wg == 0) dq_ordered<0>(dq, chunk, x, kb, kb_last, qt, T, dqb, sT, scale);
    else dq_ordered<GH>(dq, chunk, x, kb, kb_last, qt, T, dqb, sT, scale);
    if (kb > 0) {
        __syncthreads();  // every thread's part written
        if (threadIdx.x == 0) release_value(s, kb_last - kb + 1);
    }
}

// For the CTA's 64·KV_WG keys: dv_j = Σ_{i ≥ j} P_ij dO_i, dk_j = scale Σ_{i ≥ j} dS_ij q_i, computed
// transposed (keys as rows); FUSED: dq's parts too (dq_out). Grid (ceil(T / KV_BN), B·H), key block
// blockIdx.x (the first keys see the most queries: launched first), or with `ordered` the reverse.
template <bool FUSED>
__device__ __forceinline__ void bwd_kv(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
                                       const h16* __restrict__ dy, const float* __restrict__ lse,
                                       const float* __restrict__ delta, h16* __restrict__ dk, h16* __restrict__ dv,
                                       h16* __restrict__ dq, float* __restrict__ dq_acc, int* __restrict__ sem, int H, int T,
                                       long sB, long sT, long sH, float scale, int ordered) {
    constexpr int BM = FUSED ? 64 : KV_BM, TILE = BM * RB;  // queries a streamed tile (fused: one dS row a swizzle atom)
    const unsigned base = dynamic_smem_base(smem_raw, FUSED ? KV_SMEM_FUSED : KV_SMEM);
    const unsigned Ks = base, Vs = Ks + KV_BN * RB, Qs = Vs + KV_BN * RB, dOs = Qs + KV_STAGES * TILE;
    const unsigned dSs = dOs + KV_STAGES * TILE;           // FUSED: dSᵀ, KV_BN keys x 64 queries
    const unsigned Xs = dSs + (FUSED ? KV_BN * 128 : 0);      // FUSED with 2 warp groups: the dQ exchange
    const unsigned LEs = Xs + (FUSED ? KV_XCHG : 0);          // per stage: BM lse values, then BM deltas (fp32)
    const float* LE = reinterpret_cast<const float*>(smem_raw + (LEs - smem_addr(smem_raw)));

    const int kb = FUSED && ordered ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long off = b * sB + h * sH, yT = (long)H * D;
    const h16 *qb = q + off, *dyb = dy + (long)b * T * yT + h * D;
    const float *lseb = lse + (long)bh * T, *deltab = delta + (long)bh * T;
    const int k0 = kb * KV_BN, w0 = k0 + 64 * wg;  // the CTA's and the warp group's first keys
    const int n_tiles = (T - k0 + BM - 1) / BM;  // query tiles from the first key on
    const int m_wg = w0 < T ? (w0 - k0) / BM : n_tiles;  // the warp group's first tile with a query >= its keys
    const int j0 = w0 + 16 * warp + g;  // the thread's keys: j0 and j0 + 8
    const int n_qt = (T + 63) / 64, qt0 = k0 / 64;  // FUSED: 64-query tiles of a head; the CTA's first
    const float sl2 = scale * LOG2E;

    auto fetch = [&](int m) {  // query tile m (Q, dO, lse, delta) into stage m % KV_STAGES
        const int st = m % KV_STAGES, i0 = k0 + m * BM;
        load_tile<BM, KV_NT>(Qs + st * TILE, qb, sT, i0, T);
        load_tile<BM, KV_NT>(dOs + st * TILE, dyb, yT, i0, T);
#pragma unroll
        for (int n = 0; n < (2 * BM + KV_NT - 1) / KV_NT; n++) {  // a compile-time count (one at BM = 64)
            const int e = threadIdx.x + n * KV_NT;
            if ((2 * BM) % KV_NT == 0 || e < 2 * BM) {
                const int i = i0 + e % BM;
                const float* src = e < BM ? lseb : deltab;
                cp_async4(LEs + (st * 2 * BM + e) * 4, i < T ? src + i : src, i < T);
            }
        }
    };
    load_tile<KV_BN, KV_NT>(Ks, k + off, sT, k0, T);
    load_tile<KV_BN, KV_NT>(Vs, v + off, sT, k0, T);
#pragma unroll
    for (int m = 0; m < KV_STAGES - 2; m++) {
        if (m < n_tiles) fetch(m);
        cp_async_commit();
    }

    float dka[D / 2], dva[D / 2], s[BM / 2], dp[BM / 2];
    float dqa[FUSED ? D / 2 : 1];
    unsigned pf[BM / 16][4], df[BM / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.f;
    const unsigned kr = Ks + 64 * wg * RB, vr = Vs + 64 * wg * RB, ds = dSs + 64 * wg * 128;  // the warp group's rows
#if KV_OVERLAP
    int pst = 0;  // the stage of the last computed tile, whose products are still to issue
#endif

    for (int m = 0; m < n_tiles; m++) {
        cp_async_wait<KV_STAGES - 3>();
        fence_proxy_async();
        __syncthreads();
        if (m + KV_STAGES - 2 < n_tiles) fetch(m + KV_STAGES - 2);
        cp_async_commit();
        const bool active = m >= m_wg;  // some query of the tile at or after some key of the warp group
        const int st = m % KV_STAGES, i0 = k0 + m * BM;
        const unsigned qt = Qs + st * TILE, dot = dOs + st * TILE;
        const float *L = LE + st * 2 * BM, *E = L + BM;
        const bool edge = i0 < w0 + 63 || i0 + BM > T;  // some query before some key, or past T
#if !KV_OVERLAP
        if (active) {
            issue_scores<BM>(s, kr, qt);   // Sᵀ = K·Qᵀ
            issue_scores<BM>(dp, vr, dot);  // dPᵀ = V·dOᵀ
            wg_wait<0>();
            reg_fence(s);
            reg_fence(dp);
            probs_and_ds<BM>(s, dp, L, E, i0, j0, edge, sl2, t, T);
            to_frags<BM>(pf, s);
            to_frags<BM>(df, dp);
            issue_accumulate<BM>(dva, pf, dot);  // dV += Pᵀ·dO
            issue_accumulate<BM>(dka, df, qt);   // dK += dSᵀ·Q
            if constexpr (FUSED) {
                store_ds(ds, df, warp, g, t);
                fence_proxy_async();
                if (wg == 0) bar_sync<1, 128>();  // the warp group's dSᵀ complete
                else bar_sync<2, 128>();
                issue_dq(dqa, ds, kr);  // this tile's dQ part
            }
            wg_wait<0>();
        }
        if constexpr (FUSED) {
            if (active) reg_fence(dqa);
            dq_out(dqa, active, qt0 + m, kb, n_qt, T, dq_acc, sem, dq + off, sT, scale, ordered, Xs, bh);
        }
#else
        const bool deferred = m > m_wg;  // tile m − 1 computed, its products issued below
        if (active) {
            issue_scores<BM>(s, kr, qt);
            issue_scores<BM>(dp, vr, dot);
            if (deferred) {
                issue_accumulate<BM>(dva, pf, dOs + pst * TILE);
                issue_accumulate<BM>(dka, df, Qs + pst * TILE);
                if constexpr (FUSED) issue_dq(dqa, ds, kr);  // dSᵀ of m − 1, stored last iteration
                wg_wait<FUSED ? 3 : 2>();  // only Sᵀ and dPᵀ of tile m
            } else {
                wg_wait<0>();
            }
            reg_fence(s);
            reg_fence(dp);
            probs_and_ds<BM>(s, dp, L, E, i0, j0, edge, sl2, t, T);
            wg_wait<0>();  // tile m − 1's products done: its fragments and dSᵀ may change
            reg_fence(dka);
            reg_fence(dva);
            reg_fence(pf);
            reg_fence(df);
            if constexpr (FUSED) reg_fence(dqa);
            to_frags<BM>(pf, s);
            to_frags<BM>(df, dp);
            if constexpr (FUSED) {
                store_ds(ds, df, warp, g, t);
                fence_proxy_async();  // read by the next iteration's dQ product, after its barrier
            }
            pst = st;
        }
        if constexpr (FUSED) {  // tile m − 1's dQ part: computed above, or none (before the warp group's keys)
            if (m > 0) dq_out(dqa, deferred, qt0 + m - 1, kb, n_qt, T, dq_acc, sem, dq + off, sT, scale, ordered, Xs, bh);
        }
#endif
    }
#if KV_OVERLAP
    __syncthreads();  // FUSED: every thread's dSᵀ stores (each fenced) before the product that reads them
    if (n_tiles > m_wg) {  // the last tile's products
        issue_accumulate<BM>(dva, pf, dOs + pst * TILE);
        issue_accumulate<BM>(dka, df, Qs + pst * TILE);
        if constexpr (FUSED) issue_dq(dqa, ds, kr);
        wg_wait<0>();
        reg_fence(dka);
        reg_fence(dva);
        if constexpr (FUSED) reg_fence(dqa);
    }
    if constexpr (FUSED)
        dq_out(dqa, n_tiles > m_wg, qt0 + n_tiles - 1, kb, n_qt, T, dq_acc, sem, dq + off, sT, scale, ordered, Xs, bh);
#endif
    cp_async_wait<0>();
    if (w0 >= T) return;
    reg_fence(dka);
    reg_fence(dva);
    store_rows(dk + off, sT, dka, j0, T, scale, scale, t);
    store_rows(dv + off, sT, dva, j0, T, 1.f, 1.f, t);
}
#endif  // WG_KERNELS & (4 | 8)

#if WG_KERNELS & 4
// dk, dv. Grid (ceil(T / KV_BN), B·H), KV_NT threads, KV_SMEM bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(KV_NT, KV_MINB)
flash_bwd_dkdv(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
               const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
               h16* __restrict__ dk, h16* __restrict__ dv, int H, int T, long sB, long sT, long sH, float scale) {
    bwd_kv<false>(q, k, v, dy, lse, delta, dk, dv, nullptr, nullptr, nullptr, H, T, sB, sT, sH, scale, 0);
}
#endif

#if WG_KERNELS & 8
// dk, dv and dq in one pass (see the backward's notes): dq_acc [B·H, ceil(T/64), 64·D] fp32, sem
// [B·H, ceil(T/64)] int, both as flash_bwd_prep left them. Grid (ceil(T / KV_BN), B·H), KV_NT threads,
// KV_SMEM_FUSED bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(KV_NT, KV_MINB)
flash_bwd_fused(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
                const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
                h16* __restrict__ dk, h16* __restrict__ dv, h16* __restrict__ dq, float* __restrict__ dq_acc,
                int* __restrict__ sem, int H, int T, long sB, long sT, long sH, float scale, int ordered) {
    bwd_kv<true>(q, k, v, dy, lse, delta, dk, dv, dq, dq_acc, sem, H, T, sB, sT, sH, scale, ordered);
}
#endif

#if WG_KERNELS & 16
// delta[b, h, i] = Σ_d dy[b, i, h, d]·y[b, i, h, d] (D/8 threads a row, 16 bytes each), and zeros into
// n_zero float4s at zero (flash_bwd_fused's dq_acc when its sums are atomic) and n_sem ints at sem.
// Any grid of whole warps that covers B·T·H·D/8 threads.
extern "C" __global__ void flash_bwd_prep(const h16* __restrict__ dy, const h16* __restrict__ y, float* __restrict__ delta,
                                          float4* __restrict__ zero, long n_zero, int* __restrict__ sem, long n_sem, int B,
                                          int H, int T) {
    constexpr int R = D / 8;
    const long id = (long)blockIdx.x * blockDim.x + threadIdx.x, rows = (long)B * T * H, row = id / R;
    float s = 0.f;
    if (row < rows) {
        float a[8], c[8];
        unpack8(*reinterpret_cast<const uint4*>(dy + row * D + (id % R) * 8), a);
        unpack8(*reinterpret_cast<const uint4*>(y + row * D + (id % R) * 8), c);
#pragma unroll
        for (int e = 0; e < 8; e++) s = fmaf(a[e], c[e], s);
    }
#pragma unroll
    for (int o = R / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);  // a row's R lanes, aligned
    if (row < rows && id % R == 0) {
        const int h = row % H, i = (row / H) % T, b = row / ((long)H * T);
        delta[((long)b * H + h) * T + i] = s;
    }
    const long step = (long)gridDim.x * blockDim.x;
    for (long e = id; e < n_zero; e += step) zero[e] = make_float4(0.f, 0.f, 0.f, 0.f);
    for (long e = id; e < n_sem; e += step) sem[e] = 0;
}

// dq = scale·dq_acc (fragment order, see dq_out) rounded to 16 bits into the [B, T, H, D] view dq; one
// thread a float4, n4 = B·H·ceil(T/64)·16·D of them.
extern "C" __global__ void flash_bwd_dq_convert(const float* __restrict__ dq_acc, h16* __restrict__ dq, int H, int T,
                                                long sB, long sT, long sH, float scale, long n4) {
    const long e = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n4) return;
    const int x = e % 128, f = (e / 128) % (D / 8);
    const long tile = e / (128 * (D / 8));
    const int n_qt = (T + 63) / 64, qt = tile % n_qt, bh = tile / n_qt, b = bh / H, h = bh % H;
    const float4 a = reinterpret_cast<const float4*>(dq_acc)[e];
    const int warp = x / 32, lane = x % 32, r = 16 * warp + lane / 4, c = 8 * f + 2 * (lane % 4), i = qt * 64 + r;
    h16* dst = dq + b * sB + h * sH;
    if (i < T) *reinterpret_cast<unsigned*>(dst + i * sT + c) = pack(a.x * scale, a.y * scale);
    if (i + 8 < T) *reinterpret_cast<unsigned*>(dst + (i + 8) * sT + c) = pack(a.z * scale, a.w * scale);
}
#endif
