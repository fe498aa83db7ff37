"""Full-size rehearsal of the real profile's data path (issue 40, item 7).

Writes replicas of the `real` profile's hub datasets at their real row counts and sizes, scaled
by --fraction, into a local mirror laid out as the hub lays them out; then runs the data path for
ANDREA-120M as a user would, with ANDREA_HUB_MIRROR pointing at the mirror:

    andrea data fetch --profile real          (copies the mirror into the fetch folder; timed here)
    snakemake --cores N results/ANDREA-120M/shards.json
        pull_hermes3_real → prep_megachat_real → filter_shape_real → train_tokenizer → encode → shards

and records the wall time and peak resident memory of every stage, per fraction, into
<workdir>/real_scale.json and real_scale.md. Two memory figures per stage: Snakemake's benchmark
`max_rss` (its sampler looks every 0.5 s for the first 30 s, then every 30 s: a later peak can be
missed) and this runner's own sampler (every 0.5 s, the RSS summed over the job's process tree:
the job and its worker processes).

The text is the real corpus's (`bash bench/real_corpus.sh data/real`: public-domain books, the
Python documentation, WordNet glosses, a chit-chat corpus), recombined: its paragraphs, sentences
and utterances drawn at random into conversations and books whose lengths follow a per-dataset
distribution, so the shape filter and the tokenizer see natural text at the real volume.

    python bench/real_scale.py --fraction 0.25                  # replicas + data path, 2 cores here
    python bench/real_scale.py --fractions 0.25 0.5 1.0 --cores 2
    python bench/real_scale.py --fraction 0.01 --write-only      # the mirror alone
    python bench/real_scale.py --fraction 1.0 --cores 16 --target results/ANDREA-120M/ckpt \\
        --configfile train-short.yaml                            # on to the trainer (the device script)

Writing streams: rows are generated and written batch by batch (a row group, a few MB of JSONL),
in one process per file (--write-workers), so a million rows never sit in memory.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# --------------------------------------------------------------------------- the text


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def _unwrap(paragraph: str) -> str:
    """A paragraph of a hard-wrapped text file as one line."""
    return " ".join(paragraph.split())


class TextPool:
    """Units of real text to recombine: prose and expository paragraphs, sentences, questions,
    short conversational utterances and book paragraphs (hard-wrapped, as a book file has them)."""

    def __init__(self, corpus: Path):
        corpus = Path(corpus)
        if not (corpus / "gutenberg").is_dir():
            raise SystemExit(f"{corpus} holds no real corpus: build it with `bash bench/real_corpus.sh {corpus}` "
                             "(or unpack data/real-corpus.tar.xz)")
        self.book_paragraphs: list[str] = []
        for p in sorted((corpus / "gutenberg").rglob("*.txt")):
            for para in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace")):
                para = para.strip()
                if len(para) >= 40:
                    self.book_paragraphs.append(para)
        docs: list[str] = []
        for p in sorted((corpus / "repo-docs").rglob("*")):
            if p.suffix not in (".rst", ".md", ".txt"):
                continue
            for para in re.split(r"\n\s*\n", p.read_text(encoding="utf-8", errors="replace")):
                para = para.strip()
                # prose only: not directives, headings' underlines, tables or indented code
                if len(para) >= 80 and not para.startswith(("..", ":", "=", "-", "+", "*", "|", ">>>")) and "\n   " not in para:
                    docs.append(_unwrap(para))
        self.paragraphs = [_unwrap(p) for p in self.book_paragraphs] + docs
        self.sentences = [s for p in self.paragraphs for s in SENTENCE_END.split(p) if 20 <= len(s) <= 400]
        for line in (corpus / "dictionary" / "wordnet.tsv").read_text(encoding="utf-8").splitlines()[:200_000]:
            _, _, gloss = line.partition("\t")
            for g in re.split(r"\s\d+\.\s", gloss.partition(": ")[2]):
                g = re.sub(r"^\d+\.\s*", "", g).strip()
                if len(g) >= 30:
                    self.sentences.append(g[0].upper() + g[1:].rstrip("."))
        self.questions = [s for s in self.sentences if s.endswith("?")]
        self.utterances: list[str] = []
        for p in sorted((corpus / "hermes3").rglob("*.jsonl")) + sorted((corpus / "chat").rglob("*.jsonl")):
            for line in p.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                for t in row.get("conversations") or row.get("messages") or []:
                    v = (t.get("value") or t.get("content") or "").strip()
                    if v:
                        self.utterances.append(v)
        from andrea.shape import labelled_set

        # system prompts and the few system-prompt-shaped user turns the shape filter is there for
        self.system_prompts = [it.text for it in labelled_set() if it.label]
        if not (self.paragraphs and self.sentences and self.questions and self.utterances):
            raise SystemExit(f"{corpus}: the real corpus lacks paragraphs, sentences or utterances")

    def passage(self, rng: random.Random, chars: int, book: bool = False) -> str:
        """About `chars` characters: book paragraphs as the file has them (`book`), else prose and
        expository paragraphs, a third of them with sentences drawn from anywhere."""
        out, n = [], 0
        while n < chars:
            if book:
                para = rng.choice(self.book_paragraphs)
            elif rng.random() < 0.3 or chars < 200:
                para = " ".join(rng.choices(self.sentences, k=max(1, min(6, chars // 120))))
            else:
                para = rng.choice(self.paragraphs)
            out.append(para)
            n += len(para) + 2
        return "\n\n".join(out)

    def passages(self, seed: int, mean_chars: float, book: bool = False, sigma: float = 0.8):
        """An endless stream of passages whose lengths follow a log-normal of the given mean:
        most short, a long tail, as turns and chapters are."""
        rng = random.Random(seed)
        mu = math.log(max(mean_chars, 20)) - sigma * sigma / 2
        while True:
            yield self.passage(rng, int(min(200_000, max(20, rng.lognormvariate(mu, sigma)))), book)


# --------------------------------------------------------------------------- the replicas

sys.path.insert(0, str(REPO / "tests"))  # tests/replicas: the hub layouts (package `replicas`)

# The splits the real profile reads, at full size: rows (OASST: message trees of three messages),
# and the bytes per row of the hub's files (their download size over their rows), which the
# passages' mean length is calibrated to. Sources: the cards' dataset_info (tests/replicas),
# the hub's file trees; Hermes-3's JSONL size is not on any stored page: an estimate, which with
# the others' makes the ~5 GB the profile downloads.
FULL = {
    "NousResearch/Hermes-3-Dataset": {"default:train": (958_829, 1_600)},
    "flydust/ShareGPT-Vicuna-unfiltered-axolotl": {"default:train": (111_912, 361_222_437 / 111_912)},
    "HuggingFaceTB/smoltalk": {"all:train": (1_043_917, 9 * 223e6 / 1_043_917)},
    "OpenAssistant/oasst1": {"default:train": (84_437 // 3, 3 * 41_596_430 * 0.95 / 84_437)},
    # 61,340 books in 52 files of ~220 MB; the profile reads 5 of them
    "manu/project_gutenberg": {"default:en": (61_340, 220e6 * 52 / 61_340)},
    "HuggingFaceTB/everyday-conversations-llama3.1-2k": {"default:train_sft": (2_260, 2_174_280 / 2_379)},
}
JSONL_PARTS = 16  # a one-file JSONL split is written in this many parts at once, then joined


class StreamedText:
    """The replicas' text source (tests/replicas TextSource: sentence, passage, topic) over an
    endless stream of recombined passages. TextSource itself cycles what it is given, keeping every
    passage in memory: right for a test's few rows, not for millions."""

    def __init__(self, passages, seed: int):
        from replicas.layouts import TextSource

        self._topics = TextSource(None, seed)
        self._passages = passages

    def sentence(self) -> str:
        return next(self._passages)

    def passage(self, sentences: int = 3) -> str:
        return " ".join(next(self._passages) for _ in range(sentences))

    def topic(self) -> str:
        return self._topics.topic()


