"""`andrea export`: a Hugging Face directory that transformers loads as GPT-2 with our logits, a
tokenizer that gives our IDs for any text, a pipeline that writes text, and a model card."""

import json
import os
import random
import shutil
import stat
import time

import numpy as np
import pytest

pytest.importorskip("tokenizers", reason="the hf extra is not installed (pip install -c constraints.txt -e '.[hf]')")
pytest.importorskip("safetensors", reason="the hf extra is not installed (pip install -c constraints.txt -e '.[hf]')")

from andrea import cli  # noqa: E402
from andrea.audit import run_audit  # noqa: E402
from andrea.checkpoint import read_weights, write_checkpoint  # noqa: E402
from andrea.config import load_config  # noqa: E402
from andrea.export import BOS_TOKEN, byte_alphabet, hf_tokenizer  # noqa: E402
from andrea.model import ModelConfig, n_params  # noqa: E402
from andrea.sampling import InferenceModel, generate, load_model  # noqa: E402
from andrea.tokenizer import BOS, FIRST_SEGMENT, SEGMENTS_FORMAT, HarrisTokenizer, tokenizer_hash  # noqa: E402
from andrea.trainer import Trainer  # noqa: E402
from conftest import REPO  # noqa: E402
from test_trainer import MODEL, TRAIN, shards  # noqa: E402, F401  (fixture)

PROMPT = "> What causes the seasons on Earth?\n\n< "

# Segments chosen to break a naive construction: multi-byte and astral characters, a segment
# longer than WordPiece's default 100-character word limit, regex metacharacters and escapes,
# whitespace and Unicode line breaks, chains of prefixes, NUL and DEL, and the BOS token's own
# string (which must then stay text and push BOS to another name).
ADVERSARIAL = [
    "é", "ée", "über", "ü ", "中文", "中", "文字", "😀", "😀😀", "👍🏽", "e\u0301", "ß", "Ā", "ĀĀ", "😀" * 30,
    "  ", "   ", "\n\n", "\n\n< ", "\n\n> ", "\t\t", "\r\n", " \n", "\u2028x", "\u00a0\u00a0", "\x85\x85",
    "(.*", ".*", "\\d", "[a", "a]", "^$", "|x", "?!", "{2}", "+-", "\\\\", "(?:", "#x", "\\x{41}", "$1", "\\Q",
    "th", "the", "ther", "there", "therefore", "an", "and", "andrea", " the", " and",
    "\x00\x00", "\x7f\x7f", BOS_TOKEN, "<|", "|>", "ing", "tion", "ment",
]


def random_texts(segments: list[str], n: int, seed: int = 0) -> list[str]:
    """n strings from a seeded generator: random code points of every plane (no lone
    surrogates: tokenizers takes valid Unicode only), emoji, whitespace runs and newlines, text
    made of segments with random characters between them, and some long strings."""
    rng = random.Random(seed)
    ascii_ = [chr(c) for c in range(32, 127)]
    space = [" ", "\n", "\t", "\r", "\x0b", "\x0c", "\x00", "\x85", "\u00a0", "\u2028", "\u3000", "\u200b"]
    emoji = ["😀", "👍🏽", "🇩🇪", "👩\u200d💻", "🦀", "❤️", "🫠"]
    other = list("éüßñøÅçΩж中文字日本語한국어") + ["\u0301", "\u0308", "\ufeff", "\ufffd", "\U0001d400", "\U0010fffd"]

    def any_char():
        c = rng.choice([rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800), rng.randrange(0xE000, 0x10000),
                        rng.randrange(0x10000, 0x110000)])
        return chr(c)

    def piece():
        r = rng.random()
        if r < 0.45 and segments:
            return rng.choice(segments)
        if r < 0.6:
            return rng.choice(space) * rng.randint(1, 12)
        if r < 0.75:
            return "".join(rng.choice(ascii_) for _ in range(rng.randint(1, 8)))
        if r < 0.85:
            return rng.choice(emoji)
        if r < 0.93:
            return rng.choice(other)
        return any_char()

    texts = ["", BOS_TOKEN, BOS_TOKEN * 3, " " * 500, "\n" * 300]
    while len(texts) < n:
        k = rng.choice([1, 2, 5, 20, 60]) if len(texts) % 200 else 3000  # every 200th: a long one
        texts.append("".join(piece() for _ in range(rng.randint(0, k))))
    return texts


