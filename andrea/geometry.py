"""The geometry of a run (design §10.6): every part of a trained model read as geometry, after the
original's companion "the geometry of ANDREA". Four views, each a function of a trained model's
ckpt directory, its run directory and its shards:

- **embedding**: the token embeddings (wte) projected on their first two principal components
  (PCA by NumPy's SVD), tokens coloured by kind (byte, Harris segment, whole word, BOS), the most
  frequent segments labelled; nearest neighbours by cosine of a few probe tokens; and the same
  space at the initial weights and every kept checkpoint, each turned onto the final one by
  orthogonal Procrustes, so that the space is seen forming.
- **attention**: the attention probabilities of every layer and head for a few prompts (the
  audit's by default), taken from the backend's own forward pass (Backend.attn_probs recomputes
  them from the q, k and log-sum-exp the forward saved, as the backward pass does); and a
  summary per head over held-out windows: entropy, mean distance attended, the share on BOS, on
  the previous token and on itself.
- **surface**: the validation loss along the straight lines from the initial weights through
  every kept checkpoint to the final weights (the same held-out windows, batch and precision as
  training's validation, so the ends equal the losses the run recorded), and a 2-D slice around
  the final weights in two filter-normalised random directions (Li et al. 2018) on a grid.
- **simplex**: the curriculum's mixture weights, one point per phase, as a walk on the simplex of
  sources: a radial projection of its N vertices and a ternary plot of three source families (a
  static mode, such as the default proportional, has one phase, two with a curriculum warm-up).

Every forward pass runs on the engine (andrea/engine) of the resolved backend: on the GPU when
there is one, in the precision the model was trained in (bf16 for fp8), else NumPy in fp32.
run_geometry writes the numbers (geometry.json and Parquet tables) and hands them to
andrea/geometry_report.py for the plots and the page.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from andrea import geometry_report
from andrea.checkpoint import read_weights
from andrea.engine import Engine, resolve_backend
from andrea.evaluation import EvalSet, build_eval_set, evaluate, prepare_batches
from andrea.geometry_report import KIND_NAMES, TRIANGLE
from andrea.io import atomic_dir, check_replaceable, progress, read_document
from andrea.model import ModelConfig, init_weights, n_params, param_layout
from andrea.runlog import eval_records, phases
from andrea.sampling import chat_prompt
from andrea.shards import Shard
from andrea.tokenizer import BOS, N_BYTES, HarrisTokenizer, load_segments_file

log = logging.getLogger("andrea.geometry")

VIEWS = ("embedding", "attention", "surface", "simplex")
KINDS = ("byte", "segment", "word", "BOS", "unused")  # what a token ID stands for (token_kinds)
STEP_CKPT = re.compile(r"step_(\d+)\.bin$")


# ----------------------------------------------------------------------------- the run
@dataclass
class Run:
    """What the views read of a trained model: its ckpt directory's run.json and final weights,
    the tokenizer, the run directory (checkpoints, loss.jsonl) and the shards."""

    meta: dict
    cfg: ModelConfig
    tok: HarrisTokenizer
    segments: list[dict]  # harris_segments.json's entries
    settings: dict  # the run's training settings (run.json "train")
    ckpt_dir: Path
    run_dir: Path | None
    shards: dict
    final: np.ndarray  # float32 [n_params]
    step: int

    @property
    def seq_len(self) -> int:
        return self.settings.get("seq_len") or self.cfg.context

    @property
    def seed(self) -> int:
        return int(self.settings.get("seed", 0))


def load_run(ckpt_dir: str | Path, shards_json: str | Path) -> Run:
    ckpt_dir = Path(ckpt_dir)
    meta = read_document(ckpt_dir / "run.json", "ckpt directory's run.json (train the model first: snakemake results/<model>/ckpt)")
    _require_keys(meta, ("model", "model_config", "segments"), ckpt_dir / "run.json", "a trained model's ckpt directory")
    cfg = ModelConfig(**meta["model_config"])
    final = read_weights(ckpt_dir / "final.bin", expected_n_params=n_params(cfg))
    seg_doc = load_segments_file(meta["segments"])
    tok = HarrisTokenizer([s["text"] for s in seg_doc["segments"]], vocab_size=seg_doc["vocab_size"])
    smeta = read_document(shards_json, "shards.json (run the shards stage)")
    _require_keys(smeta, ("shard_dir", "tokenizer_hash", "sources"), shards_json, "the shards stage's output")
    bad = [s for s, c in smeta["sources"].items() if not isinstance(c, dict) or "n_docs" not in c]
    if bad:
        raise ValueError(f"{shards_json}: sources.{bad[0]} has no n_docs: not the shards stage's output (run it again)")
    # sizes checked against the shard manifests; the trainer checked their SHA-256 (reading a
    # real corpus's 3 GB of shards again would cost more than the views)
    shards = {s: Shard(smeta["shard_dir"], s, verify_hash=False, tokenizer_hash=smeta["tokenizer_hash"])
              for s, c in smeta["sources"].items() if c["n_docs"]}
    run_dir = Path(meta["run_dir"]) if meta.get("run_dir") else None
    if run_dir is not None and not run_dir.is_dir():
        log.warning("%s: the run directory named in %s is not there: views that need its checkpoints and loss.jsonl "
                    "(the trajectory, the curriculum's walk) are left out", run_dir, ckpt_dir / "run.json")
        run_dir = None
    return Run(meta, cfg, tok, seg_doc["segments"], meta.get("train", {}), ckpt_dir, run_dir, shards, final.weights, final.step)


def _require_keys(doc: dict, keys: tuple[str, ...], path, what: str) -> None:
    missing = [k for k in keys if k not in doc]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)}: not {what}, or written by an older version (write it again)")


def trajectory(run: Run) -> list[tuple[str, int, object]]:
    """The weights along the run: (label, step, loader) for the initial weights, every kept
    checkpoint and the final weights, by step. The run keeps no file of its initial weights; they
    are rebuilt from the run's seed (andrea.model.init_weights, as the engine drew them), which
    tests/test_geometry.py checks against the validation the trainer recorded at step 0."""
    n = n_params(run.cfg)
    init = functools.cache(lambda: init_weights(run.cfg, run.seed, np.float32))  # drawn once: ~2 s at 120M
    out: list[tuple[str, int, object]] = [("init", 0, init)]
    if run.run_dir is not None:
        for p in sorted((run.run_dir / "checkpoints").glob("step_*.bin")):
            m = STEP_CKPT.search(p.name)
            step = int(m.group(1)) if m else -1
            if 0 < step < run.step:
                out.append((f"step {step}", step, lambda p=p: read_weights(p, expected_n_params=n).weights))
    out.append(("final", run.step, lambda: run.final))
    return out


def recorded_evals(run: Run) -> dict[int, dict]:
    """The validation records of the run's loss.jsonl, by step ({} without the run directory)."""
    return {} if run.run_dir is None else eval_records(run.run_dir / "loss.jsonl")


