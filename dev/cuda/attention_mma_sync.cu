// The synchronous-tile-load tensor-core flash attention ("variant 1"), kept for dev/cuda only:
// production runs the cp.async pipelined kernels of andrea/kernels/attention_mma.cu (flash_fwd,
// flash_bwd_dq, flash_bwd_dkdv), which replaced these (they were the kernels of those names up to
// commit 9fdabf6). The same schedule, tiles loaded with plain 16-byte loads and a __syncthreads
// around each; the scores' B fragments read as 32-bit words; exp2f; masks on every tile. Built on
// the __device__ helpers of attention_mma.cu, included here (compile with -I andrea/kernels and
// -DHEAD_DIM=<D>, as dev/cuda/attention_mma.py does), and on the synchronous tile helpers below.
#include "attention_mma.cu"

// ---- the synchronous tile helpers (production's kernels no longer use them)

// 32-bit word holding elements (row, col) and (row, col + 1) of a h16 tile with leading dim ld
__device__ __forceinline__ unsigned word(const h16* s, int ld, int row, int col) {
    return *reinterpret_cast<const unsigned*>(s + row * ld + col);
}

// A fragment (16 x 16, row-major source) at rows r0.., cols c0..
__device__ __forceinline__ void load_a(unsigned a[4], const h16* s, int ld, int r0, int c0, int g, int t) {
    a[0] = word(s, ld, r0 + g, c0 + 2 * t);
    a[1] = word(s, ld, r0 + g + 8, c0 + 2 * t);
    a[2] = word(s, ld, r0 + g, c0 + 8 + 2 * t);
    a[3] = word(s, ld, r0 + g + 8, c0 + 8 + 2 * t);
}

// rows [r0, r0 + TILE) of a [*, D] view (row stride sT) into a row-major tile; rows >= T are zero.
__device__ __forceinline__ void load_rows(h16* s, const h16* src, long sT, int r0, int T) {
    const int per_row = D / 8;  // 16-byte chunks
    for (int e = threadIdx.x; e < TILE * per_row; e += WARPS * 32) {
        int r = e / per_row, c = (e % per_row) * 8;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (r0 + r < T) val = *reinterpret_cast<const uint4*>(src + (r0 + r) * sT + c);
        *reinterpret_cast<uint4*>(s + r * LDR + c) = val;
    }
}

// scores of this warp's 16 rows against a 64-wide tile: s = A · tileᵀ, A given as fragments
__device__ __forceinline__ void scores(float s[NT][4], const unsigned a[KD][4], const h16* tile, int g, int t) {
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kc = 0; kc < KD; kc++)
#pragma unroll
        for (int n = 0; n < NT; n++)
            mma(s[n], a[kc], word(tile, LDR, n * 8 + g, kc * 16 + 2 * t), word(tile, LDR, n * 8 + g, kc * 16 + 8 + 2 * t));
}


extern "C" __global__ void __launch_bounds__(WARPS * 32)
flash_fwd_sync(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v, h16* __restrict__ y,
               float* __restrict__ lse, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) h16 Qs[TILE * LDR];
    __shared__ __align__(16) h16 Ks[TILE * LDR];
    __shared__ __align__(16) h16 Vs[TILE * LDR];
    const int qb = gridDim.x - 1 - blockIdx.x;  // longest rows first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int q0 = qb * TILE, r0 = warp * 16;
    const float sl2 = scale * LOG2E;  // scores in log2 units: exp2 instead of exp

    load_rows(Qs, q + base, sT, q0, T);
    __syncthreads();
    unsigned qf[KD][4];
