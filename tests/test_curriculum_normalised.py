"""`mode: bandit_normalised` (design §5.9): the bandit with each row's reward divided by its
source's spread of row losses."""

import json
import math

import numpy as np
import pytest

from andrea.config import load_config
from andrea.curriculum import MODE_KEYS, Bandit, BanditNormalised, key_settings, make_curriculum
from conftest import REPO

CC = {**load_config(REPO / "config" / "config.yaml")["curriculum"], "mode": "bandit"}  # the bandit's settings, named
TWO = {"a": {"n_docs": 1000}, "b": {"n_docs": 1000}}


def mean_rewards(mode, loss_of, pulls=4000, seed=0):
    """Each source pulled `pulls` times, alternately; loss_of(source, i, rng) is its i-th row loss."""
    c = make_curriculum(TWO, {**CC, "mode": mode, "warmup_steps": 0, "heldout_every": 0})
    rng = np.random.default_rng(seed)
    for i in range(pulls):
        for k in TWO:
            c.observe(k, i % 1000, loss_of(k, i, rng))
    return {k: c.arms[k].mean_reward for k in TWO}


def test_worked_by_hand():
    """α 0.5: ceil(1/α) = 2 residuals before a row earns; V_k from 0, σ_k² = V_k / (1 − 0.5^m)."""
    c = make_curriculum({"s": {"n_docs": 10}}, {**CC, "mode": "bandit_normalised", "ema_alpha": 0.5,
                                                "reward_scale": 1000, "warmup_steps": 0, "heldout_every": 0})
    assert c.observe("s", 0, 4.0) == 0.0  # sets EMA 4.0, no residual
    assert c.observe("s", 1, 3.0) == 0.0  # d −1: V 0.5, m 1; EMA 3.5 (a bandit would earn 1000 here)
    assert c.sigma("s") == pytest.approx(1.0)  # sqrt(0.5 / (1 − 0.5))
    assert c.observe("s", 2, 4.5) == 0.0  # d +1: V 0.75, m 2; EMA 4.0
    assert c.sigma("s") == pytest.approx(1.0)  # sqrt(0.75 / 0.75)
    # d −0.5: r = 0.5 / 1.0 · 1000, σ before the row; then V 0.5, m 3, σ² = 0.5 / 0.875
    assert c.observe("s", 3, 3.5) == pytest.approx(500.0)
    assert c.sigma("s") == pytest.approx(math.sqrt(0.5 / 0.875))
    assert c.observe("s", 4, 3.75) == pytest.approx(0.0)  # EMA 3.75: no improvement, no reward
    c.var["s"] = 0.0  # a source whose losses never varied: σ floored at 1e-3 nats
    assert c.observe("s", 5, 3.70) == pytest.approx(0.05 / 1e-3 * 1000)


def test_stationary_sources_of_different_spreads_earn_alike():
    """Losses that never fall, σ 0.05 against 0.5: the shipped bandit's reward is ~0.4 σ a row, so it
    pays the wide source ~10× more; normalised, both earn ~0.4 · reward_scale."""
    spread = {"a": 0.05, "b": 0.5}

    def loss(k, i, rng):
        return 3.0 + float(rng.normal(0, spread[k]))

    shipped = mean_rewards("bandit", loss)
    normalised = mean_rewards("bandit_normalised", loss)
    assert 8 < shipped["b"] / shipped["a"] < 12
    assert normalised["b"] / normalised["a"] == pytest.approx(1.0, abs=0.08)
    assert normalised["a"] == pytest.approx(0.4 * CC["reward_scale"], rel=0.1)


def test_a_learning_source_earns_more_than_a_stationary_one():
    """Same spread (0.3), one source's loss falling 0.004 nats a pull: normalised, it earns more; and a
    learning source of small spread beats a stationary wide one, where the shipped bandit ranks the
    wide one first."""

    def same_spread(k, i, rng):
        return (5.0 - (0.004 * i if k == "a" else 0.0)) + float(rng.normal(0, 0.3))

    r = mean_rewards("bandit_normalised", same_spread)
    assert r["a"] > 1.1 * r["b"]

    def narrow_learner(k, i, rng):  # a: σ 0.05, falling 0.002 a pull; b: σ 0.5, flat
        return (5.0 - 0.002 * i if k == "a" else 3.0) + float(rng.normal(0, 0.05 if k == "a" else 0.5))

    normalised = mean_rewards("bandit_normalised", narrow_learner)
    shipped = mean_rewards("bandit", narrow_learner)
    assert normalised["a"] > 1.1 * normalised["b"]
    assert shipped["a"] < 0.5 * shipped["b"]