def geometry_precision(backend: str, trained: str | None) -> tuple[str, str, str]:
    """The backend and precision of the views' forward passes, and why: on the GPU, the precision
    the model was trained in when it is fp32, bf16 or fp16 (so that the loss surface's ends equal
    the run's validation; a model trained on the CPU was trained in fp32 and is read in fp32), and
    bf16 for fp8 (a training recipe) or a run.json that names none; NumPy in fp32."""
    be, prec, why = resolve_backend(backend, "auto")
    if be == "cupy" and trained in ("fp32", "bf16", "fp16"):
        prec = trained
    return be, prec, why


# ----------------------------------------------------------------------------- embedding space
def token_kinds(tok: HarrisTokenizer, segments: list[dict]) -> np.ndarray:
    """What each ID stands for: "byte" (0–255), "BOS" (256), "word" (a segment that is a whole
    word of the tokenizer's sample: harris_segments.json's `word`), "segment" (any other Harris
    segment: a piece of a word, a run of punctuation or white space), "unused" (an ID beyond the
    segments of a saturated vocabulary: it decodes to nothing and is never trained)."""
    kinds = np.full(tok.vocab_size, "unused", dtype=object)
    kinds[:N_BYTES] = "byte"
    kinds[BOS] = "BOS"
    for s in segments:
        kinds[s["id"]] = "word" if s.get("word") else "segment"
    return kinds


