"""The token and position embedding on the GPU (kernels/embedding.cu): the residual stream's start
(fp32, or 16-bit) and the gradients of the two tables, the token table's from a plan made on the host
(CupyBackend.plan_tokens, uploaded by upload_tokens): no device sort, no host sync. `be`: the
CupyBackend whose kernels and buffers run them."""

from __future__ import annotations

import cupy as cp
import numpy as np

from andrea.engine.cupy.kernels import blocks
from andrea.engine.cupy.weights import is_16bit


def embed_fwd(be, tokens, wte, wpe, out) -> None:
    B, T = tokens.shape
    C = wte.shape[1]
    n = B * T * C
    be.kernel("embedding", "embed_fwd_h16" if is_16bit(out) else "embed_fwd")(
        (blocks(n),), (256,), (tokens, wte, wpe, out, np.int32(B * T), np.int32(T), np.int32(C)))


def embed_bwd(be, dout, tokens, dwte, dwpe) -> None:
    B, T, C = dout.shape
    h16 = "_h16" if is_16bit(dout) else ""  # the residual stream's gradient in 16 bits
    be.kernel("embedding", "embed_bwd_wpe" + h16)((blocks(T * C),), (256,),
                                                  (dout, dwpe, np.int32(B), np.int32(T), np.int32(C)))
    plan = be._embed_plans.get((tokens.data.ptr, tokens.size))
    if plan is None:  # tokens not uploaded through upload_tokens: plan on the host now
        host = cp.asnumpy(tokens)
        be.upload_tokens(host, tokens, plan=be.plan_tokens(host))
        plan = be._embed_plans[(tokens.data.ptr, tokens.size)]
    n = tokens.size
    be.kernel("embedding", "embed_bwd_planned" + h16)((n,), (256,), (dout, plan[:n], plan[n:2 * n + 1],
                                                                        plan[2 * n + 1:3 * n + 1], plan[3 * n + 1:],
                                                                        dwte, np.int32(C)))