def drive(c, start, steps, rng, rows=8):
    """Sources with different spreads and rates of learning; returns (weights, draws, rewards) per step."""
    level = {"fast": 5.0, "flat": 3.0, "wide": 4.0}
    rate = {"fast": 0.0005, "flat": 0.0, "wide": 0.0001}
    spread = {"fast": 0.05, "flat": 0.05, "wide": 0.5}
    out = []
    for step in range(start, start + steps):
        c.maybe_replan(step)
        drawn = c.draw(rows, rng)
        rewards = [c.observe(src, doc, level[src] - rate[src] * step + float(rng.normal(0, spread[src])))
                   for src, doc in drawn]
        out.append((dict(c.weights), drawn, rewards))
    return out


SPEC3 = {"fast": {"n_docs": 300}, "flat": {"n_docs": 200}, "wide": {"n_docs": 500}}


def test_a_resumed_run_continues_on_the_same_trajectory():
    """Stopped at step 60 (state as JSON, as the checkpoint holds it) and resumed: the same weights,
    draws and rewards as the run that was not stopped. Resumed without its spreads (V_k, m_k) it
    would not be."""
    cc = {**CC, "mode": "bandit_normalised", "warmup_steps": 30, "warmup_sources": ["fast", "wide"], "heldout_every": 0}
    straight = make_curriculum(SPEC3, cc, seed=3)
    rng = np.random.default_rng(9)
    drive(straight, 0, 60, rng)
    saved = json.loads(json.dumps(straight.state()))
    assert saved["mode_state"]["residuals"]["flat"] > 0
    after = rng.bit_generator.state
    expected = drive(straight, 60, 120, rng)

    resumed = make_curriculum(SPEC3, cc, seed=3)
    resumed.load_state(saved)
    rng2 = np.random.default_rng()
    rng2.bit_generator.state = after
    assert drive(resumed, 60, 120, rng2) == expected
    assert json.dumps(resumed.state(), sort_keys=True) == json.dumps(straight.state(), sort_keys=True)

    forgetful = make_curriculum(SPEC3, cc, seed=3)
    forgetful.load_state({**saved, "mode_state": {"var": {}, "residuals": {}}})
    rng3 = np.random.default_rng()
    rng3.bit_generator.state = after
    assert [r for _, _, r in drive(forgetful, 60, 120, rng3)] != [r for _, _, r in expected]


def test_bandit_states_are_not_normalised_ones():
    b = make_curriculum(SPEC3, {**CC, "warmup_steps": 0})
    n = make_curriculum(SPEC3, {**CC, "mode": "bandit_normalised", "warmup_steps": 0})
    assert type(b) is Bandit and type(n) is BanditNormalised
    with pytest.raises(ValueError, match="mode 'bandit'.*'bandit_normalised'"):
        n.load_state(json.loads(json.dumps(b.state())))
    assert "mode_state" not in b.state()  # the bandit's state is what it was before modes existed


def test_the_bandit_run_key_is_unchanged():
    """A bandit config's key settings are exactly the bandit's own settings and the common ones,
    without `mode` (as before modes existed); the normalised bandit reads the same settings, plus
    its mode, so its runs sit beside the bandit's."""
    bandit_keys = ["ucb_c", "ema_alpha", "reward_scale", "phase_lengths", "focus_dice_warmup", "focus_dice",
                   "background_weight", "coverage_bonus", "warmup_steps", "heldout_every", "warmup_sources"]
    shipped = key_settings(CC)
    assert shipped == {k: CC[k] for k in bandit_keys}
    assert key_settings({**CC, "mode": "bandit_normalised"}) == {**shipped, "mode": "bandit_normalised"}
    assert MODE_KEYS["bandit_normalised"] == MODE_KEYS["bandit"]