_POOL: dict = {}


def _pool(corpus: str) -> TextPool:
    if corpus not in _POOL:
        _POOL[corpus] = TextPool(Path(corpus))
    return _POOL[corpus]


def _rows(layout, config: str, split: str, start: int, count: int, seed: int, mean_chars: float, corpus: str):
    pool = _pool(corpus)
    text = StreamedText(pool.passages(seed, mean_chars, book=layout.dataset == "manu/project_gutenberg"), seed)
    rng = random.Random(seed)
    for i in range(start, start + count):
        row = layout.rows(rng, text, config, split, i)
        yield from row if isinstance(row, list) else [row]


def _write_part(job: tuple) -> tuple[str, int, int]:
    """One file (or one part of a JSONL file) of a replica, streamed."""
    from replicas.layouts import LAYOUTS, _write_jsonl, _write_parquet, arrow_schema

    dataset, config, split, path, start, count, seed, mean_chars, corpus = job
    layout = LAYOUTS[dataset]
    rows = _rows(layout, config, split, start, count, seed, mean_chars, corpus)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if layout.fmt == "parquet":
        n = _write_parquet(path, arrow_schema(layout.features[config]), rows)
    else:
        n = _write_jsonl(path, rows)
    return str(path), n, path.stat().st_size


def calibrate(dataset: str, key: str, corpus: str, target: float, tmp: Path) -> float:
    """The passages' mean length at which the dataset's rows take `target` bytes each in its files
    (the layout's row templates add their own words: two rounds of a proportional correction)."""
    config, split = key.split(":")
    mean = 200.0
    n = 8 if dataset == "manu/project_gutenberg" else 400
    for _ in range(3):
        path = tmp / f"calibrate-{dataset.replace('/', '--')}"
        _, rows, size = _write_part((dataset, config, split, str(path), 0, n, 12345, mean, corpus))
        per_row = size / n  # per row of the layout (OASST: per tree)
        path.unlink()
        mean *= target / per_row
    return mean


