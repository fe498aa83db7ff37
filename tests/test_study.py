"""Curriculum studies (design §9.7): each arm × seed is a run of its own config; the study's table,
plots and tokens-to-target figure from their validation curves; a tiny study end to end through
Snakemake."""

import json
import math

import pytest
import yaml

from andrea.config import (ConfigError, known_sources, load_config, study_baselines, study_max_steps, study_run_config,
                           train_settings, validate_config)
from andrea.study import _verdict, mean_spread, read_run, summarise, tables, tokens_to_target, weighted_bpb, write_study
from andrea.versions import train_version
from conftest import REPO, snakemake

STUDY = {
    "model": "ANDREA-tiny",
    "tokens": 30_000,
    "seeds": [0, 1, 2],
    "train": {"eval_every": 10, "eval_tokens": 512, "sample_every": 1000},
    "curriculum": {"warmup_steps": 10},
    "arms": {
        "bandit": {"curriculum": {"mode": "bandit"}},
        "flat": {"curriculum": {"mode": "bandit", "background_weight": 1.0, "coverage_bonus": 0.0}},
        "uniform": {"curriculum": {"mode": "uniform"}},
        "prop": {"curriculum": {"mode": "proportional"}, "floors": {"chat": 0.0}, "caps": {"gutenberg": 0.5}},
        "bare": {"curriculum": {"mode": "bandit"}, "floors": 0.0},
    },
}


def study_config(**changes):
    return load_config(REPO / "config" / "config.yaml", overrides={"studies": {"s": {**STUDY, **changes}}})


def test_each_run_is_the_model_under_the_study_the_arm_and_its_seed():
    c = study_config()
    # ANDREA-tiny: 8 rows × 128 tokens a step; 30,000 tokens → 30 steps, a multiple of eval_every
    assert study_max_steps(c, "s") == 30
    assert study_max_steps(study_config(tokens=31_000), "s") == 40  # 31 steps, up to the next validation
    rc = study_run_config(c, "s", "prop", 2)
    s = train_settings(rc, "ANDREA-tiny")
    assert (s["seed"], s["max_steps"], s["eval_every"], s["lr"]) == (2, 30, 10, 2.0e-3)  # lr: the model's own
    assert s["curriculum"]["mode"] == "proportional" and s["curriculum"]["warmup_steps"] == 10
    assert rc["sources"]["chat"]["floor"] == 0.0 and rc["sources"]["gutenberg"]["cap"] == 0.5
    assert c["sources"]["chat"]["floor"] == 0.8  # the study's config is left as it was
    bare = study_run_config(c, "s", "bare", 0)["sources"]  # one number: every source's floor
    assert {v["floor"] for v in bare.values()} == {0.0} and {v["floor"] for v in c["sources"].values()} > {0.0}
    # every arm × seed is a run of its own, and the run of a floor-only arm is versioned apart too
    keys = {(a, seed): train_version(study_run_config(c, "s", a, seed), "ANDREA-tiny") for a in STUDY["arms"] for seed in (0, 1, 2)}
    assert len(set(keys.values())) == len(keys)
    assert study_baselines(c, "s") == ["uniform", "prop"]


BANDIT_ARMS = ("bandit", "flat", "no-floors")  # the shipped studies' arms that train the bandit


