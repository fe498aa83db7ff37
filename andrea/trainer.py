"""The trainer ("proxy", design §6): turns the engine into a run a person can start, watch, stop,
resume and trust.

Run directory (results/<model>/runs/<key>/; the key hashes everything the weights depend on except
max_steps and the bandit's floors and caps: andrea/versions.py train_run_key):
    checkpoints/step_NNNNNN.bin   every `checkpoint_every` steps; the last `keep_checkpoints` kept
    checkpoints/step_NNNNNN.json  the run state belonging to that checkpoint (and its SHA-256)
    state.json                    a copy of the newest checkpoint's state
    best.bin                      the weights of the best validation loss (m and v zero: for
                                  inference and the audit; resuming uses the step checkpoints)
    final.bin                     the end of the run
    loss.jsonl                    one line per step (with its wall time, `step_s`), one `"kind":
                                  "eval"` line per validation and one `"kind": "periodic"` line
                                  timing the work between two steps (validation, samples,
                                  checkpoints, re-plans); continuous across resumes; the bandit's
                                  weights and focus only where they change, the mix as row counts
                                  (andrea/runlog.py)
    samples.jsonl                 every coherence sample with its score
    plan.json                     what the run is: model, memory plan, backend, tokens/step, ETA
    train.log                     the trainer's log, every attempt appended
    parity/                       with `record_batches: N`: the initial weights and the first N
                                  batches, for bench/loss_parity.py

The step loop keeps the device busy: the next batch is drawn, cut from the shards and prepared for
the engine in a background thread while the current step runs (andrea/batches.py); a step's
results (loss, norm, row losses for the bandit) are read after the next step has been launched
(optim.launch_step: the update's decisions are taken on the device), except where something reads
the state the steps leave (a sample, validation, a checkpoint, the bandit's re-plan, the end) and in
fp16; loss records and checkpoints are written by background threads too (a checkpoint's host copy
is taken at its step, so what is written is exactly that step).

Checkpoints are written and found again by andrea/checkpoint.py (RunCheckpoints), loss.jsonl by
andrea/runlog.py (RunLogWriter); andrea/launch.py starts a run (here or as ranks) and gives its
exit status.

Signals: SIGTERM (and SIGINT, Ctrl-C) finishes the current step, writes a checkpoint and stops
(exit status 5: andrea.launch.Exit); SIGUSR1 writes a checkpoint and carries on. A run started
again resumes from the newest intact checkpoint and its state (a damaged newest one is reported
and skipped) and follows the same trajectory bit for bit (same backend and precision; fp8's
delayed scales and cast counts travel in the state file too).
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import gc
import json
import logging
import math
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from andrea.batches import BatchStream
from andrea.checkpoint import RunCheckpoints, newest_state, write_checkpoint
from andrea.coherence import coherence_score
from andrea.comm import from_environment, launch_info
from andrea.config import (
    train_settings,  # noqa: F401  (re-exported: callers import it from here)
)
from andrea.curriculum import VALIDATION_MODES, make_curriculum
from andrea.engine import Engine, load_backend, materialise, resolve_backend
from andrea.engine.fp8_records import TrainShape
from andrea.evaluation import build_eval_set, evaluate, prepare_batches
from andrea.io import atomic_dir, check_replaceable, link_or_copy, write_json_atomic
from andrea.model import ModelConfig, flops_per_token, n_params
from andrea.optim import NonFiniteCounter, NonFiniteHalt, OptimConfig, launch_step, reads_ahead
from andrea.runlog import RunLogWriter, cut_run_records
from andrea.sampling import InferenceModel, generate
from andrea.settings import TrainSettings
from andrea.shards import Shard
from andrea.tokenizer import BOS, HarrisTokenizer
from andrea.versions import train_run_key, train_version

log = logging.getLogger("andrea.trainer")

SMMA_N = 100  # the original's smoothed moving average, s_t = ((n−1)·s_{t−1} + x_t)/n
EMA_ALPHA = 0.1
PRECISIONS = ("fp32", "bf16", "fp16", "fp8")  # the config schema's precisions (less auto), for ranks to compare
WARMUP_PASSES = 5  # timed forward+backward passes before the plan; the first compiles and captures


class TrainingRefused(RuntimeError):
    """A run that should not start (e.g. months of CPU time); the message says what to do."""


class CoherenceHalt(RuntimeError):
    """The coherence gate stopped the run: samples have collapsed."""


def run_key(config: dict, model: str) -> str:
    """The model's run directory name for this config (andrea.versions.train_run_key)."""
    return train_run_key(config, model)


def cpu_flops() -> float:
    """Sustained float32 matrix-multiply rate of this machine through NumPy (FLOP/s)."""
    a = np.ones((512, 512), dtype=np.float32)
    a @ a
    t0 = time.perf_counter()
    for _ in range(4):
        a @ a
    return 4 * 2 * 512**3 / max(1e-9, time.perf_counter() - t0)


def human_duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


