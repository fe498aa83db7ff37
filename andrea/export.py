"""Export a trained model as a Hugging Face model directory that `transformers` loads as GPT-2,
with no custom code (README: "Sharing a model on the Hugging Face hub").

    model.safetensors        the weights in GPT-2's names and layout (fp32, as trained)
    config.json              GPT2LMHeadModel: learned positions, pre-LN, gelu_new, tied head
    generation_config.json   BOS/EOS 256 and the audit's sampling settings
    tokenizer.json           the Harris tokenizer for `tokenizers`: the same IDs as ours
    tokenizer_config.json, special_tokens_map.json
    README.md                the model card: data, tokenizer, training, validation, audit
    manifest.json            what was read (with SHA-256s), the code version

The model maps one to one: ANDREA is GPT-2 without biases (exported as zeros). Our linear weights
are [d_in, d_out] with y = x · W, which is also GPT-2's Conv1D convention, so nothing is
transposed: c_attn is [W_Q W_K W_V] side by side ([d, 3d]), c_proj W_O, c_fc W_1, mlp.c_proj W_2.

The tokenizer. Ours is greedy longest match of the segments, left to right, with single-byte
fallback. `tokenizers` reproduces it with
  1. a Split pre-tokenizer whose regex is the segment trie followed by `|[\\s\\S]` (one
     character): at every position the regex engine (Oniguruma: backtracking, leftmost, first
     alternative, greedy `?`, like Python's re) returns the longest segment starting there, or
     else that one character. This is the same trie-shaped regex our encoder scans with, so the
     pieces are exactly our segments and, between them, single characters;
  2. a ByteLevel pre-tokenizer (no regex, no prefix space), which maps each piece's UTF-8 bytes to
     GPT-2's printable byte alphabet;
  3. a WordPiece model with an empty continuation prefix over a vocabulary of the 256 byte
     characters (IDs 0–255), BOS (256) and the segments' byte strings (257 + i). WordPiece is
     greedy longest-match-first within a piece: a segment piece is in the vocabulary whole; a
     single-character piece splits into its bytes, because no segment lies inside one character
     (segments are valid UTF-8 of two or more bytes, and a segment equal to the character would
     have matched in step 1). Every byte is in the vocabulary, so the unknown-token path is
     never taken, and no piece is longer than `max_input_chars_per_word` (the longest segment).
Decoding is GPT-2's ByteLevel decoder: concatenate, map characters back to bytes, UTF-8.
Decision: WordPiece over the whole text (one piece, the first idea) gives the same IDs but costs
time cubic in the text's length (16,000 characters: 53 s); with pieces of at most one segment it
is linear (10,000 strings, 820,000 characters, N = 16,384: 0.4 s).
A post-processor puts BOS first, as training did, when special tokens are asked for; the BOS
string is not matched in input text (`split_special_tokens`), so every string encodes as ours.
Not representable: lone surrogates, which our encoder carries as "surrogatepass" bytes, cannot be
passed to `tokenizers` (Rust strings are valid Unicode).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np

from andrea.checkpoint import read_weights
from andrea.io import Manifest, atomic_dir, atomic_path, check_replaceable, read_document, sha256_file
from andrea.model import LN_EPS, ModelConfig, n_params, param_layout, views
from andrea.tokenizer import BOS, FIRST_SEGMENT, N_BYTES, HarrisTokenizer, trie_pattern

log = logging.getLogger("andrea.export")

BOS_TOKEN = "<|bos|>"
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "max_new_tokens")
DEFAULT_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "max_new_tokens": 200}  # andrea sample's
INSTALL_HINT = "pip install -c constraints.txt -e '.[hf]'"


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise RuntimeError(f"exporting to the Hugging Face format needs the `{module.split('.')[0]}` package: {INSTALL_HINT}") from None


# --------------------------------------------------------------------------- tokenizer


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character standing for each byte. Printable Latin-1
    bytes stand for themselves; the other 68 (controls, space, DEL, NBSP, soft hyphen) for the
    code points 256, 257, … in byte order, so every token string is printable."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    out, shifted = [], 0
    for b in range(N_BYTES):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(N_BYTES + shifted))
            shifted += 1
    return out


def _onig_escape(ch: str) -> str:
    # every character but ASCII letters and digits as a code point: no metacharacter, newline or
    # escape-syntax difference between Python's re and Oniguruma can change its meaning
    return ch if ch.isascii() and ch.isalnum() else f"\\x{{{ord(ch):X}}}"


def segment_regex(segments: list[str]) -> str:
    """Oniguruma regex matching, at any position, the longest segment there or else one character:
    our encoder's own trie pattern (andrea.tokenizer), quoted for Oniguruma, then any character."""
    if not segments:
        return r"[\s\S]"
    return trie_pattern(segments, escape=_onig_escape) + r"|[\s\S]"