@pytest.mark.parametrize("study", ["curriculum-12M", "curriculum-12M-warmup500", "curriculum-120M"])
def test_the_bandit_arms_train_what_they_did_when_the_bandit_was_the_default(study):
    """The default mode became proportional (issue 41); the shipped studies' bandit arms name their
    mode, so each run is the one it was: the same curriculum settings, run key and train version
    as under the old default (the config's curriculum.mode bandit, the arms naming no mode), and
    a run key that leaves `mode` out, as a bandit run's always did (andrea.curriculum.key_settings)."""
    from andrea.curriculum import key_settings
    from andrea.versions import train_run_key

    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    new = validate_config(raw)
    old_raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    old_raw["curriculum"]["mode"] = "bandit"  # the old default, said outright
    for name, st in old_raw["studies"].items():
        for arm in BANDIT_ARMS:
            st["arms"][arm] = {k: v for k, v in st["arms"][arm].items()}  # YAML anchors share the arms
            cur = {k: v for k, v in st["arms"][arm].get("curriculum", {}).items() if k != "mode"}
            st["arms"][arm].pop("curriculum", None)
            if cur:
                st["arms"][arm]["curriculum"] = cur
    old = validate_config(old_raw)
    model = new["studies"][study]["model"]
    for arm in BANDIT_ARMS:
        assert "mode" not in old["studies"][study]["arms"][arm].get("curriculum", {})
        assert new["studies"][study]["arms"][arm]["curriculum"]["mode"] == "bandit"
        for seed in new["studies"][study]["seeds"]:
            n, o = study_run_config(new, study, arm, seed), study_run_config(old, study, arm, seed)
            cn, co = train_settings(n, model)["curriculum"], train_settings(o, model)["curriculum"]
            assert cn == co and cn["mode"] == "bandit", (arm, seed)
            assert key_settings(cn) == key_settings({**co, "mode": "bandit"}) and "mode" not in key_settings(cn)
            assert train_run_key(n, model) == train_run_key(o, model), (arm, seed)
            assert train_version(n, model) == train_version(o, model), (arm, seed)
    # the same arms under the new default without their mode: flat's bandit settings are refused (they would
    # silently train proportional); the bandit arm, which sets nothing, would be another run (a proportional one)
    arms = old_raw["studies"][study]["arms"]
    with pytest.raises(ConfigError, match=rf"studies\.{study}\.arms\.flat\.curriculum\.background_weight: a setting of mode bandit"):
        validate_config({**raw, "studies": {study: {**raw["studies"][study], "arms": arms}}})
    unnamed = validate_config({**raw, "studies": {study: {**raw["studies"][study], "arms": {"bandit": arms["bandit"]}}}})
    assert train_run_key(study_run_config(unnamed, study, "bandit", 0), model) != train_run_key(study_run_config(new, study, "bandit", 0), model)


