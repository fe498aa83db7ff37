"""The curriculum (design §5): which sources the next batches come from. `curriculum.mode` picks
how: the static mixes (`proportional`, the default: each source by its tokens; `uniform`, `fixed`:
StaticMix); the data bandit ("firehose", `bandit`), described below; the same bandit with each row's
reward divided by its source's spread of row losses (`bandit_normalised`); Online Data Mixing's EXP3
with a smoothed training-loss reward (`exp3_loss`); EXP3-style weights from held-out progress
(`heldout_progress`). They share the arms, the warm-up, floors and caps, drawing, attribution and
the state (Curriculum); design §5.9 has every mode's equations.

Arms are data sources. Every batch row drawn from a source is a pull; its loss is attributed back
to the source (and the document it came from):

    reward  r = max(0, EMA_k − loss) · 1000, with the EMA taken before it is updated;
            EMA_k ← 0.9·EMA_k + 0.1·loss (the first pull sets EMA_k = loss, r = 0)
    UCB_k   = mean reward_k + C·sqrt(ln N / n_k); arms never pulled come first

The bandit re-plans at phase boundaries: a phase lasts one of {7, 14, 21, 28, 42} steps (seeded);
at each boundary it rolls the focus size (1d3 during the curriculum warm-up, 1d4 after) and takes
that many top-UCB arms as the focus. Tentative weights are 1.0 for the focus and a small
background weight for the other active arms; then

    coverage bonus  1 + 0.3·(1 − coverage/0.5) below 50 % of documents seen, else 1
    epoch penalty   1 / (1 + floor(lifetime pulls / n_docs))
    w_k = min(cap_k, max(floor_k, tentative_k · bonus_k · penalty_k)), normalised

During the curriculum warm-up only the warm-up sources are active (weight 0 for the others,
floors notwithstanding). Within a source, documents are visited in a seeded random order, a new
order each epoch; the cursor is part of the state. Drawing a row costs O(1) in the size of the
source: the epoch's order is a permutation computed once when the epoch starts (from the seed and
the epoch number, so it is rebuilt, not stored, on resume), and coverage is a running count. The
whole state serialises to JSON and back exactly. Every `heldout_every`-th document of a source is never drawn: the audit measures
perplexity on those.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from andrea.config_schema import STATIC_MODES  # noqa: F401 (the baselines: weights that never learn)
# which settings each mode reads, and the default mode (in config_schema: andrea.config checks configs with them)
from andrea.config_schema import BANDIT_KEYS, COMMON_KEYS, DEFAULT_MODE, MODE_KEYS  # noqa: F401
from andrea.settings import CurriculumSettings


@dataclass
class Arm:
    name: str
    n_docs: int
    floor: float = 0.0
    cap: float = 1.0
    ema: float | None = None
    pulls: int = 0  # n_k for UCB
    reward_sum: float = 0.0
    lifetime_pulls: int = 0  # persists across restarts, never decays
    cursor: int = 0  # position in this epoch's document order
    epoch: int = 0  # document-order epoch (reshuffled each pass)
    seen: np.ndarray = field(default=None, repr=False)  # bool per document
    n_seen: int = 0  # seen.sum(), kept as a running count
    order: np.ndarray = field(default=None, repr=False)  # this epoch's document order (a cache)
    order_epoch: int = -1  # the epoch `order` belongs to

    def __post_init__(self):
        if self.seen is None:
            self.seen = np.zeros(self.n_docs, dtype=bool)
        self.n_seen = int(self.seen.sum())

    @property
    def mean_reward(self) -> float:
        return self.reward_sum / self.pulls if self.pulls else 0.0

    heldout_every: int = 0  # document i is held out (never trained on) when i % every == every − 1

    def is_heldout(self, doc: int) -> bool:
        return is_heldout(doc, self.heldout_every)

    @property
    def n_train(self) -> int:
        return self.n_docs - (self.n_docs // self.heldout_every if self.heldout_every else 0)

    @property
    def coverage(self) -> float:
        return self.n_seen / self.n_train if self.n_train else 1.0


def is_heldout(doc: int, every: int) -> bool:
    """The held-out rule: document i of a source is never trained on when i % every == every − 1
    (every ≤ 0: none). Validation and the audit score those documents."""
    return every > 0 and doc % every == every - 1


def coverage_bonus(coverage: float, strength: float = 0.3) -> float:
    """1.3× at 0 % coverage, 1.15× at 25 %, 1.0× from 50 % on."""
    return 1.0 + strength * (1.0 - coverage / 0.5) if coverage < 0.5 else 1.0


def epoch_penalty(lifetime_pulls: int, n_docs: int) -> float:
    """1/(1 + epochs), epochs = floor(lifetime pulls / n_docs): 5,600 pulls over 1,400 docs → 0.2."""
    return 1.0 / (1 + lifetime_pulls // max(1, n_docs))


MODES = ("bandit", "bandit_normalised", "proportional", "uniform", "fixed", "exp3_loss", "heldout_progress")
NEVER = 2**62  # the phase end of a mode that re-plans only at the start and where the warm-up ends
VALIDATION_MODES = ("heldout_progress",)  # re-weighted by the trainer's validation (eval_every)


def key_settings(c: Mapping) -> dict:
    """The curriculum settings a run's weights depend on, for the run key (andrea.versions): its
    mode's and the common ones. The bandit's are exactly the settings the key hashed before modes
    existed, without `mode`, so a bandit run keeps its run directory across the upgrade; every
    other mode's include it. A section without `mode` is of the default mode (DEFAULT_MODE)."""
    mode = c.get("mode", DEFAULT_MODE)
    out = {k: c[k] for k in MODE_KEYS[mode] + COMMON_KEYS if k in c}
    if mode != "bandit":
        out["mode"] = mode
    return out