#pragma unroll
    for (int kc = 0; kc < KD; kc++) load_a(qf[kc], Qs, LDR, r0, kc * 16, g, t);

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // rows g and g + 8
    const int i0 = q0 + r0 + g, i1 = i0 + 8;

    for (int j0 = 0; j0 <= q0; j0 += TILE) {
        __syncthreads();
        load_rows(Ks, k + base, sT, j0, T);
        load_rows(Vs, v + base, sT, j0, T);
        __syncthreads();
        float s[NT][4];
        scores(s, qf, Ks, g, t);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            int j = j0 + n * 8 + 2 * t;
            s[n][0] = j <= i0 ? s[n][0] * sl2 : -INFINITY;
            s[n][1] = j + 1 <= i0 ? s[n][1] * sl2 : -INFINITY;
            s[n][2] = j <= i1 ? s[n][2] * sl2 : -INFINITY;
            s[n][3] = j + 1 <= i1 ? s[n][3] * sl2 : -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        float mn0 = fmaxf(m0, quad_max(mx0)), mn1 = fmaxf(m1, quad_max(mx1));
        float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // 0 on the first tile
        m0 = mn0;
        m1 = mn1;
        float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            s[n][0] = exp2f(s[n][0] - mn0);
            s[n][1] = exp2f(s[n][1] - mn0);
            s[n][2] = exp2f(s[n][2] - mn1);
            s[n][3] = exp2f(s[n][3] - mn1);
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
        accumulate(o, s, Vs, lane);
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
extern "C" __global__ void __launch_bounds__(WARPS * 32)
flash_bwd_dq_sync(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
                  const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
                  h16* __restrict__ dq, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) h16 Ks[TILE * LDR];
    __shared__ __align__(16) h16 Vs[TILE * LDR];
    const int qb = gridDim.x - 1 - blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int q0 = qb * TILE, r0 = warp * 16;
    const float sl2 = scale * LOG2E;
    const long yT = (long)H * D;

    load_rows(Ks, q + base, sT, q0, T);  // Ks, Vs double as staging for q and dy
    load_rows(Vs, dy + (long)b * T * yT + h * D, yT, q0, T);
    __syncthreads();
    unsigned qf[KD][4], df[KD][4];
#pragma unroll
    for (int kc = 0; kc < KD; kc++) {
        load_a(qf[kc], Ks, LDR, r0, kc * 16, g, t);
        load_a(df[kc], Vs, LDR, r0, kc * 16, g, t);
    }
    const int i0 = q0 + r0 + g, i1 = i0 + 8;
    const float L0 = i0 < T ? lse[(long)bh * T + i0] * LOG2E : 0.f, L1 = i1 < T ? lse[(long)bh * T + i1] * LOG2E : 0.f;
    const float d0 = i0 < T ? delta[(long)bh * T + i0] : 0.f, d1 = i1 < T ? delta[(long)bh * T + i1] : 0.f;
    float acc[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;

    for (int j0 = 0; j0 <= q0; j0 += TILE) {
        __syncthreads();
        load_rows(Ks, k + base, sT, j0, T);
        load_rows(Vs, v + base, sT, j0, T);
        __syncthreads();
        float s[NT][4], dp[NT][4];
        scores(s, qf, Ks, g, t);
        scores(dp, df, Vs, g, t);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            int j = j0 + n * 8 + 2 * t;
            float p0 = j <= i0 ? exp2f(s[n][0] * sl2 - L0) : 0.f;
            float p1 = j + 1 <= i0 ? exp2f(s[n][1] * sl2 - L0) : 0.f;
            float p2 = j <= i1 ? exp2f(s[n][2] * sl2 - L1) : 0.f;
            float p3 = j + 1 <= i1 ? exp2f(s[n][3] * sl2 - L1) : 0.f;
            s[n][0] = p0 * (dp[n][0] - d0);
            s[n][1] = p1 * (dp[n][1] - d0);
            s[n][2] = p2 * (dp[n][2] - d1);
            s[n][3] = p3 * (dp[n][3] - d1);
        }
        accumulate(acc, s, Ks, lane);
    }
    store_rows(dq + base, sT, acc, q0 + r0, T, scale, scale, g, t);
}

