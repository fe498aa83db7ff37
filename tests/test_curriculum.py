import json
import math

import numpy as np
import pytest

from andrea.config import load_config
from andrea.curriculum import Bandit, coverage_bonus, epoch_penalty
from conftest import REPO

SHIPPED = load_config(REPO / "config" / "config.yaml")["curriculum"]
# the bandit's tests read the shipped curriculum section with the bandit named: it is no longer the
# default mode (proportional is)
CC = {**SHIPPED, "mode": "bandit"}


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


# ---------------------------------------------------------------------------- modes (design §5.9)
from andrea.curriculum import MODES, STATIC_MODES, make_curriculum  # noqa: E402


def test_the_bandit_is_unchanged_by_the_modes():
    """`mode: bandit` stays design §5 exactly: a seeded run of it (weights, focus and phase at every
    step, and the state it ends in) digests to what it did before the other modes were added."""
    import hashlib

    spec = {"fast": {"n_docs": 300}, "flat": {"n_docs": 120, "floor": 0.3}, "slow": {"n_docs": 900, "cap": 0.6},
            "tiny": {"n_docs": 7}}
    b = Bandit(spec, {**CC, "warmup_steps": 100, "warmup_sources": ["fast", "flat", "tiny"], "heldout_every": 10}, seed=5)
    rng = np.random.default_rng(3)
    level = {"fast": 5.0, "flat": 3.0, "slow": 4.0, "tiny": 3.5}
    rate = {"fast": 0.004, "flat": 0.0, "slow": 0.001, "tiny": 0.002}
    h = hashlib.sha256()
    for step in range(400):
        b.maybe_replan(step)
        h.update(json.dumps([step, b.weights, b.focus, b.phase_end], sort_keys=True).encode())
        for src, doc in b.draw(8, rng):
            level[src] = max(0.5, level[src] - rate[src])
            b.observe(src, doc, level[src] + float(rng.normal(0, 0.01)))
    st = b.state()
    h.update(json.dumps([st["rng"], st["raw"], st["total_pulls"], st["arms"]], sort_keys=True).encode())
    assert h.hexdigest() == "66361ae2560f3ade777189eeafc981c0c0a287e2adb04b672592db67f73f3d87"


SPEC4 = {"big": {"n_docs": 400, "n_tokens": 60_000, "weight": 1.0},
         "mid": {"n_docs": 300, "n_tokens": 30_000, "weight": 0.5},
         "small": {"n_docs": 200, "n_tokens": 9_000, "weight": 0.2},
         "tiny": {"n_docs": 100, "n_tokens": 1_000, "weight": 0.3}}


@pytest.mark.parametrize("mode, expected", [
    ("proportional", {"big": 60, "mid": 30, "small": 9, "tiny": 1}),
    ("uniform", {"big": 1, "mid": 1, "small": 1, "tiny": 1}),
    ("fixed", {"big": 1.0, "mid": 0.5, "small": 0.2, "tiny": 0.3}),
])
def test_static_modes_draw_each_source_at_its_weight(mode, expected):
    """proportional by tokens, uniform alike, fixed by the configured weights: the weights are
    exactly those, and the rows drawn (seeded, 40,000) fall within 4 standard deviations of them."""
    c = make_curriculum(SPEC4, {**CC, "mode": mode, "warmup_steps": 0, "heldout_every": 0}, seed=1)
    rng = np.random.default_rng(7)
    counts = dict.fromkeys(SPEC4, 0)
    n = 0
    for step in range(500):
        c.maybe_replan(step)
        for src, doc in c.draw(80, rng):
            counts[src] += 1
            c.observe(src, doc, 2.0)
            n += 1
    total = sum(expected.values())
    for k, w in expected.items():
        p = w / total
        assert c.weights[k] == pytest.approx(p, rel=1e-12)
        assert abs(counts[k] - n * p) <= 4 * math.sqrt(n * p * (1 - p)), (k, counts[k], n * p)
    assert c.focus == [] and c.phase_end > 10**12  # re-planned once: a static mix never moves


def test_fixed_mode_reads_curriculum_weights_before_the_sources_weights():
    c = make_curriculum(SPEC4, {**CC, "mode": "fixed", "warmup_steps": 0, "weights": {"tiny": 2.0, "big": 0.0}})
    c.replan(0)
    # tiny 2.0 (the heaviest: 1.0 after scaling), mid 0.5, small 0.2 from their `weight`, big 0
    assert c.raw == pytest.approx({"big": 0.0, "mid": 0.25, "small": 0.1, "tiny": 1.0})
    assert c.weights["big"] == 0.0 and c.weights["tiny"] == pytest.approx(1.0 / 1.35)


