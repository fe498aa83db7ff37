"""CuPy backend: the kernel pairs of andrea/engine/backend.py on an NVIDIA GPU, with hand-written
CUDA kernels (andrea/kernels/*.cu, loaded with cupy.RawModule) for everything but the large matrix
products, which go to cuBLAS (fp32) and cuBLASLt (the 16-bit and fp8 modes), and the 16-bit training
attention, which goes to cuDNN where it is installed.

    from andrea.engine.cupy import CupyBackend
    be = CupyBackend("bf16")

Precision (one per backend object):
- "fp32": weights, gradients, Adam state and activations are float32 (the reference mode, checked
  against NumPy to 1e-5). Attention runs the CUDA-core flash kernels (kernels/attention.cu).
- "bf16": fp32 master weights, gradients, m and v, and a bf16 residual stream (its saved copies and
  its gradient; ANDREA_RESIDUAL=fp32 keeps it fp32: residual_from_env); every activation
  that feeds a matrix product (LayerNorm outputs, q/k/v, attention output, MLP hidden and GELU
  output, logits and their gradient) is stored in bf16 by the kernel that produces it, so no pass
  casts operands; so are the branch a product adds to the residual stream and each LayerNorm's
  output gradient (where the vectorised LayerNorm kernels apply). A bf16 copy of the weights is
  refreshed by the AdamW kernel. Attention is cuDNN's fused attention (cudnn_attention.py) where
  the cuDNN frontend is installed, else our fused tensor-core flash kernels (kernels/attention_mma.cu;
  on sm_90a the forward of kernels/attention_wgmma.cu); q, k, v live in one [B, T, 3, H, D] buffer written by one
  strided-batched GEMM. Matrix products accumulate in fp32 and write fp32
  straight into the gradients (beta = 1). The MLP's GELU output is kept per layer for the backward
  or recomputed there (ANDREA_GELU: gelu_policy_from_env, plan_gelu).
- "fp16": the same with fp16 for bf16 (the kernels are compiled with -DANDREA_FP16), but an fp32
  residual stream, and the loss scaled (set_loss_scale) so that small gradients survive fp16's
  range; the optimizer step unscales (andrea/optim.py: dynamic loss scaling).
- "fp8": bf16, with the q/k/v, attention-output and MLP products in fp8 (e4m3 weights and
  activations, e5m2 gradients, delayed per-tensor scales; fp8.py, the recipe of andrea/fp8.py);
  the output head stays bf16.
Every reduction of ours runs in a fixed order (no atomics), and cuDNN's attention runs its
deterministic backward (unless ANDREA_ATTENTION_DETERMINISTIC=0), so results are deterministic; the fp8 casts'
amaxes and counts are the exception that proves it: atomic maxima and integer sums, whose results
do not depend on the order.

Modules: backend (CupyBackend: buffers, transfers, the matrix products' wiring, and a method per
kernel pair that calls the family's launchers). A family of kernels has one name in three places:
andrea/kernels/X.cu, its launchers here in X.py, and its check and timing in dev/cuda/X.py: embedding,
layernorm, attention (fp32's flash kernels; it dispatches the 16-bit modes to attention_mma, the
tensor-core ones), attention_wgmma (Hopper's warp-group MMA, sm_90a only, compiled by its own NVRTC
loader; not dispatched yet), classifier (the loss), elementwise (GELU, AdamW, the gradient norm), fp8,
decode (generation) and sampling. Besides: kernels (compiling and caching the CUDA sources), gemm (cuBLAS on
the backend's own handle), cublaslt (cuBLASLt: timed algorithms, the GELU epilogue, fp8 products),
weights (dtypes, the 16-bit weight copy, operand casting), cudnn_attention (cuDNN's attention),
graphs (CUDA-graph capture). All mutable state lives on the CupyBackend object (the family modules'
functions take it as `be`), so backends of different precisions work side by side in one process.
"""

# the names the package defined before its split into modules, for those who import them from here
from andrea.engine.cupy.backend import (  # noqa: F401
    FP8_LN_BWD_SMEM, FP8_LN_OUTPUTS, GELU_KEEP_SHARE, GELU_KEEP_TOKENS, H16_BUFFERS, H16_LN_SIDES, CupyBackend, Readback,
    Snapshot, gelu_policy_from_env, residual_from_env)
from andrea.engine.cupy.layernorm import (  # noqa: F401
    LN_FEW_ROWS, LN_MAXV, LN_R16_ROWS, LN_ROWS, _ln_fused, ln_fused_rows, ln_fused_smem, smem_optin)
from andrea.engine.cupy.weights import BF16, FP16, VOCAB_PAD  # noqa: F401

__all__ = ["BF16", "FP16", "VOCAB_PAD", "CupyBackend", "Snapshot"]