def write_segments(path, segments, vocab_size):
    doc = {"format": SEGMENTS_FORMAT, "n_segments": len(segments), "vocab_size": vocab_size, "bos_id": BOS,
           "first_segment_id": FIRST_SEGMENT, "tokenizer_hash": tokenizer_hash(segments, vocab_size),
           "segments": [{"id": FIRST_SEGMENT + i, "text": s, "count": 1} for i, s in enumerate(segments)]}
    path.write_text(json.dumps(doc))
    return path


def export(ckpt, out, *extra):
    assert cli.main(["export", "--config", str(REPO / "config" / "config.yaml"), "--ckpt", str(ckpt), "--out", str(out), *extra]) == 0
    return out


# --------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory):  # noqa: F811
    """A micro model trained here (tied head), audited, and exported with the command."""
    tmp = tmp_path_factory.mktemp("trained")
    cfg = load_config(REPO / "config" / "config.yaml")
    cfg["models"]["micro"] = MODEL
    cfg["train"]["micro"] = {**TRAIN, "max_steps": 40, "eval_every": 10, "sample_every": 1000, "checkpoint_every": 1000}
    model_dir = tmp / "micro"
    Trainer(cfg, "micro", shards, tmp / "run").run(out_dir=model_dir / "ckpt")
    shutil.copy(shards, model_dir / "shards.json")
    audit = {**cfg["audit"], "prompts": cfg["audit"]["prompts"][:1], "samples_per_prompt": 1, "max_new_tokens": 8,
             "heldout_tokens": 64}
    run_audit(model_dir / "ckpt", model_dir / "shards.json", audit, cfg["curriculum"]["heldout_every"], model_dir / "audit")
    export(model_dir / "ckpt", model_dir / "hf")  # --out given, but its default is the same place
    return model_dir


@pytest.fixture(scope="module")
def untied(trained, tmp_path_factory):
    """A model with an untied head and random weights everywhere (LayerNorm too), on the
    adversarial segments with unused IDs at the end of its vocabulary."""
    tmp = tmp_path_factory.mktemp("untied")
    vocab = FIRST_SEGMENT + len(ADVERSARIAL) + 5
    segments = write_segments(tmp / "harris_segments.json", ADVERSARIAL, vocab)
    cfg = ModelConfig(vocab_size=vocab, d_model=24, n_head=3, n_layer=2, context=48, tied_head=False)
    w = np.random.default_rng(1).normal(0, 0.3, n_params(cfg)).astype(np.float32)
    (tmp / "ckpt").mkdir()
    write_checkpoint(tmp / "ckpt" / "final.bin", 7, w, np.zeros_like(w), np.zeros_like(w))
    meta = {"model": "untied", "model_config": cfg.__dict__, "train": {}, "backend": "numpy", "precision": "fp32",
            "backend_reason": "set in the config", "step": 7, "last_eval": None, "best_val_loss": None,
            "segments": str(segments), "tokenizer_hash": tokenizer_hash(ADVERSARIAL, vocab)}
    (tmp / "ckpt" / "run.json").write_text(json.dumps(meta))
    (tmp / "shards.json").write_text(json.dumps({"sources": {"made-up": {"n_docs": 3, "n_tokens": 99}}}))
    return export(tmp / "ckpt", tmp / "hf")


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("torch", reason="torch is not installed (pip install -c constraints.txt -e '.[hf]')")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # local directories only, never the hub
        yield pytest.importorskip("transformers", reason="transformers is not installed (pip install -c constraints.txt -e '.[hf]')")