def _softmax_mix(x: np.ndarray, eps: float) -> np.ndarray:
    """EXP3's sampling distribution: (1 − K·eps) · softmax(x) + eps."""
    e = np.exp(x - x.max())
    return (1.0 - len(x) * eps) * e / e.sum() + eps


class Curriculum:
    """What every mode shares (design §5): the arms and their statistics, the warm-up, floors and
    caps, drawing rows, attributing their losses, the phases and the state. A mode sets the
    policy-free weights (`raw`) at each re-plan (its `_plan`); `raw` is on the bandit's scale,
    where a focus source weighs 1.0, so that floors and caps (in [0, 1]) mean the same in every
    mode: every other mode scales its weights so that its heaviest active source weighs 1.0."""

    mode = ""

    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0, eval_every: int = 0):
        """`arms`: name → {"n_docs", "floor", "cap"} (and "n_tokens", "weight" where a mode reads
        them); `ccfg`: a model's curriculum settings (or a complete curriculum section as a
        mapping, e.g. load_config(...)["curriculum"]); `eval_every`: the trainer's validation
        cadence (heldout_progress re-weights at each validation)."""
        self.c = ccfg if isinstance(ccfg, CurriculumSettings) else CurriculumSettings.from_dict(ccfg)
        if self.c.mode != self.mode:
            raise ValueError(f"curriculum.mode is {self.c.mode!r}, but {type(self).__name__} is mode {self.mode!r}; "
                             f"andrea.curriculum.make_curriculum builds the mode's class")
        self.seed = seed
        self.eval_every = eval_every
        self.spec = {k: dict(a) for k, a in arms.items()}
        self.arms = {k: Arm(k, a["n_docs"], a.get("floor", 0.0), a.get("cap", 1.0), heldout_every=self.c.heldout_every)
                     for k, a in arms.items()}
        self.rng = np.random.default_rng([seed, 0xBA4D17])
        self.phase_end = 0  # first step of the next phase
        self.phase_start: int | None = 0  # first step of this phase (the loss log's "phase": where the walk turns)
        self.focus: list[str] = []
        self.raw: dict[str, float | None] = {k: None for k in self.arms}
        self.weights = {k: 0.0 for k in self.arms}
        self.total_pulls = 0

    # ------------------------------------------------------------------ policy
    def active(self, step: int) -> list[str]:
        """Arms that may be sampled at `step`: warm-up sources during the warm-up; never an arm
        without documents."""
        warm = step < self.c.warmup_steps
        allowed = set(self.c.warmup_sources) if warm else set(self.arms)
        return [k for k, a in self.arms.items() if a.n_docs > 0 and k in allowed]

    def _active(self, step: int) -> list[str]:
        active = self.active(step)
        if not active:
            raise ValueError(f"step {step}: no source with documents is active (check warmup_sources and the shards)")
        return active

    def replan(self, step: int) -> None:
        """New phase from `step` on, in every mode: where it starts (the loss log's "phase", which
        the geometry's walk on the simplex and the dashboard mark), then the mode's weights."""
        self.phase_start = step
        self._plan(step)

    def _plan(self, step: int) -> None:
        """The mode's weights from what it has observed (set `raw`, `focus`, `phase_end`)."""
        raise NotImplementedError

    def _set_raw(self, active: list[str], values: dict[str, float]) -> None:
        """`raw` from a mode's weights over the active arms, scaled so that the heaviest weighs
        1.0 (the bandit's scale, on which floors and caps apply); then the policy."""
        top = max(values[k] for k in active)
        self.raw = {k: ((values[k] / top if top > 0 else 0.0) if k in active else None) for k in self.arms}
        self.apply_policy()

    def apply_policy(self) -> None:
        """Weights from the phase's raw values through the floors and caps, normalised."""
        w = {k: (0.0 if r is None else min(self.arms[k].cap, max(self.arms[k].floor, r))) for k, r in self.raw.items()}
        total = sum(w.values())
        if total <= 0:  # every active arm capped at 0: uniform over the active ones
            w = {k: (0.0 if r is None else 1.0) for k, r in self.raw.items()}
            total = sum(w.values())
        self.weights = {k: v / total for k, v in w.items()}

    def replans_at(self, step: int) -> bool:
        """Whether `step` starts a new phase (its weights then depend on the losses before it)."""
        return step >= self.phase_end or step == self.c.warmup_steps

    def maybe_replan(self, step: int) -> bool:
        """Re-plan when a phase ends, or when the warm-up ends (the active set changes)."""
        if self.replans_at(step):
            self.replan(step)
            return True
        return False

    # ------------------------------------------------------------------ sampling
    def draw(self, n_rows: int, rng: np.random.Generator) -> list[tuple[str, int]]:
        """(source, document index) for each of n_rows batch rows, by the phase weights."""
        names = list(self.weights)
        p = np.array([self.weights[k] for k in names])
        picks = rng.choice(len(names), size=n_rows, p=p / p.sum())
        return [(names[i], self._next_doc(names[i])) for i in picks]

    def _order(self, a: Arm) -> np.ndarray:
        """The epoch's document order: built once per epoch (O(n_docs) every n_docs draws)."""
        if a.order_epoch != a.epoch:
            a.order = np.random.default_rng([self.seed, a.epoch, sum(map(ord, a.name)), len(a.name)]).permutation(a.n_docs)
            a.order_epoch = a.epoch
        return a.order

    def _next_doc(self, name: str) -> int:
        a = self.arms[name]
        while True:
            if a.cursor >= a.n_docs:
                a.cursor = 0
                a.epoch += 1
            doc = int(self._order(a)[a.cursor])
            a.cursor += 1
            if not a.is_heldout(doc):
                return doc

    def cursors(self) -> dict:
        """Where each source's document order stands (what drawing rows advances)."""
        return {k: (a.cursor, a.epoch) for k, a in self.arms.items()}

    # ------------------------------------------------------------------ feedback
    def observe(self, name: str, doc: int, loss: float) -> float:
        """Attribute one row's loss to its source and document; returns the reward."""
        a = self.arms[name]
        if a.ema is None:
            reward = 0.0
            a.ema = float(loss)
        else:
            reward = self._reward(name, float(loss))
            a.ema = (1 - self.c.ema_alpha) * a.ema + self.c.ema_alpha * float(loss)
        a.pulls += 1
        a.lifetime_pulls += 1
        a.reward_sum += reward
        if not a.seen[doc]:
            a.seen[doc] = True
            a.n_seen += 1
        self.total_pulls += 1
        self._observed(name, float(loss))
        return reward

    def _reward(self, name: str, loss: float) -> float:
        """One row's reward, from its source's EMA before this row updates it (design §5.1)."""
        return max(0.0, self.arms[name].ema - loss) * self.c.reward_scale

    def _observed(self, name: str, loss: float) -> None:
        """A mode's own bookkeeping of one row's loss (none for the bandit and the static modes)."""

    def observe_validation(self, step: int, sources: Mapping[str, Mapping]) -> None:
        """The trainer's validation at `step` (andrea.evaluation.summarise's `sources`: per source
        its "loss" and "bpb" on held-out documents); only heldout_progress reads it."""

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return {
            "mode": self.mode,
            "seed": self.seed,
            "rng": self.rng.bit_generator.state,
            "phase_end": self.phase_end,
            "phase_start": self.phase_start,
            "focus": self.focus,
            "raw": self.raw,
            "weights": self.weights,
            "total_pulls": self.total_pulls,
            "arms": {
                k: {
                    "n_docs": a.n_docs, "ema": a.ema, "pulls": a.pulls, "reward_sum": a.reward_sum,
                    "lifetime_pulls": a.lifetime_pulls, "cursor": a.cursor, "epoch": a.epoch,
                    "seen": base64.b64encode(np.packbits(a.seen).tobytes()).decode("ascii"),
                }
                for k, a in self.arms.items()
            },
            **({"mode_state": self._mode_state()} if self.mode != "bandit" else {}),
        }

    def _mode_state(self) -> dict:
        return {}

    def _load_mode_state(self, st: dict) -> None:
        pass

    def load_state(self, st: dict) -> None:
        """Restore a saved state. Floors, caps and curriculum settings stay as configured now, so a
        policy changed between a stop and a resume applies from the resume on."""
        saved = st.get("mode", "bandit")  # states written before modes existed are the bandit's
        if saved != self.mode:
            raise ValueError(f"the saved curriculum state is mode {saved!r}, this run's curriculum.mode is {self.mode!r}")
        self.rng.bit_generator.state = st["rng"]
        self.phase_end = st["phase_end"]
        self.phase_start = st.get("phase_start")  # None in states written before 2026-12-02: not known until the next phase
        self.focus = list(st["focus"])
        self.raw = {k: st["raw"].get(k) for k in self.arms}
        self.total_pulls = st["total_pulls"]
        for k, s in st["arms"].items():
            if k not in self.arms:
                continue  # a source removed from the config
            a = self.arms[k]
            if s["n_docs"] != a.n_docs:
                raise ValueError(f"source {k}: the saved state has {s['n_docs']} documents, the shard {a.n_docs}")
            a.ema, a.pulls, a.reward_sum = s["ema"], s["pulls"], s["reward_sum"]
            a.lifetime_pulls, a.cursor, a.epoch = s["lifetime_pulls"], s["cursor"], s["epoch"]
            bits = np.frombuffer(base64.b64decode(s["seen"]), dtype=np.uint8)
            a.seen = np.unpackbits(bits)[: a.n_docs].astype(bool)
            a.n_seen = int(a.seen.sum())
        self._load_mode_state(st.get("mode_state", {}))
        self.apply_policy()