def drive(c, steps, rng, start=0, rows=8):
    """Synthetic training: each source's loss falls at its own rate; a validation every 10 steps
    (heldout_progress reads it), in which `small` gets worse (memorised) and the others better."""
    level = {"big": 5.0, "mid": 4.0, "small": 3.0, "tiny": 4.5}
    held = {k: 3.0 for k in level}
    for step in range(start, start + steps):
        c.maybe_replan(step)
        for src, doc in c.draw(rows, rng):
            c.observe(src, doc, level[src] - 0.002 * step + float(rng.normal(0, 0.05)))
        if (step + 1) % 10 == 0:
            for k in held:
                held[k] += 0.01 if k == "small" else -0.02 * (1 + c.weights[k])
            c.observe_validation(step + 1, {k: {"loss": v, "bpb": v / 2} for k, v in held.items()})


BANDITS = ("bandit", "bandit_normalised")  # raw weights on the bandit's own scale (focus 1 × bonus × penalty)


@pytest.mark.parametrize("mode", MODES)
def test_floors_caps_and_the_warmup_hold_in_every_mode(mode):
    spec = {k: {**v} for k, v in SPEC4.items()}
    spec["tiny"]["floor"] = 0.6  # the least-favoured source in most modes
    spec["big"]["cap"] = 0.3
    cc = {**CC, "mode": mode, "warmup_steps": 40, "warmup_sources": ["big", "mid", "tiny"], "heldout_every": 0}
    c = make_curriculum(spec, cc, seed=2, eval_every=10)
    rng = np.random.default_rng(0)
    level = 4.0
    for step in range(160):
        c.maybe_replan(step)
        active = ["big", "mid", "tiny"] if step < 40 else list(spec)
        total = sum(min(spec[k].get("cap", 1.0), max(spec[k].get("floor", 0.0), c.raw[k])) for k in active)
        for k in spec:
            if k not in active:  # the warm-up: 0 whatever its floor, never drawn
                assert c.raw[k] is None and c.weights[k] == 0.0
                continue
            clipped = min(spec[k].get("cap", 1.0), max(spec[k].get("floor", 0.0), c.raw[k]))
            assert c.weights[k] == pytest.approx(clipped / total)
            if mode not in BANDITS:  # every other mode's heaviest source weighs 1 before floors and caps
                assert 0.0 <= c.raw[k] <= 1.0
        assert max(c.raw[k] for k in active) == pytest.approx(1.0) or mode in BANDITS
        assert c.weights["tiny"] >= 0.6 / len(active)  # the floor, whatever the others weigh
        drawn = c.draw(8, rng)
        assert all(src in active for src, _ in drawn)
        for src, doc in drawn:
            c.observe(src, doc, level + float(rng.normal(0, 0.1)))
        level -= 0.005
        if (step + 1) % 10 == 0:
            c.observe_validation(step + 1, {k: {"bpb": 2.0 - 0.001 * step} for k in spec})


@pytest.mark.parametrize("mode", MODES)
def test_state_round_trips_exactly_in_every_mode(mode):
    """A state saved mid-run (as JSON, as the checkpoint holds it) and loaded into a new instance
    continues exactly as the run that was not stopped: weights, draws, statistics."""
    cc = {**CC, "mode": mode, "warmup_steps": 25, "warmup_sources": ["big", "mid"], "heldout_every": 0}
    c1 = make_curriculum(SPEC4, cc, seed=11, eval_every=10)
    r1 = np.random.default_rng(1)
    drive(c1, 60, r1)
    saved = json.loads(json.dumps(c1.state()))
    c2 = make_curriculum(SPEC4, cc, seed=11, eval_every=10)
    c2.load_state(saved)
    assert json.dumps(c2.state(), sort_keys=True) == json.dumps(c1.state(), sort_keys=True)
    r2 = np.random.default_rng()
    r2.bit_generator.state = r1.bit_generator.state
    drive(c1, 90, r1, start=60)
    drive(c2, 90, r2, start=60)
    assert json.dumps(c2.state(), sort_keys=True) == json.dumps(c1.state(), sort_keys=True)


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_marks_where_its_phases_start(mode):
    """`phase_start` (the loss log's "phase", where the geometry's walk on the simplex turns) is the
    step of the latest re-plan in every mode: the static modes' start and warm-up end, the
    bandit's and exp3_loss's phase boundaries, heldout_progress's validations. A state saved before
    the mark existed loads as unknown (None) until the next re-plan."""
    cc = {**CC, "mode": mode, "warmup_steps": 25, "warmup_sources": ["big", "mid"], "heldout_every": 0}
    c = make_curriculum(SPEC4, cc, seed=4, eval_every=10)
    rng = np.random.default_rng(2)
    starts = []
    level = 4.0
    for step in range(120):
        if c.maybe_replan(step):
            starts.append(step)
        assert c.phase_start == starts[-1]
        for src, doc in c.draw(8, rng):
            c.observe(src, doc, level + float(rng.normal(0, 0.1)))
        level -= 0.005
        if (step + 1) % 10 == 0:
            c.observe_validation(step + 1, {k: {"bpb": 2.0 - 0.001 * step} for k in SPEC4})
    if mode in STATIC_MODES:
        assert starts == [0, 25]
    elif mode == "heldout_progress":
        assert starts == [0, 10, 20, 25, *range(30, 120, 10)]  # every validation, and the warm-up end
    else:
        assert len(starts) >= 4 and 25 in starts
    old = json.loads(json.dumps(c.state()))
    del old["phase_start"]
    c2 = make_curriculum(SPEC4, cc, seed=4, eval_every=10)
    c2.load_state(old)
    assert c2.phase_start is None
    c2.replan(120)
    assert c2.phase_start == 120


