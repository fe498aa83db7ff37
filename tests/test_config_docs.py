"""The configuration reference (config/README.md) is generated from the schema's descriptions and
must match it; every key of the schema is described."""

import re

from andrea.cli import main
from andrea.config import TRAIN_DEFAULTS, config_docs, load_schema
from conftest import REPO


def schema_properties(node, path=""):
    """(dotted path, schema) of every property at every level, $defs included; a property that is
    a $ref is reported with its own keys (its description sits beside the $ref)."""
    for key, sub in node.get("properties", {}).items():
        yield f"{path}.{key}" if path else key, sub
        yield from schema_properties(sub, f"{path}.{key}" if path else key)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        yield from schema_properties(extra, f"{path}.<name>")
    if isinstance(node.get("items"), dict):
        yield from schema_properties(node["items"], f"{path}[]")
    for name, sub in node.get("$defs", {}).items():
        yield from schema_properties(sub, f"$defs.{name}")


def test_every_property_of_the_schema_has_a_description():
    props = list(schema_properties(load_schema()))
    assert len(props) > 100  # the walk reaches every level: sources, models, judge, prompts, $defs
    missing = [p for p, sub in props if not str(sub.get("description") or "").strip()]
    assert not missing, f"properties without a description in andrea/schemas/config.schema.yaml: {missing}"


def test_the_committed_reference_is_the_generated_one():
    committed = (REPO / "config" / "README.md").read_text(encoding="utf-8")
    assert committed == config_docs(), "config/README.md is stale: run `andrea config docs --output config/README.md`"


def test_the_reference_has_a_row_for_every_key_with_its_default():
    doc = config_docs()
    rows = re.findall(r"^\| `([^`]+)` \| ", doc, re.M)
    leaves = [p for p, sub in schema_properties(load_schema())
              if not ({"properties", "$ref"} & set(sub) or isinstance(sub.get("additionalProperties"), dict) and "properties" in sub["additionalProperties"])
              and p.split(".")[0] not in ("train",)]  # train's keys are the $defs' (one table for defaults and models)
    assert sorted(rows) == sorted(p.rsplit(".", 1)[-1] for p in leaves)

    def section(title):
        return doc.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]

    train = section("`train.defaults` and `train.<model>`")
    assert f"| `lr` | number &gt; 0 | `{TRAIN_DEFAULTS['lr']}` | starts a new run |" in train  # defaults from the trainer's table
    assert "| `max_steps` | integer ≥ 1 | `200000` | continues the run |" in train
    assert '| `turn_separator` | string | `"\\n\\n"` |' in section("`megachat`")  # escapes shown as written in YAML
    assert "| `d_model` | integer ≥ 8 | required |" in section("`models.<model>`")
    assert "results/&lt;name&gt;/ckpt" in section("`models.<model>`")  # not an HTML tag that would vanish


def test_the_cli_writes_the_reference(tmp_path, capsys):
    assert main(["config", "docs", "--output", str(tmp_path / "README.md")]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == config_docs()
    assert main(["config", "docs"]) == 0
    assert capsys.readouterr().out == config_docs()