def _bos_token(token_strings: set[str]) -> str:
    """BOS's string: <|bos|>, unless a segment's byte string happens to be that."""
    name, k = BOS_TOKEN, 0
    while name in token_strings:
        name, k = f"<|bos{k}|>", k + 1
    return name


def hf_tokenizer(tok: HarrisTokenizer):
    """A `tokenizers.Tokenizer` giving `tok`'s IDs (module docstring), and BOS's string."""
    tk = _require("tokenizers")
    from tokenizers import decoders, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(N_BYTES)}
    for i, s in enumerate(tok.segments):
        vocab["".join(alphabet[b] for b in s.encode("utf-8"))] = FIRST_SEGMENT + i
    bos = _bos_token(set(vocab))
    vocab[bos] = BOS
    longest = max([4, *(len(s.encode("utf-8")) for s in tok.segments)])  # a character is at most 4 bytes
    # unk_token: WordPiece needs one; it is never produced (every byte is in the vocabulary)
    t = tk.Tokenizer(WordPiece(vocab, unk_token=bos, max_input_chars_per_word=longest, continuing_subword_prefix=""))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tk.Regex(segment_regex(tok.segments)), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([tk.AddedToken(bos, special=True, normalized=False)])
    # documents are BOS-led in training (design §4.1): one BOS before each text of an input
    t.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, BOS)])
    return t, bos


def check_tokenizer(t, tok: HarrisTokenizer) -> None:
    """Raise if `t` does not give `tok`'s IDs on every segment alone and on all of them in a row
    (a cheap guard at export time; tests/test_export.py checks 10,000 random strings)."""
    probes = [*tok.segments, "".join(tok.segments), " ".join(tok.segments), "".join(reversed(tok.segments)),
              "Hello, wörld! 你好 😀\n\n> x\n\n< y\t\r\n" + BOS_TOKEN]
    t.encode_special_tokens = True  # what tokenizer_config.json's split_special_tokens asks of transformers
    got = t.encode_batch(probes, add_special_tokens=False)
    for text, enc in zip(probes, got):
        want = tok.encode(text).tolist()
        if enc.ids != want:
            raise RuntimeError(f"the exported tokenizer does not reproduce ANDREA's IDs on {text[:60]!r}: "
                               f"{enc.ids[:12]} instead of {want[:12]}; please report this as a bug")


# --------------------------------------------------------------------------- model


def gpt2_tensors(cfg: ModelConfig, weights: np.ndarray) -> dict[str, np.ndarray]:
    """Our flat weights as GPT2LMHeadModel's state dict (fp32). Biases, which we do not have,
    are zeros; a tied head is not stored (transformers ties lm_head to wte)."""
    P = views(np.asarray(weights, dtype=np.float32), param_layout(cfg))
    d, m = cfg.d_model, cfg.d_mlp
    out = {"transformer.wte.weight": P["wte"], "transformer.wpe.weight": P["wpe"]}
    for l in range(cfg.n_layer):
        p, h = (lambda name, l=l: P[f"h{l}.{name}"]), f"transformer.h.{l}"
        out |= {
            f"{h}.ln_1.weight": p("ln1.g"), f"{h}.ln_1.bias": p("ln1.b"),
            f"{h}.attn.c_attn.weight": np.concatenate([p("wq"), p("wk"), p("wv")], axis=1),  # [d, 3d]
            f"{h}.attn.c_attn.bias": np.zeros(3 * d, np.float32),
            f"{h}.attn.c_proj.weight": p("wo"), f"{h}.attn.c_proj.bias": np.zeros(d, np.float32),
            f"{h}.ln_2.weight": p("ln2.g"), f"{h}.ln_2.bias": p("ln2.b"),
            f"{h}.mlp.c_fc.weight": p("w1"), f"{h}.mlp.c_fc.bias": np.zeros(m, np.float32),
            f"{h}.mlp.c_proj.weight": p("w2"), f"{h}.mlp.c_proj.bias": np.zeros(d, np.float32),
        }
    out |= {"transformer.ln_f.weight": P["lnf.g"], "transformer.ln_f.bias": P["lnf.b"]}
    if not cfg.tied_head:
        out["lm_head.weight"] = P["head"]
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def gpt2_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.d_mlp,
        "activation_function": "gelu_new",  # GELU, tanh approximation
        "layer_norm_epsilon": LN_EPS,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.tied_head,
        "use_cache": True,
        "bos_token_id": BOS,
        "eos_token_id": BOS,
        "dtype": "float32",
    }


