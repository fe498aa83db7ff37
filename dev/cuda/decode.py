"""Generation kernels (andrea/kernels/decode.cu): one decoding step with the position read on the
device, checked against andrea/engine/numpy_backend and timed.

    python3 dev/cuda/decode.py [--quick]

embed_at      out[b, t] = wte[tok[b, t]] + wpe[pos + t]     (numpy_backend.embed_fwd on wpe[pos:])
embed_at_h16  the same written in 16 bits (the bf16 and fp8 modes' 16-bit residual stream): the fp32
              sum (numpy_backend.embed_fwd in fp32) rounded once to 16 bits
kv_store      the chunk's keys and values into the caches at [pos, pos + n)  (a copy: exact)
advance       pos += n                                        (exact)
attn_decode   one new query per row over the cached keys 0..pos: the last row of causal attention
              over pos + 1 positions (numpy_backend.attn_fwd; checked against it on the edge shape)
attn_decode_store  the same with kv_store fused in and the keys split across warps (head sizes 32,
              64, 128): y as attn_decode's reference, the caches at pos exact
Rows: the model shape's batch; the caches hold its context; positions T/4 and T − 1 (the full cache).
"""

from __future__ import annotations

import math

import common
import numpy as np

from andrea.engine import numpy_backend as nb


def embed_at_reference(tok, wte, wpe, pos, out):
    nb.embed_fwd(tok, wte, wpe[pos:pos + tok.shape[1]], out)


def kv_store_reference(qkv, kc, vc, pos):
    """qkv [B, n, 3, H, D] -> caches [B, H, T_max, D] at [pos, pos + n)."""
    n = qkv.shape[1]
    kc[:, :, pos:pos + n] = qkv[:, :, 1].transpose(0, 2, 1, 3)
    vc[:, :, pos:pos + n] = qkv[:, :, 2].transpose(0, 2, 1, 3)


def advance_reference(pos, n):
    pos += n


def decode_reference(q, K, V):
    """q [B, H, D], K and V [B, H, pos + 1, D] -> y [B, H·D]: softmax(q·Kᵀ/√D)·V, in float64 (the last
    row of numpy_backend.attn_fwd over pos + 1 positions, which the edge shape checks)."""
    s = np.einsum("bhd,bhjd->bhj", q, K) / math.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhj,bhjd->bhd", p, V).reshape(q.shape[0], -1), p


SCRIPT = "decode"
REFERENCES = {"embed_at": embed_at_reference, "kv_store": kv_store_reference, "advance": advance_reference,
              "attn_decode": decode_reference, "attn_decode_store": decode_reference}
V = common.Version
H16 = ("bf16", "fp16")
SRC = "decode.cu"
VERSIONS = [
    V("embed_at", "embed_at", ("embed_at",), SRC, H16),
    V("kv_store", "kv_store", ("kv_store",), SRC, H16),
    V("advance", "advance", ("advance",), SRC, H16),
    V("attn_decode", "one block per (row, head), 256 threads", ("attn_decode",), SRC, H16),
    V("attn_decode_store", "16 warps per (row, head), online softmax, cache store fused",
      ("attn_decode_store_e1", "attn_decode_store_e2", "attn_decode_store_e4"), SRC, H16),
    V("embed_at", "embed_at_h16", ("embed_at_h16",), SRC, H16),  # the 16-bit residual stream's
]
EDGE = [common.Shape("edge B=3 T=40 C=96", 3, 40, 96, 2, 301),  # D = 48: parts of 5 groups, idle threads
        common.Shape("edge B=2 T=300 C=256", 2, 300, 256, 2, 301)]  # D = 128; up to 3 rounds of keys per warp