@pytest.mark.parametrize("which", ["trained", "untied"])
def test_transformers_loads_gpt2_with_our_logits(which, request, hf):
    import torch

    out = request.getfixturevalue(which)
    out = out / "hf" if which == "trained" else out
    lm = load_model(out.parent / "ckpt")
    model, info = hf.AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    assert model.config.tie_word_embeddings == lm.cfg.tied_head
    T, V = lm.cfg.context, lm.cfg.vocab_size
    rng = np.random.default_rng(0)
    seqs = [[BOS, *lm.tokenizer.encode(PROMPT).tolist()],
            [BOS, *lm.tokenizer.encode("Hello, wörld! 😀 " * 10).tolist()][:T],
            rng.integers(0, V, T).tolist()]  # every position, unused IDs included
    worst = 0.0
    for ids in seqs:
        ours = InferenceModel(lm.cfg, lm.weights).forward(ids)
        with torch.no_grad():
            theirs = model(torch.tensor([ids])).logits[0].numpy()
        assert theirs.shape == ours.shape
        worst = max(worst, float(np.abs(theirs - ours).max()))
    print(f"{which}: max |logit difference| {worst:.2e} over {sum(map(len, seqs))} positions")
    assert worst < 1e-4


def test_generation_stops_at_bos_and_the_pipeline_writes_our_text(trained, hf):
    import torch

    out = trained / "hf"
    lm = load_model(trained / "ckpt")
    tok = hf.AutoTokenizer.from_pretrained(out)
    model = hf.AutoModelForCausalLM.from_pretrained(out)
    assert model.generation_config.eos_token_id == BOS and model.generation_config.do_sample
    ids = tok(PROMPT, return_tensors="pt")
    assert ids.input_ids[0].tolist() == [BOS, *lm.tokenizer.encode(PROMPT).tolist()]  # BOS first, as in training
    ours = generate(lm.model, ids.input_ids[0].tolist(), 24, np.random.default_rng(0), temperature=0)
    with torch.no_grad():
        greedy = model.generate(**ids, do_sample=False, max_new_tokens=24)[0, ids.input_ids.shape[1]:].tolist()
    assert greedy[: len(ours)] == ours  # the same tokens; ours stops before BOS, theirs emits it
    assert greedy[len(ours):] in ([], [BOS])

    pipe = hf.pipeline("text-generation", model=str(out))
    text = pipe(PROMPT, do_sample=False, max_new_tokens=24, add_special_tokens=True)[0]["generated_text"]
    assert text == PROMPT + lm.tokenizer.decode(ours, errors="replace")
    hf.set_seed(0)
    sampled = pipe(PROMPT, min_new_tokens=8, max_new_tokens=16)[0]["generated_text"]  # generation_config's sampling
    assert sampled.startswith(PROMPT) and len(sampled) > len(PROMPT)


# --------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("which", ["trained", "untied"])
def test_tokenizer_gives_our_ids_on_10000_strings_and_round_trips(which, request, hf):
    out = request.getfixturevalue(which)
    out = out / "hf" if which == "trained" else out
    ours = load_model(out.parent / "ckpt").tokenizer
    tok = hf.AutoTokenizer.from_pretrained(out)
    texts = random_texts(ours.segments, 10_000, seed=len(ours.segments))
    assert sum(map(len, texts)) > 500_000
    t0 = time.perf_counter()
    got = tok(texts, add_special_tokens=False).input_ids
    t_hf = time.perf_counter() - t0
    want = [ours.encode(t).tolist() for t in texts]
    bad = [(t, g, w) for t, g, w in zip(texts, got, want) if g != w]
    assert not bad, f"{len(bad)} of {len(texts)} differ; first: {bad[0][0][:80]!r}: {bad[0][1][:10]} vs {bad[0][2][:10]}"
    assert tok.batch_decode(want) == texts  # decode round-trips (BOS string included: it is text here)
    assert tok(texts[:100]).input_ids == [[BOS, *w] for w in want[:100]]  # BOS first with special tokens
    assert tok.decode([BOS, *want[6]], skip_special_tokens=True) == texts[6]
    print(f"{which}: {len(texts)} strings, {sum(map(len, texts)):,} characters: transformers {t_hf:.2f} s")


