import copy
import dataclasses

import pytest
import yaml

from andrea.config import SCHEMA_PATH, ConfigError, load_config, load_schema, train_settings, validate_config
from andrea.config_docs import show_config
from andrea.model import vocab_size
from andrea.optim import OptimConfig
from andrea.settings import CurriculumSettings, TrainSettings
from andrea.sources import ADAPTERS
from conftest import REPO, snakemake


def shipped():
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def test_shipped_config_is_valid_and_defaults_are_filled():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert cfg["sources"]["chat"]["max_docs"] is None  # default filled inside a map entry
    assert cfg["sources"]["chat"]["enabled"] is True
    assert cfg["hermes3"]["categories"]["hermes3-roleplay"]
    assert cfg["filter_shape"]["threshold"] == 0.5


def test_model_table_matches_spec_vocabularies():
    cfg = load_config(REPO / "config" / "config.yaml")
    assert vocab_size(cfg["models"]["ANDREA-12M"]) == 4353
    assert vocab_size(cfg["models"]["ANDREA-120M"]) == 8449
    assert vocab_size(cfg["models"]["ANDREA-480M"]) == 16641
    assert "ANDREA-tiny" in cfg["models"]


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c.update(surprise=1), "surprise"),
        (lambda c: c["filter_shape"].update(treshold=0.4), "treshold"),
        (lambda c: c["sources"]["chat"].update(locaton="x"), "locaton"),
        (lambda c: c["filter_shape"].update(threshold="high"), "filter_shape.threshold"),
        (lambda c: c["models"]["ANDREA-tiny"].update(n_layer=0), "models.ANDREA-tiny.n_layer"),
        (lambda c: c["sources"]["chat"].update(adapter="nope"), "sources.chat.adapter"),
        (lambda c: c["hermes3"].update(hub_timeout_s=600), "hermes3.hub_timeout_s"),
        (lambda c: c["train"]["defaults"].update(lr="fast"), "train.defaults.lr"),
        (lambda c: c["train"]["ANDREA-tiny"].update(batch_size=2.5), "train.ANDREA-tiny.batch_size"),
        (lambda c: c["train"]["ANDREA-tiny"].update(lrr=1.0), "lrr"),
        (lambda c: c["train"]["ANDREA-tiny"]["curriculum"].update(focus_dice="four"), "train.ANDREA-tiny.curriculum.focus_dice"),
        (lambda c: c["train"]["defaults"].update(curriculum={"ucb": 1.0}), "ucb"),
        (lambda c: c["curriculum"].update(phase_lengths=[7, "x"]), "curriculum.phase_lengths"),
        (lambda c: c["train"].update({"ANDREA-tny": {"lr": 1.0e-3}}), "train.ANDREA-tny"),
    ],
)
def test_bad_config_names_the_key(mutate, key):
    cfg = shipped()
    mutate(cfg)
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert key in str(e.value)


def test_semantic_checks_name_the_key():
    cfg = shipped()
    cfg["models"]["ANDREA-tiny"]["n_head"] = 3
    with pytest.raises(ConfigError, match=r"models\.ANDREA-tiny\.d_model"):
        validate_config(cfg)
    cfg = shipped()
    cfg["sources"]["chat"]["adapter"] = "hermes3"
    with pytest.raises(ConfigError, match=r"sources\.chat\.adapter"):
        validate_config(cfg)


def test_the_schema_names_exactly_the_registered_adapters():
    """sources.<source>.adapter's enum is the @adapter registry (andrea.sources): a new adapter is
    registered and added to the schema together, or a config could name one the stage cannot run."""
    enum = load_schema()["properties"]["sources"]["additionalProperties"]["properties"]["adapter"]["enum"]
    assert sorted(enum) == sorted(ADAPTERS)
    assert len(enum) == len(set(enum))


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_hub_location_is_refused_exactly_for_the_adapters_registered_without_one(adapter):
    cfg = shipped()
    name = "hermes3-general" if adapter == "hermes3" else "chat"  # only the hermes3 parts take that adapter
    cfg["sources"][name].update(adapter=adapter, location="hub:someone/data@main")
    spec = ADAPTERS[adapter]
    if spec.from_hub:
        validate_config(cfg)
    else:
        with pytest.raises(ConfigError) as e:
            validate_config(cfg)
        assert str(e.value).endswith(f"sources.{name}.location: hub datasets are not supported here: {spec.not_from_hub}")


