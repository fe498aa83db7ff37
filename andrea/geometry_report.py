"""The geometry views' plots, their page and their numbers (andrea/geometry.py computes them).

results/<model>/geometry/:
    geometry.html               one self-contained page (plots embedded), each view with how to read it
    plots/*.png                 the same plots as files (the Snakemake report shows them)
    geometry.json               every number but the long tables, with the settings and timings
    embedding.parquet           every token: id, text, kind, count, pc1, pc2
    embedding_frames.parquet    the trajectory: label, step, id, x, y (aligned to the final space)
    attention_maps.parquet      prompt, layer, head, query, key, probability
    attention_heads.parquet     layer, head and its summary over held-out windows
    interpolation.parquet       step (position along the path), segment, t, loss
    surface.parquet             alpha, beta, loss
    simplex.parquet             one row per phase: start, end, warmup, focus, both projections, weights
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from andrea.config_schema import STATIC_MODES

# what andrea/geometry.py computes with as well (defined here, below it: geometry writes its views
# through this module)
KIND_NAMES = {"byte": "byte", "segment": "Harris segment", "word": "whole word", "BOS": "BOS", "unused": "unused ID"}
TRIANGLE = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]])  # the ternary plot's vertices

KIND_COLOURS = {"byte": "#9e9e9e", "segment": "#1f77b4", "word": "#d62728", "BOS": "#000000"}
STATS = {  # the per-head summary: name, what it is
    "entropy": "entropy of the attention row, nats (0: one key; ln n: spread evenly over n keys)",
    "distance": "mean distance attended, Σ_j P_ij·(i − j) tokens back",
    "bos": "share of the attention on BOS tokens (a resting place: a head with nothing to do looks there)",
    "previous": "share on the previous token (j = i − 1): a previous-token head",
    "self": "share on the token itself (j = i)",
}

# How to read each view: the page's captions, and the Snakemake report's (workflow/report/geometry.rst)
CAPTIONS = {
    "embedding": (
        "Every token's embedding (a row of wte, which the tied output head reads too) projected on the "
        "first two principal components of all of them (PCA by SVD); the axes say how much of the variance "
        "each holds. Colour is the token's kind: a byte (0–255), a Harris segment (a piece of a word, "
        "punctuation or white space), a whole word of the tokenizer's sample, BOS. The most frequent segments "
        "are labelled. Tokens the model uses alike lie close: look for the bytes and the segments pulling "
        "apart, words clustering by role, BOS on its own. Two components of a wide space hide most of it: "
        "the neighbour table below measures in all dimensions."),
    "embedding_checkpoints": (
        "The same space along the run: the embeddings at the initial weights (rebuilt from the run's seed), "
        "at every kept checkpoint and at the end, each turned onto the final ones by orthogonal Procrustes "
        "(the rotation that brings it closest; a rotation changes no distance or cosine) and drawn on the "
        "final PCA axes. At the start the tokens are a random cloud; the structure of the last panel "
        "forming is the model learning its vocabulary. The residual (under each panel) is what no rotation "
        "explains: ||X·R − X_final|| / ||X_final||."),
    "neighbours": (
        "Nearest neighbours by cosine of the probe tokens (geometry.probe_tokens; by default the most frequent "
        "whole words), over every used token, in the full embedding space."),
    "attention": (
        "The attention probabilities of every layer (rows of panels) and head (columns) for one prompt, as "
        "the model's own forward pass computed them: row i of a panel is where token i (the query, on the left) "
        "looks, over the tokens up to it (the keys, below); each row sums to 1 and the upper triangle is "
        "the future, which it cannot see. Colour on a square-root scale, so that weak attention shows. "
        "A bright diagonal just below the main one is a previous-token head; a bright first column, a head "
        "resting on BOS."),
    "attention_heads": (
        "What each head does, averaged over the query positions of held-out windows (never trained on): "
        "the entropy of its attention (low: it looks at one token; high: it spreads), the mean distance it "
        "looks back, and the shares it puts on BOS, on the previous token and on the token itself. Early "
        "layers tend to hold local (previous-token) heads, later ones longer-range ones."),
    "interpolation": (
        "The validation loss (nats per token, the run's own held-out windows, batch and precision) along "
        "straight lines in weight space: from the initial weights to the first kept checkpoint, on to each "
        "next one, to the final weights; the x axis places each point by the steps of its ends. The squares "
        "are the ends, the grey dots the validation the run recorded as it trained: at the ends they agree. "
        "A straight segment with no bump means the optimizer moved through a convex-looking valley; a bump "
        "between two checkpoints is a barrier the training path went around."),
    "surface": (
        "A 2-D slice of the loss surface around the final weights θ*: the loss at θ* + α·δ + β·η for two random "
        "directions δ, η, each filter-normalised (Li et al. 2018: every filter of the direction, an output "
        "unit or an embedding row, scaled to the norm of the same filter of θ*; LayerNorm's parameters not "
        "moved), so that α = 1 changes every filter by its own size. The star is θ*. Wide, round contours: "
        "a flat minimum; tight or stretched ones: a sharp one. Contour levels up to the 95th percentile of "
        "the grid, so the basin stays readable."),
    "simplex": (
        "The curriculum's walk on the simplex of sources: one dot per phase (its mixture weights), joined in "
        "order, coloured by the step the phase began. Left, the radial projection: each source a vertex on "
        "the circle (sources of a family side by side), a mixture the weighted mean of the vertices, so "
        "all weight on one source lands on its vertex and an even mix at the centre. Right, the ternary plot "
        "of three source families (geometry.families): each mixture's weight summed by family. Grey hollow "
        "dots are phases of the curriculum warm-up, when only the warm-up sources are active; the large "
        "dot is the last phase. Floors keep the walk away from the vertices."),
    "simplex_focus": (
        "The focus set of every phase (the bandit's and bandit_normalised's: the sources chosen by UCB, weight 1 before the "
        "floors, caps and bonuses; exp3_loss's and heldout_progress's: the heaviest source; a static "
        "mode has none), along the steps; the shaded band is the curriculum warm-up. Each change of "
        "colour along a row is a phase boundary."),
}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 110) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- plots
def plot_embedding(e: dict, out: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 7))
    df = pd.DataFrame(e["tokens"])
    for kind in ("byte", "segment", "word", "BOS"):
        sel = df[df["kind"] == kind]
        if len(sel):
            ax.scatter(sel["pc1"], sel["pc2"], s=30 if kind == "BOS" else 6, c=KIND_COLOURS[kind], alpha=0.9 if kind == "BOS" else 0.55,
                       label=f"{KIND_NAMES[kind]} ({len(sel):,})", marker="*" if kind == "BOS" else "o", lw=0)
    by_id = df.set_index("id")
    for i in e["labelled"]:
        if i in by_id.index:
            r = by_id.loc[i]
            ax.annotate(r["text"], (r["pc1"], r["pc2"]), fontsize=7, alpha=0.85, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel(f"PC1 ({100 * e['explained'][0]:.1f}% of the variance)")
    ax.set_ylabel(f"PC2 ({100 * e['explained'][1]:.1f}%)")
    ax.set_title("Token embeddings (final weights)")
    ax.legend(fontsize=8, markerscale=2)
    fig.tight_layout()
    return _save(fig, out / "embedding.png")


def plot_embedding_frames(e: dict, out: Path) -> Path:
    plt = _plt()
    frames = e["frames"]
    n = len(frames)
    cols = min(n, 4)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows + 0.3), squeeze=False)
    kinds = np.array([t["kind"] for t in e["tokens"]])
    colours = np.array([KIND_COLOURS.get(k, "#999") for k in kinds])
    lim = np.abs(np.concatenate([f["xy"] for f in frames])).max() * 1.05 or 1.0
    for ax, f in zip(axes.flat, frames):
        ax.scatter(f["xy"][:, 0], f["xy"][:, 1], s=3, c=colours, lw=0, alpha=0.6)
        ax.set_xlim(-lim, lim), ax.set_ylim(-lim, lim), ax.set_xticks([]), ax.set_yticks([])
        ax.set_title(f"final (step {f['step']})" if f["label"] == "final" else f["label"], fontsize=9)
        ax.set_xlabel(f"residual {f['residual']:.3f}", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle("The embedding space forming (each aligned to the final by Procrustes, final PCA axes)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out / "embedding_checkpoints.png")


def plot_attention(m: dict, k: int, out: Path) -> Path:
    """One prompt: every layer × head as one mosaic image (one imshow: fast for 12 × 12 heads)."""
    from matplotlib.colors import PowerNorm

    plt = _plt()
    P = m["probs"]  # [L, H, n, n]
    L, H, n, _ = P.shape
    gap = 1
    img = np.full((L * (n + gap) - gap, H * (n + gap) - gap), np.nan)
    for l in range(L):
        for h in range(H):
            blk = P[l, h].astype(float).copy()
            blk[np.triu_indices(n, 1)] = np.nan  # the future: not a probability, left blank
            img[l * (n + gap) : l * (n + gap) + n, h * (n + gap) : h * (n + gap) + n] = blk
    cell, fs = 0.15, 7  # inches a token, points a label: readable at the image's own size (the page scrolls it)
    left, right, bottom, top = 1.1, 1.2, 0.9, 0.35  # inches: query labels; layer labels and the colour bar; key labels
    W, Hf = left + right + H * (n + gap) * cell, bottom + top + L * (n + gap) * cell
    fig = plt.figure(figsize=(W, Hf))
    ax = fig.add_axes([left / W, bottom / Hf, 1 - (left + right) / W, 1 - (bottom + top) / Hf])
    bar = min(2.5, Hf - bottom - top)
    cax = fig.add_axes([1 - 0.45 / W, (Hf - top - bar) / Hf, 0.12 / W, bar / Hf])
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")
    im = ax.imshow(img, cmap=cmap, norm=PowerNorm(0.5, vmin=0, vmax=1), interpolation="nearest", aspect="equal")
    toks = m["tokens"]
    # the tokens as plain text beside each block (query rows left, keys below): matplotlib's tick
    # objects cost a millisecond each, which at 12 × 12 heads was most of the plot's time
    ax.set_xticks([]), ax.set_yticks([])
    bottom_row = L * (n + gap) - gap - 0.5
    for l in range(L):
        for i, t in enumerate(toks):
            ax.text(-0.8, l * (n + gap) + i, t, ha="right", va="center", fontsize=fs, clip_on=False)
    for h in range(H):
        for j, t in enumerate(toks):
            ax.text(h * (n + gap) + j, bottom_row + 0.4, t, ha="center", va="top", rotation=90, fontsize=fs, clip_on=False)
    for h in range(H):
        ax.text(h * (n + gap) + n / 2 - 0.5, -1.2, f"head {h}", ha="center", va="bottom", fontsize=fs + 1)
    for l in range(L):
        ax.text(H * (n + gap) - gap + 0.5, l * (n + gap) + n / 2 - 0.5, f"layer {l}", ha="left", va="center", rotation=-90,
                fontsize=fs + 1)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)
    fig.colorbar(im, cax=cax).ax.tick_params(labelsize=fs)
    return _save(fig, out / f"attention_{k}.png", dpi=90 if L * H <= 32 else 72)


def plot_attention_heads(s: dict, out: Path) -> Path:
    plt = _plt()
    L, H = np.asarray(s["entropy"]).shape
    fig, axes = plt.subplots(1, len(STATS), figsize=(2.0 + 1.1 * len(STATS) * max(H, 3) * 0.45, 1.6 + 0.35 * L), squeeze=False)
    for ax, (k, what) in zip(axes[0], STATS.items()):
        v = np.asarray(s[k], float)
        im = ax.imshow(v, cmap="magma" if k in ("entropy", "distance") else "viridis", aspect="auto",
                       vmin=0, vmax=None if k in ("entropy", "distance") else 1)
        ax.set_title({"bos": "share on BOS", "previous": "share on previous", "self": "share on itself",
                      "entropy": "entropy (nats)", "distance": "distance back"}[k], fontsize=9)
        ax.set_xlabel("head", fontsize=8), ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(H)), ax.set_yticks(range(L))
        ax.tick_params(labelsize=7)
        if L * H <= 64:
            for (l, h), x in np.ndenumerate(v):
                ax.text(h, l, f"{x:.2f}" if k != "distance" else f"{x:.1f}", ha="center", va="center", fontsize=6,
                        color="white" if (x < 0.5 * (np.nanmax(v) or 1)) else "black")
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04).ax.tick_params(labelsize=6)
    fig.suptitle(f"Attention heads over {s['windows']} held-out windows ({s['tokens']:,} tokens)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out / "attention_heads.png")


def plot_interpolation(it: dict, out: Path) -> Path:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 4))
    c = pd.DataFrame(it["curve"])
    ax.plot(c["step"], c["loss"], "-", color="#1f77b4", lw=1.6, label="straight lines between the weights")
    v = [r for r in it["validation"] if r["loss"] is not None]
    if v:
        ax.plot([r["step"] for r in v], [r["loss"] for r in v], "o", color="#999", ms=4, label="validation the run recorded")
    for n in it["nodes"]:
        ax.plot(n["step"], n["loss"], "s", color="#d62728", ms=7)
        ax.annotate(n["label"], (n["step"], n["loss"]), fontsize=8, xytext=(4, 6), textcoords="offset points")
    ax.set_xlabel("step (a point between two checkpoints placed by their steps)"), ax.set_ylabel("validation loss (nats/token)")
    ax.set_title("Loss along the path init → kept checkpoints → final")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _save(fig, out / "interpolation.png")


def plot_surface(sf: dict, out: Path) -> Path:
    plt = _plt()
    a, b, Z = np.asarray(sf["alpha"]), np.asarray(sf["beta"]), np.asarray(sf["loss"], float)
    top = np.nanpercentile(Z, 95)
    levels = np.linspace(np.nanmin(Z), top, 16)
    fig, ax = plt.subplots(figsize=(6.4, 5.4))
    cf = ax.contourf(a, b, np.minimum(Z, top), levels=levels, cmap="viridis")
    cs = ax.contour(a, b, Z, levels=levels[::3], colors="white", linewidths=0.6)
    ax.clabel(cs, fontsize=7, fmt="%.2f")
    ax.plot(0, 0, "*", color="#d62728", ms=14, label="final weights θ*")
    fig.colorbar(cf, ax=ax, label="validation loss (nats/token)")
    ax.set_xlabel("α (filter-normalised direction δ)"), ax.set_ylabel("β (direction η)")
    ax.set_title(f"Loss surface around θ* ({len(a)}×{len(b)}, {sf['tokens']:,} held-out tokens)")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return _save(fig, out / "surface.png")


def _walk(ax, xy: np.ndarray, starts: np.ndarray, warm: np.ndarray):
    from matplotlib.collections import LineCollection

    if len(xy) > 1:
        segs = np.stack([xy[:-1], xy[1:]], axis=1)
        lc = LineCollection(segs, cmap="viridis", linewidths=1.0, alpha=0.8)
        lc.set_array(starts[1:].astype(float))
        ax.add_collection(lc)
    sc = ax.scatter(xy[~warm, 0], xy[~warm, 1], c=starts[~warm], cmap="viridis", s=14, zorder=3,
                    vmin=starts.min(), vmax=max(starts.max(), 1))
    if warm.any():
        ax.scatter(xy[warm, 0], xy[warm, 1], facecolors="none", edgecolors="#888", s=16, zorder=3, label="curriculum warm-up")
    ax.scatter(xy[-1:, 0], xy[-1:, 1], s=90, facecolors="none", edgecolors="#d62728", lw=2, zorder=4, label="last phase")
    return sc


def plot_simplex(sx: dict, out: Path) -> Path:
    plt = _plt()
    ph = sx["phases"]
    starts = np.array([p["start"] for p in ph])
    warm = np.array([p["warmup"] for p in ph])
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 6.2))
    V = np.asarray(sx["vertices"])
    ring = np.vstack([V, V[:1]])
    ax.plot(ring[:, 0], ring[:, 1], color="#ccc", lw=0.8)
    focus_last = set(ph[-1]["focus"])
    for (x, y), s in zip(V, sx["sources"]):
        ax.plot(x, y, "o", color="#444", ms=4)
        ax.annotate(s, (x, y), xytext=(x * 8, y * 8), textcoords="offset points", ha="center", va="center", fontsize=8,
                    fontweight="bold" if s in focus_last else "normal")
    sc = _walk(ax, np.array([[p["x"], p["y"]] for p in ph]), starts, warm)
    ax.set_aspect("equal"), ax.set_xlim(-1.35, 1.35), ax.set_ylim(-1.25, 1.25), ax.axis("off")
    ax.set_title(f"Radial projection: {len(sx['sources'])} sources, {len(ph)} phase{'' if len(ph) == 1 else 's'}"
                 + (" (last phase's focus in bold)" if focus_last else " (no focus set)"), fontsize=10)
    ax.legend(loc="lower left", fontsize=8)
    tri = np.vstack([TRIANGLE, TRIANGLE[:1]])
    bx.plot(tri[:, 0], tri[:, 1], color="#444", lw=1)
    for (x, y), (name, members) in zip(TRIANGLE, sx["families"].items()):
        bx.annotate(f"{name}\n({', '.join(m for m in members if m in sx['sources']) or 'no source'})", (x, y),
                    xytext=(0, -14 if y == 0 else 10), textcoords="offset points", ha="center",
                    va="top" if y == 0 else "bottom", fontsize=7, wrap=True)
    txy = np.array([[p["tx"], p["ty"]] for p in ph], float)
    placed = np.isfinite(txy).all(axis=1)  # a phase with no weight in the families has no place in the triangle
    if placed.any():
        _walk(bx, txy[placed], starts[placed], warm[placed])
    outside = np.mean([p["outside_families"] for p in ph])
    bx.set_aspect("equal"), bx.set_xlim(-0.15, 1.15), bx.set_ylim(-0.3, 1.05), bx.axis("off")
    bx.set_title(f"Ternary plot of the families ({100 * outside:.0f}% of the weight outside them, on average"
                 + (f"; {int((~placed).sum())} phase(s) with none in them left out" if not placed.all() else "") + ")", fontsize=10)
    fig.colorbar(sc, ax=[ax, bx], fraction=0.02, pad=0.01, label="step the phase began")
    return _save(fig, out / "simplex.png")


def plot_simplex_focus(sx: dict, out: Path) -> Path:
    plt = _plt()
    ph = sx["phases"]
    sources = sx["sources"]
    edges = np.array([p["start"] for p in ph] + [ph[-1]["end"]], float)
    M = np.array([[1.0 if s in p["focus"] else (0.25 if p[f"w:{s}"] > 0 else 0.0) for p in ph] for s in sources])
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.28 * len(sources)))
    ax.pcolormesh(edges, np.arange(len(sources) + 1), M, cmap="Blues", vmin=0, vmax=1, shading="flat")
    if sx["warmup_steps"] > 0:
        ax.axvspan(0, min(sx["warmup_steps"], edges[-1]), color="#f4a261", alpha=0.18, lw=0, label="curriculum warm-up")
        ax.legend(loc="upper right", fontsize=7)
    ax.set_yticks(np.arange(len(sources)) + 0.5, sources, fontsize=7)
    if any(p["focus"] for p in ph):
        title = "Focus set per phase (dark: in focus; light: active, background weight)"
    else:  # a static mode (the default, proportional) picks no focus: the sources drawn from are what there is to show
        title = f"Active sources per phase (curriculum mode {sx.get('mode', 'bandit')}: no focus set)"
    ax.set_xlabel("step"), ax.set_title(title, fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    return _save(fig, out / "simplex_focus.png")


# ----------------------------------------------------------------------------- the page and the numbers
def plots(out: dict, d: Path) -> dict[str, tuple[str, Path]]:
    """The plots into d/plots; returns {key: (title, png)}."""
    where = d / "plots"
    figs: dict[str, tuple[str, Path]] = {}
    e = out.get("embedding")
    if e:
        figs["embedding"] = ("Embedding space", plot_embedding(e, where))
        figs["embedding_checkpoints"] = ("The space forming, checkpoint by checkpoint", plot_embedding_frames(e, where))
    a = out.get("attention")
    if a:
        for k, m in enumerate(a["maps"]):
            figs[f"attention_{k}"] = (f"Attention maps: “{m['prompt']}”", plot_attention(m, k, where))
        if a.get("summary"):
            figs["attention_heads"] = ("What each head does", plot_attention_heads(a["summary"], where))
    if out.get("interpolation"):
        figs["interpolation"] = ("Loss along the training path", plot_interpolation(out["interpolation"], where))
    if out.get("surface"):
        figs["surface"] = ("Loss surface around the final weights", plot_surface(out["surface"], where))
    if out.get("simplex"):
        figs["simplex"] = ("The curriculum's walk on the simplex of sources", plot_simplex(out["simplex"], where))
        focus = any(p["focus"] for p in out["simplex"]["phases"])
        figs["simplex_focus"] = ("The focus set, phase by phase" if focus else "The active sources, phase by phase",
                                 plot_simplex_focus(out["simplex"], where))
    return figs


def write_page(out: dict, figs: dict[str, tuple[str, Path]], d: Path) -> None:
    (d / "geometry.html").write_text(page(out, figs), encoding="utf-8")


def _img(path: Path, title: str) -> str:
    b64 = base64.b64encode(path.read_bytes()).decode("ascii")
    img = f"<img class='plot' alt='{html.escape(title)}' src='data:image/png;base64,{b64}'>"
    # an attention mosaic at its own size, scrolled sideways, so that its tokens stay readable
    return f"<div class='wide'>{img}</div>" if path.name.startswith("attention_") and path.name != "attention_heads.png" else img


def _table(header: list[str], rows: list[list]) -> str:
    e = html.escape
    return ("<table><tr>" + "".join(f"<th>{e(str(h))}</th>" for h in header) + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in rows) + "</table>")


def page(out: dict, figs: dict[str, tuple[str, Path]]) -> str:
    e = html.escape
    secs = out["seconds"]
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Geometry of {e(out['model'])}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ddd;padding:.25em .5em;text-align:left}"
             ".caption{color:#444;font-size:.93em;max-width:60em}img{max-width:100%}h2{margin-top:1.6em}"
             "code{background:#f3f3f3;padding:0 .2em}.wide{overflow-x:auto}.wide img{max-width:none}</style></head><body>",
             f"<h1>Geometry of {e(out['model'])} at step {out['step']}</h1>",
             f"<p>Forward passes on {e(out['backend'])}/{e(out['precision'])} ({e(out['backend_reason'])}). "
             f"Views: {e(', '.join(out['views']))}. Time: " + e(", ".join(f"{k} {v} s" for k, v in secs.items())) + ".</p>"]

    def fig(key: str, caption_key: str | None = None) -> None:
        if key in figs:
            title, path = figs[key]
            parts.extend([f"<h2 id='{key}'>{e(title)}</h2>", f"<p class='caption'>{e(CAPTIONS[caption_key or key])}</p>",
                          _img(path, title)])

    emb = out.get("embedding")
    if emb:
        fig("embedding")
        kinds = ", ".join(f"{n:,} {k}" + ("" if n == 1 or k == "BOS" else "s") for k, n in emb["kinds"].items())
        note = "" if emb["word_marks"] else (" This tokenizer's file predates the whole-word mark, so no token is shown as a "
                                             "whole word: run the train_tokenizer stage again to have it.")
        parts.append(f"<p class='caption'>{e(kinds)}; {emb['unused_ids']:,} unused IDs left out.{e(note)}</p>")
        parts.append("<h3>Nearest neighbours (cosine)</h3>" + f"<p class='caption'>{e(CAPTIONS['neighbours'])}</p>")
        parts.append(_table(["probe", "neighbours (cosine)"],
                            [[n["probe"], ",  ".join(f"{x['token']} ({x['cosine']:.3f})" for x in n["neighbours"])]
                             for n in emb["neighbours"]]))
        if emb["probes_refused"]:
            parts.append("<p class='caption'>Not one token, so not probed: " + e("; ".join(
                f"{r['probe']!r} encodes as {' '.join(r['encodes_as'])}" for r in emb["probes_refused"])) + "</p>")
        fig("embedding_checkpoints")
    att = out.get("attention")
    if att:
        first = True
        for k in range(len(att["maps"])):
            if first:
                fig(f"attention_{k}", "attention")
                first = False
            elif f"attention_{k}" in figs:
                title, path = figs[f"attention_{k}"]
                parts.extend([f"<h3>{e(title)}</h3>", _img(path, title)])
        if att.get("summary"):
            fig("attention_heads")
            s = att["summary"]
            L, H = np.asarray(s["entropy"]).shape
            parts.append(_table(["layer", "head", *STATS], [[l, h, *[f"{np.asarray(s[k])[l, h]:.3f}" for k in STATS]]
                                                             for l in range(L) for h in range(H)]))
            parts.append("<ul class='caption'>" + "".join(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in STATS.items()) + "</ul>")
    it = out.get("interpolation")
    if it:
        fig("interpolation")
        parts.append(_table(["point", "step", "validation loss here", "the run recorded", "difference"],
                            [[n["label"], n["step"], n["loss"], n["recorded_loss"] if n["recorded_loss"] is not None else "no validation at this step",
                              n["difference"] if n["difference"] is not None else ""] for n in it["nodes"]]))
    sf = out.get("surface")
    if sf:
        fig("surface")
        parts.append(f"<p class='caption'>Grid {len(sf['alpha'])}×{len(sf['beta'])}, α and β from {-sf['span']} to {sf['span']}, "
                     f"{sf['windows']} held-out windows ({sf['tokens']:,} tokens), directions from seed {sf['seed']} "
                     f"(cosine between them {sf['directions_cosine']}: near 0, nearly orthogonal); loss at θ* on these windows "
                     f"{sf['centre_loss'] if sf['centre_loss'] is not None else 'n/a'}; {sf['seconds']} s.</p>")
    sx = out.get("simplex")
    if sx:
        fig("simplex")
        marks = ("every phase is marked in this run's log" if sx["marks_phases"] else
                 "this run's log predates the phase mark: a new point wherever the weights or the focus changed")
        mode = sx.get("mode", "bandit")
        how = (f"curriculum mode {mode}, a static mix, set at the start and where the warm-up ends; "
               "no focus set" if mode in STATIC_MODES else f"curriculum mode {mode}")
        n = len(sx["phases"])
        parts.append(f"<p class='caption'>{n:,} phase{'' if n == 1 else 's'} over {sx['last_step'] + 1:,} steps ({e(how)}); "
                     f"curriculum warm-up {sx['warmup_steps']:,} steps; {e(marks)}.</p>")
        fig("simplex_focus")
    parts.append("<p class='caption'>The numbers behind every plot are beside this page: geometry.json and the Parquet "
                 "tables (README, “Geometry of a run”).</p></body></html>")
    return "\n".join(parts)


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_numbers(out: dict, d: Path) -> None:
    """geometry.json and the Parquet tables (module docstring)."""
    doc = {k: v for k, v in out.items() if k not in ("embedding", "attention", "simplex")}
    e = out.get("embedding")
    if e:
        pd.DataFrame(e["tokens"]).to_parquet(d / "embedding.parquet", index=False)
        ids = np.array([t["id"] for t in e["tokens"]])
        pd.concat([pd.DataFrame({"label": f["label"], "step": f["step"], "id": ids, "x": f["xy"][:, 0], "y": f["xy"][:, 1]})
                   for f in e["frames"]]).to_parquet(d / "embedding_frames.parquet", index=False)
        doc["embedding"] = {k: v for k, v in e.items() if k not in ("tokens", "frames")}
        doc["embedding"]["frames"] = [{"label": f["label"], "step": f["step"], "procrustes_residual": f["residual"]} for f in e["frames"]]
    a = out.get("attention")
    if a:
        rows = []
        for m in a["maps"]:
            P = m["probs"]
            L, H, n, _ = P.shape
            l, h, i, j = np.meshgrid(np.arange(L), np.arange(H), np.arange(n), np.arange(n), indexing="ij")
            keep = (j <= i).reshape(-1)
            rows.append(pd.DataFrame({"prompt": m["prompt"], "layer": l.reshape(-1)[keep], "head": h.reshape(-1)[keep],
                                      "query": i.reshape(-1)[keep], "key": j.reshape(-1)[keep], "probability": P.reshape(-1)[keep]}))
        if rows:
            pd.concat(rows).to_parquet(d / "attention_maps.parquet", index=False)
        doc["attention"] = {"prompts": [{"prompt": m["prompt"], "tokens": m["tokens"], "ids": m["ids"]} for m in a["maps"]]}
        s = a.get("summary")
        if s:
            L, H = np.asarray(s["entropy"]).shape
            pd.DataFrame([{"layer": l, "head": h, **{k: float(np.asarray(s[k])[l, h]) for k in STATS}}
                          for l in range(L) for h in range(H)]).to_parquet(d / "attention_heads.parquet", index=False)
            doc["attention"]["summary"] = s
    if out.get("interpolation"):
        pd.DataFrame(out["interpolation"]["curve"]).to_parquet(d / "interpolation.parquet", index=False)
    if out.get("surface"):
        sf = out["surface"]
        A, B = np.meshgrid(sf["alpha"], sf["beta"])
        pd.DataFrame({"alpha": A.reshape(-1), "beta": B.reshape(-1), "loss": np.asarray(sf["loss"]).reshape(-1)}).to_parquet(
            d / "surface.parquet", index=False)
    sx = out.get("simplex")
    if sx:
        df = pd.DataFrame(sx["phases"])
        df["focus"] = df["focus"].map(lambda f: ",".join(f))
        df.to_parquet(d / "simplex.parquet", index=False)
        doc["simplex"] = {k: v for k, v in sx.items() if k != "phases"} | {"n_phases": len(sx["phases"])}
    (d / "geometry.json").write_text(json.dumps(_jsonable(doc), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
