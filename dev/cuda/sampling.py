"""Choosing the next token on the device (andrea/kernels/sampling.cu), checked against
andrea/engine/numpy_backend.sample_tokens and timed.

    python3 dev/cuda/sampling.py [--quick]

sample_tokens  each row's next token from fp32 logits: greedy, or temperature + top-k + top-p with
               a counter-based generator per row; writes the token, the host ring and the draw count.
Rows 1 and 16 (decoding one sample, and the audit's rows) at each model's vocabulary, plus edge
shapes: top-k above the vocabulary, bf16-rounded logits (many ties at the k-th), small integers
with −0 and +0 among them (ties; the two zeros equal), masked (−inf) tokens, a row with a NaN
(token −1).

The picks must equal the reference's. The one allowed difference: a row whose draw lands within
SLACK (relative) of a boundary between two tokens' running sums, or whose top-p limit lands that
close to one: there a last-ulp difference between the kernel's expf and NumPy's exp decides. Such
rows are counted in the note.
"""

from __future__ import annotations

import common
import numpy as np

from andrea.engine import numpy_backend as nb

SLACK = 1e-5  # relative distance to a boundary below which fp32 exp rounding may decide the pick


def near_boundary(z, temperature: float, top_k: int, top_p: float, seed: int, draw: int) -> bool:
    """Whether the reference's pick for this row rests on a comparison within SLACK (relative to
    the sums compared) of going the other way: the draw against a running sum, or the top-p limit
    against the sum before a candidate. Computed in float64."""
    z = np.asarray(z, dtype=np.float32)
    if temperature <= 0:
        return False
    V, k = z.size, min(top_k, z.size)
    cut = np.partition(z, V - k)[V - k]
    cand = np.concatenate([np.flatnonzero(z > cut), np.flatnonzero(z == cut)])[:nb.SAMPLE_CANDIDATES]
    v = np.sort(z[cand])[::-1].astype(np.float64)
    cum = np.cumsum(np.exp((v - v[0]) / temperature))
    before = np.concatenate([[0.0], cum[:-1]])
    m, gaps = cum.size, []
    if top_p < 1:
        m = max(1, int(np.count_nonzero(before < top_p * cum[-1])))
        gaps.append(np.abs(before - top_p * cum[-1]).min() / cum[-1])
    target = float(nb.draw_uniform(seed, draw)) * cum[m - 1]
    gaps.append(np.abs(cum[:m] - target).min() / cum[m - 1])
    return min(gaps) < SLACK


SCRIPT = "sampling"
REFERENCES = {"sample_tokens": nb.sample_tokens}
VERSIONS = [
    common.Version("sample_tokens", "a block of 512 per row: radix select, ranked candidates", ("sample_rows",),
                   "sampling.cu", ("fp32",)),
]
EDGE = [common.Shape("edge V=301", 3, 1, 64, 1, 301), common.Shape("edge V=50", 2, 1, 64, 1, 50)]
SETTINGS = [(0.0, 1, None), (0.8, 40, 0.95), (1.0, 5, None), (1.3, 1024, 0.9)]


def run_shape(cp, report, shape, rng, reps):
    import cupyx

    from andrea.engine.cupy.sampling import SAMPLE_THREADS

    k = common.build(cp, VERSIONS[0])["sample_rows"]
    V = shape.V
    for rows in sorted({shape.B, 1, 16} if shape.name.startswith("edge") else {1, 16}):
        for temperature, top_k, top_p in SETTINGS:
            for kind in ("normal", "bf16 ties", "signed zeros", "masked", "nan row"):
                z = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
                if kind == "bf16 ties":
                    z = common.from_h16(common.to_h16(z, "bf16"), "bf16").astype(np.float32).reshape(rows, V)
                if kind == "signed zeros":  # small integers: ties everywhere, −0 and +0 among them (equal, as NumPy compares)
                    z = np.trunc(z / 3) * np.where(rng.random((rows, V)) < 0.5, -1, 1).astype(np.float32)
                if kind == "masked":
                    z[:, rng.random(V) < 0.3] = -np.inf
                if kind == "nan row":
                    z[rows // 2, V // 3] = np.nan
                seeds = rng.integers(0, 2**63, rows, dtype=np.uint64)
                draws = rng.integers(0, 1000, rows).astype(np.int32)
                R = 4
                want_tok, want_draws, want_ring = np.zeros((rows, 1), np.int64), draws.copy(), np.full((rows, R), -9, np.int32)
                nb.sample_tokens(z, seeds, want_draws, want_tok, want_ring, temperature, top_k, top_p)
                # the logits as the backend leaves them: rows of a padded buffer
                pad = cp.zeros((rows, V + 7), cp.float32)
                pad[:, :V] = cp.asarray(z)
                d_z, d_seeds, d_draws = pad[:, :V], cp.asarray(seeds), cp.asarray(draws)
                d_tok = cp.zeros((rows, 1), cp.int32)
                ring = cupyx.empty_pinned((rows, R), np.int32)  # as the backend's host_buffer
                ring[...] = -9
                greedy = temperature <= 0
                args = (d_z, np.int64(V + 7), np.int32(V), d_seeds, d_draws, d_tok, np.uint64(ring.ctypes.data), np.int32(R),
                        np.int32(greedy), np.float32(0 if greedy else 1 / temperature), np.int32(top_k),
                        np.float32(1.0 if top_p is None else top_p))

                def case(args=args, d_tok=d_tok, d_draws=d_draws, ring=ring, want_tok=want_tok, want_draws=want_draws,
                         want_ring=want_ring, z=z, seeds=seeds, draws=draws, setting=(temperature, top_k, top_p)):
                    k((rows,), (SAMPLE_THREADS,), args)
                    cp.cuda.Device().synchronize()
                    got = d_tok.get()[:, 0].astype(np.int64)
                    diff = np.flatnonzero(got != want_tok[:, 0])
                    t, tk, tp = setting
                    allowed = [b for b in diff if got[b] >= 0 and want_tok[b, 0] >= 0
                               and near_boundary(z[b], t, tk, 1.0 if tp is None else tp, int(seeds[b]), int(draws[b]))]
                    err = common.exact(np.delete(got, allowed), np.delete(want_tok[:, 0], allowed), "tokens")
                    err = err.worst(common.exact(d_draws.get(), want_draws, "draws"))
                    err = err.worst(common.exact(np.delete(ring, allowed, axis=0), np.delete(want_ring, allowed, axis=0), "ring"))
                    if allowed:
                        err.what += f" ({len(allowed)} of {rows} rows at a boundary within {SLACK:g})"
                    ms = common.bench(cp, lambda: k((rows,), (SAMPLE_THREADS,), args), reps)
                    return err, ms, common.gbps(rows * V * 4 * 6, ms)

                setting = "greedy" if greedy else f"T={temperature} k={top_k} p={top_p}"
                report.attempt("sample_tokens", VERSIONS[0].name, "fp32", f"{shape.name.split()[0]} V={V} rows={rows} {setting} {kind}", case)


def main(argv=None) -> int:
    return common.run_script(__doc__, SCRIPT, EDGE, [run_shape], argv)


if __name__ == "__main__":
    raise SystemExit(main())