def profile_wants() -> dict:
    """Each hub dataset of the real profile: the file patterns it fetches and the revision it asks for."""
    import yaml

    from andrea.config import validate_config
    from andrea.fetch import wanted
    from andrea.profiles import profile_config

    cfg = validate_config(yaml.safe_load((REPO / "config" / "config.yaml").read_text()), source="config/config.yaml")
    return {w.dataset: w for w in wanted(profile_config({**cfg, "data_profile": None}, "real"))}


def write_mirror(root: Path, fraction: float, corpus: Path, workers: int) -> dict:
    """The real profile's datasets at `fraction` of their rows, into `root` as the hub lays them out."""
    import fnmatch

    from replicas.layouts import LAYOUTS, write_download_metadata, write_replica

    t0 = time.time()
    corpus = str(Path(corpus).resolve())
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    wants = profile_wants()
    patterns = {d: w.patterns for d, w in wants.items()}
    missing = sorted(set(patterns) - set(LAYOUTS))
    if missing:
        raise SystemExit(f"tests/replicas/layouts.py has no layout for {', '.join(missing)} (datasets of the real profile)")
    jobs, means, written_rows = [], {}, {}
    with ProcessPoolExecutor(max(1, workers)) as ex:
        cal = {(d, k): ex.submit(calibrate, d, k, corpus, target, root) for d, splits in FULL.items()
               for k, (_, target) in splits.items()}
        for d in patterns:
            # the layout, its card and every split at a few rows; the splits the profile reads follow
            write_replica(root, d, text=None, seed=1, download_metadata=False)
        for (d, key), fut in cal.items():
            means[f"{d}:{key}"] = mean = fut.result()
            config, split = key.split(":")
            s = LAYOUTS[d].split(config, split)
            full_rows = FULL[d][key][0]
            paths = s.paths()
            for k, rel in enumerate(paths):
                if patterns[d] is not None and not any(fnmatch.fnmatch(rel, p) for p in patterns[d]):
                    continue  # a file the profile does not fetch keeps its few rows
                share = full_rows * (k + 1) // len(paths) - full_rows * k // len(paths)
                n = max(1, round(share * fraction))
                written_rows[f"{d}:{key}"] = written_rows.get(f"{d}:{key}", 0) + n
                seed = zlib.crc32(f"{d}:{key}:{k}".encode())
                if LAYOUTS[d].fmt == "jsonl" and n > 10_000:
                    for j in range(JSONL_PARTS):
                        a, b = n * j // JSONL_PARTS, n * (j + 1) // JSONL_PARTS
                        jobs.append((d, config, split, str(root / d / f"{rel}.part{j:03d}"), a, b - a, seed + j, mean, corpus))
                else:
                    jobs.append((d, config, split, str(root / d / rel), 0, n, seed, mean, corpus))
        jobs.sort(key=lambda j: -j[5] * j[7])  # the longest first
        done = list(ex.map(_write_part, jobs))
    parts: dict[Path, list[Path]] = {}
    for path, _, _ in done:
        p = Path(path)
        if p.suffix.startswith(".part"):
            parts.setdefault(p.with_suffix(""), []).append(p)
    for whole, pieces in parts.items():
        with open(whole, "wb") as out:
            for piece in sorted(pieces):
                with open(piece, "rb") as f:
                    shutil.copyfileobj(f, out, 16 << 20)
                piece.unlink()
    summary = {}
    for d in patterns:
        from replicas.layouts import replica_commit

        repo = root / d
        files = sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file() and ".cache" not in p.parts)
        # the commit the profile pins, where it pins one: the rehearsal measures scale, not the pins
        pinned = wants[d].revision if re.fullmatch(r"[0-9a-f]{40}", wants[d].revision) else None
        write_download_metadata(repo, files, pinned or replica_commit(d))
        fetched = [f for f in files if patterns[d] is None or any(fnmatch.fnmatch(f, p) for p in patterns[d])]
        summary[d] = {"files": len(fetched), "bytes": sum((repo / f).stat().st_size for f in fetched)}
    # rows written of the files the profile fetches (OASST: message trees of three messages)
    return {"fraction": fraction, "seconds": round(time.time() - t0, 1), "rows": written_rows, "datasets": summary,
            "bytes": sum(v["bytes"] for v in summary.values()), "mean_passage_chars": {k: round(v) for k, v in means.items()}}