def token_label(tok: HarrisTokenizer, i: int) -> str:
    """A token as readable text: BOS, a byte as its character or <0xNN>, white space made visible."""
    if i == BOS:
        return "<BOS>"
    if i < N_BYTES:
        return {32: "␣", 10: "↵", 9: "⇥"}.get(i) or (chr(i) if 33 <= i < 127 else f"<0x{i:02X}>")
    text = tok.decode_bytes([i]).decode("utf-8", "replace")
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or f"<{i}>"


def pca(X: np.ndarray, k: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Principal components by NumPy's SVD: (coordinates [n, k], axes [k, d], the share of the
    variance each axis holds [k], the mean [d]). Signs fixed (each axis's largest loading
    positive), so two runs of the same matrix draw the same picture."""
    X = np.asarray(X, np.float64)
    mu = X.mean(axis=0)
    Xc = X - mu
    _, s, vt = np.linalg.svd(Xc, full_matrices=False)
    vt = vt[:k]
    vt *= np.sign(vt[np.arange(len(vt)), np.abs(vt).argmax(axis=1)])[:, None]
    var = s**2
    return Xc @ vt.T, vt, var[:k] / var.sum() if var.sum() else np.zeros(k), mu


def procrustes(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """The orthogonal R minimising ||A·R − B||_F (Schönemann 1966): with U·Σ·Vᵀ = Aᵀ·B, R = U·Vᵀ.
    Rows are the same tokens in both; centre both first for a rotation about the means."""
    u, _, vt = np.linalg.svd(np.asarray(A, np.float64).T @ np.asarray(B, np.float64))
    return u @ vt


def nearest_neighbours(E: np.ndarray, probes: list[int], k: int, candidates: np.ndarray) -> list[list[tuple[int, float]]]:
    """For each probe ID, the k candidate IDs whose embeddings have the highest cosine with it
    (the probe itself left out), with the cosines."""
    E = np.asarray(E, np.float64)
    Z = E / np.maximum(np.linalg.norm(E, axis=1, keepdims=True), 1e-12)
    out = []
    for p in probes:
        cos = Z[candidates] @ Z[p]
        order = np.argsort(-cos, kind="stable")
        picks = [(int(candidates[i]), float(cos[i])) for i in order if candidates[i] != p][:k]
        out.append(picks)
    return out


def probe_ids(tok: HarrisTokenizer, segments: list[dict], probes: list[str], n_auto: int) -> tuple[list[int], list[dict]]:
    """The probe tokens' IDs: each configured string that is one token (its ID), "<BOS>" for BOS;
    with none configured, the n_auto most frequent whole-word segments. The strings that are not
    one token come back with what they encode as, to be reported."""
    ids, refused = [], []
    for text in probes:
        if text == "<BOS>":
            ids.append(BOS)
            continue
        enc = tok.encode(text).tolist()
        if len(enc) == 1:
            ids.append(enc[0])
        else:
            refused.append({"probe": text, "encodes_as": [token_label(tok, i) for i in enc]})
    if not probes:
        words = sorted((s for s in segments if s.get("word")), key=lambda s: -s["count"])
        pool = words or sorted(segments, key=lambda s: -s["count"])  # a tokenizer without the word mark
        ids = [s["id"] for s in pool[:n_auto]]
    return list(dict.fromkeys(ids)), refused


def embedding_view(run: Run, g: dict, traj: list[tuple[str, int, object]]) -> dict:
    """PCA of the final embeddings, kinds and labels, nearest neighbours of the probes, and the
    embeddings of every point of the trajectory aligned to the final ones (Procrustes) and
    projected on the same axes."""
    layout = {p.name: p for p in param_layout(run.cfg)}
    wte = layout["wte"]

    def emb(flat):
        return np.asarray(flat[wte.offset : wte.offset + wte.size], np.float64).reshape(wte.shape)

    kinds = token_kinds(run.tok, run.segments)
    shown = np.flatnonzero(kinds != "unused")  # unused IDs are their initial noise, decayed: left out
    E = emb(run.final)
    coords, axes, explained, mu = pca(E[shown])
    counts = {s["id"]: s["count"] for s in run.segments}
    frequent = [s["id"] for s in sorted(run.segments, key=lambda s: -s["count"])[: g["label_segments"]]]
    probes, refused = probe_ids(run.tok, run.segments, g["probe_tokens"], g["n_probes"])
    nn = nearest_neighbours(E, probes, g["neighbours"], shown)
    tokens = [{"id": int(i), "text": token_label(run.tok, int(i)), "kind": str(kinds[i]), "count": int(counts.get(int(i), 0)),
               "pc1": float(coords[k, 0]), "pc2": float(coords[k, 1])} for k, i in enumerate(shown)]
    # the space forming: each point of the trajectory turned onto the final embeddings
    target = E[shown] - mu
    frames = []
    for label, step, load in traj:
        X = emb(load())[shown]
        Xc = X - X.mean(axis=0)
        R = procrustes(Xc, target)
        aligned = Xc @ R
        frames.append({"label": label, "step": step, "xy": (aligned @ axes.T).astype(np.float32),
                       "residual": float(np.linalg.norm(aligned - target) / max(np.linalg.norm(target), 1e-12))})
    return {
        "explained": [float(x) for x in explained],
        "tokens": tokens,
        "labelled": [int(i) for i in frequent],
        "kinds": {KIND_NAMES[k]: int((kinds[shown] == k).sum()) for k in KINDS if k != "unused"},
        "unused_ids": int((kinds == "unused").sum()),
        "word_marks": any("word" in s for s in run.segments),
        "neighbours": [{"probe": token_label(run.tok, p), "id": p,
                        "neighbours": [{"token": token_label(run.tok, i), "id": i, "cosine": round(c, 4)} for i, c in row]}
                       for p, row in zip(probes, nn)],
        "probes_refused": refused,
        "frames": frames,
    }


# ----------------------------------------------------------------------------- attention
def attention_probs(engine: Engine) -> list[np.ndarray]:
    """The attention probabilities of the engine's last forward pass, every layer: [B, H, T, T]
    each, on the host (the backend computes them where its buffers are)."""
    be, A = engine.be, engine.A
    return [be.to_host(be.attn_probs(A.layer(l).qkv, A.layer(l).att_lse)) for l in range(engine.cfg.n_layer)]


def prompt_maps(run: Run, prompts: list[str], backend: str, precision: str, mcfg: dict | None) -> list[dict]:
    """Every layer's and head's attention probabilities over each prompt (rendered as a chat turn,
    led by BOS, cut to the context). The prompts run as one batch padded at the end with BOS: a
    query never sees a later position, so a prompt's own block is what it alone would give."""
    if not prompts:
        return []
    ids = [[BOS, *run.tok.encode(chat_prompt(p, mcfg)).tolist()][: run.cfg.context] for p in prompts]
    T = max(len(x) for x in ids)
    engine = Engine(run.cfg, batch_size=len(ids), seq_len=T, backend=backend, precision=precision)
    engine.load_state(run.final)
    batch = np.full((len(ids), T + 1), BOS, dtype=np.int64)
    for b, x in enumerate(ids):
        batch[b, : len(x)] = x
    engine.forward(batch[:, :-1], batch[:, 1:])
    P = attention_probs(engine)
    out = []
    for b, (text, x) in enumerate(zip(prompts, ids)):
        n = len(x)
        out.append({"prompt": text, "tokens": [token_label(run.tok, i) for i in x], "ids": x,
                    "probs": np.stack([p[b, :, :n, :n] for p in P]).astype(np.float32)})  # [L, H, n, n]
    return out


