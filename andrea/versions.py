"""Versioned artifacts: each stage's output directory is named by a hash of its own parameters
and of the versions upstream of it.

Changing a parameter of one stage therefore changes that stage's version and every version
downstream of it, so Snakemake re-runs exactly those stages and nothing upstream; artifacts of
earlier versions stay where they were, readable.

The data stages are versioned per data profile (andrea.profiles): a config is first made its
profile's (its `data_profile`, else `embedded`), whose name and locations are part of the first
stage's parameters, so each profile's artifacts have versions of their own.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from andrea.config import train_settings
from andrea.curriculum import VALIDATION_MODES, key_settings
from andrea.io import write_json_atomic
from andrea.model import ModelConfig, flops_per_token
from andrea.profiles import default_profile, model_profile, profile_config
from andrea.settings import TrainSettings

POLICY_KEYS = ("floor", "cap", "weight")
STAGES = ("pull_hermes3", "prep_megachat", "filter_shape", "train_tokenizer", "encode")


def _digest(obj) -> str:
    blob = json.dumps(obj, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


def as_profile(config: dict) -> dict:
    """The config of the data profile it names (`data_profile`, else embedded); a profile's config
    is returned as it is."""
    return profile_config(config, default_profile(config))


def stage_params(config: dict, stage: str) -> dict:
    """The configuration a stage's output depends on (defaults already filled), for a profile's
    config (as_profile)."""
    config = as_profile(config)
    if stage == "pull_hermes3":
        # the profile: every later stage's version covers it through this one
        params = {"hermes3": config["hermes3"], "strict": config["strict"], "profile": config["data_profile"]}
        if config["hermes3"].get("without_category", "rule") == "rule":
            params["part_rule"] = part_rule_fingerprint()  # a refitted or changed rule re-splits the parts
        return params
    if stage == "prep_megachat":
        # the bandit's floors/caps and the diet weight do not change the corpus
        enabled = {k: {f: x for f, x in v.items() if f not in POLICY_KEYS} for k, v in config["sources"].items() if v["enabled"]}
        return {"sources": enabled, "megachat": config["megachat"], "strict": config["strict"]}
    if stage == "filter_shape":
        return {"filter_shape": config["filter_shape"]}
    if stage == "train_tokenizer":  # N is not here: it names the directory (N<n>-<version>)
        weights = {k: v["weight"] for k, v in config["sources"].items() if v["enabled"]}
        return {"tokenizer": config["tokenizer"], "weights": weights}
    if stage == "encode":
        return {"sources": enabled_sources(config)}
    raise KeyError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")


def part_rule_fingerprint() -> str:
    """The Hermes-3 part rule as the code ships it (its cues and its fitted weights): a digest of
    andrea/hermes3_parts.py and andrea/hermes3_parts_weights.py, read as files (not imported)."""
    here = Path(__file__).parent
    blob = b"".join((here / name).read_bytes() for name in ("hermes3_parts.py", "hermes3_parts_weights.py"))
    return hashlib.sha256(blob).hexdigest()[:16]


def stage_versions(config: dict) -> dict[str, str]:
    """Each data stage's version for the config's data profile (as_profile)."""
    config = as_profile(config)
    versions: dict[str, str] = {}
    upstream = None
    for stage in STAGES:
        versions[stage] = _digest({"stage": stage, "params": stage_params(config, stage), "up": upstream})
        upstream = versions[stage]
    return versions


# Training settings that change how a run is watched and saved, not the weights it computes, and
# the ones a run may change between a stop and a resume: editing them continues the same run.
WATCH_KEYS = ("checkpoint_every", "keep_checkpoints", "sample_every", "sample_tokens", "sample_prompt",
              "sample_temperature", "coherence_halt_below", "coherence_patience", "coherence_arm_score", "eval_every",
              "eval_tokens", "prefetch", "record_batches", "max_cpu_hours", "ranks", "reduce_bucket_mb",
              "reduce_dtype")
CONTINUE_KEYS = ("max_steps",)  # raising it continues the run from its newest checkpoint
# watch settings that cannot change what a finished run's outputs hold: not in the rule's version,
# so editing them never re-runs a finished train (a running or resumed one reads them as it goes)
# ranks and reduce_dtype: a run continues on another number of ranks or reduction type, and a
# finished one stands (decision)
OUTPUT_NEUTRAL_KEYS = ("prefetch", "max_cpu_hours", "keep_checkpoints", "record_batches", "ranks", "reduce_bucket_mb",
                       "reduce_dtype")


def train_run_key(config: dict, model: str) -> str:
    """Name of a model's run directory (results/<model>/runs/<key>): a hash of everything the
    trained weights depend on — the architecture, the data (the encode stage's version, which
    covers the sources, filter and tokenizer), the training and curriculum settings and the seed —
    except `max_steps` and the bandit's floors and caps, so that raising max_steps, or changing the
    policy between a stop and a resume (the "polish pivot"), continues the same run. Of the
    curriculum settings, those its mode reads (andrea.curriculum.key_settings: `mode` itself
    unless it is the bandit)."""
    s = train_settings(config, model)
    # a mode re-weighted by the validation depends on its cadence and windows: kept in its key
    watch = [k for k in WATCH_KEYS if not (s["curriculum"]["mode"] in VALIDATION_MODES and k in ("eval_every", "eval_tokens"))]
    for k in watch + list(CONTINUE_KEYS):
        s.pop(k, None)
    # the curriculum settings its mode reads (a bandit run's key is what it was before modes existed)
    s["curriculum"] = key_settings(s["curriculum"])
    return _digest({"model": config["models"][model], "data": stage_versions(model_config(config, model))["encode"], "train": s})


def model_config(config: dict, model: str) -> dict:
    """The config of the data profile a model trains on (andrea.profiles.model_profile)."""
    if model not in config["models"]:
        raise KeyError(f"unknown model {model!r}; models in the config: {', '.join(config['models'])}")
    return profile_config(config, model_profile(config, model))


def train_version(config: dict, model: str) -> str:
    """What Snakemake compares to decide whether `train` must run again: the run key plus the
    settings a run may change on resume (max_steps, floors, caps, how it is watched). Any change
    re-runs the rule; the trainer then continues or starts the run its key names."""
    s = train_settings(config, model)
    sources = model_config(config, model)["sources"]
    policy = {k: {f: v.get(f) for f in ("floor", "cap")} for k, v in sources.items() if v["enabled"]}
    watched = {k: s[k] for k in WATCH_KEYS + CONTINUE_KEYS if k in s and k not in OUTPUT_NEUTRAL_KEYS}
    return _digest({"run": train_run_key(config, model), "policy": policy, "watched": watched})


NOMINAL_CPU_FLOPS = 5e10  # a workstation's sustained float32 matrix rate through NumPy


def train_needs_gpu(config: dict, model: str) -> bool:
    """Whether a model's train job should ask the scheduler for a GPU. `backend: cupy` always does,
    `numpy` never; `auto` does when the whole run would take longer than max_cpu_hours on a CPU at
    a nominal rate (ANDREA-tiny: seconds, so the quickstart stays on the CPU partition; ANDREA-12M
    and up: days)."""
    s = train_settings(config, model)
    if s["backend"] != "auto":
        return s["backend"] == "cupy"
    cfg = ModelConfig.from_config(config["models"][model])
    tokens = s["batch_size"] * s["grad_accum"] * (s["seq_len"] or cfg.context) * s["max_steps"]
    return flops_per_token(cfg) * tokens / NOMINAL_CPU_FLOPS > s["max_cpu_hours"] * 3600


def enabled_sources(config: dict) -> list[str]:
    """The sources the config's data profile reads (as_profile)."""
    return [k for k, v in as_profile(config)["sources"].items() if v["enabled"]]