def test_missing_and_unparsable_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_values_typed_as_text_are_coerced_to_the_schema_types():
    """What `snakemake --config force_train=true strict=yes` passes (strings; `=1` an integer) is
    read as the YAML file would be; a string setting keeps its text."""
    cfg = shipped()
    cfg.update(force_train="true", strict="YES", data_profile="embedded")
    cfg["train"]["defaults"].update(max_steps="600", lr="1e-3", seq_len="null")
    cfg["filter_shape"]["threshold"] = "0.7"
    cfg["sources"]["chat"]["enabled"] = 0
    cfg["sources"]["chat"]["optional"] = "No"
    out = validate_config(cfg)
    assert out["force_train"] is True and out["strict"] is True and out["data_profile"] == "embedded"
    assert out["train"]["defaults"]["max_steps"] == 600 and out["train"]["defaults"]["lr"] == 1e-3
    assert out["train"]["defaults"]["seq_len"] is None and out["filter_shape"]["threshold"] == 0.7
    assert out["sources"]["chat"]["enabled"] is False and out["sources"]["chat"]["optional"] is False
    for flag in ("true", "false", "yes", "no", "1", "0", "True", "FALSE"):
        assert validate_config({**shipped(), "force_train": flag})["force_train"] is (flag.lower() in ("true", "yes", "1"))
    with pytest.raises(ConfigError) as e:
        validate_config({**shipped(), "force_train": "maybe"})
    assert str(e.value).splitlines()[1] == "  force_train: 'maybe' is not a boolean (true or false; also yes/no, 1/0)"


def test_a_mistyped_key_is_two_lines_with_the_nearest_key():
    cfg = shipped()
    cfg["train"]["defaults"]["max_stpes"] = 600
    cfg["train"]["ANDREA-tny"] = {"lr": 1e-3}
    with pytest.raises(ConfigError) as e:
        validate_config(cfg, source="config/config.yaml")
    assert str(e.value).splitlines() == ["config/config.yaml is invalid:",
                                         "  train.defaults.max_stpes: unknown key; did you mean `max_steps`?"]
    assert "Failed validating" in e.value.details and "max_stpes" in e.value.details  # the full account, for --debug
    del cfg["train"]["defaults"]["max_stpes"]
    with pytest.raises(ConfigError, match="did you mean `ANDREA-tiny`"):
        validate_config(cfg)
    with pytest.raises(ConfigError, match=r"^config is invalid:\n  surprise: unknown key$"):
        validate_config({**shipped(), "surprise": 1})  # nothing near it: no guess


def test_missing_input_locations_fail_at_load_naming_the_key_and_what_to_do(tmp_path):
    from andrea.config import check_locations_exist

    cfg = shipped()
    cfg["sources"]["chat"]["location"] = str(tmp_path / "missing" / "chat.jsonl")
    cfg["sources"]["irc"].update(location=str(tmp_path / "no-irc"), optional=True)
    cfg["sources"]["gutenberg"].update(location=str(tmp_path / "no-books"), enabled=False)
    config = validate_config(cfg)
    with pytest.raises(ConfigError) as e:
        check_locations_exist(config, "config/config.yaml", ["embedded"])
    msg = str(e.value)
    assert f"sources.chat.location: {tmp_path}/missing/chat.jsonl does not exist" in msg and "\n" not in msg
    assert "enabled: false" in msg and "optional: true" in msg and "gutenberg" not in msg and "irc" not in msg
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "chat.jsonl").write_text("")
    (warning,) = check_locations_exist(config, "config/config.yaml", ["embedded"])
    assert "sources.irc.location" in warning and "optional" in warning
    # a profile's own location is named where it is written; hub datasets are not paths
    cfg = shipped()
    cfg["profiles"]["real"]["sources"]["gutenberg"] = {"location": str(tmp_path / "gone"), "licence": "public domain"}
    with pytest.raises(ConfigError, match=r"profiles\.real\.sources\.gutenberg\.location: .*gone does not exist"):
        check_locations_exist(validate_config(cfg), "config/config.yaml")
    assert check_locations_exist(validate_config(shipped()), "config/config.yaml") == []