def test_unused_ids_decode_to_nothing_and_bos_moves_off_a_segment(untied, hf):
    tok = hf.AutoTokenizer.from_pretrained(untied)
    ours = load_model(untied.parent / "ckpt").tokenizer
    assert tok.bos_token != BOS_TOKEN and tok.bos_token_id == BOS  # "<|bos|>" is a segment there
    assert tok(BOS_TOKEN, add_special_tokens=False).input_ids == ours.encode(BOS_TOKEN).tolist() == [FIRST_SEGMENT + ADVERSARIAL.index(BOS_TOKEN)]
    unused = list(range(FIRST_SEGMENT + len(ADVERSARIAL), ours.vocab_size))
    assert tok.decode([104, *unused, 105]) == ours.decode([104, *unused, 105]) == "hi"


def test_byte_alphabet_is_gpt2s():
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = byte_alphabet()
    assert len(set(alphabet)) == 256 and set(alphabet) == set(ByteLevel.alphabet())
    assert alphabet[ord("A")] == "A" and alphabet[ord(" ")] == "Ġ" and alphabet[ord("\n")] == "Ċ"  # GPT-2's well-known ones


def test_tokenizer_construction_property():
    """Hypothesis: any text (of segments and any characters) encodes as ours, built directly."""
    from hypothesis import given, settings, strategies as st

    tok = HarrisTokenizer(ADVERSARIAL)
    t, _ = hf_tokenizer(tok)
    t.encode_special_tokens = True
    texts = st.lists(st.one_of(st.sampled_from(ADVERSARIAL), st.text(max_size=8)), max_size=30).map("".join)

    @settings(max_examples=400, deadline=None)
    @given(texts)
    def check(text):
        assert t.encode(text, add_special_tokens=False).ids == tok.encode(text).tolist()
        assert t.decode(tok.encode(text).tolist()) == text

    check()


# --------------------------------------------------------------------------- the directory