@pytest.mark.parametrize("change, message", [
    ({"model": "ANDREA-3M"}, "studies.s.model: no model 'ANDREA-3M'"),
    ({"train": {"seed": 4}}, "studies.s.train.seed: a study sets every run's seed from its `seeds`"),
    ({"train": {"max_steps": 4}}, "studies.s.train.max_steps: a study sets every run's max_steps from its `tokens`"),
    ({"baselines": ["flat"]}, "arm 'flat' trains with mode bandit; a baseline is a static mode"),
    ({"baselines": ["nope"]}, "'nope' is not one of its arms"),
    ({"arms": {"a": {"floors": {"chatt": 0.1}}}}, "studies.s.arms.a.floors.chatt: no source of that name; did you mean `chat`"),
    ({"train": {"eval_every": 0}}, "eval_every must be above 0"),
])
def test_a_study_that_cannot_run_is_refused_naming_the_key(change, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        study_config(**change)


@pytest.mark.parametrize("where", ["top", "train", "study", "arm"])
@pytest.mark.parametrize("key, value", [("weights", {"chatt": 1.0}), ("warmup_sources", ["gutenberg", "chatt"])])
def test_a_misspelt_source_in_a_curriculum_is_refused_wherever_it_is(where, key, value):
    curriculum = {key: value}
    overrides = {"top": {"curriculum": curriculum}, "train": {"train": {"ANDREA-tiny": {"curriculum": curriculum}}},
                 "study": {"studies": {"s": {**STUDY, "curriculum": curriculum}}},
                 "arm": {"studies": {"s": {**STUDY, "arms": {"a": {"curriculum": curriculum}}}}}}[where]
    key_path = {"top": "curriculum", "train": "train.ANDREA-tiny.curriculum", "study": "studies.s.curriculum",
                "arm": "studies.s.arms.a.curriculum"}[where]
    with pytest.raises(ConfigError, match=rf"{key_path}\.{key}: no source 'chatt' .*did you mean `chat`"):
        load_config(REPO / "config" / "config.yaml", overrides=overrides)


def test_a_source_of_a_data_profile_or_disabled_is_a_name_a_curriculum_may_weigh():
    c = load_config(REPO / "config" / "config.yaml")
    profile_only = sorted(known_sources(c) - set(c["sources"]))
    disabled = {"sources": {"chat": {"enabled": False}}}
    load_config(REPO / "config" / "config.yaml", overrides={**disabled, "curriculum": {"weights": {"chat": 0.5}}})
    if profile_only:  # a source only a data profile has
        load_config(REPO / "config" / "config.yaml", overrides={"curriculum": {"warmup_sources": profile_only[:1]}})


def test_the_shipped_warmup_names_pass_in_a_config_trimmed_to_a_few_sources(tmp_path):
    # a config of its own (no data profiles) keeps the schema's default warm-up list, most of whose names
    # it has no source for: they are left out by the trainer, not refused (only other names must exist)
    c = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    c["sources"] = {k: v for k, v in c["sources"].items() if k in ("chat", "gutenberg")}
    c.pop("profiles", None)
    c["data_profile"] = None
    c["models"] = {"ANDREA-tiny": c["models"]["ANDREA-tiny"]}
    c["train"] = {k: v for k, v in c["train"].items() if k in ("defaults", "ANDREA-tiny")}
    c["studies"] = {}
    c["curriculum"].pop("warmup_sources", None)
    cfg = validate_config(c)
    assert "smoltalk" in cfg["curriculum"]["warmup_sources"] and "smoltalk" not in known_sources(cfg)


def test_two_studies_with_one_workflow_target_are_refused_naming_both():
    with pytest.raises(ConfigError, match=r"study_a_b is also study 'a-b'"):
        load_config(REPO / "config" / "config.yaml", overrides={"studies": {"a-b": STUDY, "a_b": STUDY}})


def test_a_study_arm_name_must_be_a_folder_name():
    with pytest.raises(ConfigError, match="arms"):
        study_config(arms={"a/b": {}})


def test_tokens_to_target_interpolates_between_validations():
    curve = [{"tokens": 0, "mean": 4.0}, {"tokens": 100, "mean": 3.0}, {"tokens": 200, "mean": 2.0}, {"tokens": 300, "mean": 2.2}]
    assert tokens_to_target(curve, 2.5) == pytest.approx(150.0)
    assert tokens_to_target(curve, 2.0) == pytest.approx(200.0)
    assert tokens_to_target(curve, 4.5) == 0  # already there at the start
    assert tokens_to_target(curve, 1.9) is None  # never reached


def test_overall_figures_weigh_sources_as_documented():
    # two sources: a big one at 1 bit/byte, a small one at 3 (nats/token and bytes/token differ)
    src = {"big": {"loss": 2.0, "bpb": 1.0}, "small": {"loss": 6.0, "bpb": 3.0}}
    # token-weighted by corpus tokens 99:1 → close to the big one's; exactly Σ W·nats / Σ W·nats/bpb
    assert weighted_bpb(src, {"big": 99, "small": 1}) == pytest.approx((99 * 2 + 6) / (99 * 2 / 1 + 6 / 3))
    assert weighted_bpb(src, {"big": 1, "small": 1}) == pytest.approx(8 / 4)
    assert mean_spread([1.0, 3.0]) == {"mean": 2.0, "spread": pytest.approx(math.sqrt(2)), "n": 2, "values": [1.0, 3.0]}
    assert mean_spread([2.5])["spread"] == 0.0


def fake_run(finals: dict, budget: float, start=4.0, points=11) -> dict:
    """A run whose every source falls linearly from `start` to its final value over the budget."""
    curve = []
    for i in range(points):
        f = i / (points - 1)
        s = {k: start + f * (v - start) for k, v in finals.items()}
        curve.append({"step": i, "tokens": f * budget, "validation_overall": None, "mean": sum(s.values()) / len(s),
                      "weighted": sum(s.values()) / len(s), "sources": s})
    return {"curve": curve, "drawn": {"a": budget / 2, "b": budget / 2}, "tokens": budget, "step": points - 1, "run_dir": ""}


def reaching_run(at: float, finals: dict, budget: float) -> dict:
    """A run whose every source falls linearly from 4 to just under 2.0 bits/byte at fraction `at`
    of the budget (the mean over sources reaches the target 2.0 there), then on to `finals`."""
    grid = sorted({i / 10 for i in range(11)} | ({at} if at <= 1 else set()))
    curve = []
    for f in grid:
        if f <= at:
            s = {k: 4.0 + f / at * (1.9999 - 4.0) for k in finals}
        else:
            s = {k: 1.9999 + (f - at) / (1 - at) * (v - 1.9999) for k, v in finals.items()}
        mean = sum(s.values()) / len(s)
        curve.append({"step": f, "tokens": f * budget, "validation_overall": None, "mean": mean, "weighted": mean, "sources": s})
    return {"curve": curve, "drawn": {"a": budget / 2, "b": budget / 2}, "tokens": budget, "step": 10, "run_dir": ""}


def goal_study(arms: dict[str, tuple[list[float], dict]]):
    """A study of a uniform baseline (final 2.0 ± 0.01 on both sources, mean over sources 2.0)
    and learning arms: name → (where each of 3 seeds reaches the target, final per-source figures)."""
    c = study_config(arms={"uniform": {"curriculum": {"mode": "uniform"}},
                           **{a: {"curriculum": {"mode": "exp3_loss"}} for a in arms}})
    budget = study_max_steps(c, "s") * 1024
    runs = {}
    for seed, jitter in zip((0, 1, 2), (-0.01, 0.0, 0.01)):
        runs[("uniform", seed)] = fake_run({"a": 2.0 + jitter, "b": 2.0 - jitter}, budget)
        for arm, (at, finals) in arms.items():
            runs[(arm, seed)] = reaching_run(at[seed], finals, budget)
    out = summarise(c, "s", runs, {"a": 1000, "b": 1000})
    assert out["best_baseline"] == "uniform" and out["target"] == pytest.approx(2.0)
    return out


def test_the_goal_is_the_mean_saving_over_seeds_with_the_worst_seed_beside_it():
    same = {"a": 1.9, "b": 1.9}
    out = goal_study({"mean": ([0.5, 0.5, 1.0], same), "under": ([0.81] * 3, same), "over": ([0.79] * 3, same)})
    # 50 %, 50 % and 100 % of the budget: mean tokens 2/3 of it, a saving of 1/3 meets the goal,
    # though the worst seed saves nothing, and the table says so
    tt = out["arms"]["mean"]["to_target"]
    assert tt["saving"] == pytest.approx(1 / 3, abs=1e-3) and tt["min_saving"] == pytest.approx(0.0, abs=1e-3)
    assert tt["meets_goal"] and tt["worse_sources"] == []
    # just under 20 % and just over it
    assert out["arms"]["under"]["to_target"]["saving"] == pytest.approx(0.19, abs=1e-3)
    assert not out["arms"]["under"]["to_target"]["meets_goal"]
    assert out["arms"]["over"]["to_target"]["saving"] == pytest.approx(0.21, abs=1e-3)
    assert out["arms"]["over"]["to_target"]["meets_goal"]
    head, rows = tables(out)["Validation bits per byte at the end of the budget (mean ± spread over seeds)"]
    row = dict(zip(head, next(r for r in rows if r[0] == "mean")))
    assert row["fewer tokens than the budget (mean over seeds)"] == "33.3 %" and row["worst seed"] == "0.0 %"
    assert row["goal"] == "MET"
    verdict = _verdict(out)
    assert verdict.startswith("Verdict: mean, over meet the goal") and "worst seed 0.0 %" in verdict


def test_a_source_worse_than_the_baseline_by_more_than_its_seed_spread_fails_the_goal():
    # the baseline's source b: 2.01, 2.0, 1.99 → 2.0 ± 0.01; a mean over sources better than the target
    out = goal_study({"within": ([0.5] * 3, {"a": 1.5, "b": 2.005}), "beyond": ([0.5] * 3, {"a": 1.5, "b": 2.05})})
    assert out["arms"]["uniform"]["sources"]["b"]["spread"] == pytest.approx(0.01)
    within, beyond = out["arms"]["within"]["to_target"], out["arms"]["beyond"]["to_target"]
    assert within["worse_sources"] == [] and within["meets_goal"]
    assert beyond["worse_sources"] == ["b"] and not beyond["meets_goal"]
    assert beyond["saving"] == pytest.approx(0.5, abs=1e-3)  # the saving alone would have met it


def test_the_goal_needs_every_seed_to_reach_the_target_and_three_seeds():
    out = goal_study({"two": ([0.5, 0.5, 2.0], {"a": 1.9, "b": 1.9})})  # seed 2 never reaches it
    tt = out["arms"]["two"]["to_target"]
    assert tt["reached"] == 2 and not tt["meets_goal"]
    assert out["arms"]["uniform"]["epochs"] == {"a": pytest.approx(out["budget_tokens"] / 2 / 1000),
                                                "b": pytest.approx(out["budget_tokens"] / 2 / 1000)}


def test_a_damaged_run_or_shards_record_is_named_with_what_is_missing(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"run_dir": str(tmp_path), "step": 3}))
    with pytest.raises(ValueError, match=r"run\.json: no 'tokens_seen' in the run's record"):
        read_run(tmp_path, {})
    shards = tmp_path / "shards.json"
    shards.write_text(json.dumps({"sources": {"chat": {"n_docs": 3}}}))
    with pytest.raises(ValueError, match=r"shards\.json: no 'n_tokens' in the shards' record"):
        write_study(study_config(), "s", {}, shards, {})