// For the 64 keys of a block: dv_j = sum_{i >= j} P_ij dy_i, dk_j = scale * sum_{i >= j} dS_ij q_i,
// computed transposed (keys as rows): Sᵀ = k · qᵀ, dPᵀ = v · dyᵀ.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
flash_bwd_dkdv_sync(const h16* __restrict__ q, const h16* __restrict__ k, const h16* __restrict__ v,
                    const h16* __restrict__ dy, const float* __restrict__ lse, const float* __restrict__ delta,
                    h16* __restrict__ dk, h16* __restrict__ dv, int H, int T, long sB, long sT, long sH, float scale) {
    __shared__ __align__(16) h16 Qs[TILE * LDR];
    __shared__ __align__(16) h16 Ds[TILE * LDR];
    __shared__ float Ls[TILE], Es[TILE];
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const long base = b * sB + h * sH;
    const int k0 = blockIdx.x * TILE, r0 = warp * 16;  // the first keys see the most queries: launched first
    const float sl2 = scale * LOG2E;
    const long yT = (long)H * D;
    const h16* dyb = dy + (long)b * T * yT + h * D;

    load_rows(Qs, k + base, sT, k0, T);  // staging for k and v
    load_rows(Ds, v + base, sT, k0, T);
    __syncthreads();
    unsigned kf[KD][4], vf[KD][4];
#pragma unroll
    for (int kc = 0; kc < KD; kc++) {
        load_a(kf[kc], Qs, LDR, r0, kc * 16, g, t);
        load_a(vf[kc], Ds, LDR, r0, kc * 16, g, t);
    }
    const int j0k = k0 + r0 + g, j1k = j0k + 8;  // this thread's two key rows
    float dka[ND][4], dva[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) {
        dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
        dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
    }

    for (int i0 = k0; i0 < T; i0 += TILE) {
        __syncthreads();
        load_rows(Qs, q + base, sT, i0, T);
        load_rows(Ds, dyb, yT, i0, T);
        for (int e = threadIdx.x; e < TILE; e += WARPS * 32) {
            int i = i0 + e;
            Ls[e] = i < T ? lse[(long)bh * T + i] * LOG2E : 0.f;
            Es[e] = i < T ? delta[(long)bh * T + i] : 0.f;
        }
        __syncthreads();
        float s[NT][4], dp[NT][4];
        scores(s, kf, Qs, g, t);
        scores(dp, vf, Ds, g, t);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            int c = n * 8 + 2 * t, i = i0 + c;  // query columns c, c + 1
            bool ok00 = i >= j0k && i < T, ok01 = i + 1 >= j0k && i + 1 < T;
            bool ok10 = i >= j1k && i < T, ok11 = i + 1 >= j1k && i + 1 < T;
            s[n][0] = ok00 ? exp2f(s[n][0] * sl2 - Ls[c]) : 0.f;
            s[n][1] = ok01 ? exp2f(s[n][1] * sl2 - Ls[c + 1]) : 0.f;
            s[n][2] = ok10 ? exp2f(s[n][2] * sl2 - Ls[c]) : 0.f;
            s[n][3] = ok11 ? exp2f(s[n][3] * sl2 - Ls[c + 1]) : 0.f;
            dp[n][0] = s[n][0] * (dp[n][0] - Es[c]);
            dp[n][1] = s[n][1] * (dp[n][1] - Es[c + 1]);
            dp[n][2] = s[n][2] * (dp[n][2] - Es[c]);
            dp[n][3] = s[n][3] * (dp[n][3] - Es[c + 1]);
        }
        accumulate(dva, s, Ds, lane);
        accumulate(dka, dp, Qs, lane);
    }
    store_rows(dk + base, sT, dka, k0 + r0, T, scale, scale, g, t);
    store_rows(dv + base, sT, dva, k0 + r0, T, 1.f, 1.f, g, t);
}