def test_export_directory_card_and_manifest(trained):
    out = trained / "hf"
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "config.json", "generation_config.json", "manifest.json", "model.safetensors",
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    run = json.loads((trained / "ckpt" / "run.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["activation_function"] == "gelu_new"
    assert (config["vocab_size"], config["n_embd"], config["n_positions"]) == (run["model_config"]["vocab_size"], MODEL["d_model"], MODEL["context"])
    audit_cfg = load_config(REPO / "config" / "config.yaml")["audit"]
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen == {"bos_token_id": BOS, "eos_token_id": BOS, "pad_token_id": BOS, "do_sample": True,
                   **{k: audit_cfg[k] for k in ("temperature", "top_k", "top_p", "max_new_tokens")}}
    card = (out / "README.md").read_text()
    shards_meta = json.loads((trained / "shards.json").read_text())
    for source, c in shards_meta["sources"].items():
        assert f"| {source} | {c['n_docs']:,} | {c['n_tokens']:,} |" in card
    summary = json.loads((trained / "audit" / "summary.json").read_text())
    assert f"| mean coherence (0–100) | {summary['mean_coherence']:.2f} |" in card
    if isinstance(summary["mean_judge_score"], str):  # no judge configured where the tests run
        assert f"| mean external judge score (0–10) | {summary['mean_judge_score']} |" in card
    assert f"| prompts found in the training documents | {summary['contaminated_prompts']} |" in card
    assert "| held-out figures cover | " in card and " sources have a held-out figure" in card
    assert f"N = {MODEL['n_segments']} segments" in card and "bytes/token on held-out text" in card
    assert f"| steps | {run['step']} |" in card and f"{run['last_eval']['loss']:.4f} nats/token" in card
    assert "| backend | numpy (fp32)" in card and "licence" in card.lower()
    manifest = json.loads((out / "manifest.json").read_text())
    assert {p["path"].rsplit("/", 1)[-1] for p in manifest["inputs"]} >= {"final.bin", "run.json", "harris_segments.json", "shards.json", "summary.json"}
    assert {p["path"] for p in manifest["outputs"]} == {p.name for p in out.iterdir()} - {"manifest.json"}


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_export_files_get_the_modes_a_plain_open_gives(untied, tmp_path, umask):
    """model.safetensors is readable where its neighbours are (safetensors itself writes 0o600)."""
    old = os.umask(umask)
    try:
        out = export(untied.parent / "ckpt", tmp_path / "hf")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {name: 0o666 & ~umask for name in modes}, {k: oct(v) for k, v in modes.items()}
    assert "model.safetensors" in modes


def test_export_best_weights(trained, tmp_path):
    from safetensors.numpy import load_file

    ckpt = tmp_path / "micro" / "ckpt"
    shutil.copytree(trained / "ckpt", ckpt)
    final = read_weights(ckpt / "final.bin")
    best = final.weights + np.float32(0.5)  # a best.bin unlike final.bin, from an earlier step
    write_checkpoint(ckpt / "best.bin", 10, best, np.zeros_like(best), np.zeros_like(best))
    out = export(ckpt, tmp_path / "best", "--which", "best", "--shards", str(trained / "shards.json"))
    wte = load_file(out / "model.safetensors")["transformer.wte.weight"]
    assert np.array_equal(wte, load_model(ckpt / "best.bin").model.P["wte"])
    assert not np.array_equal(wte, load_model(ckpt).model.P["wte"])
    assert "`best` weights (step 10;" in (out / "README.md").read_text()


def test_export_errors_name_the_file(trained, tmp_path, capsys):
    config = ["--config", str(REPO / "config" / "config.yaml")]
    assert cli.main(["export", *config, "--ckpt", str(tmp_path / "nope")]) == 1
    assert f"{tmp_path / 'nope'}: not a directory" in capsys.readouterr().err
    # --out at the model's directory (not an export) is refused and left whole
    before = sorted(p.name for p in trained.iterdir())
    assert cli.main(["export", *config, "--ckpt", str(trained / "ckpt"), "--out", str(trained)]) == 1
    assert f"{trained}: exists and is a directory without model.safetensors" in capsys.readouterr().err
    assert sorted(p.name for p in trained.iterdir()) == before
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained / "ckpt", ckpt)
    run = json.loads((ckpt / "run.json").read_text())
    segments = json.loads(open(run["segments"]).read())
    segments["segments"] = segments["segments"][:-1] + [{**segments["segments"][-1], "text": "zzzz"}]
    segments["tokenizer_hash"] = tokenizer_hash([s["text"] for s in segments["segments"]], segments["vocab_size"])
    (tmp_path / "harris_segments.json").write_text(json.dumps(segments))
    (ckpt / "run.json").write_text(json.dumps({**run, "segments": str(tmp_path / "harris_segments.json")}))
    assert cli.main(["export", *config, "--ckpt", str(ckpt), "--shards", str(trained / "shards.json")]) == 1
    assert "the segments file changed since training" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_snakemake_exports_and_a_new_audit_updates_the_export(workflow_dir):
    from conftest import snakemake
    from test_workflow import QUICK_TRAIN, set_config

    set_config(workflow_dir, QUICK_TRAIN)
    res = workflow_dir / "results" / "ANDREA-tiny"
    snakemake(workflow_dir, "results/ANDREA-tiny/hf")  # trains; no audit run, none waited for
    assert not (res / "audit").exists() and "No audit was run" in (res / "hf" / "README.md").read_text()
    assert (workflow_dir / "results" / "logs" / "export" / "ANDREA-tiny.log").stat().st_size > 0
    assert (workflow_dir / "results" / "benchmarks" / "export" / "ANDREA-tiny.tsv").exists()
    snakemake(workflow_dir)  # the default target: the audit
    assert "export" in snakemake(workflow_dir, "--dry-run", "results/ANDREA-tiny/hf").stdout
    snakemake(workflow_dir, "results/ANDREA-tiny/hf")
    summary = json.loads((res / "audit" / "summary.json").read_text())
    assert f"| mean coherence (0–100) | {summary['mean_coherence']:.2f} |" in (res / "hf" / "README.md").read_text()
    assert "Nothing to be done" in snakemake(workflow_dir, "--dry-run", "results/ANDREA-tiny/hf").stdout
