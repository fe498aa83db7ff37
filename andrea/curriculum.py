"""The data bandit ("firehose", design §5): which sources the next batches come from.

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


class Bandit:
    def __init__(self, arms: dict[str, dict], ccfg: CurriculumSettings | Mapping, seed: int = 0):
        """`arms`: name → {"n_docs", "floor", "cap"}; `ccfg`: a model's curriculum settings (or a
        complete curriculum section as a mapping, e.g. load_config(...)["curriculum"])."""
        self.c = ccfg if isinstance(ccfg, CurriculumSettings) else CurriculumSettings.from_dict(ccfg)
        self.seed = seed
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

    def ucb(self, name: str) -> float:
        a = self.arms[name]
        if a.pulls == 0:
            return math.inf
        return a.mean_reward + self.c.ucb_c * math.sqrt(math.log(max(1, self.total_pulls)) / a.pulls)

    def replan(self, step: int) -> None:
        """New phase: roll its length and focus size, pick the focus, set the weights."""
        active = self.active(step)
        if not active:
            raise ValueError(f"step {step}: no source with documents is active (check warmup_sources and the shards)")
        self.phase_start = step
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
            reward = max(0.0, a.ema - float(loss)) * self.c.reward_scale
            a.ema = (1 - self.c.ema_alpha) * a.ema + self.c.ema_alpha * float(loss)
        a.pulls += 1
        a.lifetime_pulls += 1
        a.reward_sum += reward
        if not a.seen[doc]:
            a.seen[doc] = True
            a.n_seen += 1
        self.total_pulls += 1
        return reward

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return {
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
        }

    def load_state(self, st: dict) -> None:
        """Restore a saved state. Floors, caps and curriculum settings stay as configured now, so a
        policy changed between a stop and a resume applies from the resume on."""
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
        self.apply_policy()
