// The token and position embedding: the residual stream's start and the two tables' gradients
// (andrea/engine/cupy/embedding.py; embed_rows, shared with decode.cu's embed_at, is in common.cuh).
#include "common.cuh"

// the residual stream's start: fp32, or 16-bit (embed_fwd_h16)
extern "C" __global__ void embed_fwd(const int* tok, const float* wte, const float* wpe, float* out, int N, int T, int C) {
    embed_rows(tok, wte, wpe, 0, out, N, T, C);
}

extern "C" __global__ void embed_fwd_h16(const int* tok, const float* wte, const float* wpe, h16* out, int N, int T, int C) {
    embed_rows(tok, wte, wpe, 0, out, N, T, C);
}

// Embedding backward planned on the host (andrea/engine/cupy: plan_tokens, upload_tokens): positions
// sorted (stably) by token, seg[k]..seg[k+1] the positions of the k-th distinct token uniq[k],
// count[0] distinct tokens. One block per distinct token sums its rows in position order:
// deterministic, no atomics, no device sort and no host sync (a CUDA graph can hold it).
// (dout: the residual stream's gradient, fp32, or 16-bit in the _h16 kernels)
template <typename DOut>
__device__ void embed_bwd_rows(const DOut* __restrict__ dout, const int* __restrict__ order, const int* __restrict__ seg,
                               const int* __restrict__ uniq, const int* __restrict__ count, float* __restrict__ dwte,
                               int C) {
    int k = blockIdx.x;
    if (k >= count[0]) return;
    int p0 = seg[k], p1 = seg[k + 1];
    float* dst = dwte + (long)uniq[k] * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.f;
        for (int p = p0; p < p1; p++) s += as_float(dout[(long)order[p] * C + c]);
        dst[c] += s;
    }
}

extern "C" __global__ void embed_bwd_planned(const float* dout, const int* order, const int* seg, const int* uniq,
                                             const int* count, float* dwte, int C) {
    embed_bwd_rows(dout, order, seg, uniq, count, dwte, C);
}

extern "C" __global__ void embed_bwd_planned_h16(const h16* dout, const int* order, const int* seg, const int* uniq,
                                                 const int* count, float* dwte, int C) {
    embed_bwd_rows(dout, order, seg, uniq, count, dwte, C);
}

// dwpe[t] += sum over the batch of dout[b, t], b in order
template <typename DOut>
__device__ void embed_bwd_pos(const DOut* __restrict__ dout, float* __restrict__ dwpe, int B, int T, int C) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long)T * C) return;
    float s = 0.f;
    for (int b = 0; b < B; b++) s += as_float(dout[(long)b * T * C + i]);
    dwpe[i] += s;
}

extern "C" __global__ void embed_bwd_wpe(const float* dout, float* dwpe, int B, int T, int C) {
    embed_bwd_pos(dout, dwpe, B, T, C);
}

extern "C" __global__ void embed_bwd_wpe_h16(const h16* dout, float* dwpe, int B, int T, int C) {
    embed_bwd_pos(dout, dwpe, B, T, C);
}