def stage_dir(config: dict, stage: str, n_segments: int | None = None) -> Path:
    """Where a stage writes. The tokenizer and encode stages exist once per vocabulary size N."""
    version = stage_versions(config)[stage]
    if stage in ("train_tokenizer", "encode"):
        if n_segments is None:
            raise ValueError(f"stage {stage} needs n_segments (its directory is N<n>-<version>)")
        version = f"N{n_segments}-{version}"
    return Path(config["results_dir"]) / "data" / stage / version


# ---------------------------------------------------------------------------- what changed
# A version is a hash, so Snakemake can only say that a job's parameters or output path changed.
# Each version's parameters are kept as a record, <results_dir>/versions/<stage>/<version>.json
# (train: versions/train/<model>/<version>.json), written when a workflow run starts; the next
# time the config is loaded, a stage whose current version is not built is compared with the
# record of the newest version that is, and the keys that differ are named.

RECORDS_DIR = "versions"
ARROW = "→"


def train_params(config: dict, model: str) -> dict:
    """What a model's train version depends on, as settings a user recognises: the architecture,
    the data version (encode), the effective training settings but the output-neutral ones, and
    the sources' floors and caps."""
    s = {k: v for k, v in train_settings(config, model).items() if k not in OUTPUT_NEUTRAL_KEYS}
    sources = model_config(config, model)["sources"]
    policy = {k: {f: v.get(f) for f in ("floor", "cap")} for k, v in sources.items() if v["enabled"]}
    return {"model": config["models"][model], "data": stage_versions(model_config(config, model))["encode"],
            "train": s, "policy": policy}


