import json
import math

import numpy as np
import pytest

from andrea.config import load_config
from andrea.curriculum import Bandit, coverage_bonus, epoch_penalty
from conftest import REPO

CC = load_config(REPO / "config" / "config.yaml")["curriculum"]


def arms(**n_docs):
    return {k.replace("_", "-"): {"n_docs": v} for k, v in n_docs.items()}


def test_spec_worked_numbers():
    assert coverage_bonus(0.0) == pytest.approx(1.3)
    assert coverage_bonus(0.25) == pytest.approx(1.15)
    assert coverage_bonus(0.5) == 1.0 and coverage_bonus(0.9) == 1.0
    assert epoch_penalty(5600, 1400) == pytest.approx(0.2)
    assert epoch_penalty(1399, 1400) == 1.0


def test_reward_ema_and_ucb():
    b = Bandit(arms(a=10, b=10), {**CC, "warmup_steps": 0, "ucb_c": 2.0, "ema_alpha": 0.1, "reward_scale": 1000})
    assert b.observe("a", 0, 3.0) == 0.0 and b.arms["a"].ema == 3.0  # first pull initialises
    assert b.observe("a", 1, 2.5) == pytest.approx(500.0)  # (3.0 − 2.5) × 1000, EMA before update
    assert b.arms["a"].ema == pytest.approx(2.95)  # 0.9 × 3.0 + 0.1 × 2.5 = 2.7 + 0.25
    assert b.observe("a", 2, 9.0) == 0.0  # a worse loss gives 0, not a negative reward
    assert b.arms["a"].ema == pytest.approx(3.555)  # 0.9 × 2.95 + 0.1 × 9.0 = 2.655 + 0.9
    assert b.arms["a"].mean_reward == pytest.approx(166.6667, abs=1e-4)  # (0 + 500 + 0) / 3
    assert b.ucb("b") == math.inf  # never pulled: first
    b.observe("b", 0, 4.0)  # N = 4 pulls in all, n_a = 3
    # 166.6667 + 2 × sqrt(ln 4 / 3) = 166.6667 + 2 × sqrt(1.386294 / 3) = 166.6667 + 2 × 0.679778
    assert b.ucb("a") == pytest.approx(168.0262, abs=1e-4)
    assert b.ucb("b") == pytest.approx(2.3548, abs=1e-4)  # 0 + 2 × sqrt(ln 4 / 1) = 2 × 1.177410


def test_weights_worked_by_hand_through_bonus_penalty_floor_cap():
    """design §5.4 worked by hand: w_k = min(cap, max(floor, tentative · coverage bonus · epoch
    penalty)), normalised."""
    a = {"x": {"n_docs": 10, "floor": 0.8}, "y": {"n_docs": 10, "cap": 0.05}, "z": {"n_docs": 10}, "w": {"n_docs": 2}}
    cc = {**CC, "warmup_steps": 0, "focus_dice": 1, "ucb_c": 2.0, "background_weight": 0.1, "coverage_bonus": 0.3,
          "heldout_every": 0, "reward_scale": 1000}
    b = Bandit(a, cc)
    b.observe("x", 0, 3.0)  # first pulls: reward 0
    b.observe("y", 0, 3.0)
    b.observe("z", 0, 3.0)
    b.observe("z", 1, 2.0)  # reward (3.0 − 2.0) × 1000: z's mean reward 500, the top UCB
    for doc in (0, 1, 0, 1, 0):  # w: 5 pulls of its 2 documents, no improvement
        b.observe("w", doc, 3.0)
    b.replan(0)
    assert b.focus == ["z"]  # UCB: z 500 + 2·sqrt(ln 9 / 2) ≈ 502.1; x, y 2·sqrt(ln 9) ≈ 2.96; w ≈ 1.33
    # coverage bonus 1 + 0.3 · (1 − coverage / 0.5):
    #   x, y: 1 of 10 seen → 1 + 0.3 · 0.8 = 1.24;  z: 2 of 10 → 1 + 0.3 · 0.6 = 1.18;  w: 2 of 2 → 1
    # epoch penalty 1 / (1 + floor(pulls / n_docs)): w: 1 / (1 + floor(5 / 2)) = 1/3; the others 1
    # raw: x, y 0.1 · 1.24 = 0.124;  z 1.0 · 1.18 = 1.18;  w 0.1 · 1 · 1/3 = 0.033333
    assert b.raw == pytest.approx({"x": 0.124, "y": 0.124, "z": 1.18, "w": 0.1 / 3})
    # floors and caps: x max(0.8, 0.124) = 0.8; y min(0.05, 0.124) = 0.05; z min(1.0, 1.18) = 1.0;
    # w 0.033333; sum 1.883333
    assert b.weights == pytest.approx({"x": 0.424779, "y": 0.026549, "z": 0.530973, "w": 0.017699}, abs=1e-6)