@pytest.mark.slow
def test_workflow_refuses_bad_config_before_any_job(workflow_dir):
    cfg = shipped()
    cfg["filter_shape"]["treshold"] = 0.4
    (workflow_dir / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(workflow_dir, check=False)
    assert proc.returncode != 0
    assert "treshold" in proc.stdout + proc.stderr
    assert not (workflow_dir / "results").exists()


# ---------------------------------------------------------------------------- training settings


def test_a_setting_missing_from_the_file_takes_the_schema_default():
    schema = load_schema()
    train_defaults = {k: s["default"] for k, s in schema["$defs"]["train_settings"]["properties"].items() if "default" in s}
    curriculum_defaults = {k: s["default"] for k, s in schema["properties"]["curriculum"]["properties"].items()}
    cfg = shipped()
    del cfg["train"], cfg["curriculum"]  # every training and curriculum setting left out
    s = TrainSettings.from_config(validate_config(cfg), "ANDREA-tiny")
    assert s.as_dict() == {**train_defaults, "curriculum": curriculum_defaults}
    assert (s.lr, s.beta2, s.seq_len, s.sample_prompt) == (3.0e-4, 0.999, None, "> Tell me about the sea.\n\n< ")
    assert s.curriculum.ucb_c == 14.142 and s.curriculum.phase_lengths == (7, 14, 21, 28, 42)
    assert OptimConfig.of(s) == OptimConfig()  # the optimizer's fallbacks are the schema's defaults


def test_a_model_entry_overrides_train_defaults_which_override_the_schema():
    cfg = shipped()
    cfg["train"]["defaults"].update(lr=1.0e-3, seed=7, curriculum={"ucb_c": 2.0, "focus_dice": 2})
    cfg["train"]["ANDREA-tiny"]["seed"] = 9
    cfg["train"]["ANDREA-tiny"]["curriculum"]["focus_dice"] = 3  # beside its warmup_steps: 150
    cfg["curriculum"].update(mode="bandit", ema_alpha=0.2, ucb_c=5.0)  # (the bandit's settings: its mode named)
    cfg = validate_config(cfg)
    tiny, small = TrainSettings.from_config(cfg, "ANDREA-tiny"), TrainSettings.from_config(cfg, "ANDREA-12M")
    assert (tiny.lr, tiny.seed, small.lr, small.seed) == (2.0e-3, 9, 1.0e-3, 7)  # tiny's own lr wins
    assert (tiny.curriculum.focus_dice, small.curriculum.focus_dice) == (3, 2)
    assert tiny.curriculum.ucb_c == small.curriculum.ucb_c == 2.0  # train.defaults.curriculum over curriculum
    assert tiny.curriculum.ema_alpha == 0.2 and tiny.curriculum.warmup_steps == 150
    assert "lr" not in cfg["train"]["ANDREA-12M"]  # no defaults filled into a model's entry


def test_snakemake_fills_the_same_defaults_as_the_andrea_commands():
    """Snakemake's validate (set_default=True, which a workflow importing this config may call
    first) must not fill a model's train entry with the built-in defaults, which would then beat
    train.defaults."""
    from snakemake.utils import validate

    raw = shipped()
    raw["train"]["defaults"]["lr"] = 1.0e-3
    del raw["curriculum"]
    by_snakemake = copy.deepcopy(raw)
    validate(by_snakemake, str(SCHEMA_PATH))
    assert validate_config(by_snakemake) == validate_config(raw)
    assert train_settings(validate_config(by_snakemake), "ANDREA-12M")["lr"] == 1.0e-3


def test_the_settings_classes_cover_the_schema_and_reject_unknown_keys():
    schema = load_schema()
    assert [f.name for f in dataclasses.fields(TrainSettings)] == list(schema["$defs"]["train_settings"]["properties"])
    assert [f.name for f in dataclasses.fields(CurriculumSettings)] == list(schema["properties"]["curriculum"]["properties"])
    # a model's entry and the curriculum overrides take exactly the same keys
    assert list(schema["$defs"]["train_override"]["properties"]) == list(schema["$defs"]["train_settings"]["properties"])
    assert list(schema["$defs"]["curriculum_override"]["properties"]) == list(schema["properties"]["curriculum"]["properties"])
    good = train_settings(load_config(REPO / "config" / "config.yaml"), "ANDREA-tiny")
    assert TrainSettings.from_dict(good).as_dict() == good
    with pytest.raises(ConfigError, match="train: unknown setting 'lerning_rate'"):
        TrainSettings.from_dict({**good, "lerning_rate": 1.0})
    with pytest.raises(ConfigError, match="train.curriculum: unknown setting 'ucb'"):
        TrainSettings.from_dict({**good, "curriculum": {**good["curriculum"], "ucb": 1.0}})
    with pytest.raises(ConfigError, match="missing setting 'beta1'"):
        TrainSettings.from_dict({k: v for k, v in good.items() if k != "beta1"})
    with pytest.raises(ConfigError, match="train.batch_size: expected int"):
        TrainSettings.from_dict({**good, "batch_size": 8.0})
    with pytest.raises(ConfigError, match="curriculum.warmup_sources: expected a list of str"):
        CurriculumSettings.from_dict({**good["curriculum"], "warmup_sources": "chat"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        TrainSettings.from_dict(good).lr = 1.0


def test_config_show_marks_the_values_that_came_from_defaults(tmp_path, capsys):
    from andrea.cli import main

    cfg = shipped()
    cfg["train"]["defaults"]["lr"] = 1.0e-3
    del cfg["models"]["ANDREA-12M"]["n_segments"]  # invalid: show refuses it like every command
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match="n_segments"):
        show_config(path)
    cfg["models"]["ANDREA-12M"]["n_segments"] = 4096
    path.write_text(yaml.safe_dump(cfg))

    text = show_config(path)
    assert yaml.safe_load(text) == load_config(path)  # the effective config, as YAML
    lines = text.splitlines()
    assert "    lr: 0.001" in lines  # set in the file: no mark
    assert "    beta1: 0.9  # default" in lines and "    mlp_ratio: 4  # default" in lines
    assert "  ucb_c: 14.142  # default" in lines
    assert "  warmup_sources: [hermes3-general, hermes3-creative, hermes3-roleplay, chat, smoltalk, oasst, gutenberg]" in lines

    assert main(["config", "show", "--config", str(path), "--model", "ANDREA-tiny"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert yaml.safe_load(out)["train"] == train_settings(load_config(path), "ANDREA-tiny")
    assert "  lr: 0.002" in lines  # train.ANDREA-tiny's own
    assert "  batch_size: 8  # default" in lines and "  backend: auto  # train.defaults" in lines
    assert "    warmup_steps: 150" in lines and "    ucb_c: 14.142  # default" in lines
    assert "    warmup_sources: [hermes3-general, hermes3-creative, hermes3-roleplay, chat, smoltalk, oasst, gutenberg]  # curriculum" in lines
    assert '  sample_prompt: "> Tell me about the sea.\\n\\n< "  # default' in lines
    assert "  mlp_ratio: 4  # default" in lines and "  d_model: 128" in lines
    with pytest.raises(ConfigError, match="unknown model 'nope'"):
        show_config(path, "nope")


# ---------------------------------------------------------------------------- versions: what changed, where results are


def test_a_new_version_names_the_settings_that_made_it(tmp_path):
    """After a build, a changed setting is named with its old and new value: a data stage's own
    parameter, and a model's training setting (its checkpoint records the version it was trained at)."""
    import json

    from andrea.versions import record_versions, stage_versions, train_version, version_changes

    old = load_config(REPO / "config" / "config.yaml", overrides={"results_dir": str(tmp_path / "results")})
    record_versions(old, ["embedded"])
    for stage, v in stage_versions(old).items():  # the old build's folders
        (tmp_path / "results" / "data" / stage / (f"N1024-{v}" if stage in ("train_tokenizer", "encode") else v)).mkdir(parents=True)
    ckpt = tmp_path / "results" / "ANDREA-tiny" / "ckpt"
    ckpt.mkdir(parents=True)
    (ckpt / "run.json").write_text(json.dumps({"train_version": train_version(old, "ANDREA-tiny"), "train": {}}))
    assert version_changes(old, ["embedded"]) == []

    new = copy.deepcopy(old)
    new["filter_shape"]["threshold"] = 0.7
    new["train"]["ANDREA-tiny"]["max_steps"] = old["train"]["ANDREA-tiny"]["max_steps"] + 200
    lines = version_changes(new, ["embedded"])
    assert lines[0] == "filter_shape (data profile embedded): filter_shape.threshold 0.5 → 0.7"
    assert lines[1].startswith("train (ANDREA-tiny): data version ")
    assert lines[1].endswith(f"; max_steps {old['train']['ANDREA-tiny']['max_steps']} → {new['train']['ANDREA-tiny']['max_steps']}")
    assert len(lines) == 2  # the stages after filter_shape changed only through it: not listed


def test_the_closing_lines_name_the_model_report_and_logs_of_the_targets(tmp_path):
    import json

    from andrea.versions import where_results

    cfg = load_config(REPO / "config" / "config.yaml", overrides={"results_dir": str(tmp_path / "r")})
    res = tmp_path / "r"
    (res / "ANDREA-tiny" / "ckpt").mkdir(parents=True)
    (res / "ANDREA-tiny" / "ckpt" / "run.json").write_text(json.dumps({"run_dir": f"{res}/ANDREA-tiny/runs/abc"}))
    (res / "ANDREA-tiny" / "audit").mkdir()
    (res / "ANDREA-tiny" / "audit" / "report.html").write_text("<html>")
    (res / "logs" / "train").mkdir(parents=True)
    (res / "ANDREA-12M" / "ckpt").mkdir(parents=True)  # not a target of this run
    lines = where_results(cfg, [f"{res}/ANDREA-tiny/audit"])
    assert lines == ["ANDREA-tiny:",
                     f"  checkpoint       {res}/ANDREA-tiny/ckpt/ (final.bin, best.bin, run.json)",
                     f"  run directory    {res}/ANDREA-tiny/runs/abc/ (train.log, loss.jsonl, checkpoints)",
                     f"  audit report     {res}/ANDREA-tiny/audit/report.html",
                     f"logs: {res}/logs/ (one folder per stage; `andrea versions` lists the data directories)"]
    assert where_results(cfg, [f"{res}/data/filter_shape/x/megachat.parquet"]) == [lines[-1]]


def test_a_bandit_setting_without_a_named_mode_is_an_error_under_the_default():
    """Since the default mode became proportional (issue 41), a curriculum section written for the bandit
    when it was the default (ucb_c, background_weight, ... and no `mode` here or above) would silently
    change nothing: it is an error naming the key and the fix. Named anywhere up the chain (the section,
    the top level, train.<model>, the study), another mode's settings stay allowed, as documented."""
    cfg = shipped()
    cfg["curriculum"]["ucb_c"] = 3.0
    with pytest.raises(ConfigError, match=r"curriculum\.ucb_c: a setting of mode bandit.*Add `mode: bandit`"):
        validate_config(cfg)
    cfg["curriculum"]["mode"] = "bandit"
    validate_config(cfg)  # named at the top level: the bandit's, as before

    cfg = shipped()
    cfg["train"]["ANDREA-tiny"] = {"curriculum": {"phase_lengths": [3, 5]}}
    with pytest.raises(ConfigError, match=r"train\.ANDREA-tiny\.curriculum\.phase_lengths: a setting of mode bandit"):
        validate_config(cfg)
    cfg["train"]["ANDREA-tiny"]["curriculum"]["mode"] = "exp3_loss"
    validate_config(cfg)

    cfg = shipped()
    arms = cfg["studies"]["curriculum-12M"]["arms"] = dict(cfg["studies"]["curriculum-12M"]["arms"])  # (a YAML alias: shared)
    arms["flat-old"] = {"curriculum": {"background_weight": 1.0, "coverage_bonus": 0.0}}
    with pytest.raises(ConfigError, match=r"studies\.curriculum-12M\.arms\.flat-old\.curriculum\.background_weight"):
        validate_config(cfg)
    cfg["studies"]["curriculum-12M"]["curriculum"]["mode"] = "bandit"  # named by the study: its arms inherit it
    validate_config(cfg)
    cfg = shipped()
    cfg["curriculum"]["explore"] = 0.01  # read by exp3_loss and heldout_progress only, under a named mode: ignored
    cfg["curriculum"]["mode"] = "uniform"
    validate_config(cfg)