class Bandit(Curriculum):
    """`mode: bandit`, design §5 as the original had it: UCB1 over each source's loss
    improvements picks a focus for phases of 7–42 steps (the module docstring)."""

    mode = "bandit"

    def ucb(self, name: str) -> float:
        a = self.arms[name]
        if a.pulls == 0:
            return math.inf
        return a.mean_reward + self.c.ucb_c * math.sqrt(math.log(max(1, self.total_pulls)) / a.pulls)

    def _plan(self, step: int) -> None:
        """New phase: roll its length and focus size, pick the focus, set the weights."""
        active = self._active(step)
        self.phase_end = step + int(self.rng.choice(self.c.phase_lengths))
        dice = self.c.focus_dice_warmup if step < self.c.warmup_steps else self.c.focus_dice
        k = int(self.rng.integers(1, dice + 1))
        # ties (e.g. several unpulled arms) broken by a seeded shuffle, not by config order
        order = list(self.rng.permutation(len(active)))
        ranked = sorted(range(len(active)), key=lambda i: (-self.ucb(active[i]), order[i]))
        self.focus = [active[i] for i in ranked[:k]]
        # the policy-free part of each weight is kept, so floors and caps changed between a
        # stop and a resume apply from the resume on (apply_policy)
        self.raw = {}
        for name, a in self.arms.items():
            if name not in active:
                self.raw[name] = None
                continue
            tentative = 1.0 if name in self.focus else self.c.background_weight
            self.raw[name] = tentative * coverage_bonus(a.coverage, self.c.coverage_bonus) * epoch_penalty(a.lifetime_pulls, a.n_train)
        self.apply_policy()