def test_a_state_of_another_mode_is_refused():
    b = make_curriculum(SPEC4, {**CC, "warmup_steps": 0})
    u = make_curriculum(SPEC4, {**CC, "mode": "uniform", "warmup_steps": 0})
    with pytest.raises(ValueError, match="mode 'uniform'.*'bandit'"):
        b.load_state(json.loads(json.dumps(u.state())))


def test_exp3_loss_worked_by_hand():
    """ODM's update on two sources: the moving average of importance-weighted losses per step, η
    from the step, the exploration floor."""
    spec = {"a": {"n_docs": 100}, "b": {"n_docs": 100}}
    c = make_curriculum(spec, {**CC, "mode": "exp3_loss", "warmup_steps": 0, "phase_lengths": [10], "explore": 0.05,
                               "exp3_loss_scale": 10, "exp3_smoothing": 0.9, "heldout_every": 0})
    c.replan(0)  # nothing observed: both at R 0 → alike
    assert c.weights == pytest.approx({"a": 0.5, "b": 0.5}) and c.phase_end == 10
    rng = np.random.default_rng(0)
    rows = {"a": 0, "b": 0}
    for _ in range(10):
        for src, doc in c.draw(4, rng):
            rows[src] += 1
            c.observe(src, doc, 6.0 if src == "a" else 2.0)
    c.replan(10)
    # r̂_k = Σ losses / (10 · p_k · 4 rows · 10 steps): a's rows sum 6·n_a, p 0.5 → 6·n_a / 200; b's
    # 2·n_b / 200; R̂_k = 0.9^10 · 0 + (1 − 0.9^10) · r̂_k (ten per-step updates of the moving average)
    keep = 0.9**10
    ra, rb = (1 - keep) * 6.0 * rows["a"] / 200, (1 - keep) * 2.0 * rows["b"] / 200
    assert c.reward == pytest.approx({"a": ra, "b": rb})
    # η at step 0 was min(1/2, sqrt(ln 2 / (2·1))) = 0.5 (the rate of this update), at step 10
    # min(1/2, sqrt(ln 2 / 20)) = 0.186; ε = max(0.05, 0.186) = 0.186
    eta10 = math.sqrt(math.log(2) / 20)
    e = np.exp(0.5 * np.array([ra, rb]) - 0.5 * max(ra, rb))
    pi = (1 - 2 * eta10) * e / e.sum() + eta10
    assert c.weights["a"] == pytest.approx(pi[0] / pi.sum()) and c.weights["a"] > 0.5
    assert c.eta_prev == pytest.approx(eta10)


def test_exp3_loss_favours_the_higher_loss_source_above_its_exploration_floor():
    spec = {"hard": {"n_docs": 500}, "easy": {"n_docs": 500}, "mid": {"n_docs": 500}}
    c = make_curriculum(spec, {**CC, "mode": "exp3_loss", "warmup_steps": 0, "explore": 0.05, "heldout_every": 0})
    rng = np.random.default_rng(4)
    loss = {"hard": 5.0, "easy": 1.0, "mid": 3.0}
    for step in range(2000):
        c.maybe_replan(step)
        for src, doc in c.draw(8, rng):
            c.observe(src, doc, loss[src] + float(rng.normal(0, 0.3)))
    assert c.weights["hard"] > c.weights["mid"] > c.weights["easy"]
    assert c.weights["easy"] >= 0.05 - 1e-12  # the exploration floor (no floors or caps here)


