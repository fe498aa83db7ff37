"""Text generation from a checkpoint: incremental decoding with a key/value cache.

The prompt is run once (prefill) and every new token costs one position's work: its keys and
values are appended to a per-layer cache and its query attends over the cache. The pass is the
model's own (andrea/model.py `forward` with a KVCache) on the backend the model is loaded on (the
GPU when there is one), so cached decoding gives the logits of a full forward pass
(tests/test_sampling.py). On the GPU generation runs in bf16 with the one-token step captured
once as a CUDA graph and replayed per token (the position is read on the device), and several
samples of one prompt decode together, one row each. Sampling: temperature, top-k, top-p, a
seeded generator per row, stop at BOS or a length. When the context is full the cache is rebuilt
from the last half of it (decision: positions are learned, so a window cannot simply slide).

The token is chosen where the logits are (Backend.sample_tokens: kernels/sampling.cu on the GPU,
numpy_backend.sample_tokens its definition), with a counter-based generator per row seeded from
that row's NumPy generator. The step then feeds its own pick to the next step: the host queues up
to 2·CHUNK steps and reads the picks a chunk at a time, so it never waits on the GPU per token;
rows that stopped at BOS run on (until every row has stopped or the length is reached), and their
extra tokens are dropped.
Greedy decoding and top-k up to SAMPLE_CANDIDATES take this path; top-k off (None or 0) or larger
samples on the host from the logits of each step (sample_next).
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from andrea import model as gpt
from andrea.checkpoint import read_weights
from andrea.engine import make_backend, resolve_backend
from andrea.engine.activations import Activations, KVCache
from andrea.engine.numpy_backend import SAMPLE_CANDIDATES
from andrea.model import ModelConfig, Weights, n_params, param_layout, views
from andrea.tokenizer import BOS, HarrisTokenizer

CHUNK = 8  # one-token steps per read of the sampled tokens; the host queues up to two chunks ahead
RING = 2 * CHUNK  # picks per row kept in the host ring until read


@dataclass
class _Rows:
    """What decoding B rows at once keeps: the cache, forward buffers by chunk length, and the
    captured one-token step with its token input and logits output."""

    cache: KVCache
    acts: dict = field(default_factory=dict)  # chunk length n -> Activations
    tokens: object = None  # [B, 1] on the device: the step's input
    step: object = None  # the captured one-token step
    tokens_host: object = None  # [B, 1] host_buffer the step uploads into `tokens`
    logits_host: object = None  # [B, V] host_buffer the step downloads its logits into
    seeds: object = None  # [B] uint64 on the device: each row's generator
    draws: object = None  # [B] int32 on the device: draws so far per row
    ring: object = None  # [B, RING] int32 host_buffer the sampler writes each pick into
    sampled: dict = field(default_factory=dict)  # (temperature, top_k, top_p) -> the step that samples


class InferenceModel:
    """A model for generation: fp32 weights on a backend ("numpy", or "cupy" for the GPU), a KV
    cache, and the forward pass of andrea/model.py. Given an array already on the backend (an
    engine's weights) it reads that array in place, so it sees every update and never writes it.
    `precision` auto: bf16 on the GPU (the matrix products read a 16-bit copy of the weights, made
    again at every reset), fp32 on the CPU. `graphs`: replay the one-token step as a CUDA graph
    (16-bit GPU paths). A model trained in fp8 generates in bf16 (fp8 is a recipe for the training
    products; generation reads the 16-bit weight copy, at one row per step). The residual stream is
    the backend's: bf16 in bf16 (andrea/engine/cupy residual_from_env)."""

    def __init__(self, cfg: ModelConfig, weights, backend: str = "numpy", precision: str = "auto", graphs: bool = True):
        if weights.size != n_params(cfg):
            raise ValueError(f"{weights.size:,} weights for a model of {n_params(cfg):,} parameters")
        self.cfg = cfg
        self.backend = backend
        _, self.precision, _ = resolve_backend(backend, precision)
        if self.precision == "fp8":
            self.precision = "bf16"
        self.be = make_backend(backend, self.precision)
        self.w = self.be.xp.asarray(weights, dtype=np.float32)  # no copy when it is already there, in fp32
        self.W = Weights(cfg, self.w)
        self.P = views(self.w, param_layout(cfg))
        self.be.register_weights(self.w, head=self.W.head)
        self.graphs = graphs and self.be.decodes_on_device(cfg.head_dim, cfg.context)
        self._rows: dict[int, _Rows] = {}
        self._now = self._state(1)

    def _state(self, B: int) -> _Rows:
        if B not in self._rows:
            self._rows[B] = _Rows(KVCache(self.cfg, self.be, B))
        return self._rows[B]

    @property
    def cache(self) -> KVCache:
        return self._now.cache

    @property
    def rows(self) -> int:
        return self._now.cache.B

    @property
    def pos(self) -> int:
        return self._now.cache.pos

    def reset(self, rows: int = 1) -> None:
        """An empty cache for `rows` sequences decoded together; the weights are read afresh."""
        self._now = self._state(rows)
        self._now.cache.reset()
        self.be.invalidate_weight_cache()

    def _activations(self, n: int) -> Activations:
        """Forward-only buffers for n new positions per row: kept for the one-token step and the last prompt length."""
        acts = self._now.acts
        if n not in acts:
            for k in [k for k in acts if k != 1]:
                del acts[k]
            acts[n] = Activations(self.cfg, self.rows, n, self.be, saved=False, backward=False)
        return acts[n]

    def forward(self, ids, last: bool = False) -> np.ndarray:
        """Logits (host, fp32) of `ids` placed after what is cached (which grows by n): ids [n]
        (one row) gives [n, V]; ids [rows, n] gives [rows, n, V]; with `last`, of the last
        position only ([1, V] or [rows, 1, V]: what generation reads)."""
        one = np.ndim(ids) == 1
        ids = np.asarray(ids, dtype=self.be.index_dtype).reshape(1, -1) if one else np.asarray(ids, dtype=self.be.index_dtype)
        if ids.shape[0] != self.rows:
            raise ValueError(f"{ids.shape[0]} rows of token IDs for a cache of {self.rows} (reset(rows) first)")
        if self.pos + ids.shape[1] > self.cfg.context:
            raise ValueError(f"{self.pos + ids.shape[1]} positions exceed the context of {self.cfg.context}")
        if ids.shape[1] == 1 and self.graphs:
            out = self._step(ids)
        else:
            tokens = self.be.xp.asarray(ids)
            logits = gpt.forward(self.cfg, self.be, self.W, self._activations(ids.shape[1]), tokens, cache=self.cache,
                                 last=last)
            out = self.be.to_host(logits)
        out = out.reshape(ids.shape[0], 1 if last else ids.shape[1], -1)
        return out[0] if one else out

    def _step(self, ids) -> np.ndarray:
        """Logits (host, a new array) of one token per row through the captured step (captured on
        its first use), which uploads the tokens and downloads the logits itself, from and to
        host buffers: a token costs one graph launch and one wait."""
        st, pos = self._now, self.pos
        if st.step is None:
            st.tokens = self._tokens()
            st.tokens_host = self.be.host_buffer(ids.shape, self.be.index_dtype)
            acts = self._activations(1)

            def step():  # run twice on the first call (eagerly, then captured): both from the same position
                pos_before = st.cache.pos
                self.be.upload_async(st.tokens, st.tokens_host)
                logits = gpt.forward(self.cfg, self.be, self.W, acts, st.tokens, cache=st.cache)
                if st.logits_host is None:  # on the eager call, before the capture
                    st.logits_host = self.be.host_buffer(logits.shape, logits.dtype)
                self.be.download_async(st.logits_host, logits)
                st.cache.pos = pos_before

            st.step = self.be.capture(step)
        st.tokens_host[...] = ids
        st.step()  # the first call runs eagerly, then captures
        self.be.wait()
        st.cache.pos = pos + 1
        return st.logits_host.copy()  # the buffer is the next step's

    def _tokens(self):
        """The one-token step's input, [rows, 1] on the device (shared by both captured steps)."""
        st = self._now
        if st.tokens is None:
            st.tokens = self.be.zeros((self.rows, 1), self.be.index_dtype)
        return st.tokens

    def _sampling_step(self, params: tuple):
        """A function that runs one token per row through the model and samples the next one into
        the step's input (captured as a CUDA graph on its first call where the backend can)."""
        st = self._now
        if params not in st.sampled:
            acts, tokens = self._activations(1), self._tokens()

            def run():
                pos_before = st.cache.pos
                logits = gpt.forward(self.cfg, self.be, self.W, acts, tokens, cache=st.cache)
                self.be.sample_tokens(logits, st.seeds, st.draws, tokens, st.ring, *params)
                st.cache.pos = pos_before

            st.sampled[params] = self.be.capture(run) if self.graphs else run
        fn = st.sampled[params]

        def step():
            pos = st.cache.pos
            if pos >= self.cfg.context:
                raise ValueError(f"the cache is full: {self.cfg.context} positions (rebuild it before the next step)")
            fn()
            st.cache.pos = pos + 1

        return step

    def _prefill_and_sample(self, seqs, params: tuple) -> None:
        """The cache (reset) over seqs [rows, n], and the next token of each row sampled into the step's input."""
        tokens = self.be.xp.asarray(seqs.astype(self.be.index_dtype))
        logits = gpt.forward(self.cfg, self.be, self.W, self._activations(seqs.shape[1]), tokens, cache=self.cache,
                             last=True)
        st = self._now
        self.be.sample_tokens(logits, st.seeds, st.draws, self._tokens(), st.ring, *params)

    def sample(self, prompt_ids, max_new: int, seeds: list[int], temperature: float = 0.8, top_k: int | None = 40,
               top_p: float | None = 0.95, stop_at_bos: bool = True, on_tokens=None) -> list[list[int]]:
        """Up to max_new token IDs per seed after the same prompt, decoded together (one row per
        seed), each token chosen on the backend (Backend.sample_tokens: greedy at temperature ≤ 0,
        else 1 ≤ top_k ≤ SAMPLE_CANDIDATES). Up to RING steps are queued ahead of the reads, in
        chunks of CHUNK. on_tokens(row, ids): called with each row's new tokens as they are read
        (a chunk at a time)."""
        if temperature > 0 and not (top_k and 1 <= top_k <= SAMPLE_CANDIDATES):
            raise ValueError(f"sampling on the backend takes top_k from 1 to {SAMPLE_CANDIDATES}, got {top_k}")
        T, B = self.cfg.context, len(seeds)
        outs: list[list[int]] = [[] for _ in range(B)]
        if max_new <= 0 or B == 0:
            return outs
        seqs = np.tile(np.asarray(list(prompt_ids)[-T:], dtype=np.int64), (B, 1))
        self.reset(rows=B)
        st = self._now
        if st.ring is None:
            st.seeds, st.draws = self.be.zeros((B,), np.uint64), self.be.zeros((B,), np.int32)
            st.ring = self.be.host_buffer((B, RING), np.int32)
        self.be.upload(np.asarray(seeds, dtype=np.uint64), st.seeds)
        st.draws.fill(0)
        # the captured step's key: greedy ignores top_k and top_p
        params = (0.0, 1, None) if temperature <= 0 else (float(temperature), int(top_k), None if top_p is None else float(top_p))
        step = self._sampling_step(params)
        done = np.zeros(B, dtype=bool)
        since_prefill: list[np.ndarray] = []  # picks since the cache was last built, for a rebuild
        marks: deque = deque()  # (picks queued, the backend's mark after them)
        self._prefill_and_sample(seqs, params)
        launched, read = 1, 0  # picks queued (the prefill's included), picks read
        while True:
            while True:  # queue steps: chunks ending at multiples of CHUNK picks, RING unread at most, not past the context
                n = min(CHUNK - launched % CHUNK, max_new - launched, T - self.pos, RING - (launched - read))
                if n <= 0:
                    break
                for _ in range(n):
                    step()
                launched += n
                marks.append((launched, self.be.mark()))
            if not marks or marks[-1][0] < launched:  # a prefill's pick with no step queued after it
                marks.append((launched, self.be.mark()))
            upto, mark = marks.popleft()
            mark.wait()
            had = [len(o) for o in outs]
            for d in range(read, upto):
                col = st.ring[:, d % RING].copy()
                if (col[~done] < 0).any():  # (a finished row's garbage does not count)
                    raise FloatingPointError(f"generated token {d + 1}: the model's logits are not finite (NaN or +inf) "
                                             f"in row(s) {np.flatnonzero((col < 0) & ~done).tolist()}")
                since_prefill.append(np.maximum(col, 0))
                for k in np.flatnonzero(~done):
                    if stop_at_bos and col[k] == BOS:
                        done[k] = True
                    else:
                        outs[k].append(int(col[k]))
            if on_tokens is not None:
                for k in range(B):
                    if len(outs[k]) > had[k]:
                        on_tokens(k, outs[k][had[k]:])
            read = upto
            if done.all() or read >= max_new:
                return outs
            if read == launched and self.pos >= T:  # context full: rebuild the cache from the last half
                seqs = np.concatenate([seqs, np.stack(since_prefill, axis=1)], axis=1)[:, -(T // 2):]
                since_prefill = []
                self.reset(rows=B)
                self._prefill_and_sample(seqs, params)
                launched += 1


def sample_next(logits: np.ndarray, rng: np.random.Generator, temperature: float = 0.8, top_k: int | None = 40,
                top_p: float | None = 0.95) -> int:
    """One token from a logits row: greedy at temperature 0, else temperature, top-k, top-p."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    if top_k and top_k < z.size:
        cut = np.partition(z, -top_k)[-top_k]
        z[z < cut] = -np.inf
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < top_p  # the smallest prefix reaching top_p
        p[order[~keep]] = 0.0
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def generate(model: InferenceModel, prompt_ids, max_new: int, rng: np.random.Generator, temperature: float = 0.8,
             top_k: int | None = 40, top_p: float | None = 0.95, stop_at_bos: bool = True, on_tokens=None) -> list[int]:
    """Up to max_new token IDs after `prompt_ids` (which should start with BOS); on_tokens(ids), when
    given, receives them as they come."""
    each = None if on_tokens is None else (lambda _row, ids: on_tokens(ids))
    return generate_rows(model, prompt_ids, max_new, [rng], temperature, top_k, top_p, stop_at_bos, each)[0]


def generate_rows(model: InferenceModel, prompt_ids, max_new: int, rngs: list[np.random.Generator], temperature: float = 0.8,
                  top_k: int | None = 40, top_p: float | None = 0.95, stop_at_bos: bool = True,
                  on_tokens=None) -> list[list[int]]:
    """One sample of up to max_new tokens per generator, all after the same prompt, decoded
    together (one cache row each): row k draws from rngs[k] alone, so it is the sample that
    `generate` gives with that generator (to the float rounding of a batched product). Greedy,
    or top-k up to SAMPLE_CANDIDATES: chosen on the backend (InferenceModel.sample, the row's
    generator seeding the row's draws); top-k off: on the host (sample_next). on_tokens(row, ids):
    each row's new tokens as they come (InferenceModel.sample)."""
    if temperature <= 0 or (top_k and 1 <= top_k <= SAMPLE_CANDIDATES):
        seeds = [int(r.integers(0, 2**63)) for r in rngs]
        return model.sample(prompt_ids, max_new, seeds, temperature, top_k, top_p, stop_at_bos, on_tokens)
    return _generate_on_host(model, prompt_ids, max_new, rngs, temperature, top_k, top_p, stop_at_bos, on_tokens)


def _generate_on_host(model: InferenceModel, prompt_ids, max_new: int, rngs: list[np.random.Generator], temperature: float,
                      top_k: int | None, top_p: float | None, stop_at_bos: bool, on_tokens=None) -> list[list[int]]:
    """generate_rows with each token chosen on the host from the step's logits."""
    T, B = model.cfg.context, len(rngs)
    seqs = np.tile(np.asarray(list(prompt_ids)[-T:], dtype=np.int64), (B, 1))
    model.reset(rows=B)
    logits = model.forward(seqs, last=True)[:, -1]
    outs: list[list[int]] = [[] for _ in range(B)]
    done = [False] * B
    for _ in range(max_new):
        nxt = np.full(B, BOS, dtype=np.int64)  # a finished row is fed BOS; its logits are not read
        for k in range(B):
            if done[k]:
                continue
            nxt[k] = sample_next(logits[k], rngs[k], temperature, top_k, top_p)
            if stop_at_bos and nxt[k] == BOS:
                done[k] = True
            else:
                outs[k].append(int(nxt[k]))
                if on_tokens is not None:
                    on_tokens(k, [int(nxt[k])])
        if all(done):
            break
        seqs = np.concatenate([seqs, nxt[:, None]], axis=1)
        if model.pos >= T:  # context full: rebuild the cache from the last half
            seqs = seqs[:, -(T // 2) :]
            model.reset(rows=B)
            logits = model.forward(seqs, last=True)[:, -1]
        else:
            logits = model.forward(nxt[:, None])[:, 0]
    return outs


def chat_prompt(text: str, mcfg: dict | None = None) -> str:
    """A user turn rendered as in training (SPEC §8), followed by the assistant's prefix."""
    mcfg = mcfg or {}
    return f"{mcfg.get('user_prefix', '> ')}{text.strip()}{mcfg.get('turn_separator', chr(10) * 2)}{mcfg.get('assistant_prefix', '< ')}"


@dataclass
class LoadedModel:
    cfg: ModelConfig
    model: InferenceModel
    weights: np.ndarray  # the flat weights (andrea/model.py layout)
    tokenizer: HarrisTokenizer
    step: int
    meta: dict


def load_model(ckpt: str | Path, backend: str = "auto") -> LoadedModel:
    """A checkpoint directory (results/<model>/ckpt, with run.json) or a .bin inside one, for
    generation on `backend` (auto: the GPU when one is usable, else the CPU)."""
    ckpt = Path(ckpt)
    d = ckpt if ckpt.is_dir() else ckpt.parent
    bin_path = d / "final.bin" if ckpt.is_dir() else ckpt
    meta_path = d / "run.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path}: missing; give a trained model's ckpt directory (results/<model>/ckpt)")
    meta = json.loads(meta_path.read_text())
    cfg = ModelConfig(**meta["model_config"])
    ck = read_weights(bin_path, expected_n_params=n_params(cfg))
    tok = HarrisTokenizer.load(meta["segments"])
    name, _, _ = resolve_backend(backend, "auto")
    return LoadedModel(cfg, InferenceModel(cfg, ck.weights, backend=name), ck.weights, tok, ck.step, meta)