# --------------------------------------------------------------------------- measuring


def _proc_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, resident KB, command line), read from /proc (no psutil needed)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            rss = 0
            with open(f"/proc/{d}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                        break
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(d)] = (ppid, rss, cmd)
    return out


JOB_SCRIPT = re.compile(r"\.snakemake/scripts/tmp\w+\.(\w+)\.py")


class TreeSampler(threading.Thread):
    """Every `interval` s: the resident memory of each Snakemake job's process tree (the job's
    script and the worker processes it started), summed; the peak per job script is kept."""

    def __init__(self, root_pid: int, interval: float = 0.5):
        super().__init__(daemon=True)
        self.root_pid, self.interval = root_pid, interval
        self.peak_kb: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            table = _proc_table()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _, _) in table.items():
                children.setdefault(ppid, []).append(pid)

            def tree(pid: int) -> int:
                return table[pid][1] + sum(tree(c) for c in children.get(pid, []))

            def walk(pid: int) -> None:
                for c in children.get(pid, []):
                    m = JOB_SCRIPT.search(table[c][2])
                    if m:
                        kb = tree(c)
                        self.peak_kb[m.group(1)] = max(self.peak_kb.get(m.group(1), 0), kb)
                    else:
                        walk(c)

            walk(self.root_pid)
            self.stop.wait(self.interval)


def timed(cmd: list[str], env: dict, log: Path, sample: bool = False) -> dict:
    """Run `cmd`; its wall time, the peak RSS of it and its waited-for descendants (wait4), and
    with `sample` the per-job tree peaks (TreeSampler)."""
    t0 = time.time()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        sampler = TreeSampler(proc.pid) if sample else None
        if sampler:
            sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    if sampler:
        sampler.stop.set()
        sampler.join()
    wall = time.time() - t0
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}); log {log}:\n{tail}")
    return {"wall_s": round(wall, 1), "max_rss_mb": round(usage.ru_maxrss / 1024),
            "tree_peak_mb": {k: round(v / 1024) for k, v in (sampler.peak_kb if sampler else {}).items()}}


