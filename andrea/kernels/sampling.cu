// The next token of each row, chosen on the device from its fp32 logits, so that a captured
// one-token step can feed its own output back and the host reads token IDs only, a few steps behind
// (andrea/sampling.py). The NumPy reference is andrea/engine/numpy_backend.sample_tokens; the
// operations below follow it step for step, in fp32, sums in the same order.
//
// One block of SAMPLE_THREADS threads per row. Thread t owns the contiguous indices
// [t·per, (t + 1)·per) of the row, so scans over threads keep index order.
//   greedy (temperature ≤ 0): the first largest logit.
//   otherwise: the k-th largest logit by a radix select over order-preserving keys (four passes
//   of 8 bits); the candidates are every logit above it, then the ties at it in index order (at
//   most SAMPLE_CANDIDATES in all); ranked by (logit descending, index ascending); p = exp((z −
//   z_max)·(1/temperature)); one thread sums them in rank order, keeps the smallest prefix whose
//   sum before each member stays below top_p·total, and picks the first member whose running sum
//   exceeds u·(the kept sum), u from a counter-based generator: splitmix64 of (seed, draw).
// NaN or +inf anywhere in a row: the pick is −1 (the host reports it), and the next step's input
// gets token 0 instead (steps already queued embed it: never an index outside the table). −inf is
// a masked token. Writes tokens[row] (the next step's input), ring[row·R + draw % R] (host-mapped
// memory: the host reads it after an event) and draws[row] = draw + 1.
#include "common.cuh"  // INFINITY (NVRTC has no <math.h>)

#define SAMPLE_THREADS 512
#define SAMPLE_CANDIDATES 1024

