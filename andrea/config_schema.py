"""The configuration's schema and its error: the bottom of the config modules.

andrea.config (load, validate, fill defaults) sits on top of andrea.profiles, which checks data
profiles and so needs the error type and the Hermes-3 part names before andrea.config exists:
they live here, and andrea.config re-exports them (`from andrea.config import ConfigError` stays
the way to name it).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

SCHEMA_PATH = Path(str(resources.files("andrea") / "schemas" / "config.schema.yaml"))
HERMES3_PARTS = ("hermes3-general", "hermes3-creative", "hermes3-roleplay")
# curriculum.mode's baselines: weights that never learn (andrea.curriculum.StaticMix); a study's
# target comes from them (andrea.config.study_baselines)
STATIC_MODES = ("proportional", "uniform", "fixed")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key. `details`: the validator's
    full account (the schema of each failing key), shown only on request (--debug, ANDREA_DEBUG=1)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