class Trainer:
    """One model's training run. With several ranks (data parallelism: andrea/comm.py) every rank
    runs a Trainer over the same run directory: each trains on its share of the global batch, and
    rank 0 alone writes (checkpoints, loss.jsonl, samples, plan, best and final weights); every
    decision that stops or saves is taken by all ranks together."""

    def __init__(self, config: dict, model: str, shards_json: str | Path, run_dir: str | Path, force: bool = False,
                 comm=None):
        if model not in config["models"]:
            raise ValueError(f"unknown model {model!r}; models in the config: {', '.join(config['models'])}")
        self.config, self.model_name, self.force = config, model, force
        self.s = TrainSettings.from_config(config, model)
        self.cfg = ModelConfig.from_config(config["models"][model])
        self.T = self.s.seq_len or self.cfg.context
        self.B = self.s.batch_size
        self.run_dir = Path(run_dir)
        # precision auto: fp8 where the fp8 record says it pays for this GPU, model and batch; a run
        # resumed keeps the precision its checkpoints were trained in (andrea/engine/fp8_records.py)
        trained = newest_state(self.run_dir)
        self.backend, self.precision, self.backend_reason = resolve_backend(
            self.s.backend, self.s.precision, shape=TrainShape(model, asdict(self.cfg), self.B, self.T),
            trained=(trained.get("backend"), trained["precision"]) if trained and "precision" in trained else None)
        if self.s.reduce_dtype not in load_backend(self.backend).reduce_dtypes:
            raise ValueError(f"train.{model}.reduce_dtype: {self.s.reduce_dtype} needs the CuPy GPU backend (NCCL), but this "
                             f"run uses {self.backend} ({self.backend_reason}); set reduce_dtype: float32")
        self.oc = OptimConfig.of(self.s)
        self.ckpt_dir = self.run_dir / "checkpoints"
        if comm is None and launch_info()["size"] > 1:  # one of several ranks
            self.run_dir.mkdir(parents=True, exist_ok=True)  # NCCL's id may pass through a file there
        # before anything is allocated on a GPU: NCCL picks this rank's GPU
        self.comm = comm if comm is not None else from_environment(self.backend, rendezvous_dir=self.run_dir)
        self.root = self.comm.is_root
        self._check_ranks_agree_on_precision()
        # rank 0 alone writes checkpoints and loss.jsonl (the others' calls do nothing)
        self.checkpoints = RunCheckpoints(self.run_dir, n_params(self.cfg), self.s.keep_checkpoints, writer=self.root,
                                          materialise=materialise)
        self.runlog = RunLogWriter(self.run_dir / "loss.jsonl", enabled=self.root)
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
            src: {"n_docs": sh.n_docs, "n_tokens": sh.n_tokens,
                  "floor": config["sources"].get(src, {}).get("floor", 0.0),
                  "cap": config["sources"].get(src, {}).get("cap", 1.0),
                  "weight": config["sources"].get(src, {}).get("weight", 1.0)}
            for src, sh in self.shards.items()
        }
        # the curriculum of curriculum.mode (design §5): proportional (by tokens) unless another mode
        # is asked for; `bandit`, after the data bandit, is its name throughout the trainer
        self.bandit = make_curriculum(arms, self.s.curriculum, seed=self.s.seed, eval_every=self.s.eval_every)
        self.rng = np.random.default_rng([self.s.seed, 0xDA7A])
        self.step = 0
        self.ema = None
        self.smma = None
        self.best = math.inf  # best validation loss (or smoothed training loss while there is none)
        self.last_eval = None
        self.nonfinite = NonFiniteCounter()
        self.low_samples = 0
        self.gate_armed = self.s.coherence_arm_score <= 0
        self.tokens_seen = 0
        self._stop = False
        self._save_now = False
        self.engine = None
        self.batches: BatchStream | None = None
        self.eval_set = None
        self.eval_batches: list = []
        self._resumed = False
        self.timing: dict = {}
        # a step's wall time: from when the step before was seen done to when this one is, less
        # the work between steps (validation, samples, checkpoints, re-plans), which is timed and
        # written on records of its own ("kind": "periodic"); see _finish_step
        self._clock = 0.0
        self._between_s = 0.0  # work between steps since the last step was seen done
        self._between: dict[str, float] = {}  # that work by kind, for the next "periodic" record
        self._speed = {"steps": 0, "tokens": 0, "step_s": 0.0, "periodic_s": 0.0}  # this attempt's totals
        self._recent = [0, 0.0]  # tokens and step seconds since the last progress line
        self._kinds: dict[str, list] = {}  # work between steps by kind: [seconds, times], for the ETA
        self.plan_doc: dict | None = None  # what plan.json holds (the actual time is added at the end)

    # ------------------------------------------------------------------ plan
    def _check_ranks_agree_on_precision(self) -> None:
        """Each rank resolved `precision: auto` on its own (its GPU, its fp8 record, its view of the run
        directory): ranks training one model in different precisions would average unlike gradients, so
        they must agree, or every rank stops with the same error."""
        if self.comm.size == 1:
            return
        mine = PRECISIONS.index(self.precision)
        seen = self.comm.allreduce_host(np.array([mine, -mine], np.int32), op="max")  # the highest and the lowest
        if seen[0] != -seen[1]:
            raise RuntimeError(f"train.{self.model_name}: the {self.comm.size} ranks resolved precision "
                               f"{self.s.precision!r} differently ({PRECISIONS[-seen[1]]} to {PRECISIONS[seen[0]]}; "
                               f"rank {self.comm.rank}: {self.precision}, {self.backend_reason}); set the precision in "
                               "the config, or give every rank the same GPU kind, fp8 record and run directory")

    def plan(self) -> dict:
        s = self.s
        tokens_per_step = self.B * self.T * s.grad_accum * self.comm.size
        remaining = max(0, s.max_steps - self.step)
        flops_step = flops_per_token(self.cfg) * tokens_per_step
        plan = {
            "model": self.model_name,
            "n_params": n_params(self.cfg),
            "backend": self.backend,
            "precision": self.precision,
            "backend_reason": self.backend_reason,
            "batch": {"batch_size": self.B, "seq_len": self.T, "grad_accum": s.grad_accum, "ranks": self.comm.size,
                      "tokens_per_step": tokens_per_step},
            "steps": {"max_steps": s.max_steps, "start": self.step, "remaining": remaining},
            "sources": {k: v.n_docs for k, v in self.shards.items()},
            # the curriculum's mode and warm-up, which the dashboard names and marks on the walk on the simplex
            "curriculum": {"mode": s.curriculum.mode, "warmup_steps": s.curriculum.warmup_steps,
                           "warmup_sources": list(s.curriculum.warmup_sources)},
        }
        if self.backend == "numpy":
            # before allocating anything: a model this size may not even fit, let alone finish
            # (each rank computes its share of the step at the same time: its rows' flops)
            est = flops_step / self.comm.size / (0.5 * cpu_flops()) * remaining
            plan["estimate_before_warmup_s"] = est
            too_long = est > s.max_cpu_hours * 3600 and not self.force
            if self.comm.any(too_long):  # every rank refuses, or none
                raise TrainingRefused(
                    f"{self.model_name} ({n_params(self.cfg):,} parameters, {tokens_per_step:,} tokens per step, "
                    f"{remaining:,} steps) on the NumPy CPU backend ({self.backend_reason}) would take about "
                    f"{human_duration(est)} (limit train.max_cpu_hours = {s.max_cpu_hours}). Train ANDREA-tiny instead "
                    f"(snakemake --cores 2 results/ANDREA-tiny/ckpt), train on a machine with an NVIDIA GPU and "
                    f"`pip install -c constraints.txt -e '.[gpu]'` (backend: auto picks it), "
                    f"or start anyway with `andrea train --force` (Snakemake: --config force_train=true)."
                )
        return plan

    def _warmup(self) -> dict:
        """Time what a step costs once compilation and graph capture are done: WARMUP_PASSES
        forward+backward passes on a batch of zeros (the first compiles and captures and is not
        counted), an AdamW update of copies of the weights and Adam state, a forward pass
        (validation's unit) and the snapshot a checkpoint takes. Gradients are discarded; weights,
        optimizer, data and random streams are untouched, so the warm-up cannot change the
        trajectory. (In fp8 its casts are the first of the scales' histories, as in every run from
        step 0; a resumed run gets its checkpoint's histories back after the warm-up.)"""
        e = self.engine
        zeros = e.prepare(np.zeros((self.B, self.T), dtype=np.int64), np.zeros((self.B, self.T), dtype=np.int64))
        passes = []
        for _ in range(WARMUP_PASSES):
            # the passes launch_step makes (the same captured graphs): the first clears the gradients,
            # the last (with several ranks) averages them over the ranks
            t0 = time.perf_counter()
            e.forward_backward(zeros, reduce=self.s.grad_accum == 1, zero_grads=True)
            e.grad_norm()  # waits for the device
            passes.append(time.perf_counter() - t0)
            if self.s.grad_accum > 1:
                e.forward_backward(zeros, reduce=True)  # the last micro-batch's pass: captured now too
        xp = e.xp
        w, m, v = (xp.array(a, copy=True) for a in (e.w, e.m, e.v))
        opt = []
        for _ in range(2):  # the first compiles the kernel
            t0 = time.perf_counter()
            e.be.adamw(w, e.g, m, v, e.decay, 1e-9, self.oc.beta1, self.oc.beta2, self.oc.eps, 0.0, 1, 1.0)
            float(w[0])  # waits for the device
            opt.append(time.perf_counter() - t0)
        del w, m, v
        e.zero_grads()
        t0 = time.perf_counter()
        e.forward(zeros)
        e.row_losses()
        t_forward = time.perf_counter() - t0
        t0 = time.perf_counter()
        snap = e.snapshot(e.w)  # what the step loop waits for at a checkpoint, per buffer
        float(e.w[0])  # (on the GPU: until the device-side copy is done)
        t_host = time.perf_counter() - t0
        del snap
        return {"first_pass_s": passes[0], "step_s": float(np.median(passes[1:])) * self.s.grad_accum + opt[-1],
                "optimizer_s": opt[-1],
                "forward_s": t_forward, "checkpoint_copy_s": 3 * t_host}

    def _sample_cost(self) -> float:
        """Seconds one coherence sample takes: the fixed part (the prompt's prefill, one token)
        plus sample_tokens times the cost of one more token (from 17 tokens against 1). Scaling
        the whole of a short generation counted the fixed part many times: an ANDREA-120M
        estimate was 7x the real sample. A first generation of two tokens warms up (kernels
        compiled, the one-token step captured: once per run, not per sample) and is not counted."""
        ids = [BOS, *self.tok.encode(self.s.sample_prompt).tolist()]
        rng = np.random.default_rng(0)
        model = self._sampler()
        generate(model, ids, 2, rng, self.s.sample_temperature, stop_at_bos=False)
        times = []
        for n in (1, 17):
            t0 = time.perf_counter()
            generate(model, ids, n, rng, self.s.sample_temperature, stop_at_bos=False)
            times.append(time.perf_counter() - t0)
        per_token = max(0.0, times[1] - times[0]) / 16
        return times[0] + per_token * self.s.sample_tokens

    def _estimate(self, warm: dict) -> dict:
        """Seconds to finish: steps at the warmed-up rate plus the periodic work still to come."""
        s, start, end = self.s, self.step, self.s.max_steps

        def due(every: int, include_start: bool = False) -> int:
            if every <= 0:
                return 0
            return end // every - start // every + (1 if include_start and start % every == 0 else 0)

        n_eval = due(s.eval_every, include_start=start == 0) if self.eval_set is not None else 0
        # forward passes, plus the weights' host copy for best.bin (while validation improves)
        eval_s = warm["forward_s"] * -(-len(self.eval_set) // self.B) + warm["checkpoint_copy_s"] / 3 if self.eval_set is not None else 0.0
        n_sample = due(s.sample_every)
        sample_s = self._sample_cost() if n_sample else 0.0
        n_ckpt = due(s.checkpoint_every)
        total = (end - start) * warm["step_s"] + n_eval * eval_s + n_sample * sample_s + n_ckpt * warm["checkpoint_copy_s"]
        return {**warm, "eval_s": eval_s, "evals": n_eval, "sample_s": sample_s, "samples": n_sample,
                "checkpoints": n_ckpt, "estimated_remaining_s": total}

    # ------------------------------------------------------------------ state
    def _state(self, ckpt_name: str) -> dict:
        bandit = self.bandit.state()
        # the draw state from before this step's batch was drawn (it may be drawn already)
        draw = self.batches.state_for(self.step) if self.batches is not None else {"rng": self.rng.bit_generator.state,
                                                                                    "cursors": self.bandit.cursors()}
        for name, (cursor, epoch) in draw["cursors"].items():
            bandit["arms"][name]["cursor"], bandit["arms"][name]["epoch"] = cursor, epoch
        return {
            "step": self.step,
            "checkpoint": ckpt_name,
            "model": self.model_name,
            "n_params": n_params(self.cfg),
            "run_key": run_key(self.config, self.model_name),
            "backend": self.backend,
            "precision": self.precision,
            "adam_t": self.engine.adam_t,
            "loss_scale": {"scale": self.engine.loss_scale, "good_steps": self.engine.scale_good_steps},
            "precision_state": self.engine.be.precision_state(),  # fp8: the delayed scales (a host sync)
            "rng": copy.deepcopy(draw["rng"]),
            "bandit": bandit,
            "ema": self.ema,
            "smma": self.smma,
            "best": self.best if math.isfinite(self.best) else None,
            "last_eval": self.last_eval,
            "nonfinite": {"consecutive": self.nonfinite.consecutive, "total": self.nonfinite.total, "steps": list(self.nonfinite.steps)},
            "low_samples": self.low_samples,
            "gate_armed": self.gate_armed,
            "tokens_seen": self.tokens_seen,
            "tokenizer_hash": self.shards_meta["tokenizer_hash"],
            "schedule": {"lr": self.oc.lr, "warmup_steps": self.oc.warmup_steps, "max_steps": self.oc.max_steps},
        }

    def _host_copy(self) -> tuple:
        """The weights and Adam state as of this step, for the writer thread (Engine.snapshot: on
        the GPU a device-side copy, brought to the host by the writer; training goes on)."""
        return tuple(self.engine.snapshot(a) for a in (self.engine.w, self.engine.m, self.engine.v))

    def save_checkpoint(self, reason: str = "periodic", wait: bool = False) -> Path:
        """This step's checkpoint with its state (RunCheckpoints.save: the host copy is taken now,
        the files are written in the background). Rank 0 writes it: every rank holds the same
        weights, Adam state, draw state and bandit."""
        path = self.checkpoints.path(self.step)
        if self.root:
            self.runlog.flush()  # loss.jsonl holds every step before this one when the state names it
            self.checkpoints.save(self.step, self._state(path.name), self._host_copy, reason, wait=wait)
        return path

    def _write_best_now(self) -> None:
        """best.bin: the weights as of now (rank 0; the copy is taken now, written in the background)."""
        if self.root:
            self.checkpoints.save_best(self.step, self.engine.snapshot(self.engine.w))

    def resume(self) -> bool:
        """Continue from the newest intact checkpoint and its state, if the run directory has one
        (RunCheckpoints.to_resume: damaged newer ones are reported and skipped)."""
        st, ck = self.checkpoints.to_resume(self.model_name, self.shards_meta["tokenizer_hash"])
        if st is None:
            return False
        if st.get("precision", self.precision) != self.precision or st.get("backend", self.backend) != self.backend:
            log.warning("%s was trained on %s/%s up to step %d and goes on on %s/%s (%s): its trajectory changes",
                        self.model_name, st.get("backend"), st.get("precision"), st["step"], self.backend, self.precision,
                        self.backend_reason)
        self.engine.load_state(ck.weights, ck.m, ck.v, adam_t=st["adam_t"])
        if "loss_scale" in st:  # absent from state files written before fp16 existed
            self.engine.set_loss_scale(st["loss_scale"]["scale"])
            self.engine.scale_good_steps = st["loss_scale"]["good_steps"]
        # fp8's delayed scales: restored after the warm-up passes (run()), whose casts would move them on
        self._precision_state = st.get("precision_state")  # absent before fp8 existed
        self.step = st["step"]
        self.rng.bit_generator.state = st["rng"]
        self.bandit.load_state(st["bandit"])
        self.ema, self.smma = st["ema"], st["smma"]
        self.best = st["best"] if st["best"] is not None else math.inf
        self.last_eval = st.get("last_eval")
        nf = st["nonfinite"]
        self.nonfinite = NonFiniteCounter(nf["consecutive"], nf["total"], list(nf["steps"]))
        self.low_samples = st["low_samples"]
        self.gate_armed = st.get("gate_armed", True) or self.gate_armed  # older states: the gate was always on
        self.tokens_seen = st["tokens_seen"]
        if self.root:  # records written after that checkpoint belong to steps that will run again
            s = self.s
            parity = min(self.step, s.record_batches) * self.B * s.grad_accum * (self.T + 1) * 2 if s.record_batches else None
            cut_run_records(self.run_dir, self.step, parity)
        log.info("resumed %s at step %d from %s", self.model_name, self.step, st["checkpoint"])
        return True

    # ------------------------------------------------------------------ signals
    def _on_term(self, signum, frame):
        self._stop = True

    def _on_usr1(self, signum, frame):
        self._save_now = True

    # ------------------------------------------------------------------ records
    def _record_batch(self, tokens: np.ndarray) -> None:
        """With record_batches: this step's token rows, appended to parity/batches.bin."""
        self.runlog.append_bytes(self.run_dir / "parity" / "batches.bin", tokens.astype("<u2").tobytes())

    def _start_recording(self) -> None:
        d = self.run_dir / "parity"
        d.mkdir(exist_ok=True)
        w = self.engine.host(self.engine.w)
        write_checkpoint(d / "init.bin", 0, w, np.zeros_like(w), np.zeros_like(w))
        (d / "batches.bin").unlink(missing_ok=True)
        meta = {"model": self.model_name, "model_config": self.cfg.__dict__, "batch_size": self.B, "grad_accum": self.s.grad_accum,
                "seq_len": self.T, "steps": min(self.s.record_batches, self.s.max_steps), "backend": self.backend,
                "precision": self.precision, "optim": self.oc.__dict__}
        write_json_atomic(d / "meta.json", meta)

    # ------------------------------------------------------------------ sampling and validation
    def _sampler(self) -> InferenceModel:
        """The generation model over the engine's own weights, on its device and in its precision
        (read in place, never written: samples see every update; the coherence gate judges text
        made in the precision the run trains in)."""
        if self._inference is None:
            self._inference = InferenceModel(self.cfg, self.engine.w, backend=self.engine.backend,
                                             precision=self.engine.precision)
        return self._inference

    def sample(self) -> dict:
        prompt = self.s.sample_prompt
        ids = [BOS, *self.tok.encode(prompt).tolist()]
        rng = np.random.default_rng([self.s.seed, 0x5A3, self.step])  # never touches the training RNG
        out = generate(self._sampler(), ids, self.s.sample_tokens, rng, self.s.sample_temperature)
        text = self.tok.decode(out, errors="replace")
        score = coherence_score(text)
        rec = {"step": self.step, "prompt": prompt, "text": text, "coherence": round(score.score, 2), "parts": score.as_dict()}
        with open(self.run_dir / "samples.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        log.info("sample at step %d, coherence %.1f: %r", self.step, score.score, text[:120])
        # The gate watches for collapse: it is armed by the first sample that reads as language
        # (coherence_arm_score), so a young model's gibberish does not stop the run it is learning in.
        if not self.gate_armed and score.score >= self.s.coherence_arm_score:
            self.gate_armed = True
            log.info("coherence gate armed at step %d (a sample scored %.1f >= %s)", self.step, score.score,
                     self.s.coherence_arm_score)
        if self.gate_armed and score.score < self.s.coherence_halt_below:
            self.low_samples += 1
        else:
            self.low_samples = 0
        return rec

    def validate(self) -> dict:
        """Loss on the fixed held-out set, recorded; best.bin follows the best validation loss."""
        r = evaluate(self.engine, self.eval_set, self.eval_batches)
        self.bandit.observe_validation(self.step, r["sources"])  # heldout_progress's reward (every rank alike)
        rec = {"kind": "eval", "step": self.step, **r}
        if self.precision == "fp8":  # what this rank's fp8 casts lost so far
            c = self.engine.be.fp8_counts()
            rec["fp8"] = {k: c[k] for k in ("values", "overflow", "underflow")}
            log.info("fp8 casts by step %d: %d values, %d overflowed (%.2e), %d underflowed (%.2e)", self.step, c["values"],
                     c["overflow"], c["overflow"] / max(c["values"], 1), c["underflow"], c["underflow"] / max(c["values"], 1))
        self.runlog.record(rec)
        self.last_eval = rec
        per = ", ".join(f"{k} {v['bpb']:.3f}" for k, v in r["sources"].items() if v["bpb"] is not None)
        log.info("validation at step %d: %.4f nats/token, %.4f bits/byte (%s) [%.2f s]", self.step, r["loss"],
                 r["bpb"] or float("nan"), per, r["seconds"])
        if r["loss"] is not None and math.isfinite(r["loss"]) and r["loss"] < self.best:
            self.best = r["loss"]
            self._write_best_now()
        return rec

    # ------------------------------------------------------------------ run
    def run(self, out_dir: str | Path | None = None) -> dict:
        if not self.root:
            return self._run_rank(out_dir)
        if out_dir is not None:  # before the run: a wrong --out is refused, not deleted by the export at its end
            check_replaceable(out_dir, "run.json")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.ckpt_dir.mkdir(exist_ok=True)
        lock = open(self.run_dir / ".lock", "w")
        try:  # one trainer per run directory: a second would interleave its records and checkpoints
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise RuntimeError(f"{self.run_dir}: another trainer is running in this run directory") from None
        for stale in [*self.run_dir.glob(".*.tmp"), *self.ckpt_dir.glob(".*.tmp")]:
            stale.unlink()  # a write cut short by a crash (kill -9, power): never under a real name
        handler = logging.FileHandler(self.run_dir / "train.log", mode="a", encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger("andrea").addHandler(handler)
        try:
            return self._run_rank(out_dir)
        finally:
            logging.getLogger("andrea").removeHandler(handler)
            handler.close()
            lock.close()

    def _run_rank(self, out_dir) -> dict:
        """This rank's run, with the signal handlers installed from the start (a stop asked for
        while it starts takes effect at its first step). With several ranks none returns (or
        raises a halt, which every rank raises at the same step) before all are done: a rank's
        exit must not end the job while rank 0 still writes."""
        # SIGTERM (a scheduler) and SIGINT (Ctrl-C on the terminal) stop cleanly at the end of the
        # current step with a checkpoint; SIGUSR1 checkpoints and carries on; SIGUSR2 stops like
        # SIGTERM (what the rank launcher sends through mpirun, which kills ranks on SIGTERM)
        handlers = {signal.SIGTERM: self._on_term, signal.SIGINT: self._on_term, signal.SIGUSR1: self._on_usr1,
                    signal.SIGUSR2: self._on_term}
        previous = {sig: signal.signal(sig, h) for sig, h in handlers.items()}
        try:
            if self.comm.size == 1:
                return self._run(out_dir)
            if not self.root:  # its records would repeat rank 0's: warnings and errors only
                logging.getLogger("andrea").setLevel(logging.WARNING)
            try:
                result = self._run(out_dir)
            except (CoherenceHalt, NonFiniteHalt):
                self.comm.barrier()
                self._close_comm()
                raise
            self.comm.barrier()
            self._close_comm()
            return result
        finally:
            for sig, h in previous.items():
                signal.signal(sig, h)

    def _close_comm(self) -> None:
        """The communicator closed after the CUDA graphs whose NCCL operations it serves
        (Engine.release_graphs); left to the interpreter's exit, the order is chance and the
        process can hang. Not after a crash: the launcher aborts the job then."""
        if self.engine is not None:
            self.engine.release_graphs()
        self._inference = None
        gc.collect()  # the graphs' last references (reference cycles through bound methods)
        self.comm.close()

    def _run(self, out_dir) -> dict:
        s = self.s
        plan = self.plan()  # may refuse before anything big is allocated
        self.engine = Engine(self.cfg, batch_size=self.B, seq_len=self.T, backend=self.backend, seed=s.seed,
                             precision=self.precision, comm=self.comm, reduce_bucket_mb=s.reduce_bucket_mb,
                             reduce_dtype=s.reduce_dtype)
        self._inference = None  # the sampler over the engine's weights (made on first use)
        self.checkpoints.open()
        try:
            resumed = self._resumed = self.resume()
            if s.eval_every > 0:
                self.eval_set = build_eval_set(self.shards, s.curriculum.heldout_every, self.T, s.eval_tokens, self.tok.token_bytes)
                for src, why in self.eval_set.skipped.items():
                    log.info("validation: %s not scored during training: %s", src, why)  # the reason says what the audit does
                if not len(self.eval_set):
                    log.warning("validation: no source has held-out text for a window; no validation loss (best.bin by smoothed loss)")
                    self.eval_set = None
                else:
                    self.eval_batches = prepare_batches(self.engine, self.eval_set)  # once: the windows are fixed
            if self.eval_set is None and s.curriculum.mode in VALIDATION_MODES:
                raise ValueError(f"curriculum.mode {s.curriculum.mode} re-weights the sources from the validation, but this run "
                                 f"has none (train.eval_every {s.eval_every}, or no source with a held-out window)")
            mem = self.engine.memory_plan()
            warm = self._warmup()
            if resumed:
                self.engine.be.load_precision_state(self._precision_state)
            est = self._estimate(warm)
            self.timing = {"estimate": est}
            plan.update({
                "memory_plan_bytes": {"parameters": mem.parameters, "activations": mem.activations, "scratch": mem.scratch, "total": mem.total},
                "warmup_step_s": warm["step_s"],
                "estimate": est,
                "estimated_remaining_s": est["estimated_remaining_s"],
                "eval": {"windows": len(self.eval_set), "tokens": self.eval_set.tokens, "sources": self.eval_set.sources}
                if self.eval_set is not None else None,
                "resumed_from_step": self.step if resumed else None,
                "run_key": run_key(self.config, self.model_name),
                "train_version": train_version(self.config, self.model_name),
            })
            if self.root:
                write_json_atomic(self.run_dir / "plan.json", plan)
            self.plan_doc = plan
            periodic = []
            if self.eval_set is not None:
                periodic.append(f"validation {est['eval_s']:.2f} s every {s.eval_every} steps")
            if est["samples"]:
                periodic.append(f"a sample {est['sample_s']:.2f} s every {s.sample_every} steps")
            ranks = (f"{self.comm.size} ranks × {self.B} rows × {s.grad_accum} micro-batches "
                     f"(gradients averaged in {s.reduce_dtype}) = " if self.comm.size > 1 else "")
            log.info(
                "plan: %s, %s parameters, backend %s/%s (%s%s), %s%s tokens/step, steps %d→%d; %s; %.4f s/step after "
                "warm-up (first pass with compilation/capture %.2f s)%s → about %s to finish",
                self.model_name, f"{plan['n_params']:,}", self.backend, self.precision, self.backend_reason,
                "".join(f"; {i}" for i in [self.engine.be.implementation()] if i), ranks,
                f"{plan['batch']['tokens_per_step']:,}", self.step, s.max_steps, mem.describe(), warm["step_s"],
                warm["first_pass_s"], "".join(f", {p}" for p in periodic), human_duration(est["estimated_remaining_s"]),
            )
            self.batches = BatchStream(self.bandit, self.shards, self.rng, self.B, s.grad_accum, self.T,
                                       prepare=self.engine.prepare, prefetch=s.prefetch, rank=self.comm.rank,
                                       ranks=self.comm.size)
            self.recording = bool(s.record_batches) and self.comm.size == 1
            if s.record_batches and self.comm.size > 1:
                log.warning("record_batches: not with %d ranks (the replay is one process's trajectory); "
                            "nothing recorded", self.comm.size)
            if self.recording and not resumed and self.root:
                self._start_recording()
            self.runlog.open()
            try:
                result = self._loop()
            finally:
                try:
                    self.batches.close()
                finally:
                    try:
                        self.runlog.close()
                    finally:
                        self.checkpoints.wait()
        finally:
            self.checkpoints.close()
        if result["finished"] and out_dir is not None and self.root:
            self._export(Path(out_dir))
        return result

    def _loop(self) -> dict:
        s = self.s
        self._t_start = self._clock = time.perf_counter()
        self._steps_start = self.step
        # on the host backend a step is computed inside launch_step: it is done when that returns;
        # on the GPU launch_step only queues it, and it is known done when its results are read
        self._launch_computes = self.engine.xp is np
        if self.eval_set is not None and not self._resumed:
            with self._between_steps("eval_s"):
                self.validate()  # the curve starts at the initial weights
        # a step is launched before the previous one's results are read (optim.launch_step), so the
        # device never waits on the host's bookkeeping; not in fp16, whose loss scale the host sets
        # from each step's result before the next, nor with several ranks, where reading a step
        # gathers the row losses through a collective that waits for the device (NCCL's host
        # all-reduce): there the next batch is drawn and prepared while the step runs, as before
        self._defer = reads_ahead(self.engine)
        self._inflight = None  # (PendingStep, Batch): launched, its results not yet read
        while self.step < s.max_steps:
            stop, save_now = self._stop, self._save_now
            if self.comm.size > 1:  # a signal seen by any rank stops (or saves) all of them, at the same step
                sent = np.array([stop, save_now], dtype=np.int32)
                # decided on the reduced copy: a signal that lands during the collective stays set
                # on this rank and is sent at the next step
                stop, save_now = (bool(x) for x in self.comm.allreduce_host(sent.copy(), "max"))
            if stop or save_now:
                self._settle()
            if stop:
                with self._between_steps("ckpt_s"):
                    self.save_checkpoint("SIGTERM/SIGINT", wait=True)
                self._record_between()
                log.info("stopped by a signal at step %d; run again to resume", self.step)
                return {"finished": False, "step": self.step, "reason": "signal"}
            if save_now:
                self._save_now = False
                with self._between_steps("ckpt_s"):
                    self.save_checkpoint("SIGUSR1")
            if self.bandit.replans_at(self.step):  # the steps before were settled (_must_settle)
                with self._between_steps("replan_s"):
                    self.bandit.maybe_replan(self.step)
            self._record_between()  # what ran since the step before, on a record of its own
            batch = self.batches.get(self.step)
            nxt = self.step + 1
            prefetch = nxt < s.max_steps and not self.bandit.replans_at(nxt)
            try:
                if prefetch and not self._defer:
                    self.batches.prefetch(nxt)  # drawn and prepared while this step runs
                pending = launch_step(self.engine, batch.micro, self.step, self.oc, self.nonfinite)
                launched = (pending, batch, time.perf_counter() if self._launch_computes else None)
                self.step += 1
                previous, self._inflight = self._inflight, launched
                if previous is not None:
                    self._finish_step(*previous)  # the step before: its copies are in by now
                if prefetch and self._defer:
                    self.batches.prefetch(nxt)  # after the step before was observed, as without launching ahead
                if not self._defer or self._must_settle(self.step):
                    self._settle()
            except NonFiniteHalt as e:
                try:  # the step still in flight: its result is read (a halt of its own changes nothing)
                    self._settle()
                except NonFiniteHalt:
                    pass
                # the checkpoint holds every step launched (the failing ones skipped, on record); a
                # resume (with, say, a lower lr) carries on after them with max_nonfinite fresh tries
                self.nonfinite.consecutive = 0
                self.save_checkpoint("non-finite halt", wait=True)
                raise NonFiniteHalt(f"{e} Checkpoint: {self.ckpt_dir}") from None
            # a step's sample and validation come before its checkpoint, which then holds their effects
            if self.step % s.sample_every == 0 and self.root:
                with self._between_steps("sample_s"):
                    self.sample()
            if self.eval_set is not None and self.step % s.eval_every == 0:
                with self._between_steps("eval_s"):
                    self.validate()
            if self.step % s.checkpoint_every == 0:
                # the last step's checkpoint is the run's end: written (and logged) once, as that
                reason = "end of run" if self.step >= s.max_steps else "periodic"
                with self._between_steps("ckpt_s"):
                    if self.eval_set is None and self.smma is not None and self.smma < self.best:
                        self.best = self.smma  # no validation set: best.bin by the smoothed training loss
                        # best.bin first: the state written with the checkpoint then never names a
                        # best that is not on disk
                        self._write_best_now()
                    self.save_checkpoint(reason)
            if self.step % s.sample_every == 0 and self.comm.any(self.root and self.low_samples >= s.coherence_patience):
                self._record_between()
                path = self.save_checkpoint("coherence halt", wait=True)
                raise CoherenceHalt(
                    f"coherence gate: {self.low_samples} consecutive samples scored below "
                    f"{s.coherence_halt_below} (last at step {self.step}); the model is producing "
                    f"degenerate text. Stopped; checkpoint {path}. Read {self.run_dir / 'samples.jsonl'}."
                )
        self._settle()
        final = self.run_dir / "final.bin"
        newest = self.checkpoints.path(self.step)
        if self.root:
            # the last step's checkpoint, unless the loop queued it (a periodic one, logged as the end
            # of the run) or an earlier attempt wrote it (a run resumed at its end)
            if self.checkpoints.queued != newest and not newest.exists():
                with self._between_steps("ckpt_s"):
                    self.save_checkpoint("end of run")
            with self._between_steps("ckpt_s"):
                self.checkpoints.wait()
            link_or_copy(newest, final)  # final.bin is the last checkpoint's bytes
            if not (self.run_dir / "best.bin").exists():
                link_or_copy(final, self.run_dir / "best.bin")
        self._record_between()
        elapsed = time.perf_counter() - self._t_start
        self.timing["loop_s"] = elapsed
        self.timing["steps"] = self.step - self._steps_start
        speed = self.speed()
        if self.timing.get("estimate"):
            est = self.timing["estimate"]["estimated_remaining_s"]
            log.info("finished at step %d in %s (the plan estimated %s)", self.step, human_duration(elapsed), human_duration(est))
            self.plan_doc["actual_remaining_s"] = elapsed
            self.plan_doc["actual_speed"] = speed
            if self.root:
                write_json_atomic(self.run_dir / "plan.json", self.plan_doc)
        if speed["steps"]:
            log.info("speed: %s tokens in %d steps of %s: %s tokens/s; %s tokens/s counting the %s of validation, "
                     "samples and checkpoints between them", f"{speed['tokens']:,}", speed["steps"],
                     human_duration(speed["step_s"]), f"{speed['tokens_per_s']:,.0f}",
                     f"{speed['tokens_per_s_with_periodic']:,.0f}", human_duration(speed["periodic_s"]))
        return {"finished": True, "step": self.step, "ema": self.ema, "smma": self.smma,
                "val_loss": self.last_eval["loss"] if self.last_eval else None, "seconds": elapsed, "speed": speed}

    def speed(self) -> dict:
        """This attempt's tokens over the wall time of its steps, without and with the work between
        them (validation, samples, checkpoints, re-plans): the figures the log and plan.json give."""
        sp = dict(self._speed)
        sp["step_s"], sp["periodic_s"] = round(sp["step_s"], 6), round(sp["periodic_s"], 6)
        sp["tokens_per_s"] = round(sp["tokens"] / sp["step_s"], 1) if sp["step_s"] > 0 else None
        total = sp["step_s"] + sp["periodic_s"]
        sp["tokens_per_s_with_periodic"] = round(sp["tokens"] / total, 1) if total > 0 else None
        return sp

    @contextlib.contextmanager
    def _between_steps(self, what: str):
        """Time work done between two steps (`what`: eval_s, sample_s, ckpt_s, replan_s): left out of
        the next step's wall time and written on a "periodic" record (_record_between)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self._between_s += dt
            self._between[what] = self._between.get(what, 0.0) + dt
            kind = self._kinds.setdefault(what, [0.0, 0])
            kind[0] += dt
            kind[1] += 1

    def _eta(self, done: int) -> float:
        """Seconds to finish after `done` steps: the steps left at this attempt's mean step time,
        plus the validations, samples and checkpoints still due at their mean time so far (the
        plan's estimate of one until one has run)."""
        s, est, sp = self.s, self.timing.get("estimate") or {}, self._speed
        left = (s.max_steps - done) * sp["step_s"] / max(sp["steps"], 1)
        for what, every, planned in (("eval_s", s.eval_every if self.eval_set is not None else 0, est.get("eval_s", 0.0)),
                                     ("sample_s", s.sample_every, est.get("sample_s", 0.0)),
                                     ("ckpt_s", s.checkpoint_every, est.get("checkpoint_copy_s", 0.0))):
            if every > 0:
                total, n = self._kinds.get(what, (0.0, 0))
                # the work at step `done` itself runs after its step is read: still to come
                left += (s.max_steps // every - (done - 1) // every) * (total / n if n else planned)
        return left

    def _record_between(self) -> None:
        """The work timed since the last step, as `{"kind": "periodic", "step", "seconds", "eval_s",
        "sample_s", "ckpt_s", "replan_s"}` (the kinds that ran) in loss.jsonl."""
        if not self._between:
            return
        parts, self._between = self._between, {}
        total = sum(parts.values())
        self._speed["periodic_s"] += total
        self.runlog.record({"kind": "periodic", "step": self.step, "seconds": round(total, 6),
                            **{k: round(v, 6) for k, v in sorted(parts.items())}})

    def _must_settle(self, step: int) -> bool:
        """Whether the steps launched so far must be read before step `step` is launched: where
        something reads the state they leave (the end, a sample, validation, a checkpoint, the
        bandit's replan). The same on every rank (signals are settled at the loop's top, after
        the ranks agree on them)."""
        s = self.s
        return (step >= s.max_steps or step % s.sample_every == 0 or step % s.checkpoint_every == 0
                or (self.eval_set is not None and step % s.eval_every == 0) or self.bandit.replans_at(step))

    def _settle(self) -> None:
        """Read the step in flight, if any."""
        if self._inflight is not None:
            launched, self._inflight = self._inflight, None
            self._finish_step(*launched)

    def _finish_step(self, pending, batch, computed_at: float | None) -> None:
        """A launched step's results, in launch order: the bandit's rewards, the loss averages, the
        loss record and the progress line.

        The step's wall time runs from when the step before was seen done to when this one is:
        on the host backend when launch_step returned (`computed_at`: it computed the step), on
        the GPU when its results arrived here (the read waits for the step, and for nothing
        queued after it). The GPU runs the steps back to back, so the time between two arrivals
        is one step's (the host is never more than a step ahead: no sync is added for timing).
        The work between steps (validation, samples, checkpoints, re-plans: _between_steps) is
        taken out and goes on its own record, so a step followed by a sample is not timed as
        instant and the one after it is not charged with the sample."""
        s = self.s
        res = pending.result(raise_halt=False)  # a halt is raised below, once the step is on record
        done_at = computed_at if computed_at is not None else time.perf_counter()
        step_s = max(done_at - self._clock - self._between_s, 1e-9)
        self._clock, self._between_s = done_at, 0.0
        if not res.skipped and math.isfinite(res.loss):
            for (src, doc), loss in zip(batch.rows, res.row_losses.tolist()):
                self.bandit.observe(src, doc, loss)
            self.ema = res.loss if self.ema is None else (1 - EMA_ALPHA) * self.ema + EMA_ALPHA * res.loss
            self.smma = res.loss if self.smma is None else ((SMMA_N - 1) * self.smma + res.loss) / SMMA_N
        if self.recording and res.step < s.record_batches:
            self._record_batch(batch.tokens)
        n_tok = len(batch.rows) * self.T
        self.tokens_seen += n_tok
        self._speed["steps"] += 1
        self._speed["tokens"] += n_tok
        self._speed["step_s"] += step_s
        self._recent[0] += n_tok
        self._recent[1] += step_s
        mix = {}
        for src, _ in batch.rows:
            mix[src] = mix.get(src, 0) + 1
        self.runlog.record({
            "step": res.step, "loss": res.loss, "ema": self.ema, "smma": self.smma, "lr": res.lr,
            "grad_norm": res.grad_norm, "clipped": res.clipped, "skipped": res.skipped,
            "tokens_per_s": round(n_tok / step_s, 1), "step_s": round(step_s, 6),
            "rows": len(batch.rows), "mix": dict(sorted(mix.items())),  # the mix as row counts
            "weights": {k: round(v, 6) for k, v in self.bandit.weights.items()},
            "focus": list(self.bandit.focus),
            "phase": self.bandit.phase_start,  # the first step of the curriculum's phase, in every mode (written where it changes)
        })
        done_step = res.step + 1
        if done_step % 10 == 0 or done_step == s.max_steps:
            # tokens/s over the steps since the last line; the ETA at this attempt's pace so far,
            # the work between steps included (more of it is to come)
            eta = self._eta(done_step)
            log.info("step %d/%d loss %.4f (ema %.4f) lr %.2e norm %.3f %s tok/s ETA %s",
                     done_step, s.max_steps, res.loss, self.ema or float("nan"), res.lr, res.grad_norm,
                     f"{self._recent[0] / self._recent[1]:,.0f}", human_duration(eta))
            self._recent = [0, 0.0]
        if pending.halt is not None:
            raise NonFiniteHalt(pending.halt)

    def _export(self, out: Path) -> None:
        """The workflow's output: final and best weights plus what they are, in one directory."""
        meta = {
            "model": self.model_name,
            "model_config": self.cfg.__dict__,
            "train": self.s.as_dict(),
            "backend": self.backend,
            "precision": self.precision,
            "backend_reason": self.backend_reason,
            "run_key": run_key(self.config, self.model_name),
            "train_version": train_version(self.config, self.model_name),
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "smma": self.smma,
            "ema": self.ema,
            "best_val_loss": self.best if (self.last_eval and math.isfinite(self.best)) else None,
            "last_eval": self.last_eval,
            "segments": self.shards_meta["segments"],
            "tokenizer_hash": self.shards_meta["tokenizer_hash"],
            "run_dir": str(self.run_dir),
        }
        with atomic_dir(out, "run.json") as tmp:  # a ckpt directory, or nothing of value
            link_or_copy(self.run_dir / "final.bin", tmp / "final.bin")
            link_or_copy(self.run_dir / "best.bin", tmp / "best.bin")
            (tmp / "run.json").write_text(json.dumps(meta, indent=2))