def benchmarks(results: Path) -> dict[str, dict]:
    """Snakemake's benchmark files: stage -> {s, max_rss (MB), cpu_time}."""
    out = {}
    for tsv in sorted((results / "benchmarks").glob("*/*.tsv")):
        with open(tsv) as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        if not rows:
            continue
        r = rows[-1]

        def num(k):
            try:
                return round(float(r[k]), 1)
            except (KeyError, ValueError):
                return None

        out[tsv.parent.name] = {"s": num("s"), "max_rss_mb": num("max_rss"), "cpu_s": num("cpu_time"), "file": str(tsv)}
    return out


def counts(results: Path) -> dict:
    """What the stages made: documents per source after prep and the filter, tokens."""
    def manifest(stage: str) -> dict:
        found = sorted((results / "data" / stage).glob("*/manifest.json"), key=lambda p: p.stat().st_mtime)
        return json.loads(found[-1].read_text()) if found else {}

    prep, filt, enc, pull = manifest("prep_megachat"), manifest("filter_shape"), manifest("encode"), manifest("pull_hermes3")
    return {
        "pull_hermes3": (pull.get("counts") or {}).get("per_part"),
        "prep_documents": (prep.get("counts") or {}).get("documents"),
        "prep_per_source": {k: v.get("kept", v) for k, v in ((prep.get("counts") or {}).get("per_source") or {}).items()},
        "filter_kept": (filt.get("counts") or {}).get("kept"),
        "filter_dropped_shape": (filt.get("counts") or {}).get("dropped_shape"),
        "tokens": (enc.get("counts") or {}).get("n_tokens"),
        "tokens_per_source": {k: v["n_tokens"] for k, v in ((enc.get("counts") or {}).get("per_source") or {}).items()},
    }


STAGE_ORDER = ["fetch", "pull_hermes3", "prep_megachat", "filter_shape", "train_tokenizer", "encode", "shards", "train"]


def run_fraction(work: Path, fraction: float, corpus: Path, cores: int, target: str, configfiles: list[str],
                 keep_mirror: bool) -> dict:
    """Replicas at `fraction`, then the data path through Snakemake; the measurements."""
    fdir = work / f"f{fraction:g}"
    shutil.rmtree(fdir, ignore_errors=True)
    fdir.mkdir(parents=True)
    mirror = work / "mirror"
    print(f"[real_scale] fraction {fraction:g}: writing the replicas into {mirror} ({cores} processes) ...", flush=True)
    written = write_mirror(mirror, fraction, corpus, cores)
    print(f"[real_scale]   {written['bytes'] / 1e9:.2f} GB in {written['seconds']} s", flush=True)
    overlay = fdir / "overlay.yaml"
    overlay.write_text(json.dumps({"results_dir": str(fdir / "results"), "fetch_dir": str(fdir / "hub"),
                                   "cluster": {"job_threads": cores}}))
    env = {k: v for k, v in os.environ.items() if k != "ANDREA_HUB_MIRROR"}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    print("[real_scale]   andrea data fetch --profile real (from the mirror) ...", flush=True)
    fetch = timed([sys.executable, "-m", "andrea", "data", "fetch", "--profile", "real", "--dir", str(fdir / "hub")],
                  {**env, "ANDREA_HUB_MIRROR": str(mirror)}, fdir / "fetch.log")
    print(f"[real_scale]   fetch {fetch['wall_s']} s, {fetch['max_rss_mb']} MB", flush=True)
    if not keep_mirror:
        shutil.rmtree(mirror)  # the fetched copy is what the stages read
    print(f"[real_scale]   snakemake --cores {cores} {target} ...", flush=True)
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", str(cores), "--configfile", "config/config.yaml",
           str(overlay), *configfiles]
    snake = timed(cmd, env, fdir / "snakemake.log", sample=True)
    bench = benchmarks(fdir / "results")
    stages = {"fetch": {"s": fetch["wall_s"], "max_rss_mb": fetch["max_rss_mb"], "tree_peak_mb": fetch["max_rss_mb"]}}
    for name, b in bench.items():
        stages[name] = {**b, "tree_peak_mb": snake["tree_peak_mb"].get(name)}
    result = {
        "fraction": fraction, "cores": cores, "target": target, "replicas": written, "snakemake_wall_s": snake["wall_s"],
        "data_path_s": round(fetch["wall_s"] + sum(v["s"] or 0 for k, v in stages.items() if k not in ("fetch", "train")), 1),
        "stages": dict(sorted(stages.items(), key=lambda kv: STAGE_ORDER.index(kv[0]) if kv[0] in STAGE_ORDER else 99)),
        "counts": counts(fdir / "results"),
        "disk_gb": round(sum(p.stat().st_size for p in fdir.rglob("*") if p.is_file()) / 1e9, 2),
        "load_before": os.getloadavg(),
    }
    print(f"[real_scale]   data path {result['data_path_s']} s; " + ", ".join(
        f"{k} {v['s']} s {v['tree_peak_mb']} MB" for k, v in result["stages"].items()), flush=True)
    return result


