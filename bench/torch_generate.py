"""The plain-PyTorch baseline for generation speed (issue: single-stream generation tokens/s for
12M/120M beside PyTorch's): ANDREA's GPT (bench/torch_reference.py, our weights) decoding greedily
from a static KV cache, one token per step, the argmax on the device.

Two variants of one decoder. eager: the step attends over the cache slice [:pos+1]. compile: the
step has static shapes, as Hugging Face's StaticCache does it: the position lives in a device
tensor, the new key/value go into the cache with index_copy_, attention covers the whole cache with
positions > pos masked, and torch.compile(mode="reduce-overhead") replays the step as a CUDA graph.
The prefill (one causal SDPA over the prompt) stays eager in both. Compilation happens in the
warm-up rounds: it is reported as warmup_s and kept out of the timed rounds.

    python3 bench/torch_generate.py --models ANDREA-12M ANDREA-120M --device cuda --dtype bfloat16 --compile --out r.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import MODELS  # noqa: E402  (also puts the repository on sys.path)
from torch_reference import load_flat, torch_model  # noqa: E402


class TorchDecoder:
    """`batch` sequences decoded together. static=True (implied by compile) is the static-shape
    step; it runs uncompiled too, which is how the CPU tests check it. Under compile the logits a
    step returns live in the CUDA graph's memory: use them before the next step."""

    def __init__(self, cfg, flat, batch: int = 1, device: str = "cpu", dtype=torch.float32, compile: bool = False,
                 static: bool | None = None):
        self.cfg, self.batch, self.device, self.compile = cfg, batch, torch.device(device), compile
        self.static = compile if static is None else static
        if compile and not self.static:
            raise ValueError("compile needs the static-shape step (static=True)")
        model = torch_model(cfg)
        load_flat(model, cfg, flat)
        self.model = model.to(device=self.device, dtype=dtype).eval().requires_grad_(False)
        self.head = self.model.wte.weight if cfg.tied_head else self.model.head.weight
        # One [B, H, context, D] buffer per layer (the [L, B, H, context, D] cache, split) so that
        # the compiled step updates each in place, a graph input of fixed address.
        shape = (batch, cfg.n_head, cfg.context, cfg.head_dim)
        self.k = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.v = [torch.zeros(shape, device=self.device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.positions = torch.arange(cfg.context, device=self.device)
        self.pos = 0  # host copy of the position, for bounds checks
        self.pos_t = torch.zeros(1, dtype=torch.long, device=self.device)  # the static step's position
        self._step = self._static_step if self.static else self._eager_step
        if compile:
            for t in (*self.k, *self.v, self.pos_t):
                torch._dynamo.mark_static_address(t)
            self._step = torch.compile(self._static_step, mode="reduce-overhead", fullgraph=True)

    def _block(self, b, x, attend):
        """One block of torch_reference's Block, its attention given as attend(q, k, v) -> y."""
        B, T, d = x.shape
        q, k, v = b.qkv(b.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(B, T, self.cfg.n_head, self.cfg.head_dim).transpose(1, 2) for t in (q, k, v))
        x = x + b.wo(attend(q, k, v).transpose(1, 2).reshape(B, T, d))
        return x + b.w2(F.gelu(b.w1(b.ln2(x)), approximate="tanh"))

    def _logits(self, x):
        return (self.model.lnf(x) @ self.head.T).float()

    @torch.no_grad()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt ids [B, n] from position 0; logits [B, V] (fp32) of its last position."""
        B, n = ids.shape
        if B != self.batch or not 0 < n <= self.cfg.context:
            raise ValueError(f"prefill ids of shape {tuple(ids.shape)}: want [{self.batch}, 1..{self.cfg.context}]")
        x = self.model.wte(ids) + self.model.wpe.weight[:n]
        for i, b in enumerate(self.model.blocks):
            def attend(q, k, v, i=i):
                self.k[i][:, :, :n], self.v[i][:, :, :n] = k, v
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = self._block(b, x, attend)
        self.pos = n
        self.pos_t.fill_(n)
        return self._logits(x[:, -1])

    def _eager_step(self, ids):
        pos = self.pos
        x = (self.model.wte(ids) + self.model.wpe.weight[pos])[:, None]
        for i, b in enumerate(self.model.blocks):
            def attend(q, k, v, i=i):
                self.k[i][:, :, pos : pos + 1], self.v[i][:, :, pos : pos + 1] = k, v
                return F.scaled_dot_product_attention(q, self.k[i][:, :, : pos + 1], self.v[i][:, :, : pos + 1])
            x = self._block(b, x, attend)
        return self._logits(x[:, 0])

    def _static_step(self, ids):
        x = (self.model.wte(ids) + self.model.wpe(self.pos_t))[:, None]
        mask = (self.positions <= self.pos_t)[None, None, None, :]  # [1, 1, 1, context]: True attends
        for i, b in enumerate(self.model.blocks):
            def attend(q, k, v, i=i):
                self.k[i].index_copy_(2, self.pos_t, k)
                self.v[i].index_copy_(2, self.pos_t, v)
                return F.scaled_dot_product_attention(q, self.k[i], self.v[i], attn_mask=mask)
            x = self._block(b, x, attend)
        self.pos_t.add_(1)
        return self._logits(x[:, 0])

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """One new token per row, ids [B], at the current position; logits [B, V] (fp32)."""
        if ids.shape != (self.batch,):
            raise ValueError(f"step ids of shape {tuple(ids.shape)}: want [{self.batch}]")
        if self.pos >= self.cfg.context:
            raise ValueError(f"the cache is full: {self.cfg.context} positions")
        if self.compile:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs may be overwritten now
        logits = self._step(ids)
        self.pos += 1
        return logits


def _kept(logits: torch.Tensor, temperature: float, top_k: int, top_p: float | None):
    """The top_k logits over temperature, with −inf past the top-p prefix, and their token IDs."""
    v, i = torch.topk(logits.float() / temperature, top_k, dim=-1)
    if top_p is not None and top_p < 1:
        p = torch.softmax(v, dim=-1)
        v = v.masked_fill(p.cumsum(-1) - p >= top_p, float("-inf"))
    return v, i


def pick(logits: torch.Tensor, temperature: float, top_k: int, top_p: float | None, gen) -> torch.Tensor:
    """The next token of each row, on the device and without a host wait: argmax at temperature ≤ 0,
    else the usual plain-PyTorch sampler (topk, softmax, the top-p prefix, multinomial)."""
    if temperature <= 0:
        return logits.argmax(-1)
    v, i = _kept(logits, temperature, top_k, top_p)
    return i.gather(-1, torch.multinomial(torch.softmax(v, dim=-1), 1, generator=gen))[:, 0]


def pick_gumbel(logits: torch.Tensor, temperature: float, top_k: int, top_p: float | None) -> torch.Tensor:
    """pick's distribution through the Gumbel-max trick (argmax of the kept logits plus Gumbel noise
    from torch.rand): no multinomial and no generator object, so torch.compile(mode="reduce-overhead")
    takes the whole pick into a CUDA graph."""
    v, i = _kept(logits, temperature, top_k, top_p)
    gumbel = -torch.log(-torch.log(torch.rand_like(v).clamp(1e-20, 1.0 - 1e-7)))
    return i.gather(-1, (v + gumbel).argmax(-1, keepdim=True))[:, 0]


def generate_tokens_per_s(cfg, flat, device: str, dtype, compile: bool, prompt_len: int = 32, new_tokens: int = 200,
                          batch: int = 1, warmup: int = 1, rounds: int = 3, temperature: float = 0.0, top_k: int = 40,
                          top_p: float | None = 0.95, compiled_pick: bool = False) -> dict:
    """Decoding of new_tokens after a prompt_len random prompt (greedy at temperature 0, else
    sampled on the device: pick, or with compiled_pick pick_gumbel compiled into a CUDA graph of
    its own), timed over `rounds` after `warmup` untimed rounds (compilation included there); the
    median round counts."""
    if prompt_len + new_tokens > cfg.context:
        raise ValueError(f"prompt {prompt_len} + new {new_tokens} tokens exceed the context of {cfg.context}")
    if compile:  # each decoder's model is a new class: compile afresh, not as a recompile towards dynamo's limit
        torch._dynamo.reset()
    dec = TorchDecoder(cfg, flat, batch=batch, device=device, dtype=dtype, compile=compile)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (batch, prompt_len), generator=gen).to(dec.device)
    sync = torch.cuda.synchronize if dec.device.type == "cuda" else (lambda: None)
    if compiled_pick and temperature > 0:
        torch.manual_seed(1)
        compiled = torch.compile(lambda logits: pick_gumbel(logits, temperature, top_k, top_p), mode="reduce-overhead")

        def chooser(logits):  # within the step's cudagraph "step": its logits stay valid
            return compiled(logits).clone()  # out of the graph's pool before the next step begins
    else:
        draws = torch.Generator(device=dec.device).manual_seed(1)

        def chooser(logits):
            return pick(logits, temperature, top_k, top_p, draws)

    def one_round():
        sync()
        t0 = time.perf_counter()
        ids = chooser(dec.prefill(prompt))
        sync()
        t1 = time.perf_counter()
        for _ in range(new_tokens):
            ids = chooser(dec.step(ids))
        sync()
        return (t1 - t0), time.perf_counter() - t1

    t0 = time.perf_counter()
    for _ in range(warmup):
        one_round()
    warmup_s = time.perf_counter() - t0
    prefills, decodes = zip(*(one_round() for _ in range(rounds)))
    med = statistics.median(decodes)
    return {"tokens_per_s": new_tokens * batch / med, "ms_per_token": med / new_tokens * 1e3,
            "prefill_ms": statistics.median(prefills) * 1e3, "rounds_s": list(decodes),
            "warmup_s": round(warmup_s, 3), "variant": "compile" if compile else "eager", "batch": batch,
            "prompt_len": prompt_len, "new_tokens": new_tokens, "temperature": temperature,
            "compiled_pick": bool(compiled_pick and temperature > 0), "dtype": str(dtype).removeprefix("torch."),
            "device": torch.cuda.get_device_name(dec.device) if dec.device.type == "cuda" else "cpu"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--compile", action="store_true", help="static-shape step, torch.compile reduce-overhead (CUDA graphs)")
    ap.add_argument("--batch", nargs="+", type=int, default=[1])
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.compile and not args.device.startswith("cuda"):
        ap.error("--compile (CUDA graphs) needs --device cuda")

    from andrea.io import write_json_atomic
    from andrea.model import init_weights, n_params

    rows = []
    for name in args.models:
        cfg = MODELS[name]
        flat = init_weights(cfg, seed=0)
        for B in args.batch:
            r = {"model": name, "params": n_params(cfg), **generate_tokens_per_s(
                cfg, flat, args.device, getattr(torch, args.dtype), args.compile, args.prompt_len, args.new_tokens, B,
                args.warmup, args.rounds)}
            print(f"{name} B={B} {r['variant']} {r['dtype']}: {r['tokens_per_s']:,.0f} tok/s, {r['ms_per_token']:.3f} ms/token, "
                  f"prefill {r['prefill_ms']:.2f} ms, warm-up {r['warmup_s']:.1f} s, rounds {[round(t * 1e3, 1) for t in r['rounds_s']]} ms", flush=True)
            rows.append(r)
    if args.out:
        write_json_atomic(args.out, rows)


if __name__ == "__main__":
    main()