def test_heldout_progress_worked_by_hand():
    spec = {"a": {"n_docs": 100}, "b": {"n_docs": 100}, "c": {"n_docs": 100}}
    cc = {**CC, "mode": "heldout_progress", "warmup_steps": 0, "explore": 0.05, "progress_smoothing": 0.5,
          "progress_sharpness": 2.0, "heldout_every": 0}
    h = make_curriculum(spec, cc, eval_every=100)
    h.observe_validation(0, {"a": {"bpb": 3.0}, "b": {"bpb": 3.0}})  # c: no validation figure
    h.replan(0)
    assert h.weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) and h.phase_end == 100
    for src, n in (("a", 30), ("b", 60), ("c", 10)):
        for i in range(n):
            h.observe(src, i, 2.0)
    h.observe_validation(100, {"a": {"bpb": 2.7}, "b": {"bpb": 2.94}})
    # a: gained 0.3 on 30 % of the rows → 1.0; b: 0.06 on 60 % → 0.1; c: no figure → the bottom, −1
    assert h.progress["a"] == pytest.approx(1.0) and h.progress["b"] == pytest.approx(0.1) and h.progress["c"] is None
    assert not h.replans_at(99) and h.replans_at(100)
    h.replan(100)
    x = np.exp(2.0 * np.array([1.0, 0.1, -1.0]))
    pi = 0.85 * x / x.sum() + 0.05
    assert [h.weights[k] for k in "abc"] == pytest.approx(list(pi / pi.max() / (pi / pi.max()).sum()))
    assert h.focus == ["a"] and h.phase_end == 200
    # a next validation where a got worse (memorised): −0.1 on half the rows, −0.2, and its running
    # progress 0.5 · 1.0 + 0.5 · (−0.2) = 0.4
    for i in range(50):
        h.observe("a", i, 2.0)
        h.observe("b", i, 2.0)
    h.observe_validation(200, {"a": {"bpb": 2.8}, "b": {"bpb": 2.9}})
    assert h.progress["a"] == pytest.approx(0.4)


def test_heldout_progress_draws_less_of_a_source_whose_held_out_loss_rises():
    c = make_curriculum(SPEC4, {**CC, "mode": "heldout_progress", "warmup_steps": 0, "heldout_every": 0}, eval_every=10)
    drive(c, 300, np.random.default_rng(1))
    assert c.weights["small"] == min(c.weights.values())
    assert c.weights["small"] < 0.5 / len(SPEC4)


def test_heldout_progress_needs_validation():
    with pytest.raises(ValueError, match="eval_every > 0"):
        make_curriculum(SPEC4, {**CC, "mode": "heldout_progress"}, eval_every=0)


def test_the_mode_is_part_of_the_run_key_and_other_modes_settings_are_not(config):
    from andrea.versions import train_run_key

    bandit = {**config, "curriculum": {**config["curriculum"], "mode": "bandit"}}
    base = train_run_key(bandit, "ANDREA-tiny")
    # settings the bandit does not read leave a bandit run where it was (its run continues)
    assert train_run_key({**bandit, "curriculum": {**bandit["curriculum"], "explore": 0.3}}, "ANDREA-tiny") == base
    assert train_run_key({**bandit, "curriculum": {**bandit["curriculum"], "exp3_smoothing": 0.5}}, "ANDREA-tiny") == base
    exp3 = {**config, "curriculum": {**config["curriculum"], "mode": "exp3_loss"}}
    assert (train_run_key({**exp3, "curriculum": {**exp3["curriculum"], "exp3_smoothing": 0.5}}, "ANDREA-tiny")
            != train_run_key(exp3, "ANDREA-tiny"))
    keys = {m: train_run_key({**config, "curriculum": {**config["curriculum"], "mode": m}}, "ANDREA-tiny") for m in MODES}
    assert len(set(keys.values())) == len(MODES) and keys["bandit"] == base
    # the shipped config trains the default mode, proportional: its run is that mode's run
    assert train_run_key(config, "ANDREA-tiny") == keys["proportional"]
    # a static mode does not read the bandit's settings; heldout_progress reads the validation's cadence
    uni = {**config, "curriculum": {**config["curriculum"], "mode": "uniform"}}
    assert train_run_key({**uni, "curriculum": {**uni["curriculum"], "ucb_c": 1.0}}, "ANDREA-tiny") == keys["uniform"]
    held = {**config, "curriculum": {**config["curriculum"], "mode": "heldout_progress"}}
    more = {**held, "train": {**held["train"], "ANDREA-tiny": {**held["train"]["ANDREA-tiny"], "eval_every": 25}}}
    assert train_run_key(more, "ANDREA-tiny") != keys["heldout_progress"]
    assert STATIC_MODES == ("proportional", "uniform", "fixed")