def version_records(config: dict, profiles: list[str]) -> dict[str, dict]:
    """Each version's record by its path under <results_dir>/versions: every data stage of each
    profile, and each model's train version."""
    out: dict[str, dict] = {}
    for profile in profiles:
        pc = profile_config(config, profile)
        versions = stage_versions(pc)
        upstream = None
        for stage in STAGES:
            out[f"{stage}/{versions[stage]}.json"] = {"stage": stage, "profile": profile,
                                                      "params": stage_params(pc, stage), "up": upstream}
            upstream = versions[stage]
    for model in config["models"]:
        out[f"train/{model}/{train_version(config, model)}.json"] = {"stage": "train", "model": model,
                                                                      "params": train_params(config, model)}
    return out


def record_versions(config: dict, profiles: list[str]) -> None:
    """Write the records of this config's versions that are not written yet (a record is named by
    its version, a hash of its content, so one written is never out of date)."""
    root = Path(config["results_dir"]) / RECORDS_DIR
    for rel, record in version_records(config, profiles).items():
        if not (root / rel).is_file():
            write_json_atomic(root / rel, record)


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 60 else text[:57] + "..."


def params_diff(old, new, prefix: str = "") -> list[str]:
    """"key old → new" for every leaf that differs between two parameter trees (dotted keys; a key
    only one side has is shown as absent on the other)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in list(old) + [k for k in new if k not in old]:
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in new:
                out.append(f"{key} {_short(old[k])} {ARROW} (absent)")
            elif k not in old:
                out.append(f"{key} (absent) {ARROW} {_short(new[k])}")
            else:
                out += params_diff(old[k], new[k], key)
        return out
    return [] if old == new else [f"{prefix} {_short(old)} {ARROW} {_short(new)}"]


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def version_changes(config: dict, profiles: list[str]) -> list[str]:
    """One line per stage whose current version is not built but an earlier one is, naming the
    settings that differ from the newest built version's record ("filter_shape (data profile
    embedded): filter_shape.threshold 0.5 → 0.7"), and per model whose checkpoint was trained with
    other settings ("train (ANDREA-tiny): max_steps 400 → 600"). A stage that changed only because
    a stage before it did is not listed: the earlier stage's line says why."""
    results = Path(config["results_dir"])
    records = results / RECORDS_DIR
    lines = []
    for profile in profiles:
        pc = profile_config(config, profile)
        versions = stage_versions(pc)
        for stage in STAGES:
            folder = results / "data" / stage
            if not folder.is_dir():
                continue
            built = {}  # version -> newest mtime of its folders (train_tokenizer, encode: N<n>-<version>)
            for d in folder.iterdir():
                if d.is_dir():
                    v = d.name.rpartition("-")[2] if stage in ("train_tokenizer", "encode") else d.name
                    built[v] = max(built.get(v, 0.0), d.stat().st_mtime)
            if versions[stage] in built:
                continue
            previous = []
            for v, mtime in built.items():
                record = _read_json(records / stage / f"{v}.json")
                if record and record.get("profile") == profile and isinstance(record.get("params"), dict):
                    previous.append((mtime, v, record))
            if not previous:
                continue
            _, _, record = max(previous)
            diff = params_diff(record["params"], stage_params(pc, stage))
            if diff:
                lines.append(f"{stage} (data profile {profile}): {'; '.join(diff)}")
    for model in config["models"]:
        run = _read_json(results / model / "ckpt" / "run.json")
        if not run or run.get("train_version") in (None, train_version(config, model)):
            continue
        record = _read_json(records / "train" / model / f"{run['train_version']}.json")
        if record and isinstance(record.get("params"), dict):  # the keys as the config names them
            names = {"train.": "", "model.": f"models.{model}.", "policy.": "sources.", "data ": "data version "}
            diff = []
            for d in params_diff(record["params"], train_params(config, model)):
                head = next(h for h in (*names, "") if d.startswith(h))
                diff.append(names.get(head, "") + d.removeprefix(head))
        else:  # a checkpoint from before records were kept: its run.json holds the training settings
            diff = params_diff({k: v for k, v in run.get("train", {}).items() if k not in OUTPUT_NEUTRAL_KEYS},
                               {k: v for k, v in TrainSettings.from_config(config, model).as_dict().items()
                                if k not in OUTPUT_NEUTRAL_KEYS})
        lines.append(f"train ({model}): {'; '.join(diff) or 'the data or the sources floors and caps changed'}")
    return lines


