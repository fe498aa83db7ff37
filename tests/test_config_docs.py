"""The configuration reference (config/README.md) is generated from the schema's descriptions and
must match it; every key of the schema is described."""

import re

from andrea.cli import main
from andrea.config import load_schema
from andrea.config_docs import config_docs
from conftest import REPO


SCHEMA = load_schema()


def resolved(sub, schema=SCHEMA):
    """A property's schema with its $refs followed, the property's own keys winning."""
    while "$ref" in sub:
        target = schema
        for part in sub["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        sub = {**target, **{k: v for k, v in sub.items() if k != "$ref"}}
    return sub


def is_mirror(sub) -> bool:
    """An override schema: its every key a bare $ref to the same key of the schema it overrides."""
    return bool(sub.get("properties")) and all(set(p) == {"$ref"} for p in sub["properties"].values())


def schema_properties(node, path=""):
    """(dotted path, schema) of every property at every level, $defs included; a property that is
    a $ref is reported with its own keys (its description sits beside the $ref), a bare $ref with
    the keys of what it refers to."""
    for key, sub in node.get("properties", {}).items():
        yield f"{path}.{key}" if path else key, resolved(sub) if set(sub) == {"$ref"} else sub
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
    schema = load_schema()
    mirrors = [name for name, sub in schema["$defs"].items() if is_mirror(sub)]
    assert sorted(mirrors) == ["curriculum_override", "geometry_override", "train_override"]
    leaves = [p for p, sub in schema_properties(schema)
              if not ("properties" in resolved(sub) and not is_mirror(resolved(sub))  # a section, not a row
                      or isinstance(sub.get("additionalProperties"), dict) and "properties" in sub["additionalProperties"])
              and p.split(".")[0] not in ("train",)  # train's keys are the $defs' (one table for defaults and models)
              and not any(p.startswith(f"$defs.{m}.") for m in mirrors)]  # overrides: documented by what they override
    assert sorted(rows) == sorted(p.rsplit(".", 1)[-1] for p in leaves)

    def section(title):
        return doc.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]

    train = section("`train.defaults` and `train.<model>`")
    assert "| `lr` | number &gt; 0 | `0.0003` | starts a new run |" in train  # the schema's defaults
    assert "| `curriculum` | mapping: keys of `curriculum` | — | starts a new run |" in train
    assert "| `beta2` | number in [0, 1) | `0.999` |" in train and "| `seq_len` | integer or null ≥ 8 | `null` |" in train
    assert "| `max_steps` | integer ≥ 1 | `200000` | continues the run |" in train
    assert '| `turn_separator` | string | `"\\n\\n"` |' in section("`megachat`")  # escapes shown as written in YAML
    assert "| `d_model` | integer ≥ 8 | required |" in section("`models.<model>`")
    assert "results/&lt;name&gt;/ckpt" in section("`models.<model>`")  # not an HTML tag that would vanish


def test_the_cli_writes_the_reference(tmp_path, capsys):
    assert main(["config", "docs", "--output", str(tmp_path / "README.md")]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == config_docs()
    assert main(["config", "docs"]) == 0
    assert capsys.readouterr().out == config_docs()