def head_summary(P, tokens, xp=np) -> dict:
    """Per head, sums over the query positions i ≥ 1 (position 0 can only attend to itself) of a
    batch's probabilities P [B, H, T, T] over token IDs [B, T] (arrays of the module `xp`: on the
    GPU the T × T rows never leave it): entropy (nats), distance attended Σ_j P_ij·(i − j), and
    the shares on BOS, on the previous token (j = i − 1) and on itself, each [H] on the host;
    `rows` counts the rows summed (divide by it for the means), so batches add up."""
    B, H, T, _ = P.shape
    i = xp.arange(T)
    safe = xp.where(P > 0, P, 1.0)
    ent = -(P * xp.log(safe)).sum(-1)  # [B, H, T]; 0·log 0 = 0
    dist = i * P.sum(-1) - P @ i.astype(P.dtype)  # Σ_j P_ij·(i − j)
    bos = xp.einsum("bhij,bj->bhi", P, xp.asarray(tokens == BOS, dtype=P.dtype))
    prev = P[:, :, i[1:], i[1:] - 1]  # [B, H, T - 1]
    diag = P[:, :, i, i]
    host = lambda a: np.asarray(a.get() if hasattr(a, "get") else a, np.float64)  # noqa: E731
    return {"entropy": host(ent[:, :, 1:].sum((0, 2))), "distance": host(dist[:, :, 1:].sum((0, 2))),
            "bos": host(bos[:, :, 1:].sum((0, 2))), "previous": host(prev.sum((0, 2))), "self": host(diag[:, :, 1:].sum((0, 2))),
            "rows": B * (T - 1)}


