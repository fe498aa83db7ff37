"""Typed training and curriculum settings, built from the effective configuration.

The schema (andrea/schemas/config.schema.yaml) is the one home of every setting's type, default
and description; andrea.config fills the defaults when a config is loaded. These frozen dataclasses
are what the trainer, the optimizer and the bandit read: a model's settings after
train.defaults < train.<model> (andrea.config.train_settings), with attribute access instead of
dict lookups, and an error naming the key for anything unknown, missing or of the wrong type.

They have no defaults of their own, on purpose: a second table of defaults here would drift from
the schema's.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Mapping

from andrea.config import ConfigError, load_schema, train_settings


@dataclass(frozen=True)
class CurriculumSettings:
    """The curriculum's settings (the config's `curriculum` section, with a model's overrides)."""

    mode: str
    ucb_c: float
    ema_alpha: float
    reward_scale: float
    phase_lengths: tuple[int, ...]
    focus_dice_warmup: int
    focus_dice: int
    background_weight: float
    coverage_bonus: float
    warmup_steps: int
    heldout_every: int
    warmup_sources: tuple[str, ...]
    weights: dict | None
    explore: float
    exp3_loss_scale: float
    exp3_smoothing: float
    progress_smoothing: float
    progress_sharpness: float

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "curriculum") -> CurriculumSettings:
        return cls(**_checked(cls, d, where))

    def as_dict(self) -> dict:
        return _plain(self)


@dataclass(frozen=True)
class TrainSettings:
    """A model's effective training settings (design §3.3, §6); the schema's train_settings says
    what each one does."""

    backend: str
    precision: str
    batch_size: int
    grad_accum: int
    seq_len: int | None  # None: the model's context
    max_steps: int
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    beta1: float
    beta2: float
    grad_clip: float
    max_nonfinite: int
    checkpoint_every: int
    keep_checkpoints: int
    sample_every: int
    sample_tokens: int
    sample_prompt: str
    sample_temperature: float
    coherence_halt_below: float
    coherence_patience: int
    coherence_arm_score: float
    eval_every: int
    eval_tokens: int
    prefetch: bool
    ranks: int
    reduce_bucket_mb: float
    reduce_dtype: str
    record_batches: int
    seed: int
    max_cpu_hours: float
    curriculum: CurriculumSettings

    @classmethod
    def from_config(cls, config: dict, model: str) -> TrainSettings:
        """`model`'s settings in a config as load_config returns it (defaults filled)."""
        return cls.from_dict(train_settings(config, model), f"train.{model}")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "train") -> TrainSettings:
        values = _checked(cls, d, where)
        values["curriculum"] = CurriculumSettings.from_dict(values["curriculum"], f"{where}.curriculum")
        return cls(**values)

    def as_dict(self) -> dict:
        """The plain form (lists, not tuples) that andrea.config.train_settings returns."""
        return _plain(self)


def _plain(obj) -> dict:
    def plain(v):
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return [plain(x) for x in v] if isinstance(v, (tuple, list)) else v

    return plain(dataclasses.asdict(obj))


def _checked(cls, d: Mapping[str, Any], where: str) -> dict:
    """`d` as the keyword arguments of `cls`: every field present, nothing else, each of its type
    (ints pass for floats and are kept as written; sequences become tuples)."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(d).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in d if k not in hints]
    if unknown:
        raise ConfigError(f"{where}: unknown setting {', '.join(map(repr, unknown))}; the settings are {', '.join(names)}")
    missing = [k for k in names if k not in d]
    if missing:
        raise ConfigError(f"{where}: missing setting {', '.join(map(repr, missing))} (load the config with "
                          f"andrea.config.load_config, which fills the schema's defaults)")
    out = {}
    for k in names:
        v, hint = d[k], hints[k]
        if typing.get_origin(hint) is tuple:
            item = typing.get_args(hint)[0]
            if not isinstance(v, (list, tuple)) or not all(_is(x, item) for x in v):
                raise ConfigError(f"{where}.{k}: expected a list of {item.__name__}, got {v!r}")
            v = tuple(v)
        elif not _is(v, hint):
            raise ConfigError(f"{where}.{k}: expected {_name(hint)}, got {v!r}")
        out[k] = v
    return out


def _is(v, hint) -> bool:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_is(v, h) for h in typing.get_args(hint))
    if hint is type(None):
        return v is None
    if not isinstance(hint, type) or dataclasses.is_dataclass(hint):
        return True  # a nested section, checked by its own class
    if hint is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, hint)


def _name(hint) -> str:
    args = typing.get_args(hint)
    return " or ".join(_name(a) for a in args) if args else ("null" if hint is type(None) else hint.__name__)


def builtin_train_defaults() -> dict:
    """The schema's default of every training setting (what train.defaults holds when the config
    sets nothing); what OptimConfig falls back on when built directly."""
    return dict(_builtin_train_defaults())


@cache
def _builtin_train_defaults() -> dict:
    props = load_schema()["$defs"]["train_settings"]["properties"]
    return {k: sub["default"] for k, sub in props.items() if "default" in sub}
