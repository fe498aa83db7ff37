"""The `andrea` command: every pipeline stage, callable outside Snakemake too.

    andrea config validate            check config/config.yaml against the schema
    andrea config docs [-o PATH]      the configuration reference (config/README.md), from the schema
    andrea config show [--model M]    the effective configuration, defaults marked
    andrea versions [--json]          the version (output directory) of each stage, present or missing
    andrea pull-hermes3               stage 1: Hermes-3 → three Parquet sources
    andrea prep-megachat              stage 2: every source → one megachat Parquet
    andrea filter-shape               stage 3: drop system-prompt-shaped records
    andrea data [--profile P]         stages 1–3 in order, for a data profile (default: embedded)
    andrea data fetch [--profile real] [--dir DIR]   download a profile's hub datasets once, to read offline
    andrea tokenizer train --model M  stage 4: learn the Harris segments for a model's N
    andrea tokenizer encode|decode    text → token IDs → text with a segments file
    andrea encode --model M           stage 5: token shards of every source
    andrea train --model M            stage 6: train (resumes a stopped run)
    andrea dashboard RUN_DIR          live loss dashboard on http://127.0.0.1:8050
    andrea sample --ckpt DIR --prompt TEXT [--samples N]   continuations from a trained model
    andrea audit --model M            stage 7: samples, judges and a report
    andrea geometry --model M [--views V ...]   embedding space, attention maps, loss surface, the curriculum's walk
    andrea export --ckpt DIR          a trained model as a Hugging Face directory (GPT-2 layout)
    andrea shape score TEXT | -       system-prompt-shape score of a text, with its features
    andrea shape eval                 precision and recall on the labelled set: held out and in-sample
    andrea shape fit                  refit the shape scorer's weights on the labelled set
    andrea render PARQUET             print documents as training text
    andrea ckpt info PATH             a checkpoint's step and parameter count, as JSON (a file, or
                                      a ckpt directory: its final.bin and best.bin)

Errors the user can fix print one paragraph and exit non-zero (2: configuration or a refusal to
train); `andrea --debug COMMAND ...` shows the traceback. `andrea train` exits with the statuses of
andrea.launch.Exit (the README's table: 3 and 4 halts, 5 stopped by a signal).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from andrea import __version__

# Each command imports its modules when it runs (function-local imports below, kept on purpose):
# `andrea --help` or `andrea config validate` then starts in about 0.05 s, not the seconds that
# loading every stage (numpy, pandas, pyarrow, the engine, the trainer) takes. They are cli.py's
# dependencies all the same: tests/test_import_layers.py counts them in its layers.

log = logging.getLogger("andrea")
DEFAULT_CONFIG = Path("config/config.yaml")
PACKAGE_DIR = str(Path(__file__).resolve().parent) + os.sep


def _config(args):
    from andrea.config import load_config

    return load_config(args.config)


def cmd_config_validate(args) -> int:
    """The schema and the checks beyond it, and every local input path of the data profiles the
    models train on (as the workflow checks them before any job)."""
    from andrea.config import check_locations_exist

    cfg = _config(args)
    for warning in check_locations_exist(cfg, str(args.config)):
        log.warning("%s: %s", args.config, warning)
    print(f"{args.config}: valid ({len(cfg['sources'])} sources, {len(cfg['models'])} models)")
    return 0


def cmd_config_docs(args) -> int:
    from andrea.config_docs import config_docs
    from andrea.io import write_text_atomic

    text = config_docs()
    if args.output:
        write_text_atomic(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_config_show(args) -> int:
    from andrea.config_docs import show_config

    sys.stdout.write(show_config(args.config, args.model))
    return 0


def cmd_versions(args) -> int:
    """Each profile's data stage directories, and each model's (on its profile) and its run
    directory, each marked present or missing: a version is named by the config whether or not it
    has been built, and a user reading the list should not have to look for each folder."""
    from andrea.profiles import model_profile, used_profiles
    from andrea.versions import STAGES, model_config, stage_dir, train_run_key

    cfg = _config(args)
    dirs: dict[str, dict[str, str]] = {}
    for profile in used_profiles(cfg):
        pc = _profile_config(cfg, profile)
        dirs[f"profile {profile}"] = {s: str(stage_dir(pc, s)) for s in STAGES if s not in ("train_tokenizer", "encode")}
    for name, m in cfg["models"].items():
        mc = model_config(cfg, name)
        dirs[f"{name} (profile {model_profile(cfg, name)})"] = {
            **{s: str(stage_dir(mc, s, m["n_segments"])) for s in ("train_tokenizer", "encode")},
            "run": f"{cfg['results_dir']}/{name}/runs/{train_run_key(cfg, name)}"}
    if args.json:
        print(json.dumps({group: {s: {"path": d, "present": Path(d).is_dir()} for s, d in stages.items()}
                          for group, stages in dirs.items()}, indent=2))
        return 0
    width = max(len(s) for stages in dirs.values() for s in stages)
    for group, stages in dirs.items():
        print(group)
        for stage, d in stages.items():
            print(f"  {stage:<{width}}  {'present' if Path(d).is_dir() else 'missing'}  {d}")
    print("(missing: not built for this configuration yet; the workflow builds it when a target needs it)")
    return 0


def _profile_config(cfg: dict, profile: str | None) -> dict:
    """The config of a data profile (--profile; default: data_profile, else embedded)."""
    from andrea.profiles import default_profile, profile_config

    return profile_config(cfg, profile or default_profile(cfg))


def _data_config(args) -> dict:
    return _profile_config(_config(args), getattr(args, "profile", None))


def cmd_data_fetch(args) -> int:
    from andrea.fetch import fetch_profile

    cfg = _config(args)
    args.profile = args.profile or "real"  # `andrea data fetch` fetches the real profile unless told
    if args.dry_run:
        return _data_fetch_dry_run(cfg, args)
    summary = fetch_profile(cfg, args.profile, dest=args.dir, update=args.update)
    dest = args.dir or cfg["fetch_dir"]
    for dataset, s in summary.items():
        state = "fetched" if s["fetched"] else "already complete"
        print(f"{dataset}: commit {s['commit']}, {s['files']} files, {s['bytes'] / 1e6:.1f} MB, {state} "
              f"({', '.join(s['sources'])})")
    print(f"data profile {args.profile}: {len(summary)} hub datasets in {dest}"
          + ("" if args.dir is None or Path(args.dir) == Path(cfg["fetch_dir"]) else
             f" (the data stages read {cfg['fetch_dir']}: set fetch_dir: {args.dir}, or move the folder there)"))
    return 0


def _n(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _data_fetch_dry_run(cfg: dict, args) -> int:
    """Every file the fetch would download, with its size, per dataset its revision, commit and
    licence, and the total; downloads and writes nothing."""
    from andrea.fetch import dry_run, human_size

    dest = args.dir or cfg["fetch_dir"]
    datasets, refused = dry_run(cfg, args.profile, dest=args.dir, update=args.update)
    print(f"data profile {args.profile}: what `andrea data fetch` would download into {dest} (dry run: nothing is "
          f"downloaded or written)")
    total = have = n_get = n_have = 0
    unknown = False
    for d in datasets:
        commit = " (a pinned commit)" if d["revision"] == d["commit"] else f" = commit {d['commit']}"
        print(f"\n{d['dataset']} ({', '.join(d['sources'])}): revision {d['revision']}{commit}; "
              f"licence {'; '.join(d['licences'])}")
        width = max(len(p) for p, _, _ in d["files"])
        get = sum(s or 0 for _, s, done in d["files"] if not done)
        for path, size, done in d["files"]:
            print(f"  {path:<{width}}  {human_size(size):>10}{'  already fetched' if done else ''}")
            unknown |= size is None and not done
        todo = [f for f in d["files"] if not f[2]]
        print(f"  {len(todo)} of {_n(len(d['files']), 'file')} to download, {human_size(get)}")
        total += get
        have += sum(s or 0 for _, s, done in d["files"] if done)
        n_get += len(todo)
        n_have += len(d["files"]) - len(todo)
    print(f"\ntotal: {_n(n_get, 'file')}, {human_size(total)} to download{' (some sizes unknown)' if unknown else ''}; "
          f"{_n(n_have, 'file')}, {human_size(have)} already fetched")
    if refused is not None:
        raise refused  # what the fetch would stop at, after the list the user asked for
    return 0


def cmd_pull(args) -> int:
    from andrea.hermes3 import pull_hermes3
    from andrea.versions import stage_dir, stage_versions

    cfg = _data_config(args)
    out = Path(args.out) if args.out else stage_dir(cfg, "pull_hermes3")
    pull_hermes3(cfg["hermes3"], out, stage_versions(cfg)["pull_hermes3"], strict=cfg["strict"], hub_dir=cfg["fetch_dir"],
                 workers=args.workers)
    print(out)
    return 0


def cmd_prep(args) -> int:
    from andrea.megachat import prep_megachat
    from andrea.versions import stage_dir, stage_versions

    cfg = _data_config(args)
    out = Path(args.out) if args.out else stage_dir(cfg, "prep_megachat")
    pull = Path(args.pull_dir) if args.pull_dir else stage_dir(cfg, "pull_hermes3")
    prep_megachat(cfg, out, stage_versions(cfg)["prep_megachat"], pull_dir=pull, hub_dir=cfg["fetch_dir"], workers=args.workers)
    print(out)
    return 0


def cmd_filter(args) -> int:
    from andrea.filter import filter_shape
    from andrea.versions import stage_dir, stage_versions

    cfg = _data_config(args)
    out = Path(args.out) if args.out else stage_dir(cfg, "filter_shape")
    src = Path(args.input) if args.input else stage_dir(cfg, "prep_megachat") / "megachat.parquet"
    filter_shape(src, out, cfg["filter_shape"], stage_versions(cfg)["filter_shape"], workers=args.workers)
    print(out)
    return 0


def cmd_data(args) -> int:
    if getattr(args, "data_command", None) == "fetch":
        return cmd_data_fetch(args)
    for fn in (cmd_pull, cmd_prep, cmd_filter):
        args.out = None
        args.pull_dir = None
        args.input = None
        args.workers = os.cpu_count() or 1
        fn(args)
    return 0


def _model_n(cfg, model: str) -> int:
    from andrea.config import ConfigError

    if model not in cfg["models"]:
        raise ConfigError(f"unknown model {model!r}; models in the config: {', '.join(cfg['models'])}")
    return cfg["models"][model]["n_segments"]


def cmd_tokenizer_train(args) -> int:
    from andrea.tokenizer import train_tokenizer
    from andrea.versions import model_config, stage_dir, stage_versions

    cfg = _config(args)
    n = _model_n(cfg, args.model)
    cfg = model_config(cfg, args.model)  # the model's data profile
    out = Path(args.out) if args.out else stage_dir(cfg, "train_tokenizer", n)
    src = Path(args.input) if args.input else stage_dir(cfg, "filter_shape") / "megachat.parquet"
    train_tokenizer(src, out, n, cfg, stage_versions(cfg)["train_tokenizer"])
    print(out)
    return 0


def _read_arg_or_stdin(value: str) -> str:
    return sys.stdin.read() if value == "-" else value


def cmd_tokenizer_encode(args) -> int:
    from andrea.tokenizer import HarrisTokenizer

    tok = HarrisTokenizer.load(args.segments)
    print(" ".join(map(str, tok.encode(_read_arg_or_stdin(args.text)).tolist())))
    return 0


def cmd_tokenizer_decode(args) -> int:
    from andrea.tokenizer import HarrisTokenizer

    tok = HarrisTokenizer.load(args.segments)
    ids = [int(x) for x in _read_arg_or_stdin(" ".join(args.ids)).split()]
    bad = [i for i in ids if not 0 <= i < tok.vocab_size]
    if bad:
        raise ValueError(f"token IDs out of range 0..{tok.vocab_size - 1}: {bad[:10]}")
    sys.stdout.write(tok.decode(ids, errors="replace"))
    return 0


def cmd_encode(args) -> int:
    from andrea.shards import encode_shards
    from andrea.versions import enabled_sources, model_config, stage_dir, stage_versions

    cfg = _config(args)
    n = _model_n(cfg, args.model)
    cfg = model_config(cfg, args.model)  # the model's data profile
    out = Path(args.out) if args.out else stage_dir(cfg, "encode", n)
    segments = stage_dir(cfg, "train_tokenizer", n) / "harris_segments.json"
    src = stage_dir(cfg, "filter_shape") / "megachat.parquet"
    encode_shards(src, segments, out, enabled_sources(cfg), cfg["megachat"], stage_versions(cfg)["encode"], workers=args.workers)
    print(out)
    return 0


def cmd_train(args) -> int:
    from andrea.launch import Exit, train
    from andrea.trainer import run_key

    cfg = _config(args)
    _model_n(cfg, args.model)
    results = Path(cfg["results_dir"])
    overrides = {}
    if args.max_steps is not None:
        overrides["max_steps"] = args.max_steps
    if args.ranks is not None:
        if args.ranks < 1:
            raise ValueError(f"--ranks {args.ranks}: give 1 or more")
        overrides["ranks"] = args.ranks
    if overrides:
        cfg.setdefault("train", {})
        cfg["train"][args.model] = {**cfg["train"].get(args.model, {}), **overrides}
    shards = args.shards or results / args.model / "shards.json"
    run_dir = args.run_dir or results / args.model / "runs" / run_key(cfg, args.model)
    # the exit status is andrea.launch.Exit's (the README's table)
    status, result, message = train(cfg, args.model, shards, run_dir, out=args.out, force=args.force,
                                    result_file=args.result, again="run the same command again")
    if message:
        print(f"andrea: {message}", file=sys.stderr)
    if status in (Exit.FINISHED, Exit.STOPPED) and args.result is None:  # not a launched rank: the run's result
        print(json.dumps(result))
    return int(status)


def cmd_dashboard(args) -> int:
    from andrea.dashboard import find_run_dir, make_server

    if args.run_dir is None:
        if not args.model:
            raise ValueError("give a run directory, or --model to use that model's latest run")
        cfg = _config(args)
        run_dir = find_run_dir(cfg["results_dir"], args.model)
        families = cfg["geometry"]["families"]
    else:
        run_dir = args.run_dir
        families = None  # a run directory needs no config: it only names the ternary view's families
        if args.config.exists():
            from andrea.config import ConfigError

            try:
                families = _config(args)["geometry"]["families"]
            except ConfigError as e:
                log.warning("%s does not load: the dashboard runs without it (the walk on the simplex without the "
                            "ternary view of the source families, geometry.families)\n%s", args.config, e)
    # the source families of the ternary view of the curriculum's walk: the geometry's (geometry.families);
    # without a config the page draws the radial view alone
    server = make_server(run_dir, args.host, args.port, families=families)
    print(f"dashboard for {run_dir}: http://{args.host}:{server.server_address[1]}/  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


def cmd_sample(args) -> int:
    import codecs

    import numpy as np

    from andrea.sampling import chat_prompt, generate, generate_rows, load_model
    from andrea.tokenizer import BOS

    if args.samples < 1:
        raise SystemExit(f"--samples {args.samples}: at least 1")
    lm = load_model(args.ckpt, backend=args.backend)
    text = args.prompt if args.raw else chat_prompt(args.prompt)
    ids = [BOS, *lm.tokenizer.encode(text).tolist()]
    if args.samples == 1:  # the text as it comes (bytes of a character split across tokens wait for the rest)
        text = codecs.getincrementaldecoder("utf-8")(errors="replace")

        def show(new_ids):
            sys.stdout.write(text.decode(lm.tokenizer.decode_bytes(new_ids)))
            sys.stdout.flush()

        generate(lm.model, ids, args.max_tokens, np.random.default_rng(args.seed), args.temperature, args.top_k, args.top_p,
                 on_tokens=show)
        print(text.decode(b"", final=True))
        return 0
    # decoded together, one cache row each; sample k draws from its own generator (seed, k)
    rngs = [np.random.default_rng([args.seed, k]) for k in range(args.samples)]
    for k, out in enumerate(generate_rows(lm.model, ids, args.max_tokens, rngs, args.temperature, args.top_k, args.top_p)):
        print(f"--- sample {k + 1} of {args.samples}")
        print(lm.tokenizer.decode(out, errors="replace"))
    return 0


def cmd_audit(args) -> int:
    from andrea.audit import run_audit

    cfg = _config(args)
    _model_n(cfg, args.model)
    res = Path(cfg["results_dir"]) / args.model
    from andrea.config import train_settings

    heldout_every = train_settings(cfg, args.model)["curriculum"]["heldout_every"]  # the model's, as it trained
    summary = run_audit(args.ckpt or res / "ckpt", res / "shards.json", cfg["audit"], heldout_every,
                        args.out or res / "audit", cfg["megachat"])
    print(json.dumps(summary, indent=2))
    return 0


def cmd_geometry(args) -> int:
    from andrea.config import geometry_prompts, geometry_settings
    from andrea.geometry import run_geometry

    cfg = _config(args)
    _model_n(cfg, args.model)
    res = Path(cfg["results_dir"]) / args.model
    g = geometry_settings(cfg, args.model)
    if args.backend:
        g["backend"] = args.backend
    out = args.out or res / "geometry"
    r = run_geometry(args.ckpt or res / "ckpt", res / "shards.json", g, out, geometry_prompts(cfg, g), cfg["megachat"],
                     views=args.views)
    print(f"geometry of {r['model']} at step {r['step']} ({', '.join(r['views'])}; {r['seconds']['total']} s): {out / 'geometry.html'}")
    return 0


def cmd_export(args) -> int:
    from andrea.export import export_hf

    cfg = _config(args)
    model_dir = args.ckpt.parent  # results/<model>
    audit = model_dir / "audit" / "summary.json"
    result = export_hf(args.ckpt, args.out or model_dir / "hf", args.which, shards=args.shards,
                       audit_summary=audit if audit.exists() else None, sampling=cfg["audit"], mcfg=cfg["megachat"])
    print(json.dumps(result))
    return 0


def cmd_shape_score(args) -> int:
    from andrea.shape import shape_score

    text = sys.stdin.read() if args.text == "-" else args.text
    s = shape_score(text)
    print(json.dumps({"score": s.score, "system_prompt_shape": s.is_system_prompt, "points": s.points, "features": s.features}, indent=2))
    return 0


def cmd_shape_eval(args) -> int:
    from andrea.shape import cross_validate, evaluate

    held_out = cross_validate(k=args.folds, repeats=args.repeats, seed=args.seed)
    in_sample = evaluate(args.threshold)
    print(json.dumps({
        "cross_validated": {"measure": f"held-out: {held_out.pop('method')}; weights and threshold fitted on the training folds only", **held_out},
        "in_sample": {"measure": f"the shipped weights on the set they were fitted on, at score threshold {args.threshold} (flatters the scorer)", **in_sample},
    }, indent=2, ensure_ascii=False))
    return 0


def cmd_shape_fit(args) -> int:
    from andrea.shape import cross_validate, fit, write_weights

    model, held_out = fit(), cross_validate()
    path = write_weights(model, held_out, args.out)
    print(json.dumps({"written": str(path), "threshold": model["threshold"], "l2": model["l2"],
                      "cross_validated": {k: held_out[k] for k in ("method", "precision", "recall")}}, indent=2))
    return 0


def cmd_render(args) -> int:
    from andrea.megachat import iter_megachat, render_document

    shown = 0
    for row in iter_megachat(args.parquet):
        if args.source and row["source"] != args.source:
            continue
        print(f"=== {row['source']} / {row['doc_id']}")
        print(render_document(row["turns"], row["text"]))
        print()
        shown += 1
        if shown >= args.n:
            break
    return 0


CKPT_EXPORTS = ("final.bin", "best.bin")


def cmd_ckpt_info(args) -> int:
    from andrea.checkpoint import checkpoint_info

    path = args.path
    if not path.is_dir():
        print(json.dumps(checkpoint_info(path)))
        return 0
    # a model's ckpt directory (results/<model>/ckpt): the exported weights it holds
    files = sorted(p.name for p in path.iterdir())
    if not any(name in files for name in CKPT_EXPORTS):
        shown = ", ".join(files[:8]) + (f" and {len(files) - 8} more" if len(files) > 8 else "")
        raise FileNotFoundError(
            f"{path} is a directory without final.bin or best.bin (it holds {shown or 'nothing'}); "
            "give a checkpoint file, e.g. results/<model>/ckpt/final.bin or a run's checkpoints/step_*.bin"
        )
    info = {name: checkpoint_info(path / name) if name in files else None for name in CKPT_EXPORTS}
    print(json.dumps({"path": str(path), **info, "files": files}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="andrea", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"andrea {__version__}")
    p.add_argument("--log", help="also write the log to this file")
    p.add_argument("--debug", action="store_true", help="on an error, show the full traceback")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_config(sp):
        sp.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="config file (default: %(default)s)")
        return sp

    c = sub.add_parser("config", help="check the configuration")
    csub = c.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    with_config(csub.add_parser("validate", help="validate the config against its schema")).set_defaults(fn=cmd_config_validate)
    sp = csub.add_parser("docs", help="print the configuration reference (config/README.md), generated from the schema")
    sp.add_argument("--output", "-o", type=Path, help="write it to this file instead")
    sp.set_defaults(fn=cmd_config_docs)
    sp = with_config(csub.add_parser("show", help="print the effective configuration (YAML), values taken from defaults marked"))
    sp.add_argument("--model", help="that model's architecture and effective training settings, each marked with where it came from")
    sp.set_defaults(fn=cmd_config_show)
    sp = with_config(sub.add_parser("versions", help="print each stage's versioned output directory, marked present or missing"))
    sp.add_argument("--json", action="store_true", help="as JSON: each directory's path and whether it is present")
    sp.set_defaults(fn=cmd_versions)

    def with_profile(sp):
        sp.add_argument("--profile", help="data profile (profiles: in the config; default: data_profile, else embedded)")
        return sp

    sp = with_profile(with_config(sub.add_parser("pull-hermes3", help="stage pull_hermes3: Hermes-3 → three Parquet sources")))
    sp.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="processes validating rows and deciding their parts (default: all cores, %(default)s)")
    sp.add_argument("--out", help="output directory (default: the versioned stage directory)")
    sp.set_defaults(fn=cmd_pull)
    sp = with_profile(with_config(sub.add_parser("prep-megachat", help="stage prep_megachat: every source → one megachat Parquet")))
    sp.add_argument("--pull-dir", help="pull_hermes3 output directory (default: its versioned directory)")
    sp.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="processes reading sources at once (default: all cores, %(default)s)")
    sp.add_argument("--out", help="output directory (default: the versioned stage directory)")
    sp.set_defaults(fn=cmd_prep)
    sp = with_profile(with_config(sub.add_parser("filter-shape", help="stage filter_shape: drop system-prompt-shaped records")))
    sp.add_argument("--input", help="megachat.parquet to filter (default: prep_megachat's output)")
    sp.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="scoring processes (default: all cores, %(default)s)")
    sp.add_argument("--out", help="output directory (default: the versioned stage directory)")
    sp.set_defaults(fn=cmd_filter)
    sp = with_profile(with_config(sub.add_parser("data", help="run pull-hermes3, prep-megachat and filter-shape in order; "
                                                 "`data fetch`: download a profile's hub datasets")))
    sp.set_defaults(fn=cmd_data)
    dsub = sp.add_subparsers(dest="data_command", metavar="ACTION")
    sp = dsub.add_parser("fetch", help="download every hub dataset of a data profile to a local folder, once "
                         "(resumable, checksummed in its manifest.json); the data stages then read it offline")
    # SUPPRESS: given before `fetch` (andrea data --config X fetch) they stay; after it, they win
    sp.add_argument("--config", type=Path, default=argparse.SUPPRESS, help=f"config file (default: {DEFAULT_CONFIG})")
    sp.add_argument("--profile", default=argparse.SUPPRESS, help="data profile (default: real)")
    sp.add_argument("--dir", help="folder to fetch into (default: the config's fetch_dir)")
    sp.add_argument("--update", action="store_true", help="move a dataset pinned @main to the commit main is now")
    sp.add_argument("--dry-run", action="store_true", help="list every file the fetch would download (size, revision, "
                    "commit, licence, total) and download nothing")
    sp.set_defaults(fn=cmd_data_fetch)

    tk = sub.add_parser("tokenizer", help="the Harris tokenizer")
    tksub = tk.add_subparsers(dest="tokenizer_command", required=True, metavar="ACTION")
    sp = with_config(tksub.add_parser("train", help="stage train_tokenizer: learn segments for a model's vocabulary"))
    sp.add_argument("--model", required=True, help="model whose n_segments to learn (e.g. ANDREA-tiny)")
    sp.add_argument("--input", help="filtered megachat.parquet (default: filter_shape's output)")
    sp.add_argument("--out", help="output directory (default: the versioned stage directory)")
    sp.set_defaults(fn=cmd_tokenizer_train)
    sp = tksub.add_parser("encode", help="print the token IDs of a text ('-' reads standard input)")
    sp.add_argument("--segments", required=True, help="harris_segments.json")
    sp.add_argument("text")
    sp.set_defaults(fn=cmd_tokenizer_encode)
    sp = tksub.add_parser("decode", help="print the text of token IDs ('-' reads them from standard input)")
    sp.add_argument("--segments", required=True, help="harris_segments.json")
    sp.add_argument("ids", nargs="+")
    sp.set_defaults(fn=cmd_tokenizer_decode)
    sp = with_config(sub.add_parser("encode", help="stage encode: token shards of every source for a model"))
    sp.add_argument("--model", required=True)
    sp.add_argument("--out", help="output directory (default: the versioned stage directory)")
    sp.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="encoding processes (default: all cores, %(default)s)")
    sp.set_defaults(fn=cmd_encode)

    sp = with_config(sub.add_parser("train", help="stage train: train a model on its shards (resumes a stopped run)"))
    sp.add_argument("--model", required=True)
    sp.add_argument("--shards", type=Path, help="shards.json (default: results/<model>/shards.json)")
    sp.add_argument("--run-dir", type=Path, help="run directory (default: results/<model>/runs/<architecture+tokenizer key>)")
    sp.add_argument("--out", type=Path, help="export final/best weights here when the run finishes")
    sp.add_argument("--max-steps", type=int, help="override train.max_steps")
    sp.add_argument("--force", action="store_true", help="start even if the CPU estimate exceeds train.max_cpu_hours")
    sp.add_argument("--ranks", type=int, help="override train.ranks: data-parallel ranks (GPUs, or CPU processes), started "
                                              "with mpirun (srun inside a SLURM job)")
    sp.add_argument("--result", type=Path, help=argparse.SUPPRESS)  # a launched rank: rank 0 writes the outcome here
    sp.set_defaults(fn=cmd_train)

    sp = with_config(sub.add_parser("dashboard", help="serve the live loss dashboard of a run on localhost"))
    sp.add_argument("run_dir", nargs="?", type=Path, help="run directory (results/<model>/runs/<key>)")
    sp.add_argument("--model", help="instead of RUN_DIR: this model's most recent run")
    sp.add_argument("--host", default="127.0.0.1")
    sp.add_argument("--port", type=int, default=8050)
    sp.set_defaults(fn=cmd_dashboard)

    sp = sub.add_parser("sample", help="print a continuation from a trained model")
    sp.add_argument("--ckpt", required=True, type=Path, help="results/<model>/ckpt (or a .bin inside it)")
    sp.add_argument("--prompt", required=True)
    sp.add_argument("--raw", action="store_true", help="use the prompt as it is, not as a chat turn")
    sp.add_argument("--max-tokens", type=int, default=200)
    sp.add_argument("--temperature", type=float, default=0.8)
    sp.add_argument("--top-k", type=int, default=40,
                    help="sample among this many most likely tokens (default 40; 0: no top-k). 0, or over 1024: "
                         "chosen on the host, slower (greedy, at --temperature 0, always on the device)")
    sp.add_argument("--top-p", type=float, default=0.95)
    sp.add_argument("--seed", type=int, default=0)
    sp.add_argument("--samples", type=int, default=1, help="continuations of the prompt, decoded together (default 1)")
    sp.add_argument("--backend", choices=("auto", "numpy", "cupy"), default="auto",
                    help="auto: the GPU when one is usable (bf16), else the CPU (default: %(default)s)")
    sp.set_defaults(fn=cmd_sample)
    sp = with_config(sub.add_parser("audit", help="stage audit: samples, judges and a report for a trained model"))
    sp.add_argument("--model", required=True)
    sp.add_argument("--ckpt", type=Path, help="default: results/<model>/ckpt")
    sp.add_argument("--out", type=Path, help="default: results/<model>/audit")
    sp.set_defaults(fn=cmd_audit)

    sp = with_config(sub.add_parser("geometry", help="the geometry views of a trained model: embedding space, attention maps, "
                                                     "loss surface, the curriculum's walk on the simplex"))
    sp.add_argument("--model", required=True)
    sp.add_argument("--views", nargs="+", choices=["embedding", "attention", "surface", "simplex"],
                    help="only these views (default: geometry.views of the config)")
    sp.add_argument("--ckpt", type=Path, help="default: results/<model>/ckpt")
    sp.add_argument("--out", type=Path, help="default: results/<model>/geometry")
    sp.add_argument("--backend", choices=["auto", "numpy", "cupy"], help="default: geometry.backend of the config")
    sp.set_defaults(fn=cmd_geometry)

    sp = with_config(sub.add_parser("export", help="a trained model as a Hugging Face directory that transformers loads (GPT-2)"))
    sp.add_argument("--ckpt", required=True, type=Path, help="the model's ckpt directory (results/<model>/ckpt)")
    sp.add_argument("--out", type=Path, help="default: results/<model>/hf, beside the ckpt directory")
    sp.add_argument("--which", choices=("final", "best"), default="final",
                    help="final.bin or best.bin (the lowest validation loss) (default: %(default)s)")
    sp.add_argument("--shards", type=Path, help="the model's shards.json (default: beside the ckpt directory)")
    sp.set_defaults(fn=cmd_export)

    sh = sub.add_parser("shape", help="the system-prompt-shape scorer")
    shsub = sh.add_subparsers(dest="shape_command", required=True, metavar="ACTION")
    sp = shsub.add_parser("score", help="score one text ('-' reads standard input)")
    sp.add_argument("text")
    sp.set_defaults(fn=cmd_shape_score)
    sp = shsub.add_parser("eval", help="precision and recall on the labelled set: cross-validated (held out) and in-sample")
    sp.add_argument("--threshold", type=float, default=0.5, help="score threshold of the in-sample figures")
    sp.add_argument("--folds", type=int, default=5)
    sp.add_argument("--repeats", type=int, default=5, help="rounds of k-fold cross-validation, pooled")
    sp.add_argument("--seed", type=int, default=13, help="seed of the first round's fold assignment")
    sp.set_defaults(fn=cmd_shape_eval)
    sp = shsub.add_parser("fit", help="refit the scorer on the labelled set and write andrea/shape_weights.py")
    sp.add_argument("--out", type=Path, help="write the weights here instead (for inspection)")
    sp.set_defaults(fn=cmd_shape_fit)

    ck = sub.add_parser("ckpt", help="checkpoints")
    cksub = ck.add_subparsers(dest="ckpt_command", required=True, metavar="ACTION")
    sp = cksub.add_parser("info", help="print step and n_params of a checkpoint (or a ckpt directory's final/best) as JSON")
    sp.add_argument("path", type=Path)
    sp.set_defaults(fn=cmd_ckpt_info)

    sp = sub.add_parser("render", help="print megachat documents as training text")
    sp.add_argument("parquet", type=Path)
    sp.add_argument("-n", type=int, default=5, help="how many documents (default: %(default)s)")
    sp.add_argument("--source", help="only this source")
    sp.set_defaults(fn=cmd_render)
    return p


def main(argv: list[str] | None = None) -> int:
    from andrea.io import setup_logging

    args = build_parser().parse_args(argv)
    setup_logging(args.log)
    try:
        return args.fn(args)
    except (OSError, ValueError, RuntimeError, KeyError, KeyboardInterrupt) as e:
        # Refusals and bad input (a config key, a missing or malformed file, a shard that does
        # not match its manifest...) are for the user to fix: one paragraph, no traceback.
        # Other exceptions are bugs and keep theirs; --debug shows it for these too.
        if args.debug:
            if getattr(e, "details", ""):  # a config error: the validator's full account, schema and value
                print(e.details, file=sys.stderr)
            raise
        status, message = _explain(e)
        print(f"andrea: {message}", file=sys.stderr)
        return status


def _explain(e: BaseException) -> tuple[int, str]:
    """The exit status and the message for an error the user can act on."""
    from andrea.config import ConfigError

    trainer = sys.modules.get("andrea.trainer")  # only loaded (and only raising) when training
    if isinstance(e, KeyboardInterrupt):
        return 130, "interrupted"
    if isinstance(e, ConfigError):
        return 2, f"configuration error: {e}"
    if trainer is not None and isinstance(e, trainer.TrainingRefused):
        return 2, f"refusing to train: {e}"
    if isinstance(e, OSError) and e.filename and e.strerror:  # from open(), stat() and the like
        message = f"{e.filename}: {e.strerror}"
    elif isinstance(e, KeyError):
        message = f"missing key {e}"
    else:
        message = str(e) or type(e).__name__
    # a message the package wrote itself says what to do; one from a library (NumPy, pyarrow,
    # the standard library) may be a bug, so say how to see where it came from
    tb = traceback.extract_tb(e.__traceback__)
    if tb and not tb[-1].filename.startswith(PACKAGE_DIR) and not isinstance(e, OSError):
        message += f" ({type(e).__name__}; `andrea --debug ...` shows where)"
    return 1, f"error: {message}"


if __name__ == "__main__":
    sys.exit(main())