def attention_summary(engine: Engine, es: EvalSet, n_windows: int) -> dict:
    """head_summary over n_windows held-out windows of `es` (spread over its sources), every layer,
    one layer's probabilities at a time: {stat: [L, H]}, means per query position."""
    pick = spread(len(es), n_windows)
    L, H = engine.cfg.n_layer, engine.cfg.n_head
    acc = {k: np.zeros((L, H)) for k in ("entropy", "distance", "bos", "previous", "self")}
    rows = np.zeros(L)
    for s in range(0, len(pick), engine.B):
        idx = pick[np.arange(s, s + engine.B) % len(pick)]
        keep = min(engine.B, len(pick) - s)
        w = es.windows[idx].astype(np.int64)
        engine.forward(w[:, :-1], w[:, 1:])
        be, xp = engine.be, engine.xp
        for l in range(L):  # one layer's probabilities at a time, where the engine's buffers are
            P = be.attn_probs(engine.A.layer(l).qkv, engine.A.layer(l).att_lse)[:keep]
            h = head_summary(P, xp.asarray(w[:keep, :-1]), xp)
            for k in acc:
                acc[k][l] += h[k]
            rows[l] += h["rows"]
    return {k: (v / rows[:, None]).round(5) for k, v in acc.items()} | {"windows": int(len(pick)), "tokens": int(len(pick) * es.seq_len)}


# ----------------------------------------------------------------------------- loss surface
def spread(n: int, k: int) -> np.ndarray:
    """k indices of range(n) spread evenly over it (all of them when k ≥ n): windows of every source."""
    if k >= n:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def subset(es: EvalSet, idx: np.ndarray) -> EvalSet:
    return EvalSet(es.seq_len, es.windows[idx], es.source_index[idx], es.target_bytes[idx], es.sources, es.skipped)


