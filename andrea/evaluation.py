"""Validation (design §6.5): the model's loss on a fixed held-out set, per source and overall, in nats
per token and in bits per byte.

The held-out set of a source is its held-out documents (every `heldout_every`-th one, which the
bandit never draws: andrea/curriculum.py), each led by its BOS, laid end to end and cut into
windows of T + 1 tokens, at most `tokens_per_source` target tokens per source. The windows hold
held-out text only (a window never runs on into a training document) and are the same at every
evaluation, so the curve measures the model, not the sample.

Bits per byte = nats / ln 2 summed over the target tokens, divided by the UTF-8 bytes those tokens
stand for (a BOS stands for none). Unlike nats per token it does not depend on the tokenizer, so
runs with different vocabularies compare.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from andrea.curriculum import is_heldout
from andrea.engine import Engine, resolve_backend
from andrea.sampling import InferenceModel

LN2 = math.log(2.0)


@dataclass
class EvalSet:
    seq_len: int
    windows: np.ndarray  # uint16 [n, T + 1]
    source_index: np.ndarray  # [n]: which of `sources` each window comes from
    target_bytes: np.ndarray  # [n]: UTF-8 bytes of each window's T target tokens
    sources: list[str]
    skipped: dict[str, str]  # sources without a window, and why

    def __len__(self) -> int:
        return len(self.windows)

    @property
    def tokens(self) -> int:
        return len(self.windows) * self.seq_len


def heldout_documents(n_docs: int, heldout_every: int) -> list[int]:
    """Indices of a source's held-out documents (andrea.curriculum.is_heldout)."""
    return [d for d in range(heldout_every - 1, n_docs, max(1, heldout_every)) if is_heldout(d, heldout_every)]


def heldout_coverage(shards: dict, heldout_every: int, seq_len: int) -> dict[str, dict]:
    """Per source, what held-out text it has and who scores it, in the words training's validation
    and the audit both use: `documents`, `heldout_documents`, `heldout_tokens` (BOS included),
    `validation` (training's windows of seq_len + 1 tokens score it), `audit` ("windows", "whole"
    or None) and `why` (for a source without a validation figure; None otherwise)."""
    out = {}
    for name in sorted(shards):
        sh = shards[name]
        docs = heldout_documents(sh.n_docs, heldout_every)
        offsets = np.asarray(sh.offsets, dtype=np.int64)
        tokens = int((offsets[np.add(docs, 1)] - offsets[docs]).sum()) if docs else 0
        row = {"documents": int(sh.n_docs), "heldout_documents": len(docs), "heldout_tokens": tokens,
               "validation": False, "audit": None, "why": None}
        if heldout_every <= 0:
            row["why"] = "no document is held out (curriculum.heldout_every is 0)"
        elif not docs:
            row["why"] = (f"no held-out document: only {sh.n_docs} document{'s' if sh.n_docs != 1 else ''}, and every {heldout_every}th is held out "
                          f"(curriculum.heldout_every)")
        elif tokens < seq_len + 1:
            row["audit"] = "whole"
            row["why"] = (f"its held-out text ({len(docs)} document{'s' if len(docs) != 1 else ''}, {tokens} tokens) is shorter than one validation "
                          f"window of {seq_len + 1} tokens; the audit scores it whole")
        else:
            row["validation"], row["audit"] = True, "windows"
        out[name] = row
    return out