SIGMA_FLOOR = 1e-3  # nats: bandit_normalised's least σ_k, so a source of near-constant loss cannot win ×1/σ


class BanditNormalised(Bandit):
    """`mode: bandit_normalised`: the bandit (phases, focus dice, UCB, coverage bonus, epoch
    penalty, all as `bandit`) with each row's reward divided by its source's own spread of row
    losses about its EMA, so that UCB ranks sources by how fast they learn rather than by how much
    their rows' losses vary (design §5.10: `max(0, EMA − loss)` is ~0.4 σ_k a row for a source
    that learns nothing). For a row of source k with loss x, EMA_k and V_k taken before it:

        d     = x − EMA_k
        σ_k   = max(1e-3, sqrt(V_k / (1 − (1 − α)^m_k)))       m_k: residuals seen before this row
        r     = max(0, −d) / σ_k · reward_scale   when m_k ≥ ceil(1/α), else 0
        V_k  ← (1 − α)·V_k + α·d²,  m_k ← m_k + 1                V_k starts at 0; α = ema_alpha

    then EMA_k as in the bandit. σ_k² is the exponentially weighted mean of the squared residuals
    (the division undoes V_k's start at 0, as Adam's bias correction does); the first row of a
    source (which sets EMA_k) has no residual, and the next ceil(1/α) rows (the EMA's time
    constant: 10) earn 0 while σ_k is a mean of too few residuals: one small first residual
    would otherwise divide a later row's improvement by ~0 and its reward would lead that
    source's mean for thousands of pulls. A row's own residual is not in the σ_k that divides it.
    A source that learns nothing earns ~0.4·reward_scale a row (E max(0, z) for z ~ N(0, 1)),
    whatever its spread; one whose loss falls by s a pull (each row s/α below the EMA on average)
    earns ~(0.4 + 0.5·s/(α·σ_k))·reward_scale: the common 0.4 does not change UCB's ranking."""

    mode = "bandit_normalised"

    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0, eval_every: int = 0):
        super().__init__(arms, ccfg, seed, eval_every)
        self.var = {k: 0.0 for k in self.arms}  # V_k
        self.residuals = {k: 0 for k in self.arms}  # m_k
        self.warm_residuals = math.ceil(1.0 / self.c.ema_alpha)

    def sigma(self, name: str) -> float | None:
        """σ_k before the next row (None while it has no residual)."""
        m = self.residuals[name]
        if m == 0:
            return None
        return max(SIGMA_FLOOR, math.sqrt(self.var[name] / (1.0 - (1.0 - self.c.ema_alpha) ** m)))

    def _reward(self, name: str, loss: float) -> float:
        """The normalised reward (the class docstring); updates V_k and m_k with this row."""
        d = loss - self.arms[name].ema
        reward = 0.0
        if self.residuals[name] >= self.warm_residuals:
            reward = max(0.0, -d) / self.sigma(name) * self.c.reward_scale
        alpha = self.c.ema_alpha
        self.var[name] = (1.0 - alpha) * self.var[name] + alpha * d * d
        self.residuals[name] += 1
        return reward

    def _mode_state(self) -> dict:
        return {"var": self.var, "residuals": self.residuals}

    def _load_mode_state(self, st: dict) -> None:
        self.var = {k: st["var"].get(k, 0.0) for k in self.arms}
        self.residuals = {k: st["residuals"].get(k, 0) for k in self.arms}


