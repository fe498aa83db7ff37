"""The trainer ("proxy", SPEC §6): turns the engine into a run a person can start, watch, stop,
resume and trust.

Run directory (results/<model>/runs/<key>/, key = architecture + tokenizer; it survives
Snakemake's removal of incomplete outputs):
    checkpoints/step_NNNNNN.bin   every `checkpoint_every` steps; the last `keep_checkpoints` kept
    best.bin, final.bin           lowest smoothed loss so far; the end of the run
    state.json                    step, bandit, RNG, data cursors, schedule, smoothing, counters,
                                  and which checkpoint it belongs to (written right after it)
    loss.jsonl                    one line per step, continuous across resumes
    samples.jsonl                 every coherence sample with its score
    plan.json                     what the run is: model, memory plan, backend, tokens/step, ETA

Signals: SIGTERM (and SIGINT, Ctrl-C) finishes the current step, writes a checkpoint and exits 0;
SIGUSR1 writes a checkpoint and carries on. A run started again resumes from the newest checkpoint and its state
and follows the same trajectory bit for bit (same backend and precision).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import math
import os
import shutil
import signal
import time
from pathlib import Path

import numpy as np

from andrea.checkpoint import read_checkpoint, write_checkpoint
from andrea.coherence import coherence_score
from andrea.config import deep_merge
from andrea.curriculum import Bandit
from andrea.engine import Engine
from andrea.io import atomic_path, read_jsonl, write_json_atomic, write_text_atomic
from andrea.model import ModelConfig, flops_per_token, n_params
from andrea.optim import NonFiniteCounter, NonFiniteHalt, OptimConfig, train_step
from andrea.sampling import InferenceModel, generate
from andrea.shards import Shard
from andrea.tokenizer import BOS, HarrisTokenizer

log = logging.getLogger("andrea.trainer")

TRAIN_DEFAULTS = {
    "backend": "numpy",
    "precision": "fp32",
    "batch_size": 8,
    "grad_accum": 1,
    "seq_len": None,  # the model's context
    "max_steps": 200_000,
    "lr": 3e-4,
    "min_lr_ratio": 0.1,
    "warmup_steps": 2000,
    "weight_decay": 0.1,
    "beta1": 0.9,
    "beta2": 0.999,
    "grad_clip": 1.0,
    "max_nonfinite": 5,
    "checkpoint_every": 100,
    "keep_checkpoints": 3,
    "sample_every": 100,
    "sample_tokens": 420,
    "sample_prompt": "> Tell me about the sea.\n\n< ",
    "sample_temperature": 0.8,
    "coherence_halt_below": 30,
    "coherence_patience": 5,
    "seed": 0,
    "max_cpu_hours": 12,
    "curriculum": {},
}
SMMA_N = 100  # the original's smoothed moving average, s_t = ((n−1)·s_{t−1} + x_t)/n
EMA_ALPHA = 0.1


class TrainingRefused(RuntimeError):
    """A run that should not start (e.g. months of CPU time); the message says what to do."""


class CoherenceHalt(RuntimeError):
    """The coherence gate stopped the run: samples have collapsed."""


def train_settings(config: dict, model: str) -> dict:
    """Defaults < config train.defaults < config train.<model>; the curriculum section merged
    with the model's curriculum overrides."""
    tcfg = config.get("train", {})
    s = deep_merge(TRAIN_DEFAULTS, tcfg.get("defaults", {}))
    s = deep_merge(s, tcfg.get(model, {}))
    s["curriculum"] = deep_merge(config["curriculum"], s.get("curriculum", {}))
    return s


def optim_config(s: dict) -> OptimConfig:
    return OptimConfig(
        lr=s["lr"], min_lr_ratio=s["min_lr_ratio"], warmup_steps=s["warmup_steps"], max_steps=s["max_steps"],
        beta1=s["beta1"], beta2=s["beta2"], weight_decay=s["weight_decay"], grad_clip=s["grad_clip"],
        max_nonfinite=s["max_nonfinite"],
    )