def test_warmup_sources_only_until_the_warmup_ends():
    cc = {**CC, "warmup_steps": 50, "warmup_sources": ["chat", "gutenberg"]}
    b = Bandit(arms(chat=100, gutenberg=100, dictionary=100, repo_docs=100), cc, seed=3)
    rng = np.random.default_rng(0)
    seen_before, seen_after = set(), set()
    for step in range(120):
        b.maybe_replan(step)
        for src, doc in b.draw(8, rng):
            (seen_before if step < 50 else seen_after).add(src)
            b.observe(src, doc, 3.0)
    assert seen_before == {"chat", "gutenberg"}
    assert {"dictionary", "repo-docs"} & seen_after


def test_held_out_documents_are_never_drawn():
    b = Bandit(arms(a=200), {**CC, "warmup_steps": 0, "heldout_every": 50})
    docs = set()
    for _ in range(1000):
        doc = b._next_doc("a")
        docs.add(doc)
        b.observe("a", doc, 1.0)
    assert docs == set(range(200)) - {49, 99, 149, 199}
    assert b.arms["a"].n_train == 196 and b.arms["a"].coverage == 1.0


def test_documents_are_visited_without_repetition_within_an_epoch():
    b = Bandit(arms(a=37), {**CC, "warmup_steps": 0})
    b.replan(0)
    docs = [b._next_doc("a") for _ in range(37)]
    assert sorted(docs) == list(range(37))
    nxt = [b._next_doc("a") for _ in range(37)]
    assert sorted(nxt) == list(range(37)) and nxt != docs and b.arms["a"].epoch == 1


def test_state_round_trips_exactly_and_continues_identically():
    cc = {**CC, "warmup_steps": 5}
    spec = arms(chat=50, smoltalk=40, gutenberg=30, dictionary=20)
    b1 = Bandit(spec, cc, seed=11)
    rng = np.random.default_rng(1)
    for step in range(30):
        b1.maybe_replan(step)
        for src, doc in b1.draw(4, rng):
            b1.observe(src, doc, 3.0 - 0.01 * step)
    saved = json.loads(json.dumps(b1.state()))
    b2 = Bandit(spec, cc, seed=11)
    b2.load_state(saved)
    assert json.dumps(b2.state(), sort_keys=True) == json.dumps(b1.state(), sort_keys=True)
    r1, r2 = np.random.default_rng(2), np.random.default_rng(2)
    for step in range(30, 80):
        for b, r in ((b1, r1), (b2, r2)):
            b.maybe_replan(step)
            for src, doc in b.draw(4, r):
                b.observe(src, doc, 2.0)
    assert json.dumps(b2.state(), sort_keys=True) == json.dumps(b1.state(), sort_keys=True)