def where_results(config: dict, paths: list[str]) -> list[str]:
    """The lines a finished workflow run prints: where the model, its report and the logs are,
    for the models whose results the run's targets lie under (`paths`: the target jobs' inputs
    and outputs), each path named only where it exists."""
    results = Path(config["results_dir"])
    models = [m for m in config["models"] if any(Path(p) == results / m or (results / m) in Path(p).parents for p in paths)]
    lines = []
    for model in models:
        ckpt, audit, hf = results / model / "ckpt", results / model / "audit" / "report.html", results / model / "hf"
        geometry = results / model / "geometry" / "geometry.html"
        run = _read_json(ckpt / "run.json") or {}
        found = [f"  checkpoint       {ckpt}/ (final.bin, best.bin, run.json)" if ckpt.is_dir() else "",
                 f"  run directory    {run['run_dir']}/ (train.log, loss.jsonl, checkpoints)" if run.get("run_dir") else "",
                 f"  audit report     {audit}" if audit.is_file() else "",
                 f"  geometry         {geometry}" if geometry.is_file() else "",
                 f"  Hugging Face     {hf}/" if hf.is_dir() else ""]
        if any(found):
            lines += [f"{model}:"] + [f for f in found if f]
    reports = [p for p in paths if Path(p).suffix == ".html" and (results / "report") in Path(p).parents and Path(p).is_file()]
    if reports:
        lines += ["data reports:"] + [f"  {p}" for p in reports]
    if (results / "logs").is_dir():
        lines.append(f"logs: {results / 'logs'}/ (one folder per stage; `andrea versions` lists the data directories)")
    return lines