def run_key(config: dict, model: str, shards_json: str | Path) -> str:
    """What makes two runs the same run: the architecture and the tokenizer. Training settings,
    floors and caps may change between a stop and a resume (the polish pivot) without starting
    over; a new vocabulary or shape starts a new run directory."""
    meta = json.loads(Path(shards_json).read_text())
    blob = json.dumps({"model": config["models"][model], "tokenizer": meta["tokenizer_hash"]}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def cpu_flops() -> float:
    """Sustained float32 matrix-multiply rate of this machine through NumPy (FLOP/s)."""
    a = np.ones((512, 512), dtype=np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    return 4 * 2 * 512**3 / max(1e-9, time.perf_counter() - t0)


def human_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


class Trainer:
    def __init__(self, config: dict, model: str, shards_json: str | Path, run_dir: str | Path, force: bool = False):
        if model not in config["models"]:
            raise ValueError(f"unknown model {model!r}; models in the config: {', '.join(config['models'])}")
        self.config, self.model_name, self.force = config, model, force
        self.s = train_settings(config, model)
        self.cfg = ModelConfig.from_config(config["models"][model])
        self.T = self.s["seq_len"] or self.cfg.context
        self.B = self.s["batch_size"]
        self.oc = optim_config(self.s)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        meta = json.loads(Path(shards_json).read_text())
        self.shards_meta = meta
        self.tok = HarrisTokenizer.load(meta["segments"])
        if self.tok.vocab_size != self.cfg.vocab_size:
            raise ValueError(f"{meta['segments']}: vocabulary {self.tok.vocab_size}, but {model} expects {self.cfg.vocab_size}")
        self.shards = {}
        for src, c in meta["sources"].items():
            if c["n_docs"] > 0:
                self.shards[src] = Shard(meta["shard_dir"], src, tokenizer_hash=meta["tokenizer_hash"])
        if not self.shards:
            raise ValueError(f"{shards_json}: every shard is empty; nothing to train on")
        arms = {
            src: {"n_docs": sh.n_docs, "floor": config["sources"].get(src, {}).get("floor", 0.0),
                  "cap": config["sources"].get(src, {}).get("cap", 1.0)}
            for src, sh in self.shards.items()
        }
        self.bandit = Bandit(arms, self.s["curriculum"], seed=self.s["seed"])
        self.rng = np.random.default_rng([self.s["seed"], 0xDA7A])
        self.step = 0
        self.ema = None
        self.smma = None
        self.best = math.inf
        self.nonfinite = NonFiniteCounter()
        self.low_samples = 0
        self.tokens_seen = 0
        self._stop = False
        self._save_now = False
        self.engine = None

    # ------------------------------------------------------------------ plan
    def plan(self) -> dict:
        s = self.s
        tokens_per_step = self.B * self.T * s["grad_accum"]
        remaining = max(0, s["max_steps"] - self.step)
        flops_step = flops_per_token(self.cfg) * tokens_per_step
        plan = {
            "model": self.model_name,
            "n_params": n_params(self.cfg),
            "backend": s["backend"],
            "precision": s["precision"],
            "batch": {"batch_size": self.B, "seq_len": self.T, "grad_accum": s["grad_accum"], "tokens_per_step": tokens_per_step},
            "steps": {"max_steps": s["max_steps"], "start": self.step, "remaining": remaining},
            "sources": {k: v.n_docs for k, v in self.shards.items()},
        }
        if s["backend"] == "numpy":
            # before allocating anything: a model this size may not even fit, let alone finish
            est = flops_step / (0.5 * cpu_flops()) * remaining
            plan["estimate_before_warmup_s"] = est
            if est > s["max_cpu_hours"] * 3600 and not self.force:
                raise TrainingRefused(
                    f"{self.model_name} ({n_params(self.cfg):,} parameters, {tokens_per_step:,} tokens per step, "
                    f"{remaining:,} steps) on the NumPy CPU backend would take about {human_duration(est)} "
                    f"(limit train.max_cpu_hours = {s['max_cpu_hours']}). Train ANDREA-tiny instead "
                    f"(snakemake --cores 2 results/ANDREA-tiny/ckpt), use a GPU backend when one is available, "
                    f"or start anyway with `andrea train --force` (Snakemake: --config force_train=true)."
                )
        return plan

    # ------------------------------------------------------------------ state
    def _state(self, ckpt_name: str) -> dict:
        return {
            "step": self.step,
            "checkpoint": ckpt_name,
            "model": self.model_name,
            "n_params": n_params(self.cfg),
            "adam_t": self.engine.adam_t,
            "loss_scale": {"scale": self.engine.loss_scale, "good_steps": self.engine.scale_good_steps},
            "rng": self.rng.bit_generator.state,
            "bandit": self.bandit.state(),
            "ema": self.ema,
            "smma": self.smma,
            "best": self.best if math.isfinite(self.best) else None,
            "nonfinite": {"consecutive": self.nonfinite.consecutive, "total": self.nonfinite.total, "steps": self.nonfinite.steps},
            "low_samples": self.low_samples,
            "tokens_seen": self.tokens_seen,
            "tokenizer_hash": self.shards_meta["tokenizer_hash"],
            "schedule": {"lr": self.oc.lr, "warmup_steps": self.oc.warmup_steps, "max_steps": self.oc.max_steps},
        }

    def save_checkpoint(self, reason: str = "periodic") -> Path:
        e = self.engine
        name = f"step_{self.step:06d}.bin"
        path = self.ckpt_dir / name
        write_checkpoint(path, self.step, e.host(e.w), e.host(e.m), e.host(e.v))
        write_json_atomic(self.run_dir / "state.json", self._state(name))
        kept = sorted(self.ckpt_dir.glob("step_*.bin"))
        for old in kept[: -self.s["keep_checkpoints"]]:
            old.unlink()
        log.info("checkpoint %s (%s)", path, reason)
        return path

    @staticmethod
    def _copy_atomic(src: Path, dst: Path) -> None:
        with atomic_path(dst) as tmp:
            shutil.copyfile(src, tmp)

    def resume(self) -> bool:
        """Continue from state.json and its checkpoint, if the run directory has them."""
        state_path = self.run_dir / "state.json"
        if not state_path.exists():
            if list(self.ckpt_dir.glob("step_*.bin")):
                raise RuntimeError(f"{self.run_dir}: checkpoints but no state.json; cannot resume exactly (move the directory away to start over)")
            return False
        st = json.loads(state_path.read_text())
        if st["model"] != self.model_name or st["n_params"] != n_params(self.cfg):
            raise RuntimeError(
                f"{state_path}: a run of {st['model']} with {st['n_params']:,} parameters, but {self.model_name} "
                f"now has {n_params(self.cfg):,}; use another run directory to start over"
            )
        if st["tokenizer_hash"] != self.shards_meta["tokenizer_hash"]:
            raise RuntimeError(f"{state_path}: trained with another tokenizer; start a new run directory")
        ck = read_checkpoint(self.ckpt_dir / st["checkpoint"], expected_n_params=n_params(self.cfg))
        if ck.step != st["step"]:
            raise RuntimeError(f"{st['checkpoint']}: holds step {ck.step}, state.json says {st['step']}")
        self.engine.load_state(ck.weights, ck.m, ck.v, adam_t=st["adam_t"])
        if "loss_scale" in st:  # absent from state files written before fp16 existed
            self.engine.set_loss_scale(st["loss_scale"]["scale"])
            self.engine.scale_good_steps = st["loss_scale"]["good_steps"]
        self.step = st["step"]
        self.rng.bit_generator.state = st["rng"]
        self.bandit.load_state(st["bandit"])
        self.ema, self.smma = st["ema"], st["smma"]
        self.best = st["best"] if st["best"] is not None else math.inf
        nf = st["nonfinite"]
        self.nonfinite = NonFiniteCounter(nf["consecutive"], nf["total"], list(nf["steps"]))
        self.low_samples = st["low_samples"]
        self.tokens_seen = st["tokens_seen"]
        # lines written after that checkpoint belong to steps that will run again
        for name in ("loss.jsonl", "samples.jsonl"):
            self._truncate_jsonl(self.run_dir / name, self.step)
        log.info("resumed %s at step %d from %s", self.model_name, self.step, st["checkpoint"])
        return True

    @staticmethod
    def _truncate_jsonl(path: Path, step: int) -> None:
        if path.exists():  # a torn last line from a crash is dropped by read_jsonl
            lines = path.read_text(encoding="utf-8").splitlines()  # kept byte for byte
            keep = [line for line, r in zip(lines, read_jsonl(path)) if r["step"] < step]
            write_text_atomic(path, "".join(line + "\n" for line in keep))

    # ------------------------------------------------------------------ signals
    def _on_term(self, signum, frame):
        self._stop = True

    def _on_usr1(self, signum, frame):
        self._save_now = True

    # ------------------------------------------------------------------ data
    def _batch(self):
        """grad_accum micro-batches of (inputs, targets), and each row's (source, doc)."""
        rows = self.bandit.draw(self.B * self.s["grad_accum"], self.rng)
        x = np.stack([self.shards[src].window(doc, self.T)[0] for src, doc in rows]).astype(np.int64)
        micro = [(x[i : i + self.B, :-1], x[i : i + self.B, 1:]) for i in range(0, len(rows), self.B)]
        return micro, rows

    # ------------------------------------------------------------------ sampling
    def sample(self) -> dict:
        prompt = self.s["sample_prompt"]
        ids = [BOS, *self.tok.encode(prompt).tolist()]
        rng = np.random.default_rng([self.s["seed"], 0x5A3, self.step])  # never touches the training RNG
        model = InferenceModel(self.cfg, self.engine.host(self.engine.w))  # reads the weights, never writes them
        out = generate(model, ids, self.s["sample_tokens"], rng, self.s["sample_temperature"])
        text = self.tok.decode(out, errors="replace")
        score = coherence_score(text)
        rec = {"step": self.step, "prompt": prompt, "text": text, "coherence": round(score.score, 2), "parts": score.as_dict()}
        with open(self.run_dir / "samples.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        log.info("sample at step %d, coherence %.1f: %r", self.step, score.score, text[:120])
        if score.score < self.s["coherence_halt_below"]:
            self.low_samples += 1
        else:
            self.low_samples = 0
        return rec

    # ------------------------------------------------------------------ run
    def run(self, out_dir: str | Path | None = None) -> dict:
        s = self.s
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(exist_ok=True)
        plan = self.plan()  # may refuse before anything big is allocated
        self.engine = Engine(self.cfg, batch_size=self.B, seq_len=self.T, backend=s["backend"], seed=s["seed"],
                             precision=s["precision"])
        resumed = self.resume()
        mem = self.engine.memory_plan()
        # timed warm-up: forward+backward on one batch of zeros, gradients discarded; the
        # weights, optimizer and data stream are untouched, so it cannot change the trajectory
        zeros = np.zeros((self.B, self.T), dtype=np.int64)
        t0 = time.perf_counter()
        self.engine.forward(zeros, zeros)
        self.engine.backward()
        step_s = (time.perf_counter() - t0) * s["grad_accum"]
        self.engine.zero_grads()
        plan.update({
            "memory_plan_bytes": {"parameters": mem.parameters, "activations": mem.activations, "scratch": mem.scratch, "total": mem.total},
            "warmup_step_s": step_s,
            "estimated_remaining_s": step_s * plan["steps"]["remaining"],
            "resumed_from_step": self.step if resumed else None,
        })
        write_json_atomic(self.run_dir / "plan.json", plan)
        log.info(
            "plan: %s, %s parameters, backend %s/%s, %s tokens/step, steps %d→%d; %s; ~%.3f s/step → about %s to finish",
            self.model_name, f"{plan['n_params']:,}", s["backend"], s["precision"], f"{plan['batch']['tokens_per_step']:,}",
            self.step, s["max_steps"], mem.describe(), step_s, human_duration(plan["estimated_remaining_s"]),
        )
        # SIGTERM (a scheduler) and SIGINT (Ctrl-C on the terminal) stop cleanly at the end of
        # the current step with a checkpoint; SIGUSR1 checkpoints and carries on
        handlers = {signal.SIGTERM: self._on_term, signal.SIGINT: self._on_term, signal.SIGUSR1: self._on_usr1}
        previous = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
        try:
            result = self._loop()
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)
        if result["finished"] and out_dir is not None:
            self._export(Path(out_dir))
        return result

    def _loop(self) -> dict:
        s = self.s
        loss_log = open(self.run_dir / "loss.jsonl", "a", encoding="utf-8")
        t_start, steps_start = time.time(), self.step
        try:
            while self.step < s["max_steps"]:
                if self._stop:
                    self.save_checkpoint("SIGTERM/SIGINT")
                    log.info("stopped by a signal at step %d; run again to resume", self.step)
                    return {"finished": False, "step": self.step, "reason": "signal"}
                if self._save_now:
                    self._save_now = False
                    self.save_checkpoint("SIGUSR1")
                self.bandit.maybe_replan(self.step)
                t0 = time.perf_counter()
                micro, rows = self._batch()
                try:
                    res = train_step(self.engine, micro, self.step, self.oc, self.nonfinite)
                except NonFiniteHalt as e:
                    self.save_checkpoint("non-finite halt")
                    raise NonFiniteHalt(f"{e} Checkpoint: {self.ckpt_dir}") from None
                dt = time.perf_counter() - t0
                if not res.skipped:
                    for (src, doc), loss in zip(rows, res.row_losses.tolist()):
                        self.bandit.observe(src, doc, loss)
                    self.ema = res.loss if self.ema is None else (1 - EMA_ALPHA) * self.ema + EMA_ALPHA * res.loss
                    self.smma = res.loss if self.smma is None else ((SMMA_N - 1) * self.smma + res.loss) / SMMA_N
                n_tok = len(rows) * self.T
                self.tokens_seen += n_tok
                mix = {}
                for src, _ in rows:
                    mix[src] = mix.get(src, 0) + 1
                rec = {
                    "step": self.step, "loss": res.loss, "ema": self.ema, "smma": self.smma, "lr": res.lr,
                    "grad_norm": res.grad_norm, "clipped": res.clipped, "skipped": res.skipped,
                    "tokens_per_s": round(n_tok / dt, 1),
                    "mix": {k: v / len(rows) for k, v in sorted(mix.items())},
                    "weights": {k: round(v, 6) for k, v in self.bandit.weights.items()},
                    "focus": self.bandit.focus,
                }
                loss_log.write(json.dumps(rec) + "\n")
                loss_log.flush()
                self.step += 1
                done = self.step - steps_start
                if self.step % 10 == 0 or self.step == s["max_steps"]:
                    eta = (time.time() - t_start) / done * (s["max_steps"] - self.step)
                    log.info("step %d/%d loss %.4f (ema %.4f) lr %.2e norm %.3f %s tok/s ETA %s",
                             self.step, s["max_steps"], res.loss, self.ema or float("nan"), res.lr, res.grad_norm,
                             f"{n_tok / dt:,.0f}", human_duration(eta))
                if self.smma is not None and self.smma < self.best and self.step % s["checkpoint_every"] == 0:
                    self.best = self.smma
                    best_due = True
                else:
                    best_due = False
                if self.step % s["checkpoint_every"] == 0:
                    path = self.save_checkpoint()
                    if best_due:
                        self._copy_atomic(path, self.run_dir / "best.bin")
                if self.step % s["sample_every"] == 0:
                    self.sample()
                    if self.low_samples >= s["coherence_patience"]:
                        path = self.save_checkpoint("coherence halt")
                        raise CoherenceHalt(
                            f"coherence gate: {self.low_samples} consecutive samples scored below "
                            f"{s['coherence_halt_below']} (last at step {self.step}); the model is producing "
                            f"degenerate text. Stopped; checkpoint {path}. Read {self.run_dir / 'samples.jsonl'}."
                        )
        finally:
            loss_log.close()
        final = self.run_dir / "final.bin"
        e = self.engine
        write_checkpoint(final, self.step, e.host(e.w), e.host(e.m), e.host(e.v))
        if self.step % s["checkpoint_every"]:  # else the periodic checkpoint of this step is already there
            self.save_checkpoint("end of run")
        if not (self.run_dir / "best.bin").exists():
            self._copy_atomic(final, self.run_dir / "best.bin")
        return {"finished": True, "step": self.step, "ema": self.ema, "smma": self.smma}

    def _export(self, out: Path) -> None:
        """The workflow's output: final and best weights plus what they are, in one directory."""
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copyfile(self.run_dir / "final.bin", tmp / "final.bin")
        shutil.copyfile(self.run_dir / "best.bin", tmp / "best.bin")
        meta = {
            "model": self.model_name,
            "model_config": self.cfg.__dict__,
            "train": copy.deepcopy(self.s),
            "step": self.step,
            "smma": self.smma,
            "ema": self.ema,
            "segments": self.shards_meta["segments"],
            "tokenizer_hash": self.shards_meta["tokenizer_hash"],
            "run_dir": str(self.run_dir),
        }
        (tmp / "run.json").write_text(json.dumps(meta, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
