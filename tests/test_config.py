import pytest
import yaml

from andrea.config import ConfigError, load_config, validate_config, vocab_size
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


def test_missing_and_unparsable_config_files(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


@pytest.mark.slow
def test_workflow_refuses_bad_config_before_any_job(workflow_dir):
    cfg = shipped()
    cfg["filter_shape"]["treshold"] = 0.4
    (workflow_dir / "config" / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = snakemake(workflow_dir, check=False)
    assert proc.returncode != 0
    assert "treshold" in proc.stdout + proc.stderr
    assert not (workflow_dir / "results").exists()