def test_the_default_mode_is_proportional():
    """Issue 41: the static mix by tokens is the default (the bandit lost to it in the curriculum
    studies). The schema's default, the shipped config, DEFAULT_MODE and a section that names no
    mode agree; the bandit's key still leaves its mode out (its runs keep their directories)."""
    from andrea.config import load_schema
    from andrea.curriculum import DEFAULT_MODE, StaticMix, key_settings

    schema = load_schema()["properties"]["curriculum"]["properties"]["mode"]["default"]
    assert SHIPPED["mode"] == schema == DEFAULT_MODE == "proportional"
    c = make_curriculum(SPEC4, {**SHIPPED, "warmup_steps": 0, "heldout_every": 0})
    assert isinstance(c, StaticMix) and c.mode == "proportional"
    c.maybe_replan(0)
    assert c.weights == pytest.approx({"big": 0.6, "mid": 0.3, "small": 0.09, "tiny": 0.01}, rel=1e-12)
    unnamed = {k: v for k, v in SHIPPED.items() if k != "mode"}
    assert key_settings(unnamed) == key_settings(SHIPPED) == {"mode": "proportional", "warmup_steps": SHIPPED["warmup_steps"],
                                                              "heldout_every": SHIPPED["heldout_every"],
                                                              "warmup_sources": SHIPPED["warmup_sources"]}
    assert "mode" not in key_settings(CC) and key_settings(CC)["ucb_c"] == CC["ucb_c"]


def test_heldout_progress_does_not_credit_a_source_left_out_by_the_warmup():
    """Every source improves by the same held-out amount at every validation. Those outside the
    warm-up got no rows, so that gain is transfer, not their own progress: the weights must not
    jump toward them when the warm-up ends (their gain over a floored share would count ×1/explore)."""
    cc = {**CC, "mode": "heldout_progress", "warmup_steps": 30, "warmup_sources": ["big", "mid"], "heldout_every": 0,
          "explore": 0.02}
    spec = {k: {k2: v2 for k2, v2 in v.items() if k2 != "floor"} for k, v in SPEC4.items()}
    c = make_curriculum(spec, cc, seed=3, eval_every=10)
    rng = np.random.default_rng(2)
    bpb = 3.0
    for step in range(30):
        c.maybe_replan(step)
        for src, doc in c.draw(8, rng):
            c.observe(src, doc, 3.0)
        if (step + 1) % 10 == 0:
            bpb -= 0.05
            c.observe_validation(step + 1, {k: {"loss": 2 * bpb, "bpb": bpb} for k in spec})
    assert c.progress["small"] is None and c.progress["tiny"] is None  # never drawn: no progress of their own
    assert c.last_bpb["small"] == pytest.approx(bpb)  # but the next gain counts from their last figure
    c.maybe_replan(30)  # the warm-up ends: every source is allowed
    assert max(c.weights["small"], c.weights["tiny"]) <= min(c.weights["big"], c.weights["mid"]) + 1e-12


def test_exp3_loss_does_not_collapse_onto_the_highest_loss_source():
    """Constant losses 5, 3 and 1 nats for 20,000 steps. With ODM's moving average the estimate
    R̂_k stays near each loss, so η·R̂ shrinks with η and the mix stays spread; a plain sum of
    rewards grows like t, η·R like √t, and the mix ends on the hardest source at 1 − 2ε."""
    spec = {"hard": {"n_docs": 500}, "easy": {"n_docs": 500}, "mid": {"n_docs": 500}}
    c = make_curriculum(spec, {**CC, "mode": "exp3_loss", "warmup_steps": 0, "explore": 0.02, "heldout_every": 0})
    rng = np.random.default_rng(4)
    loss = {"hard": 5.0, "easy": 1.0, "mid": 3.0}
    seen = {}
    for step in range(20_000):
        c.maybe_replan(step)
        if step in (2_000, 19_999):
            seen[step] = dict(c.weights)
        for src, doc in c.draw(8, rng):
            c.observe(src, doc, loss[src])
    assert c.reward["hard"] == pytest.approx(0.5, rel=0.25) and c.reward["easy"] == pytest.approx(0.1, rel=0.25)
    assert seen[19_999]["hard"] < 0.5 and seen[19_999]["easy"] > 0.2  # spread, not collapsed
    assert seen[19_999]["hard"] <= seen[2_000]["hard"] + 0.01  # and not drifting toward one source
    assert c.weights["hard"] > c.weights["mid"] > c.weights["easy"]