class StaticMix(Curriculum):
    """The baselines (`proportional`, `uniform`, `fixed`): weights that never learn. Each source's
    base weight — its tokens (proportional), 1 (uniform), or its configured weight (fixed:
    curriculum.weights, else sources.<name>.weight) — is scaled so that the heaviest active
    source weighs 1.0, then floors and caps apply as in every mode (Curriculum). Re-planned at
    the start and where the warm-up ends (the active set changes), never otherwise."""

    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0, eval_every: int = 0):
        c = ccfg if isinstance(ccfg, CurriculumSettings) else CurriculumSettings.from_dict(ccfg)
        if c.mode not in STATIC_MODES:
            raise ValueError(f"StaticMix is the static modes ({', '.join(STATIC_MODES)}), not {c.mode!r}")
        self.mode = c.mode
        super().__init__(arms, c, seed, eval_every)
        self.base = {k: self._base(k) for k in self.arms}

    def _base(self, name: str) -> float:
        a = self.spec[name]
        if self.mode == "uniform":
            return 1.0
        if self.mode == "proportional":
            if "n_tokens" not in a:
                raise ValueError(f"curriculum.mode proportional weighs sources by their tokens, but source {name} has no n_tokens")
            return float(a["n_tokens"])
        configured = self.c.weights or {}
        w = configured.get(name, a.get("weight"))
        if w is None:
            raise ValueError(f"curriculum.mode fixed: source {name} has no weight (curriculum.weights or sources.{name}.weight)")
        return float(w)

    def _plan(self, step: int) -> None:
        active = self._active(step)
        self.phase_end = NEVER
        self.focus = []
        self._set_raw(active, self.base)