def save(work: Path, results: list[dict], machine: str) -> None:
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine,
           "command": " ".join(sys.argv), "results": results}
    (work / "real_scale.json").write_text(json.dumps(doc, indent=1))
    (work / "real_scale.md").write_text(markdown(results, machine))


def run_then(fdir: Path, target: str, cores: int, configfiles: list[str], steps: int) -> dict:
    """Snakemake on to `target` (the trainer) on the rehearsal's shards, with max_steps `steps`
    (checkpoint, sample and validation at the end only): its wall time and the train job's."""
    model = Path(target).parts[1] if target.startswith("results/") else "ANDREA-120M"
    overlay = fdir / "train-short.yaml"
    overlay.write_text(json.dumps({"train": {model: {"max_steps": steps, "checkpoint_every": steps,
                                                     "sample_every": steps, "eval_every": steps}}}))
    env = {k: v for k, v in os.environ.items() if k != "ANDREA_HUB_MIRROR"}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    target = target.replace("results/", str(fdir / "results") + "/", 1)
    print(f"[real_scale]   snakemake --cores {cores} {target} (max_steps {steps}) ...", flush=True)
    cmd = [sys.executable, "-m", "snakemake", target, "--cores", str(cores), "--configfile", "config/config.yaml",
           str(fdir / "overlay.yaml"), *configfiles, str(overlay)]
    snake = timed(cmd, env, fdir / "snakemake-then.log", sample=True)
    bench = benchmarks(fdir / "results")
    out = {"target": target, "max_steps": steps, "snakemake_wall_s": snake["wall_s"],
           "jobs": {k: {**v, "tree_peak_mb": snake["tree_peak_mb"].get(k)} for k, v in bench.items() if k in snake["tree_peak_mb"] or k == "train"}}
    run = sorted((fdir / "results" / model / "runs").glob("*/loss.jsonl"))
    if run:
        recs = [json.loads(line) for line in run[-1].read_text().splitlines() if line.strip()]
        train = [r for r in recs if r.get("kind", "train") == "train"]
        if train:
            out["train_steps"] = len(train)
            out["loss_first_last"] = [train[0].get("loss"), train[-1].get("loss")]
            out["tokens_per_s_median"] = sorted(r.get("tokens_per_s", 0) for r in train)[len(train) // 2]
    print(f"[real_scale]   then: {out['snakemake_wall_s']} s; {out.get('train_steps')} steps, loss {out.get('loss_first_last')}",
          flush=True)
    return out


def peak_mb(v: dict) -> int:
    """A stage's peak: the larger of Snakemake's max_rss and the runner's process-tree sample."""
    return round(max(x for x in (v.get("tree_peak_mb"), v.get("max_rss_mb"), 0) if x is not None))


def markdown(results: list[dict], machine: str) -> str:
    fr = [r["fraction"] for r in results]
    stages = [s for s in STAGE_ORDER if any(s in r["stages"] for r in results)]
    lines = [f"Machine: {machine}.", "",
             "| stage | " + " | ".join(f"{f:g}: s | {f:g}: peak MB" for f in fr) + " |",
             "|---|" + "---|---|" * len(fr)]
    for s in stages:
        cells = []
        for r in results:
            v = r["stages"].get(s)
            cells += ["–", "–"] if v is None else [f"{v['s']}", f"{peak_mb(v):,}"]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    lines.append("| **data path** | " + " | ".join(
        f"**{r['data_path_s']}** | **{max(peak_mb(v) for k, v in r['stages'].items() if k != 'train'):,}**" for r in results) + " |")
    lines += ["", "| fraction | replicas (GB fetched) | rows written | documents after prep | kept by the filter | tokens | disk (GB) |",
              "|---|---|---|---|---|---|---|"]
    for r in results:
        c = r["counts"]
        lines.append(f"| {r['fraction']:g} | {r['replicas']['bytes'] / 1e9:.2f} | {sum(r['replicas']['rows'].values()):,} | "
                     f"{c['prep_documents'] or 0:,} | {c['filter_kept'] or 0:,} | {c['tokens'] or 0:,} | {r['disk_gb']} |")
    for r in results:
        t = r.get("then")
        if t:
            tr = t["jobs"].get("train", {})
            lines += ["", f"Then `{Path(t['target']).relative_to(Path(t['target']).parents[2])}` at fraction {r['fraction']:g}, "
                      f"max_steps {t['max_steps']}: snakemake {t['snakemake_wall_s']} s, the train job {tr.get('s')} s, "
                      f"peak {peak_mb(tr) if tr else '–'} MB; {t.get('train_steps')} steps, loss {t.get('loss_first_last')}, "
                      f"median {t.get('tokens_per_s_median')} tokens/s."]
    lines += ["", "Peak MB: the larger of Snakemake's benchmark max_rss and the runner's 0.5 s sample of the job's process "
              "tree (the job and its workers, summed)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fraction", type=float, help="one fraction of the real row counts")
    ap.add_argument("--fractions", type=float, nargs="+", help="several, in turn (e.g. 0.25 0.5 1.0)")
    ap.add_argument("--corpus", type=Path, default=REPO / "data" / "real", help="the real corpus (bench/real_corpus.sh)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/andrea-real-scale"))
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    ap.add_argument("--target", default="results/ANDREA-120M/shards.json",
                    help="what snakemake makes (results/ is replaced by the run's own results folder)")
    ap.add_argument("--configfile", nargs="*", default=[], help="more config overlays for snakemake (e.g. max_steps)")
    ap.add_argument("--then", metavar="TARGET", help="after the measured data path, make this too (e.g. "
                    "results/ANDREA-120M/ckpt): the trainer on the rehearsal's shards, timed")
    ap.add_argument("--train-steps", type=int, default=200, help="max_steps of the --then training (default %(default)s)")
    ap.add_argument("--write-only", action="store_true", help="write the mirror (workdir/mirror) and stop")
    ap.add_argument("--keep-mirror", action="store_true", help="keep the mirror after the fetch (default: removed)")
    args = ap.parse_args()
    fractions = args.fractions or [args.fraction or 0.25]
    work = args.workdir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.write_only:
        print(json.dumps(write_mirror(work / "mirror", fractions[0], args.corpus, args.cores), indent=1))
        return
    machine = (f"{platform.machine()}, {os.cpu_count()} cores ({args.cores} used), "
               f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python {platform.python_version()}")
    results = []
    for f in fractions:
        target = args.target.replace("results/", str(work / f"f{f:g}" / "results") + "/", 1)
        r = run_fraction(work, f, args.corpus, args.cores, target, args.configfile, args.keep_mirror)
        results.append(r)
        save(work, results, machine)
        if args.then:
            r["then"] = run_then(work / f"f{f:g}", args.then, args.cores, args.configfile, args.train_steps)
            save(work, results, machine)
    print((work / "real_scale.md").read_text())


if __name__ == "__main__":
    main()
