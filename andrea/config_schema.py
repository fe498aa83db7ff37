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
# the mode of a curriculum section that names none: the schema's default (andrea/schemas/config.schema.yaml,
# curriculum.mode; tests/test_curriculum.py checks they agree). The static mix by tokens beat the bandit
# in the curriculum studies (issue 41)
DEFAULT_MODE = "proportional"
# The curriculum settings each mode reads, beside the ones every mode reads (the warm-up and the
# held-out documents): what a run's key hashes (andrea.curriculum.key_settings), so that a setting of another mode
# never starts a new run
COMMON_KEYS = ("warmup_steps", "heldout_every", "warmup_sources")
BANDIT_KEYS = ("ucb_c", "ema_alpha", "reward_scale", "phase_lengths", "focus_dice_warmup", "focus_dice",
               "background_weight", "coverage_bonus")
MODE_KEYS = {
    "bandit": BANDIT_KEYS,
    "bandit_normalised": BANDIT_KEYS,  # the bandit's settings; its reward alone differs
    "proportional": (),
    "uniform": (),
    "fixed": ("weights",),
    "exp3_loss": ("phase_lengths", "explore", "exp3_loss_scale", "exp3_smoothing"),
    "heldout_progress": ("explore", "progress_smoothing", "progress_sharpness"),
}


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key. `details`: the validator's
    full account (the schema of each failing key), shown only on request (--debug, ANDREA_DEBUG=1)."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text(encoding="utf-8"))