class Exp3Loss(Curriculum):
    """`mode: exp3_loss`: Online Data Mixing (Albalak et al. 2023, arXiv 2312.02406), EXP3 with the
    training loss as the reward and a smoothed (moving-average) reward estimate, with an
    exploration floor. Per phase of ℓ steps (the bandit's phase lengths: re-weighting only at
    phase boundaries keeps the next batch drawn ahead), for each active source k drawn with
    probability p_k (the weights after floors and caps) in rows of n per step:

        r̂_k = Σ(row losses of k in the phase) / (exp3_loss_scale · p_k · n · ℓ)   importance-weighted:
                                                       an unbiased estimate of k's loss per step
        R̂_k ← α^ℓ · R̂_k + (1 − α^ℓ) · r̂_k              α = exp3_smoothing: ℓ per-step updates
        η_t = min(1/K, sqrt(ln K / (K·t)))             t: the step; K: active sources
        ε_t = min(1/K, max(explore, η_t))              the exploration floor
        π_k = (1 − K·ε_t) · exp(η_{t'}·R̂_k) / Σ_j exp(η_{t'}·R̂_j) + ε_t      t': the previous re-plan

    A source's loss stands for what is left to learn in it: the higher, the more it is drawn.
    The moving average is ODM's (its SmoothedMeanWeightUpdater, "the data mixing implementation
    described in the paper"); a plain sum of rewards, classic EXP3, grows like t while η shrinks
    like 1/√t, so η·R grows like √t and the mix collapses onto the highest-loss source.
    Differences from ODM's code: there the reward is exp(loss) of a batch of one domain, not
    importance-weighted, updated every step; here batches mix sources, so the estimate is the
    importance-weighted loss over a phase (design §5.9). A source that becomes active (the
    warm-up ends) starts at the mean R̂ of the others."""

    mode = "exp3_loss"

    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0, eval_every: int = 0):
        super().__init__(arms, ccfg, seed, eval_every)
        self.reward = {k: None for k in self.arms}  # R̂_k, None until the source is first active
        self.phase_started: int | None = None  # the step the phase being observed started
        self.eta_prev: float | None = None
        self.phase_loss = {k: 0.0 for k in self.arms}
        self.rows_per_step = 0

    def draw(self, n_rows: int, rng: np.random.Generator) -> list[tuple[str, int]]:
        self.rows_per_step = n_rows
        return super().draw(n_rows, rng)

    def _observed(self, name: str, loss: float) -> None:
        self.phase_loss[name] += loss

    def _plan(self, step: int) -> None:
        active = self._active(step)
        steps = step - (self.phase_started if self.phase_started is not None else step)
        if self.rows_per_step and steps > 0:  # the phase that ends: its importance-weighted losses, per step
            keep = self.c.exp3_smoothing ** steps  # ℓ per-step updates with the phase's estimate
            for k, total in self.phase_loss.items():
                if self.weights[k] > 0 and self.reward[k] is not None:
                    r = total / (self.c.exp3_loss_scale * self.weights[k] * self.rows_per_step * steps)
                    self.reward[k] = keep * self.reward[k] + (1 - keep) * r
        self.phase_started = step
        self.phase_loss = {k: 0.0 for k in self.arms}
        known = [self.reward[k] for k in active if self.reward[k] is not None]
        for k in active:
            if self.reward[k] is None:
                self.reward[k] = float(np.mean(known)) if known else 0.0
        K = len(active)
        eta = min(1.0 / K, math.sqrt(math.log(K) / (K * max(1, step))))
        eps = min(1.0 / K, max(self.c.explore, eta))
        rate = eta if self.eta_prev is None else self.eta_prev
        pi = _softmax_mix(np.array([rate * self.reward[k] for k in active]), eps)
        self.eta_prev = eta
        self.phase_end = step + int(self.rng.choice(self.c.phase_lengths))
        self.focus = [active[int(np.argmax(pi))]]
        self._set_raw(active, dict(zip(active, pi.tolist())))

    def _mode_state(self) -> dict:
        return {"reward": self.reward, "eta_prev": self.eta_prev, "phase_loss": self.phase_loss,
                "rows_per_step": self.rows_per_step, "phase_started": self.phase_started}

    def _load_mode_state(self, st: dict) -> None:
        self.reward = {k: st["reward"].get(k) for k in self.arms}
        self.eta_prev = st["eta_prev"]
        self.phase_loss = {k: st["phase_loss"].get(k, 0.0) for k in self.arms}
        self.rows_per_step = st["rows_per_step"]
        self.phase_started = st.get("phase_started")