def build_eval_set(shards: dict, heldout_every: int, seq_len: int, tokens_per_source: int, token_bytes: np.ndarray) -> EvalSet:
    """The fixed held-out windows of every source (see the module docstring); the sources without
    one in `skipped`, with heldout_coverage's reason."""
    T = seq_len
    want = max(1, tokens_per_source // T)  # windows per source
    windows, index, nbytes, names, skipped = [], [], [], [], {}
    coverage = heldout_coverage(shards, heldout_every, seq_len)
    for name in sorted(shards):
        sh = shards[name]
        docs = heldout_documents(sh.n_docs, heldout_every)
        if not coverage[name]["validation"]:
            skipped[name] = coverage[name]["why"]
            continue
        need = want * T + 1
        parts, have = [], 0
        for d in docs:  # held-out documents end to end, each with its BOS, until `want` windows fit
            a, b = int(sh.offsets[d]), int(sh.offsets[d + 1])
            parts.append(np.asarray(sh.tokens[a:b]))
            have += b - a
            if have >= need:
                break
        stream = np.concatenate(parts) if parts else np.zeros(0, np.uint16)
        n = min(want, (len(stream) - 1) // T)
        names.append(name)
        for i in range(n):
            w = stream[i * T : i * T + T + 1]
            windows.append(w)
            index.append(len(names) - 1)
            nbytes.append(int(token_bytes[w[1:]].sum()))
    if not windows:
        return EvalSet(T, np.zeros((0, T + 1), np.uint16), np.zeros(0, np.int64), np.zeros(0, np.int64), [], skipped)
    return EvalSet(T, np.stack(windows).astype(np.uint16), np.array(index), np.array(nbytes, dtype=np.int64), names, skipped)


def summarise(es: EvalSet, window_loss: np.ndarray, seconds: float | None = None) -> dict:
    """Per-source and overall nats/token and bits/byte from each window's mean loss."""
    nats = window_loss.astype(np.float64) * es.seq_len  # summed over the window's targets
    out = {"loss": None, "bpb": None, "tokens": int(es.tokens), "sources": {}}
    for i, name in enumerate(es.sources):
        sel = es.source_index == i
        tok = int(sel.sum()) * es.seq_len
        b = int(es.target_bytes[sel].sum())
        out["sources"][name] = {"loss": round(float(nats[sel].sum() / tok), 5),
                                "bpb": round(float(nats[sel].sum() / LN2 / b), 5) if b else None, "tokens": tok}
    if len(es):
        total_bytes = int(es.target_bytes.sum())
        out["loss"] = round(float(nats.sum() / es.tokens), 5)
        out["bpb"] = round(float(nats.sum() / LN2 / total_bytes), 5) if total_bytes else None
    if seconds is not None:
        out["seconds"] = round(seconds, 4)
    return out


def prepare_batches(engine, es: EvalSet) -> list:
    """The set's windows as the engine's batches, checked and converted once (the last batch
    padded with repeats whose losses are dropped); forward-only, so no backward plan."""
    B = engine.B
    out = []
    for i in range(0, len(es), B):
        x = es.windows[np.arange(i, i + B) % len(es)]
        out.append(engine.prepare(x[:, :-1], x[:, 1:], backward=False))
    return out


def evaluate(engine, es: EvalSet, batches: list | None = None) -> dict:
    """Forward passes only, on the engine's backend (the GPU when it runs there), in batches of
    the engine's batch size; `batches` from prepare_batches (made here when not given). With
    several ranks (engine.comm) each runs every ranks-th batch and the window losses are summed
    over the ranks, so every rank gets the whole set's figures in 1/ranks of the time."""
    t0 = time.perf_counter()
    batches = prepare_batches(engine, es) if batches is None else batches
    losses = np.zeros(len(es), dtype=np.float64)
    comm = engine.comm
    for n, batch in enumerate(batches):
        if n % comm.size != comm.rank:
            continue
        engine.forward(batch)
        i = n * engine.B
        k = min(engine.B, len(es) - i)
        losses[i : i + k] = np.asarray(engine.row_losses(), dtype=np.float64)[:k]
    if comm.size > 1:
        comm.allreduce_host(losses, "sum")  # each window is one rank's; the others hold 0 there
    return summarise(es, losses, time.perf_counter() - t0)


def _score_stream(model, stream: np.ndarray, token_bytes: np.ndarray) -> tuple[float, int, int]:
    """Summed nats, target tokens and their bytes of one token stream, in chunks of the context
    (the KV-cache model of andrea/sampling.py)."""
    ctx = model.cfg.context
    nats = 0.0
    tokens = nbytes = 0
    for a in range(0, len(stream) - 1, ctx):
        x = np.asarray(stream[a : a + ctx + 1], dtype=np.int64)
        if len(x) < 2:
            break
        model.reset()
        logits = model.forward(x[:-1]).astype(np.float64)
        top = logits.max(-1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
        nats += float((lse - logits[np.arange(len(x) - 1), x[1:]]).sum())
        tokens += len(x) - 1
        nbytes += int(token_bytes[x[1:]].sum())
    return nats, tokens, nbytes


def heldout_report(cfg, weights: np.ndarray, token_bytes: np.ndarray, shards: dict, heldout_every: int, seq_len: int,
                   tokens_per_source: int, backend: str = "auto", trained_precision: str | None = None) -> dict:
    """The audit's held-out loss for every source that has held-out documents: nats/token,
    bits/byte and perplexity. Windows of `seq_len` run on the engine of the resolved backend (the
    GPU when there is one: in the precision the model was trained in, or bf16 if that was fp32 on
    the CPU or fp8; on the CPU in fp32); a source whose held-out text is shorter than one window is scored
    whole by the generation model (andrea/sampling.py) on the same backend."""
    es = build_eval_set(shards, heldout_every, seq_len, tokens_per_source, token_bytes)
    coverage = heldout_coverage(shards, heldout_every, seq_len)
    per: dict[str, dict] = {}
    sums = {}  # source -> (nats, tokens, bytes)
    info = {"seq_len": seq_len, "backend": None}
    if len(es):
        be, prec, why = resolve_backend(backend, "auto")
        if be == "cupy" and trained_precision in ("fp32", "bf16", "fp16"):
            prec = trained_precision
        info.update(backend=be, precision=prec, backend_reason=why)
        engine = Engine(cfg, batch_size=min(8, len(es)), seq_len=seq_len, backend=be, precision=prec)
        engine.load_state(weights)
        r = evaluate(engine, es)
        for src, v in r["sources"].items():
            i = es.sources.index(src)
            sums[src] = (v["loss"] * v["tokens"], v["tokens"], int(es.target_bytes[es.source_index == i].sum()), "windows")
    whole = None  # the generation model, on the resolved backend in fp32
    for src, c in coverage.items():
        if c["audit"] != "whole":
            continue
        sh = shards[src]
        docs = heldout_documents(sh.n_docs, heldout_every)
        stream = np.concatenate([np.asarray(sh.tokens[int(sh.offsets[d]) : int(sh.offsets[d + 1])]) for d in docs])
        whole = whole or InferenceModel(cfg, weights, backend=info["backend"] or resolve_backend(backend, "auto")[0],
                                        precision="fp32")
        nats, tok, nbytes = _score_stream(whole, stream, token_bytes)
        if tok:
            sums[src] = (nats, tok, nbytes, "whole")
    for src in sorted(sums):
        nats, tok, nbytes, how = sums[src]
        per[src] = {"loss": round(nats / tok, 5), "bpb": round(nats / LN2 / nbytes, 5) if nbytes else None,
                    "perplexity": round(math.exp(nats / tok), 3), "tokens": tok, "method": how}
    total_nats = sum(v[0] for v in sums.values())
    total_tok = sum(v[1] for v in sums.values())
    total_bytes = sum(v[2] for v in sums.values())
    overall = {"loss": round(total_nats / total_tok, 5) if total_tok else None,
               "bpb": round(total_nats / LN2 / total_bytes, 5) if total_bytes else None,
               "perplexity": round(math.exp(total_nats / total_tok), 3) if total_tok else None, "tokens": total_tok}
    for src, v in per.items():
        v["share"] = round(v["tokens"] / total_tok, 4)  # of the overall figure's tokens
    # each source counted once, however much held-out text it has: the overall figure above is
    # weighted by tokens, so one large source can stand for nearly all of it
    bpbs = [v["bpb"] for v in per.values() if v["bpb"] is not None]
    overall["bpb_mean_of_sources"] = round(float(np.mean(bpbs)), 5) if bpbs else None
    largest = max(per, key=lambda s: per[s]["tokens"]) if per else None
    no_heldout = {s: c["why"] for s, c in coverage.items() if s not in per}
    return {**info, "overall": overall, "per_source": per, "without_heldout": no_heldout, "coverage": coverage,
            "largest_source": largest, "heldout_every": heldout_every}