def test_new_floors_apply_on_resume():
    spec = arms(chat=50, gutenberg=50)
    cc = {**CC, "warmup_steps": 0, "focus_dice": 1, "background_weight": 0.1, "coverage_bonus": 0.3}
    b1 = Bandit(spec, cc, seed=1)
    b1.replan(0)
    (focus,) = b1.focus
    other = "gutenberg" if focus == "chat" else "chat"
    floored = {focus: {"n_docs": 50}, other: {"n_docs": 50, "floor": 0.9}}
    b2 = Bandit(floored, cc, seed=1)
    b2.load_state(json.loads(json.dumps(b1.state())))
    # nothing seen yet: bonus 1.3, penalty 1; raw focus 1.0 · 1.3 = 1.3, other 0.1 · 1.3 = 0.13.
    # before: min(1, 1.3) = 1.0 and 0.13 → other 0.13 / 1.13 = 0.115044
    assert b1.weights[other] == pytest.approx(0.115044, abs=1e-6)
    # after: the floor lifts the other to max(0.9, 0.13) = 0.9 → 0.9 / 1.9 = 0.473684
    assert b2.weights[other] == pytest.approx(0.473684, abs=1e-6)
    assert b2.focus == b1.focus and b2.phase_end == b1.phase_end


def test_bandit_shifts_weight_to_improving_sources_while_floors_hold():
    """Synthetic sources: 'fast' keeps improving, 'flat' does not move, 'slow' improves a little;
    'floored' never improves but has a floor."""
    spec = {"fast": {"n_docs": 5000}, "flat": {"n_docs": 5000}, "slow": {"n_docs": 5000}, "floored": {"n_docs": 5000, "floor": 0.3}}
    b = Bandit(spec, {**CC, "warmup_steps": 0, "ucb_c": 2.0}, seed=0)
    rng = np.random.default_rng(0)
    level = {"fast": 5.0, "flat": 3.0, "slow": 4.0, "floored": 3.0}
    rate = {"fast": 0.004, "flat": 0.0, "slow": 0.001, "floored": 0.0}
    mass = {k: 0.0 for k in spec}
    least_floored = 1.0
    for step in range(600):
        b.maybe_replan(step)
        least_floored = min(least_floored, b.weights["floored"])
        for src, doc in b.draw(8, rng):
            level[src] = max(0.5, level[src] - rate[src])
            b.observe(src, doc, level[src] + rng.normal(0, 0.002))
        if step >= 300:
            for k in spec:
                mass[k] += b.weights[k]
    assert mass["fast"] > mass["flat"] and mass["fast"] > mass["slow"]
    # the least the floor can mean after normalisation: 0.3 against three arms at the cap 1.0
    assert least_floored >= 0.3 / (0.3 + 3 * 1.0) - 1e-12


def test_drawing_a_row_does_not_depend_on_the_source_size():
    """A row costs O(1) in the source's size: the epoch's document order is built once per epoch
    (not once per row, as before), and coverage is a running count."""
    import time

    cc = {**CC, "warmup_steps": 0, "heldout_every": 50}
    timings = {}
    for n in (1_000, 1_000_000):
        b = Bandit({"big": {"n_docs": n}}, cc, seed=1)
        b.replan(0)
        rng = np.random.default_rng(0)
        b.draw(32, rng)  # builds the epoch order: once per epoch
        builds = []
        orig = b._order

        def counting(arm, orig=orig):
            if arm.order_epoch != arm.epoch:
                builds.append(arm.epoch)
            return orig(arm)

        b._order = counting
        t0 = time.perf_counter()
        for _ in range(200):
            for src, doc in b.draw(32, rng):
                b.observe(src, doc, 2.0)
        timings[n] = time.perf_counter() - t0
        assert len(builds) == b.arms["big"].epoch  # one order per epoch (none within the 1M-doc one)
        assert b.arms["big"].n_seen == int(b.arms["big"].seen.sum())
    assert timings[1_000_000] < 5 * timings[1_000] + 0.05, timings


def test_epoch_order_visits_every_training_document_once():
    b = Bandit({"s": {"n_docs": 500}}, {**CC, "warmup_steps": 0, "heldout_every": 50}, seed=2)
    b.replan(0)
    rng = np.random.default_rng(0)
    docs = [d for _ in range(490 // 10) for _, d in b.draw(10, rng)]
    assert sorted(docs) == [i for i in range(500) if i % 50 != 49]  # a permutation of the training docs
    assert b.arms["s"].epoch == 0 and b.draw(1, rng) and b.arms["s"].epoch == 1