def test_a_run_without_a_validated_source_is_named():
    c = study_config(arms={"uniform": {"curriculum": {"mode": "uniform"}}})
    runs = {("uniform", s): fake_run({"a": 2.0}, 1000) for s in (0, 1, 2)}
    for p in runs[("uniform", 1)]["curve"]:
        p.update(mean=None, sources={})
    with pytest.raises(ValueError, match="arm uniform seed 1 .* no source with a validation figure"):
        summarise(c, "s", runs, {"a": 1000})


@pytest.mark.slow
def test_a_tiny_study_runs_end_to_end_through_snakemake(workflow_dir):
    """2 arms × 2 seeds of ANDREA-tiny on the embedded corpus, 30 steps each, through the
    workflow: the table, the plots, the tokens-to-target figure, and the report."""
    study = {"model": "ANDREA-tiny", "tokens": 30_000, "seeds": [0, 1],
             "train": {"eval_every": 10, "eval_tokens": 512, "sample_every": 1000, "checkpoint_every": 10},
             # more held-out documents, so that several sources of the small corpus have a validation window
             "curriculum": {"warmup_steps": 10, "heldout_every": 4},
             "arms": {"bandit": {"description": "the data bandit as shipped", "curriculum": {"mode": "bandit"}},
                      "uniform": {"curriculum": {"mode": "uniform"}}}}
    overlay = workflow_dir / "study.yaml"
    overlay.write_text(yaml.safe_dump({"sources": {"repo-docstrings": {"max_docs": 200}}, "studies": {"tiny": study}}))
    snakemake(workflow_dir, "study_tiny", "--configfile", "config/config.yaml", str(overlay), "--cores", "2", timeout=600)
    out = workflow_dir / "results" / "studies" / "tiny"
    for name in ("report.html", "table.md", "summary.json", "curves.png", "sources.png", "mix.png"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["best_baseline"] == "uniform" and summary["budget_tokens"] == 30 * 1024
    assert len(summary["sources"]) >= 3 and set(summary["arms"]) == {"bandit", "uniform"}
    for arm, a in summary["arms"].items():
        assert a["final"]["mean"]["n"] == 2 and 0 < a["final"]["mean"]["mean"] < 8
        assert 0 < a["final"]["weighted"]["mean"] < 8 and set(a["sources"]) == set(summary["sources"])
        tt = a["to_target"]
        assert tt["of"] == 2 and all(t is None or 0 <= t <= summary["budget_tokens"] for t in tt["per_seed"])
    # the target is the baseline's mean final figure: at least one of its own seeds reaches it
    assert summary["target"] == pytest.approx(summary["arms"]["uniform"]["final"]["mean"]["mean"])
    assert summary["arms"]["uniform"]["to_target"]["reached"] >= 1
    for key, curves in summary["curves"].items():
        assert curves[0]["tokens"] == 0 and curves[-1]["tokens"] == summary["budget_tokens"], key
        assert curves[-1]["mean"] < curves[0]["mean"]  # the runs learned
    table = (out / "table.md").read_text()
    assert "uniform (best baseline)" in table and "Verdict:" in table and "tokens to target" in table
    page = (out / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 3 and "Verdict:" in page
    # each run trained in its own run directory, resumable; nothing left to do on a second call
    assert len(list((out / "runs").glob("*/seed*/*/checkpoints"))) == 4
    again = snakemake(workflow_dir, "study_tiny", "--configfile", "config/config.yaml", str(overlay))
    assert "Nothing to be done" in again.stdout + again.stderr