def run_shape(cp, report, shape, rng, reps):
    from andrea.engine.cupy.decode import DEC_WARPS, WARPS_E
    from andrea.engine.cupy.decode import _launch_shape as launch_shape

    B, T, H, D, C = shape.B, shape.T, shape.H, shape.D, shape.C
    u32 = common.u("fp32")
    for prec in H16:
        ks = common.build(cp, VERSIONS[0], prec)
        ks.update(common.build(cp, VERSIONS[1], prec))
        ks.update(common.build(cp, VERSIONS[2], prec))
        ks.update(common.build(cp, VERSIONS[3], prec))
        ks.update(common.build(cp, VERSIONS[4], prec))
        ks.update(common.build(cp, VERSIONS[5], prec))
        for pos in sorted({T // 4, T - 1}):
            d_pos = cp.asarray(np.array([pos], np.int32))
            # embed_at: one token per row at pos (fp32 tables: one rounding of one addition)
            tok = rng.integers(0, shape.V, (B, 1)).astype(np.int32)
            wte = rng.standard_normal((shape.V, C)).astype(np.float32)
            wpe = rng.standard_normal((T, C)).astype(np.float32)
            want = np.zeros((B, 1, C))
            embed_at_reference(tok, wte.astype(np.float64), wpe.astype(np.float64), pos, want)
            d_tok, d_wte, d_wpe, d_out = cp.asarray(tok), cp.asarray(wte), cp.asarray(wpe), cp.zeros((B, 1, C), cp.float32)
            run = lambda: ks["embed_at"]((common.blocks(B * C),), (256,), (d_tok, d_wte, d_wpe, d_pos, d_out, np.int32(B), np.int32(1), np.int32(C)))  # noqa: E731

            def case_embed(run=run, d_out=d_out, want=want):
                run()
                ms = common.bench(cp, run, reps)
                return common.compare(d_out.get(), want, rtol=u32), ms, common.gbps(3 * B * C * 4, ms)

            report.attempt("embed_at", "embed_at", prec, f"{shape.name} pos={pos}", case_embed)

            # embed_at_h16: the fp32 sum (one IEEE addition, as NumPy's in fp32) rounded once to 16 bits
            want32 = np.zeros((B, 1, C), np.float32)
            embed_at_reference(tok, wte, wpe, pos, want32)
            d_out16 = cp.zeros((B, 1, C), cp.uint16)
            run16 = lambda d_out16=d_out16: ks["embed_at_h16"]((common.blocks(B * C),), (256,), (d_tok, d_wte, d_wpe, d_pos, d_out16, np.int32(B), np.int32(1), np.int32(C)))  # noqa: E731

            def case_embed16(run16=run16, d_out16=d_out16, want32=want32):
                run16()
                ms = common.bench(cp, run16, reps)
                err = common.compare(common.loaded(d_out16, prec), want32.astype(np.float64), rtol=common.u(prec), atol=common.tiny(prec))
                return err, ms, common.gbps(2 * B * C * 4 + B * C * 2, ms)

            report.attempt("embed_at", VERSIONS[5].name, prec, f"{shape.name} pos={pos}", case_embed16)

            # the cache: positions 0..pos-1 filled, then kv_store puts the new key/value at pos
            kc_host = rng.standard_normal((B, H, T, D))
            vc_host = rng.standard_normal((B, H, T, D))
            qkv_host = rng.standard_normal((B, 1, 3, H, D))
            kc = common.rounded(kc_host, prec)
            vc = common.rounded(vc_host, prec)
            qkv = common.rounded(qkv_host, prec)
            d_kc = cp.asarray(common.stored(kc, prec).reshape(B, H, T, D))
            d_vc = cp.asarray(common.stored(vc, prec).reshape(B, H, T, D))
            d_kc2, d_vc2 = d_kc.copy(), d_vc.copy()  # attn_decode_store's caches: it stores the new key itself
            d_qkv = cp.asarray(common.stored(qkv, prec).reshape(B, 1, 3, H, D))
            kv_store_reference(qkv, kc, vc, pos)
            store = lambda: ks["kv_store"]((common.blocks(B * H * D),), (256,), (d_qkv, d_kc, d_vc, d_pos, np.int32(B), np.int32(1), np.int32(H), np.int32(D), np.int32(T)))  # noqa: E731

            def case_store(store=store, d_kc=d_kc, d_vc=d_vc, kc=kc, vc=vc):
                store()
                err = common.exact(common.loaded(d_kc, prec), kc, "keys").worst(common.exact(common.loaded(d_vc, prec), vc, "values"))
                ms = common.bench(cp, store, reps)
                return err, ms, common.gbps(4 * B * H * D * 2, ms)

            report.attempt("kv_store", "kv_store", prec, f"{shape.name} pos={pos}", case_store)

            # attn_decode over 0..pos (the new key at pos stored above)
            y_ref, p = decode_reference(qkv[:, 0, 0], kc[:, :, :pos + 1], vc[:, :, :pos + 1])
            parts, threads, shared = launch_shape(D, T)  # as the backend launches it
            d_y = cp.zeros((B, 1, H * D), np.uint16)
            attn = lambda: ks["attn_decode"]((B * H,), (threads,), (d_qkv, d_kc, d_vc, d_y, d_pos, np.int32(H), np.int32(D), np.int32(T), np.int32(parts), np.float32(1 / math.sqrt(D))), shared_mem=shared)  # noqa: E731
            # fp32 arithmetic on 16-bit inputs, the result rounded once to 16 bits (u·|y|). A score
            # is a sum of D products: |Δs| ≤ D·u32·Σ_d|q_d·k_d|/√D; a probability moves by at most
            # 2·max|Δs| relative (its score and the normalising sum), plus __expf's 2 ulp; the
            # weighted sum of pos + 1 terms adds (pos + 1)·u32: all times Σ_j p_j·|v_j|
            spread = np.einsum("bhj,bhjd->bhd", p, np.abs(vc[:, :, :pos + 1])).reshape(B, -1)
            s_abs = np.einsum("bhd,bhjd->bhj", np.abs(qkv[:, 0, 0]), np.abs(kc[:, :, :pos + 1])).max() / math.sqrt(D)
            atol = (2 * D * u32 * s_abs + (pos + 8) * u32) * spread

            def case_attn(attn=attn, d_y=d_y, y_ref=y_ref, atol=atol):
                attn()
                err = common.compare(common.loaded(d_y, prec).reshape(B, -1), y_ref, rtol=common.u(prec), atol=atol + common.tiny(prec))
                ms = common.bench(cp, attn, reps)
                return err, ms, common.gbps(2 * B * H * (pos + 1) * D * 2, ms)

            report.attempt("attn_decode", VERSIONS[3].name, prec, f"{shape.name} pos={pos}", case_attn)

            if D in WARPS_E:
                d_y2 = cp.zeros((B, 1, H * D), np.uint16)
                attn2 = lambda: ks[f"attn_decode_store_e{WARPS_E[D]}"]((B * H,), (32 * DEC_WARPS,), (d_qkv, d_kc2, d_vc2, d_y2, d_pos, np.int32(H), np.int32(T), np.float32(1 / math.sqrt(D))))  # noqa: E731

                def case_attn2(attn2=attn2, d_y2=d_y2, y_ref=y_ref, atol=atol, spread=spread, kc=kc, vc=vc, d_kc2=d_kc2, d_vc2=d_vc2):
                    attn2()
                    # the online softmax rescales each warp's sums once per group of keys: a few u32 more
                    err = common.compare(common.loaded(d_y2, prec).reshape(B, -1), y_ref, rtol=common.u(prec),
                                         atol=atol + 64 * common.u("fp32") * spread + common.tiny(prec))
                    err = err.worst(common.exact(common.loaded(d_kc2, prec), kc, "keys"))
                    err = err.worst(common.exact(common.loaded(d_vc2, prec), vc, "values"))
                    ms = common.bench(cp, attn2, reps)
                    return err, ms, common.gbps(2 * B * H * (pos + 1) * D * 2, ms)

                report.attempt("attn_decode_store", VERSIONS[4].name, prec, f"{shape.name} pos={pos}", case_attn2)

            run_adv = lambda: ks["advance"]((1,), (32,), (d_pos, np.int32(3)))  # noqa: E731

            def case_advance(run_adv=run_adv, d_pos=d_pos, pos=pos):
                run_adv()
                want = np.array([pos], np.int64)
                advance_reference(want, 3)
                return common.exact(d_pos.get().astype(np.int64), want), None, ""

            report.attempt("advance", "advance", prec, f"{shape.name} pos={pos}", case_advance)
    if shape.name.startswith("edge"):
        # the reference itself: the last row of numpy_backend.attn_fwd over pos + 1 positions
        n = 9
        q, k, v = (rng.standard_normal((1, H, n, D)) for _ in range(3))
        y, lse = np.zeros((1, n, H * D)), np.zeros((1, H, n))
        nb.attn_fwd(np.stack([q, k, v]), y, lse)
        mine, _ = decode_reference(q[:, :, -1], k, v)
        report.add("attn_decode", "reference = numpy_backend.attn_fwd's last row", "fp64", shape,
                   common.compare(mine, y[:, -1], rtol=1e-12, atol=1e-12))


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