def filter_normalised_direction(cfg: ModelConfig, theta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A random direction with each filter scaled to the norm of the weights' filter (Li et al.
    2018, "Visualizing the loss landscape of neural nets", §4): a filter is an output unit, a
    column of a [d_in, d_out] matrix, or a row of an embedding table (a token's or a position's
    vector, as their code's first dimension); LayerNorm's gains and biases (1-D) are not moved,
    as Li et al. leave biases and normalisation parameters. So a step of 1 along it changes every
    filter by as much as the filter's own size, whatever its scale."""
    d = rng.standard_normal(theta.size, dtype=np.float32)
    for p in param_layout(cfg):
        seg = d[p.offset : p.offset + p.size]
        if len(p.shape) == 1:
            seg[:] = 0.0
            continue
        axis = 1 if p.name in ("wte", "wpe", "head") else 0  # the norm over this axis is a filter's
        w = theta[p.offset : p.offset + p.size].reshape(p.shape).astype(np.float64)
        v = seg.reshape(p.shape)
        scale = np.linalg.norm(w, axis=axis, keepdims=True) / np.maximum(np.linalg.norm(v, axis=axis, keepdims=True), 1e-10)
        v *= scale.astype(np.float32)
    return d


class Evaluator:
    """The validation loss of any weights on one engine (the trainer's batch and length), the
    weights combined where the engine's buffers are (on the GPU, no host copy per point)."""

    def __init__(self, run: Run, es: EvalSet, backend: str, precision: str):
        self.engine = Engine(run.cfg, batch_size=int(run.settings.get("batch_size", 8)), seq_len=run.seq_len,
                             backend=backend, precision=precision)
        self.xp = self.engine.xp
        self.es = es
        self.batches = prepare_batches(self.engine, es)

    def to_device(self, flat: np.ndarray):
        return self.xp.asarray(flat, dtype=np.float32)

    def loss(self, w, es: EvalSet | None = None, batches: list | None = None) -> float:
        """Mean nats per token of the weights `w` (a device or host array) on the windows."""
        self.engine.w[...] = w
        self.engine.be.invalidate_weight_cache()
        r = evaluate(self.engine, es or self.es, batches if batches is not None else self.batches)
        return r["loss"]


def interpolation_view(ev: Evaluator, traj: list[tuple[str, int, object]], recorded: dict[int, dict], points: int) -> dict:
    """The validation loss along the straight segments init → each kept checkpoint → final, with
    `points` points inside each segment; at the ends, the losses the run recorded at those steps."""
    nodes, curve = [], []
    prev = None
    bar = progress(total=(len(traj) - 1) * (points + 1) + 1, desc="geometry: interpolation", unit=" points")
    for k, (label, step, load) in enumerate(traj):
        w = ev.to_device(load())
        loss = ev.loss(w)
        bar.update()
        rec = recorded.get(step, {}).get("loss")
        nodes.append({"label": label, "step": step, "loss": loss, "recorded_loss": rec,
                      "difference": None if rec is None else round(loss - rec, 6)})
        if prev is not None:
            (w0, s0) = prev
            for j in range(1, points + 1):
                t = j / (points + 1)
                curve.append({"segment": k - 1, "t": t, "step": s0 + t * (step - s0), "loss": ev.loss(w0 + (w - w0) * np.float32(t))})
                bar.update()
        curve.append({"segment": max(k - 1, 0), "t": 1.0 if k else 0.0, "step": float(step), "loss": loss})
        prev = (w, step)
    bar.close()
    curve.sort(key=lambda r: (r["step"], r["segment"]))
    return {"nodes": nodes, "curve": curve,
            "validation": [{"step": s, "loss": r.get("loss")} for s, r in sorted(recorded.items())]}


def surface_view(ev: Evaluator, run: Run, grid: int, span: float, tokens: int, seed: int) -> dict:
    """The loss on a grid×grid slice θ* + α·δ + β·η, α, β in [−span, span], around the final
    weights θ* in two filter-normalised random directions, over held-out windows of `tokens`
    target tokens in all (spread over the sources)."""
    rng = np.random.default_rng([seed, 0x5EED])
    d1 = filter_normalised_direction(run.cfg, run.final, rng)
    d2 = filter_normalised_direction(run.cfg, run.final, rng)
    es = subset(ev.es, spread(len(ev.es), max(1, tokens // ev.es.seq_len)))
    batches = prepare_batches(ev.engine, es)
    base, D1, D2 = ev.to_device(run.final), ev.to_device(d1), ev.to_device(d2)
    axis = np.linspace(-span, span, grid)
    loss = np.zeros((grid, grid))
    t0 = time.perf_counter()
    bar = progress(total=grid * grid, desc="geometry: loss surface", unit=" points")
    for i, b in enumerate(axis):  # rows: β
        for j, a in enumerate(axis):  # columns: α
            loss[i, j] = ev.loss(base + D1 * np.float32(a) + D2 * np.float32(b), es, batches)
            bar.update()
    bar.close()
    cos = float(np.dot(d1.astype(np.float64), d2) / (np.linalg.norm(d1) * np.linalg.norm(d2)))
    return {"alpha": axis.tolist(), "beta": axis.tolist(), "loss": loss, "windows": len(es), "tokens": es.tokens,
            "seed": seed, "span": span, "directions_cosine": round(cos, 5), "seconds": round(time.perf_counter() - t0, 2),
            "centre_loss": float(loss[grid // 2, grid // 2]) if grid % 2 else None}


# ----------------------------------------------------------------------------- the curriculum's walk
def radial_vertices(n: int) -> np.ndarray:
    """The N vertices of the radial projection: evenly on the unit circle, the first at the top,
    clockwise."""
    a = 2 * np.pi * np.arange(n) / max(n, 1)
    return np.stack([np.sin(a), np.cos(a)], axis=1)


def radial_coords(W: np.ndarray) -> np.ndarray:
    """Each mixture (a row of W over N sources, normalised to sum 1) as the mean of the vertices it
    weighs: a one-hot mixture lands on its vertex, the uniform one at the centre."""
    W = np.asarray(W, np.float64)
    W = W / np.maximum(W.sum(axis=1, keepdims=True), 1e-300)
    return W @ radial_vertices(W.shape[1])



def ternary_coords(W: np.ndarray, sources: list[str], families: dict[str, list[str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each mixture summed by family (three) and normalised over them, as a point of the triangle
    TRIANGLE (the families' vertices in their config order): (xy [n, 2], the family shares
    [n, 3], the share of the weight outside the three families [n]). A mixture with no weight in
    the families has no place in the triangle: its xy and shares are NaN (left out of the plot, as
    the dashboard leaves it out), its outside share 1."""
    W = np.asarray(W, np.float64)
    F = np.zeros((W.shape[0], len(families)))
    for f, members in enumerate(families.values()):
        cols = [sources.index(s) for s in members if s in sources]
        F[:, f] = W[:, cols].sum(axis=1) if cols else 0.0
    total = W.sum(axis=1)
    inside = F.sum(axis=1)
    shares = np.where(inside[:, None] > 0, F / np.maximum(inside[:, None], 1e-300), np.nan)
    outside = np.where(total > 0, 1 - inside / np.maximum(total, 1e-300), 0.0)
    return shares @ TRIANGLE[: len(families)], shares, outside


def vertex_order(sources: list[str], families: dict[str, list[str]]) -> list[str]:
    """The sources around the circle: family by family (so neighbours on it are alike), then the rest."""
    ordered = [s for members in families.values() for s in members if s in sources]
    return list(dict.fromkeys(ordered + sorted(s for s in sources if s not in ordered)))


def simplex_view(run: Run, families: dict[str, list[str]]) -> dict | None:
    """The walk: one point per phase on both projections, with its steps, focus and warm-up mark."""
    if run.run_dir is None or not (run.run_dir / "loss.jsonl").exists():
        return None
    ph = phases(run.run_dir / "loss.jsonl")
    if not ph["phases"]:
        return None
    seen = list(dict.fromkeys(s for p in ph["phases"] for s in p["weights"]))
    sources = vertex_order(seen, families)
    W = np.array([[p["weights"].get(s, 0.0) for s in sources] for p in ph["phases"]])
    xy = radial_coords(W)
    txy, shares, outside = ternary_coords(W, sources, families)
    warm = int(run.settings.get("curriculum", {}).get("warmup_steps", 0))
    mode = run.settings.get("curriculum", {}).get("mode", "bandit")  # a run from before modes existed was the bandit
    rows = []
    for k, p in enumerate(ph["phases"]):
        rows.append({"phase": k, "start": p["start"], "end": p["end"], "warmup": p["start"] < warm,
                     "focus": p["focus"], "x": float(xy[k, 0]), "y": float(xy[k, 1]), "tx": float(txy[k, 0]),
                     "ty": float(txy[k, 1]), **{f"family:{f}": float(shares[k, i]) for i, f in enumerate(families)},
                     "outside_families": float(outside[k]), **{f"w:{s}": float(W[k, j]) for j, s in enumerate(sources)}})
    return {"sources": sources, "families": families, "mode": mode, "warmup_steps": warm, "phases": rows,
            "last_step": ph["last_step"], "marks_phases": ph["marks_phases"], "vertices": radial_vertices(len(sources)).tolist()}


# ----------------------------------------------------------------------------- the stage
def run_geometry(ckpt_dir: str | Path, shards_json: str | Path, g: dict, out_dir: str | Path, prompts: list[str] | None = None,
                 mcfg: dict | None = None, views: list[str] | None = None) -> dict:
    """Compute the views asked for (`views`, default g["views"]) and write them to out_dir:
    geometry.json, the Parquet tables, plots/*.png and geometry.html (andrea/geometry_report.py).
    `g`: a model's effective geometry settings (andrea.config.geometry_settings); `prompts`: the
    attention maps' prompts (g["attention_prompts"], else the audit's)."""
    t_start = time.perf_counter()
    views = list(views or g["views"])
    unknown = [v for v in views if v not in VIEWS]
    if unknown:
        raise ValueError(f"unknown view(s) {', '.join(unknown)}; the views are {', '.join(VIEWS)}")
    check_replaceable(out_dir, "geometry.json")  # before the work: a wrong --out is refused, not deleted at the end
    run = load_run(ckpt_dir, shards_json)
    backend, precision, why = geometry_precision(g["backend"], run.meta.get("precision"))
    log.info("geometry of %s at step %d: %s on %s/%s (%s)", run.meta["model"], run.step, ", ".join(views), backend, precision, why)
    out: dict = {"model": run.meta["model"], "step": run.step, "backend": backend, "precision": precision,
                 "backend_reason": why, "views": views, "settings": g, "seconds": {}}
    traj = trajectory(run)
    timed = out["seconds"]
    heldout_every = int(run.settings.get("curriculum", {}).get("heldout_every", 50))
    needs_eval = any(v in views for v in ("attention", "surface"))
    es = build_eval_set(run.shards, heldout_every, run.seq_len, int(run.settings.get("eval_tokens", 16384)),
                        run.tok.token_bytes) if needs_eval else None
    ev = Evaluator(run, es, backend, precision) if es is not None and len(es) else None
    if needs_eval and ev is None:
        log.warning("no source has held-out text for a window: no loss surface and no attention summary")
    if "embedding" in views:
        t = time.perf_counter()
        out["embedding"] = embedding_view(run, g, traj)
        timed["embedding"] = round(time.perf_counter() - t, 2)
    if "attention" in views:
        t = time.perf_counter()
        out["attention"] = {"maps": prompt_maps(run, prompts or [], backend, precision, mcfg)}
        if ev is not None:
            ev.engine.load_state(run.final)
            out["attention"]["summary"] = attention_summary(ev.engine, es, g["attention_windows"])
        timed["attention"] = round(time.perf_counter() - t, 2)
    if "surface" in views and ev is not None:
        t = time.perf_counter()
        out["interpolation"] = interpolation_view(ev, traj, recorded_evals(run), g["line_points"])
        timed["interpolation"] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()
        out["surface"] = surface_view(ev, run, g["surface_grid"], g["surface_span"], g["surface_tokens"], g["surface_seed"])
        timed["surface"] = round(time.perf_counter() - t, 2)
    if "simplex" in views:
        t = time.perf_counter()
        out["simplex"] = simplex_view(run, g["families"])
        if out["simplex"] is None:
            log.warning("no curriculum weights in the run's loss.jsonl: no walk on the simplex")
        timed["simplex"] = round(time.perf_counter() - t, 2)
    with atomic_dir(out_dir, "geometry.json") as tmp:  # the directory appears complete, or not at all
        t = time.perf_counter()
        figs = geometry_report.plots(out, tmp)
        timed["plots"] = round(time.perf_counter() - t, 2)
        timed["total"] = round(time.perf_counter() - t_start, 2)
        geometry_report.write_page(out, figs, tmp)
        geometry_report.write_numbers(out, tmp)
    log.info("geometry of %s: %s (%.1f s)", run.meta["model"], ", ".join(f"{k} {v} s" for k, v in timed.items()), timed["total"])
    return out