def generation_config(sampling: dict) -> dict:
    """Our generation: sample with the audit's temperature, top-k and top-p; stop at BOS."""
    return {
        "bos_token_id": BOS,
        "eos_token_id": BOS,
        "pad_token_id": BOS,
        "do_sample": True,
        "temperature": sampling["temperature"],
        "top_k": sampling["top_k"],
        "top_p": sampling["top_p"],
        "max_new_tokens": sampling["max_new_tokens"],
    }


# --------------------------------------------------------------------------- model card


def _fmt(x, digits=4) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    if isinstance(x, int):
        return f"{x:,}"
    return str(x)


AUDIT_ROWS = [  # summary.json key, label, digits
    ("heldout_loss", "held-out loss (nats/token)", 4), ("heldout_bits_per_byte", "held-out bits per byte", 4),
    ("perplexity", "held-out perplexity", 2), ("mean_coherence", "mean coherence (0–100)", 2),
    ("external_judge", "external judge", 0), ("mean_judge_score", "mean external judge score (0–10)", 2),
    ("contaminated_prompts", "prompts found in the training documents", 0),
    ("heldout_sources", "held-out figures cover", 0),
]


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def model_card(meta: dict, cfg: ModelConfig, step: int, which: str, bos: str, shards: dict, saturation: dict | None,
               audit: dict | None, sampling: dict, mcfg: dict) -> str:
    name = meta.get("model", "ANDREA model")
    train = meta.get("train", {})
    user, assistant = mcfg.get("user_prefix", "> "), mcfg.get("assistant_prefix", "< ")
    sep = mcfg.get("turn_separator", "\n\n")
    prompt = f"{user}What causes the seasons on Earth?{sep}{assistant}"
    lines = [
        "---", "library_name: transformers", "pipeline_tag: text-generation", "tags: [andrea, gpt2]", "---", "",
        f"# {name}", "",
        f"A {_count(n_params(cfg))}-parameter GPT ({cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.n_head} heads, "
        f"context {cfg.context} tokens) trained from scratch by ANDREA on chat and reference text. These are its "
        f"`{which}` weights (step {step:,}; `best` is the step of the lowest validation loss), in GPT-2's layout: "
        "`transformers` loads them as `GPT2LMHeadModel` with no custom code. ANDREA's linear layers have no "
        "biases; they are stored as zeros.", "",
        "## Use", "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        "tok = AutoTokenizer.from_pretrained(DIR)",
        "model = AutoModelForCausalLM.from_pretrained(DIR)",
        f"ids = tok({prompt!r}, return_tensors=\"pt\")  # puts BOS first, as in training",
        "out = model.generate(**ids)  # the sampling settings of generation_config.json",
        "print(tok.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True))",
        "```", "",
        f"Prompts are rendered as in training: a user turn behind `{user}`, then a blank line and "
        f"`{assistant}` for the answer. Generation stops at BOS (`{bos}`, ID {BOS}), the document "
        "separator, which is also the EOS token. `pipeline(\"text-generation\", model=DIR)` works too; pass "
        "`add_special_tokens=True` to it so the prompt starts with BOS as in training. Sampling defaults "
        f"(the audit's): temperature {sampling['temperature']}, top-k {sampling['top_k']}, top-p {sampling['top_p']}, "
        f"up to {sampling['max_new_tokens']} new tokens.", "",
        "## Training data", "",
        "Documents and tokens per source as encoded for training (every document led by BOS), held-out "
        "documents included:", "",
        "| source | documents | tokens |", "|---|---:|---:|",
    ]
    sources = shards.get("sources", {})
    for s, c in sorted(sources.items()):
        lines.append(f"| {s} | {_fmt(c['n_docs'])} | {_fmt(c['n_tokens'])} |")
    lines.append(f"| **all** | {_fmt(sum(c['n_docs'] for c in sources.values()))} | "
                 f"{_fmt(sum(c['n_tokens'] for c in sources.values()))} |")
    n_seg = cfg.vocab_size - FIRST_SEGMENT
    lines += [
        "", "## Tokenizer", "",
        f"ANDREA's Harris tokenizer with N = {n_seg:,} segments (vocabulary {cfg.vocab_size:,}): IDs 0–255 are raw "
        f"UTF-8 bytes, {BOS} is BOS, {FIRST_SEGMENT}+i is segment i, learned from the corpus by successor/"
        "predecessor variety. Text is encoded by greedy longest match of the segments with single-byte "
        "fallback, so every string round-trips. `tokenizer.json` gives the same IDs as ANDREA's encoder "
        "(a Split pre-tokenizer on the segment trie, GPT-2's byte-level alphabet, WordPiece with no "
        "continuation prefix); strings with lone surrogates, which ANDREA encodes as bytes, cannot be "
        "passed to `tokenizers`.",
    ]
    if saturation:
        held, samp = saturation.get("heldout") or {}, saturation.get("sample") or {}
        bpt = [f"{v['bytes_per_token']:.3f} bytes/token on {what}" for what, v in (("held-out text", held), ("its training sample", samp)) if v]
        if bpt:
            lines += ["", f"Compression: {' and '.join(bpt)}."]
    lines += ["", f"Tokenizer hash: `{meta.get('tokenizer_hash')}`.", "", "## Training", "", "| | |", "|---|---|"]
    rows = [("steps", _fmt(meta.get("step"))), ("batch size × sequence length",
            f"{train.get('batch_size')} × {train.get('seq_len') or cfg.context}"
            + (f", {train['grad_accum']} micro-batches per step" if train.get("grad_accum", 1) > 1 else "")
            if train.get("batch_size") else None),
            ("learning rate", train.get("lr")), ("seed", train.get("seed"))]
    if meta.get("tokens_seen") is not None:  # counted by the trainer (grad_accum and resumes included)
        rows.append(("tokens trained on", f"{meta['tokens_seen']:,}"))
    elif train.get("batch_size"):
        tokens = meta.get("step", 0) * train["batch_size"] * train.get("grad_accum", 1) * (train.get("seq_len") or cfg.context)
        rows.append(("tokens trained on", f"{tokens:,}"))
    ev = meta.get("last_eval") or {}
    if ev.get("loss") is not None:
        rows.append(("validation loss (last, step %s)" % _fmt(ev.get("step")),
                     f"{_fmt(ev['loss'])} nats/token" + (f", {_fmt(ev['bpb'])} bits/byte" if ev.get("bpb") is not None else "")))
    if meta.get("best_val_loss") is not None:
        rows.append(("best validation loss", f"{_fmt(meta['best_val_loss'])} nats/token"))
    rows += [("backend", f"{meta.get('backend')} ({meta.get('precision')}); {meta.get('backend_reason')}"),
             ("run key", f"`{meta.get('run_key')}`")]
    lines += [f"| {k} | {v} |" for k, v in rows if v is not None]
    lines += ["", "Validation: the held-out documents of every source (never trained on), loss in nats per token "
              "and bits per byte."]
    lines += ["", "## Audit", ""]
    if audit:
        lines += [f"ANDREA's audit of step {_fmt(audit.get('step'))}: samples for a fixed prompt set ({audit.get('samples')} in "
                  "all) scored by the built-in judges (and an external judge when one was configured), and the loss "
                  "on held-out documents.", "", "| | |", "|---|---|"]
        for k, label, digits in AUDIT_ROWS:
            if audit.get(k) is not None:
                lines.append(f"| {label} | {_fmt(audit[k], digits)} |")
    else:
        lines.append("No audit was run for this export.")
    lines += [
        "", "## Licence", "",
        "The ANDREA code is under the Apache-2.0 licence. The weights were learned from the training data "
        "above; each source's text keeps its own licence and terms of use, and they may bear on how the "
        "model can be shared and used. Check them before you redistribute the model.", "",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- export


def export_hf(ckpt_dir: str | Path, out_dir: str | Path, which: str = "final", shards: str | Path | None = None,
              audit_summary: str | Path | None = None, sampling: dict | None = None, mcfg: dict | None = None) -> dict:
    """Write the Hugging Face directory `out_dir` for the `which` (final|best) weights of a model's
    ckpt directory. `shards`: its shards.json (default: beside the ckpt directory); `audit_summary`:
    the audit's summary.json for the model card, if any; `sampling`: the audit's temperature,
    top_k, top_p and max_new_tokens for generation_config.json."""
    ckpt_dir, out = Path(ckpt_dir), Path(out_dir)
    if not ckpt_dir.is_dir():
        raise FileNotFoundError(f"{ckpt_dir}: not a directory; give a trained model's ckpt directory "
                                "(results/<model>/ckpt; --which picks final.bin or best.bin in it)")
    if which not in ("final", "best"):
        raise ValueError(f"which must be final or best, not {which!r}")
    check_replaceable(out, "model.safetensors")  # a wrong --out is refused, not deleted
    safetensors_numpy = _require("safetensors.numpy")
    meta = read_document(ckpt_dir / "run.json", "file (a trained model's ckpt directory has one: results/<model>/ckpt)")
    cfg = ModelConfig(**meta["model_config"])
    bin_path = ckpt_dir / f"{which}.bin"
    ck = read_weights(bin_path, expected_n_params=n_params(cfg))
    tok = HarrisTokenizer.load(meta["segments"])
    if tok.hash != meta["tokenizer_hash"]:
        raise ValueError(f"{meta['segments']}: its tokenizer hash differs from the one {ckpt_dir / 'run.json'} was "
                         "trained with: the segments file changed since training")
    if tok.vocab_size != cfg.vocab_size:
        raise ValueError(f"{meta['segments']}: vocabulary {tok.vocab_size} but the model has {cfg.vocab_size}")
    shards_path = Path(shards) if shards else ckpt_dir.parent / "shards.json"
    shards_meta = read_document(shards_path, "file (the model's shards.json)")
    saturation_path = Path(meta["segments"]).with_name("saturation.json")
    saturation = read_document(saturation_path) if saturation_path.exists() else None
    audit = read_document(audit_summary, "file (the audit's summary.json)") if audit_summary else None
    sampling = {k: (sampling or DEFAULT_SAMPLING)[k] for k in SAMPLING_KEYS}

    manifest = Manifest("export", meta.get("train_version", ""), {"which": which, "sampling": sampling})
    for p in (bin_path, ckpt_dir / "run.json", Path(meta["segments"]), shards_path, *([Path(audit_summary)] if audit else [])):
        manifest.add_input(p)

    t, bos = hf_tokenizer(tok)
    check_tokenizer(t, tok)
    with atomic_dir(out, "model.safetensors") as tmp:  # into a temporary directory, renamed when complete
        tensors = gpt2_tensors(cfg, ck.weights)
        with atomic_path(tmp / "model.safetensors") as st:
            mode = stat.S_IMODE(st.stat().st_mode)  # what a plain open() gives here: 0o666 less the umask
            safetensors_numpy.save_file(tensors, st, metadata={"format": "pt"})
            os.chmod(st, mode)  # save_file leaves its file 0o600, private among 0o644 neighbours
        t.save(str(tmp / "tokenizer.json"))
        special = {"bos_token": bos, "eos_token": bos, "pad_token": bos}
        files = {
            "config.json": gpt2_config(cfg),
            "generation_config.json": generation_config(sampling),
            "special_tokens_map.json": special,
            "tokenizer_config.json": {
                "tokenizer_class": "PreTrainedTokenizerFast",
                **special,
                "model_max_length": cfg.context,
                "clean_up_tokenization_spaces": False,  # it would edit spaces before punctuation on decode
                "split_special_tokens": True,  # "<|bos|>" in a text is text, as for our encoder
                "added_tokens_decoder": {str(BOS): {"content": bos, "special": True, "normalized": False, "lstrip": False,
                                                    "rstrip": False, "single_word": False}},
            },
        }
        for name, doc in files.items():
            (tmp / name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(model_card(meta, cfg, ck.step, which, bos, shards_meta, saturation, audit, sampling, mcfg or {}),
                                       encoding="utf-8")
        for p in sorted(tmp.iterdir()):  # named relative to the directory, which is meant to be moved (uploaded)
            manifest.data["outputs"].append({"path": p.name, "bytes": p.stat().st_size, "sha256": sha256_file(p)})
        manifest.data["counts"] = {"n_params": n_params(cfg), "step": ck.step, "tensors": len(tensors)}
        manifest.write(tmp / "manifest.json")
    log.info("exported %s (%s, step %d) to %s", ckpt_dir, which, ck.step, out)
    return {"out": str(out), "which": which, "step": ck.step, "n_params": n_params(cfg), "files": sorted(os.listdir(out))}

