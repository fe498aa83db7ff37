"""Every `--config key=value` example the documentation gives works: each is run through
Snakemake's own --config (a dry run of the workflow, in a copy of the shipped config), so the
README cannot recommend a setting that validation then refuses."""

import re
import shlex

import pytest

from conftest import REPO, snakemake

# where a user reads a --config example: the README, the configuration reference (generated from
# the schema's descriptions) and the Snakefile's header
DOCUMENTS = ("README.md", "config/README.md", "Snakefile")
# `snakemake ... --config k=v ...` (the whole command, within one line or code span), or a bare `--config k=v`
EXAMPLE = re.compile(r"(?:(snakemake\b[^`\n]*?)\s)?--config((?:\s+[A-Za-z_][\w.-]*=[^\s`;,)]+)+)")


def readme_examples() -> list[tuple[str, tuple[str, ...]]]:
    """(where, Snakemake arguments) of each distinct example, the command's own targets kept."""
    seen: dict[tuple[str, ...], str] = {}
    for doc in DOCUMENTS:
        for number, line in enumerate((REPO / doc).read_text(encoding="utf-8").splitlines(), 1):
            for m in EXAMPLE.finditer(line):
                command, pairs = m.group(1), m.group(2).split()
                args = shlex.split(command)[1:] if command else []
                while "--cores" in args:  # the test runs with --cores 1
                    i = args.index("--cores")
                    del args[i:i + 2]
                seen.setdefault((*args, "--config", *pairs), f"{doc}:{number}")
    return [(where, args) for args, where in seen.items()]


EXAMPLES = readme_examples()


def test_the_documentation_gives_the_examples_users_are_told_to_type():
    given = {a for _, args in EXAMPLES for a in args}
    assert {"force_train=true", "data_profile=embedded"} <= given


@pytest.mark.parametrize("where, args", EXAMPLES, ids=[w for w, _ in EXAMPLES])
def test_each_config_example_passes_through_snakemake(where, args, workflow_dir):
    proc = snakemake(workflow_dir, "-n", *args, check=False)
    assert proc.returncode == 0, f"{where}: snakemake -n {' '.join(args)}\n{proc.stderr[-2000:]}"
    assert "This was a dry-run" in proc.stdout


def test_each_example_value_means_what_it_says():
    """Snakemake's own parsing of each pair, then the config path the workflow takes: the value
    arrives as the schema's type (force_train=true is True, not the string 'true')."""
    from snakemake.cli import parse_config

    from andrea.config import load_config

    for where, args in EXAMPLES:
        pairs = args[args.index("--config") + 1:]
        overrides = parse_config(pairs)
        cfg = load_config(REPO / "config" / "config.yaml", overrides=overrides)
        for pair in pairs:
            key, _, text = pair.partition("=")
            expected = {"true": True, "false": False}.get(text.lower(), text)
            assert cfg[key] == expected, (where, pair, cfg[key])