class HeldoutProgress(Curriculum):
    """`mode: heldout_progress`: weights from each source's progress on its own held-out documents
    (the trainer's validation, every eval_every steps), per share of the rows it was given. At
    validation v, for each source k with a validation figure that was drawn since v−1 (one that was
    not, e.g. outside the warm-up, only has its bpb_k(v) recorded, its P_k left as it was):

        g_k = bpb_k(v−1) − bpb_k(v)                  held-out bits per byte gained (negative: worse)
        u_k = g_k / max(s_k, explore)                per share s_k of the rows drawn since v−1
        P_k ← (1 − progress_smoothing)·P_k + progress_smoothing·u_k     (the first u_k sets P_k)

    and the weights until the next validation:

        z_k = P_k / max_j |P_j|                      (a source without a validation figure: −1)
        π_k = (1 − K·ε) · exp(progress_sharpness·z_k) / Σ_j exp(progress_sharpness·z_j) + ε,
              ε = min(explore, 1/K)

    Held-out progress is what the study measures, and bits per byte weigh every source alike
    whatever its tokenizer; a source being memorised (its training loss still falling, its
    held-out loss rising) loses weight instead of gaining it."""

    mode = "heldout_progress"

    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0, eval_every: int = 0):
        super().__init__(arms, ccfg, seed, eval_every)
        if eval_every <= 0:
            raise ValueError("curriculum.mode heldout_progress re-weights the sources at every validation: "
                             "set train.eval_every > 0")
        self.last_bpb: dict[str, float] = {}
        self.progress: dict[str, float | None] = {k: None for k in self.arms}
        self.rows = {k: 0 for k in self.arms}  # rows drawn from each source since the last validation

    def _observed(self, name: str, loss: float) -> None:
        self.rows[name] += 1

    def observe_validation(self, step: int, sources: Mapping[str, Mapping]) -> None:
        total = sum(self.rows.values())
        for k, v in sources.items():
            bpb = v.get("bpb") if isinstance(v, Mapping) else None
            if k not in self.arms or bpb is None:
                continue
            # only a source that was drawn since the last validation has progress of its own: one
            # left out (the warm-up) moves by transfer alone, and that gain over a share floored at
            # `explore` would be multiplied ×1/explore and win it the mix the moment it is allowed.
            # Its figure is still recorded, so its next gain counts from here
            if k in self.last_bpb and total and self.rows[k] > 0:
                u = (self.last_bpb[k] - bpb) / max(self.rows[k] / total, self.c.explore)
                p = self.progress[k]
                self.progress[k] = u if p is None else (1 - self.c.progress_smoothing) * p + self.c.progress_smoothing * u
            self.last_bpb[k] = float(bpb)
        self.rows = {k: 0 for k in self.arms}

    def _plan(self, step: int) -> None:
        active = self._active(step)
        known = [self.progress[k] for k in active if self.progress[k] is not None]
        scale = max(map(abs, known), default=0.0)
        # a source without a validation figure (too little held-out text for a window) cannot show
        # progress: it gets the bottom of the scale, -1 (a tiny source would otherwise get a middle
        # weight and be drawn through hundreds of epochs)
        z = np.array([(self.progress[k] / scale if self.progress[k] is not None else -1.0) if scale > 0 else 0.0
                      for k in active])
        pi = _softmax_mix(self.c.progress_sharpness * z, min(self.c.explore, 1.0 / len(active)))
        self.phase_end = (step // self.eval_every + 1) * self.eval_every  # the next validation's step
        self.focus = [active[int(np.argmax(pi))]] if scale > 0 else []
        self._set_raw(active, dict(zip(active, pi.tolist())))

    def _mode_state(self) -> dict:
        return {"last_bpb": self.last_bpb, "progress": self.progress, "rows": self.rows}

    def _load_mode_state(self, st: dict) -> None:
        self.last_bpb = {k: v for k, v in st["last_bpb"].items() if k in self.arms}
        self.progress = {k: st["progress"].get(k) for k in self.arms}
        self.rows = {k: st["rows"].get(k, 0) for k in self.arms}


def make_curriculum(arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0,
                    eval_every: int = 0) -> Curriculum:
    """The curriculum of `ccfg.mode` (Bandit, BanditNormalised, StaticMix, Exp3Loss or HeldoutProgress)."""
    c = ccfg if isinstance(ccfg, CurriculumSettings) else CurriculumSettings.from_dict(ccfg)
    cls = {"bandit": Bandit, "bandit_normalised": BanditNormalised, "exp3_loss": Exp3Loss, "heldout_progress": HeldoutProgress}.get(c.mode, StaticMix)
    if c.mode not in MODES:
        raise ValueError(f"curriculum.mode: unknown mode {c.mode!r}; the modes are {', '.join(MODES)}")
    return cls(arms, c, seed, eval_every)