__device__ __forceinline__ unsigned int order_key(float x) {
    // larger float, larger key; NaN is caught separately and ranks as −inf here; −0 is +0 (as compared)
    if (isnan(x)) x = -INFINITY;
    if (x == 0.0f) x = 0.0f;
    unsigned int b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// u in [0, 1) with 24 random bits: exact in fp32
__device__ __forceinline__ float draw_uniform(unsigned long long seed, int draw) {
    unsigned long long x = mix64(seed + (unsigned long long)(draw + 1) * 0x9e3779b97f4a7c15ULL);
    return (float)(x >> 40) * 5.9604644775390625e-08f;  // 2^-24
}

// exclusive scan of one int per thread over the block (index order = thread order); returns the total
__device__ __forceinline__ int block_exclusive_scan(int v, int* out, int* warp_sums) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int x = v;
    for (int o = 1; o < 32; o <<= 1) {
        int y = __shfl_up_sync(0xffffffff, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        int s = lane < warps ? warp_sums[lane] : 0;
        for (int o = 1; o < 32; o <<= 1) {
            int y = __shfl_up_sync(0xffffffff, s, o);
            if (lane >= o) s += y;
        }
        if (lane < warps) warp_sums[lane] = s;  // inclusive, per warp
    }
    __syncthreads();
    *out = x - v + (warp > 0 ? warp_sums[warp - 1] : 0);
    int total = warp_sums[warps - 1];
    __syncthreads();  // warp_sums is reused by the next scan
    return total;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows(const float* __restrict__ logits, long long ld, int V, const unsigned long long* __restrict__ seeds,
            int* __restrict__ draws, int* __restrict__ tokens, unsigned long long ring_addr, int R, int greedy,
            float inv_temp, int top_k, float top_p) {
    __shared__ unsigned int hist[256];
    __shared__ int warp_sums[32];
    __shared__ unsigned int s_prefix;
    __shared__ int s_remaining, s_bad;
    __shared__ float cand_val[SAMPLE_CANDIDATES], sorted_val[SAMPLE_CANDIDATES], prob[SAMPLE_CANDIDATES];
    __shared__ int cand_idx[SAMPLE_CANDIDATES], sorted_idx[SAMPLE_CANDIDATES];
    __shared__ unsigned int best_key[32];
    __shared__ int best_idx[32];

    const int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* z = logits + (long long)row * ld;
    const int per = (V + blockDim.x - 1) / blockDim.x;
    const int lo = min(V, tid * per), hi = min(V, lo + per);
    if (tid == 0) s_bad = 0;
    __syncthreads();

    // non-finite logits (NaN, +inf), and the greedy pick: the first largest key of the thread's stretch
    unsigned int bk = 0;
    int bi = V;
    bool bad = false;
    for (int i = lo; i < hi; ++i) {
        float x = z[i];
        bad |= isnan(x) || (isinf(x) && x > 0);
        unsigned int k = order_key(x);
        if (bi == V || k > bk) bk = k, bi = i;
    }
    if (bad) s_bad = 1;
    int pick = -1;
    if (greedy) {
        for (int o = 16; o > 0; o >>= 1) {
            unsigned int k2 = __shfl_down_sync(0xffffffff, bk, o);
            int i2 = __shfl_down_sync(0xffffffff, bi, o);
            if (i2 < V && (bi == V || k2 > bk || (k2 == bk && i2 < bi))) bk = k2, bi = i2;
        }
        if (lane == 0) best_key[warp] = bk, best_idx[warp] = bi;
        __syncthreads();
        if (tid == 0) {
            unsigned int k = best_key[0];
            int i = best_idx[0];
            for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
                if (best_idx[w] < V && (i == V || best_key[w] > k || (best_key[w] == k && best_idx[w] < i)))
                    k = best_key[w], i = best_idx[w];
            pick = s_bad ? -1 : i;
        }
    } else {
        // the k-th largest key: four 8-bit digits, most significant first
        const int k = min(top_k, V);
        unsigned int prefix = 0, mask = 0;
        int remaining = k;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int i = lo; i < hi; ++i) {
                unsigned int key = order_key(z[i]);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (warp == 0) {
                // lane l holds bins 255 − 8l … 248 − 8l (descending); find the bin where the count
                // from the top reaches `remaining`
                int c[8], sum = 0;
                for (int j = 0; j < 8; ++j) c[j] = hist[255 - 8 * lane - j], sum += c[j];
                int incl = sum;
                for (int o = 1; o < 32; o <<= 1) {
                    int y = __shfl_up_sync(0xffffffff, incl, o);
                    if (lane >= o) incl += y;
                }
                int excl = incl - sum;
                unsigned int found = __ballot_sync(0xffffffff, excl < remaining && incl >= remaining);
                int owner = __ffs(found) - 1;
                if (lane == owner) {
                    int above = excl, j = 0;
                    while (above + c[j] < remaining) above += c[j], ++j;
                    s_prefix = prefix | ((unsigned int)(255 - 8 * lane - j) << shift);
                    s_remaining = remaining - above;
                }
            }
            __syncthreads();
            prefix = s_prefix;
            remaining = s_remaining;
            mask |= 255u << shift;
            __syncthreads();
        }
        const unsigned int cut = prefix;
        // candidates: above the cut first, then the ties at it, each in index order
        int n_above = 0, n_tie = 0;
        for (int i = lo; i < hi; ++i) {
            unsigned int key = order_key(z[i]);
            n_above += key > cut;
            n_tie += key == cut;
        }
        int at_above, at_tie;
        const int total_above = block_exclusive_scan(n_above, &at_above, warp_sums);
        const int total_tie = block_exclusive_scan(n_tie, &at_tie, warp_sums);
        at_tie += total_above;  // total_above < k ≤ SAMPLE_CANDIDATES: every one above the cut fits
        for (int i = lo; i < hi; ++i) {
            unsigned int key = order_key(z[i]);
            float x = isnan(z[i]) ? -INFINITY : z[i];
            if (key > cut) cand_val[at_above] = x, cand_idx[at_above] = i, ++at_above;
            else if (key == cut) {
                if (at_tie < SAMPLE_CANDIDATES) cand_val[at_tie] = x, cand_idx[at_tie] = i;
                ++at_tie;
            }
        }
        const int n = min(total_above + total_tie, SAMPLE_CANDIDATES);
        __syncthreads();
        // rank: logit descending, index ascending (unique ranks)
        for (int a = tid; a < n; a += blockDim.x) {
            float va = cand_val[a];
            int ia = cand_idx[a], r = 0;
            for (int b = 0; b < n; ++b) {
                float vb = cand_val[b];
                r += vb > va || (vb == va && cand_idx[b] < ia);
            }
            sorted_val[r] = va, sorted_idx[r] = ia;
        }
        __syncthreads();
        const float vmax = sorted_val[0];
        for (int r = tid; r < n; r += blockDim.x) prob[r] = expf((sorted_val[r] - vmax) * inv_temp);
        __syncthreads();
        if (tid == 0) {
            if (s_bad || !isfinite(vmax)) {
                pick = -1;
            } else {
                float cum = 0.0f;
                for (int r = 0; r < n; ++r) cum += prob[r], prob[r] = cum;  // running sums, in rank order
                const float total = prob[n - 1];
                int m = n;
                if (top_p < 1.0f) {
                    const float limit = top_p * total;
                    m = 0;
                    while (m < n && (m == 0 ? 0.0f : prob[m - 1]) < limit) ++m;
                    if (m == 0) m = 1;
                }
                const float target = draw_uniform(seeds[row], draws[row]) * prob[m - 1];
                int r = 0;
                while (r < m - 1 && !(prob[r] > target)) ++r;
                pick = sorted_idx[r];
            }
        }
    }
    if (tid == 0) {
        const int d = draws[row];
        tokens[row] = max(pick, 0);
        if (ring_addr) reinterpret_cast<int*>(ring_addr)[(long long)row * R + d % R] = pick;
        draws[row] = d + 1;
    }
}
