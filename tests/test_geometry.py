"""The geometry views (andrea/geometry.py): the pieces against what they must recover, and the whole
stage on a model trained here."""

import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from andrea.config import geometry_settings, load_config
from andrea.engine import Engine
from andrea.engine.numpy_backend import NumpyBackend
from andrea.evaluation import build_eval_set, evaluate
from andrea.geometry import (
    TRIANGLE,
    filter_normalised_direction,
    head_summary,
    load_run,
    nearest_neighbours,
    pca,
    procrustes,
    radial_coords,
    radial_vertices,
    run_geometry,
    spread,
    subset,
    ternary_coords,
)
from andrea.model import ModelConfig, init_weights, param_layout
from andrea.trainer import Trainer
from conftest import REPO
from test_trainer import MODEL, TRAIN, shards  # noqa: F401  (fixture)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FAMILIES = {"chat": ["a", "b"], "prose": ["c"], "reference": ["d"]}


# ----------------------------------------------------------------------------- projections
def test_pca_recovers_a_planted_plane():
    """Points on a 2-D plane (a ring and a cross in it) embedded in 64 dimensions with a little noise:
    the two principal components span that plane, and hold nearly all of the variance."""
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 2 * np.pi, 300)
    Z = np.concatenate([np.stack([3 * np.cos(t), 3 * np.sin(t)], 1), np.stack([np.linspace(-2, 2, 100), np.zeros(100)], 1)])
    basis, _ = np.linalg.qr(rng.standard_normal((64, 2)))  # an orthonormal plane in R^64
    X = Z @ basis.T + 5.0 + 0.01 * rng.standard_normal((400, 64))
    coords, axes, explained, mu = pca(X)
    assert explained.sum() > 0.999
    # the axes span the planted plane: projecting its basis onto them loses nothing
    assert np.allclose(np.linalg.norm(axes @ basis, axis=0), 1, atol=1e-3)
    # and the coordinates are the planted points up to a rotation (Procrustes finds it)
    Zc = Z - Z.mean(0)
    R = procrustes(coords, Zc)
    assert np.abs(coords @ R - Zc).max() < 0.05


def test_procrustes_undoes_a_rotation_and_reflection():
    rng = np.random.default_rng(1)
    A = rng.standard_normal((50, 8))
    Q, _ = np.linalg.qr(rng.standard_normal((8, 8)))
    Q[:, 0] *= -1  # a reflection too: Procrustes' R is any orthogonal matrix
    R = procrustes(A @ Q, A)
    assert np.allclose(R @ R.T, np.eye(8), atol=1e-10)
    assert np.allclose(A @ Q @ R, A, atol=1e-10)


def test_nearest_neighbours_by_cosine_leave_the_probe_out():
    E = np.array([[1, 0], [2, 0.1], [0, 1], [-1, 0], [0.9, 0.5]], float)
    nn = nearest_neighbours(E, [0], 3, np.arange(5))
    assert [i for i, _ in nn[0]] == [1, 4, 2]  # length does not matter, direction does
    assert nn[0][0][1] == pytest.approx(2 / np.hypot(2, 0.1))


def test_filter_normalisation_scales_every_filter_to_the_weights_own():
    cfg = ModelConfig(vocab_size=300, d_model=16, n_head=2, n_layer=2, context=8)
    theta = init_weights(cfg, 3) * np.float32(3.0)
    d = filter_normalised_direction(cfg, theta, np.random.default_rng(0))
    for p in param_layout(cfg):
        w = theta[p.offset:p.offset + p.size].reshape(p.shape)
        v = d[p.offset:p.offset + p.size].reshape(p.shape)
        if len(p.shape) == 1:
            assert not v.any(), p.name  # LayerNorm's gains and biases stay
        else:
            axis = 1 if p.name in ("wte", "wpe") else 0  # an embedding row; a matrix's output column
            assert np.allclose(np.linalg.norm(v, axis=axis), np.linalg.norm(w, axis=axis), rtol=1e-4), p.name


# ----------------------------------------------------------------------------- the simplex
def test_a_one_hot_mixture_lands_on_its_vertex():
    n = 5
    W = np.eye(n)
    assert np.allclose(radial_coords(W), radial_vertices(n))
    assert np.allclose(radial_coords(np.full((1, n), 0.2)), 0, atol=1e-12)  # the even mix: the centre
    assert np.allclose(radial_coords(3 * W), radial_vertices(n))  # weights are normalised first
    sources = ["a", "b", "c", "d", "e"]
    xy, shares, outside = ternary_coords(np.eye(5), sources, FAMILIES)
    assert np.allclose(xy[:4], TRIANGLE[[0, 0, 1, 2]])  # a and b are chat's vertex, c prose's, d reference's
    assert np.allclose(outside, [0, 0, 0, 0, 1])  # e is in no family
    # all its weight outside the families: no place in the triangle (not chat's vertex), as on the dashboard
    assert np.isnan(xy[4]).all() and np.isnan(shares[4]).all()
    half = ternary_coords(np.array([[0.5, 0, 0.5, 0, 0]]), sources, FAMILIES)[0]
    assert np.allclose(half, (TRIANGLE[0] + TRIANGLE[1]) / 2)  # on the chat-prose edge


# ----------------------------------------------------------------------------- attention
def test_attention_probabilities_are_the_forward_pass_own():
    """Rows sum to one, nothing falls on the future, and P·V is the attention output the forward
    pass computed, layer by layer (the NumPy backend in float64, so the match is exact)."""
    cfg = ModelConfig(vocab_size=300, d_model=32, n_head=4, n_layer=2, context=16)
    e = Engine(cfg, batch_size=2, seq_len=12, dtype="float64")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 300, (2, 13))
    e.forward(x[:, :-1], x[:, 1:])
    for l in range(cfg.n_layer):
        a = e.A.layer(l)
        P = e.be.attn_probs(a.qkv, a.att_lse)
        assert P.shape == (2, 4, 12, 12)
        assert np.allclose(P.sum(-1), 1, atol=1e-12)
        assert not np.triu(P, 1).any()
        y = (P @ a.qkv[2]).transpose(0, 2, 1, 3).reshape(2, 12, 32)
        assert np.allclose(y, a.att_y, atol=1e-12)
    # the backend-independent version (the one the GPU backend inherits) gives the same in fp32
    e32 = Engine(cfg, batch_size=2, seq_len=12)
    e32.forward(x[:, :-1], x[:, 1:])
    a = e32.A.layer(1)
    base = super(NumpyBackend, e32.be).attn_probs(a.qkv, a.att_lse)
    assert np.allclose(base, e32.be.attn_probs(a.qkv, a.att_lse), atol=1e-6)


def test_head_summary_of_known_patterns():
    T = 6
    prev = np.zeros((1, 2, T, T))
    prev[0, 0, 0, 0] = 1
    prev[0, 0, np.arange(1, T), np.arange(T - 1)] = 1  # head 0: the previous token
    prev[0, 1, :, 0] = 1  # head 1: everything on position 0 (BOS)
    tokens = np.array([[256, 5, 6, 7, 8, 9]])
    s = head_summary(prev, tokens)
    mean = {k: s[k] / s["rows"] for k in ("entropy", "distance", "bos", "previous", "self")}
    # query 1 of head 0 looks back at position 0, the BOS: a fifth of its rows
    assert np.allclose(mean["previous"], [1, 1 / (T - 1)]) and np.allclose(mean["bos"], [1 / (T - 1), 1])
    assert np.allclose(mean["distance"], [1, np.mean(np.arange(1, T))]) and np.allclose(mean["entropy"], 0)
    uniform = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    s = head_summary(uniform[None, None], tokens)
    assert s["entropy"][0] / s["rows"] == pytest.approx(np.mean(np.log(np.arange(2, T + 1))))


# ----------------------------------------------------------------------------- the stage on a trained run
@pytest.fixture(scope="module")
def trained(shards, tmp_path_factory):  # noqa: F811
    tmp = tmp_path_factory.mktemp("geometry")
    cfg = load_config(REPO / "config" / "config.yaml")
    cfg["models"]["micro"] = MODEL
    cfg["train"]["micro"] = {**TRAIN, "max_steps": 120, "sample_every": 200, "checkpoint_every": 40, "eval_every": 40,
                             "keep_checkpoints": 2}
    Trainer(cfg, "micro", shards, tmp / "run").run(out_dir=tmp / "ckpt")
    g = geometry_settings(cfg, "micro") | {"surface_grid": 5, "surface_tokens": 128, "line_points": 2,
                                           "attention_windows": 4, "label_segments": 5}
    prompts = ["Why does ice float?", "define harvest"]
    out = run_geometry(tmp / "ckpt", shards, g, tmp / "geometry", prompts, cfg["megachat"])
    out["shards"] = shards
    return cfg, tmp, out


def test_interpolation_ends_are_the_runs_own_validation_losses(trained):
    """The path's ends (the initial weights, rebuilt from the seed; each kept checkpoint; the final
    weights) measured again equal the validation losses the trainer recorded at those steps."""
    _, tmp, out = trained
    nodes = out["interpolation"]["nodes"]
    assert [n["step"] for n in nodes] == [0, 80, 120]  # keep_checkpoints 2: steps 80 and 120, final is 120's bytes
    for n in nodes:
        assert n["recorded_loss"] is not None and n["loss"] == pytest.approx(n["recorded_loss"], abs=2e-5), n
    curve = pd.read_parquet(tmp / "geometry" / "interpolation.parquet")
    assert len(curve) == 3 + 2 * 2 and curve["step"].is_monotonic_increasing
    assert nodes[0]["loss"] > nodes[-1]["loss"]  # training lowered it


def test_the_stage_writes_its_views_numbers_and_page(trained):
    cfg, tmp, out = trained
    d = tmp / "geometry"
    doc = json.loads((d / "geometry.json").read_text())
    assert doc["views"] == ["embedding", "attention", "surface", "simplex"] and doc["backend"] == "numpy"
    emb = pd.read_parquet(d / "embedding.parquet")
    assert set(emb["kind"]) >= {"byte", "segment", "word", "BOS"} and (emb["kind"] == "BOS").sum() == 1
    frames = pd.read_parquet(d / "embedding_frames.parquet")
    assert frames["label"].unique().tolist() == ["init", "step 80", "final"]
    assert doc["embedding"]["frames"][-1]["procrustes_residual"] < 1e-6 < doc["embedding"]["frames"][0]["procrustes_residual"]
    assert len(doc["embedding"]["neighbours"]) == 8 and all(len(n["neighbours"]) == 8 for n in doc["embedding"]["neighbours"])
    maps = pd.read_parquet(d / "attention_maps.parquet")
    sums = maps.groupby(["prompt", "layer", "head", "query"])["probability"].sum()
    assert np.allclose(sums, 1, atol=1e-5) and (maps["key"] <= maps["query"]).all()
    assert doc["attention"]["prompts"][1]["tokens"][0] == "<BOS>"
    heads = pd.read_parquet(d / "attention_heads.parquet")
    assert len(heads) == MODEL["n_layer"] * MODEL["n_head"] and heads["bos"].between(0, 1).all()
    surf = pd.read_parquet(d / "surface.parquet")
    assert len(surf) == 25 and surf["alpha"].min() == -1 and surf["beta"].max() == 1
    # the slice's centre is the final weights, measured on the slice's windows (4 of 32 tokens)
    run = load_run(tmp / "ckpt", out["shards"])
    es = build_eval_set(run.shards, cfg["curriculum"]["heldout_every"], run.seq_len, TRAIN["eval_tokens"], run.tok.token_bytes)
    es = subset(es, spread(len(es), 4))
    e = Engine(run.cfg, batch_size=TRAIN["batch_size"], seq_len=run.seq_len)
    e.load_state(run.final)
    centre = surf.loc[(surf.alpha == 0) & (surf.beta == 0), "loss"].iloc[0]
    assert doc["surface"]["windows"] == 4 and centre == evaluate(e, es)["loss"]
    simplex = pd.read_parquet(d / "simplex.parquet")
    assert len(simplex) >= 2 and simplex["warmup"].iloc[0] and not simplex["warmup"].iloc[-1]  # curriculum warm-up 60 steps
    assert np.allclose(np.hypot(simplex["x"], simplex["y"]) <= 1 + 1e-9, True)
    # the trainer marks every phase in loss.jsonl: each point starts where the one before ends, at a re-plan
    assert doc["simplex"]["marks_phases"] and simplex["start"].iloc[0] == 0 and (simplex["start"].iloc[1:].values == simplex["end"].iloc[:-1].values).all()
    lengths = np.diff(np.append(simplex["start"].values[simplex["start"].values < 60], 60))  # to the warm-up's end, a re-plan
    assert set(lengths[:-1]) <= set(cfg["curriculum"]["phase_lengths"])
    pngs = sorted(p.name for p in (d / "plots").glob("*.png"))
    assert pngs == ["attention_0.png", "attention_1.png", "attention_heads.png", "embedding.png", "embedding_checkpoints.png",
                    "interpolation.png", "simplex.png", "simplex_focus.png", "surface.png"]
    page = (d / "geometry.html").read_text()
    assert page.count("<img class='plot'") == len(pngs) and "filter-normalised" in page and "Procrustes" in page


def test_views_can_be_chosen_and_a_bad_one_is_named(trained, shards, tmp_path):  # noqa: F811
    cfg, tmp, _ = trained
    g = geometry_settings(cfg, "micro")
    out = run_geometry(tmp / "ckpt", shards, g, tmp_path / "g", [], cfg["megachat"], views=["simplex"])
    assert out["views"] == ["simplex"] and "surface" not in out and (tmp_path / "g" / "simplex.parquet").exists()
    with pytest.raises(ValueError, match="unknown view.*the views are embedding, attention, surface, simplex"):
        run_geometry(tmp / "ckpt", shards, g, tmp_path / "h", [], views=["embeddings"])
    # a run.json without a key the views need: the file and the key named
    broken = tmp_path / "broken"
    shutil.copytree(tmp / "ckpt", broken)
    meta = json.loads((broken / "run.json").read_text())
    del meta["model_config"]
    (broken / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"broken/run.json: no model_config"):
        load_run(broken, shards)
    # a previous geometry output is replaced; any other directory (here the checkpoint) is refused, untouched
    run_geometry(tmp / "ckpt", shards, g, tmp_path / "g", [], cfg["megachat"], views=["simplex"])
    before = sorted(p.name for p in (tmp / "ckpt").iterdir())
    with pytest.raises(FileExistsError, match="ckpt: exists and is a directory without geometry.json"):
        run_geometry(tmp / "ckpt", shards, g, tmp / "ckpt", [], cfg["megachat"], views=["simplex"])
    assert sorted(p.name for p in (tmp / "ckpt").iterdir()) == before and "final.bin" in before


def test_the_walk_of_the_default_static_mix_is_its_two_phases(trained, shards, tmp_path):  # noqa: F811
    """The default curriculum (proportional, issue 41) sets its mix at the start and where the warm-up
    ends: the walk is those two points, with no focus, and the page says it is a static mix; the
    bandit's page names its mode."""
    cfg, tmp, _ = trained
    assert "curriculum mode bandit)" in (tmp / "geometry" / "geometry.html").read_text()
    cfg = {**cfg, "train": {**cfg["train"], "micro": {**cfg["train"]["micro"], "max_steps": 80,
                                                      "curriculum": {"warmup_steps": 60}}}}
    assert "mode" not in cfg["train"]["micro"]["curriculum"] and cfg["curriculum"]["mode"] == "proportional"
    Trainer(cfg, "micro", shards, tmp_path / "run").run(out_dir=tmp_path / "ckpt")
    out = run_geometry(tmp_path / "ckpt", shards, geometry_settings(cfg, "micro"), tmp_path / "g", [], cfg["megachat"],
                       views=["simplex"])
    sx = out["simplex"]
    assert sx["mode"] == "proportional" and [(p["start"], p["end"], p["warmup"], p["focus"]) for p in sx["phases"]] == [
        (0, 60, True, []), (60, 80, False, [])]
    page = (tmp_path / "g" / "geometry.html").read_text()
    assert "2 phases over 80 steps (curriculum mode proportional, a static mix" in page
    assert "The active sources, phase by phase" in page and "The focus set, phase by phase" not in page
    assert (tmp_path / "g" / "plots" / "simplex_focus.png").stat().st_size > 0


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (Debian: apt-get install chromium)")
def test_page_renders_in_a_browser(trained, tmp_path):
    _, tmp, _ = trained
    page = (tmp / "geometry" / "geometry.html").as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'p'}"]
    dom = subprocess.run([CHROMIUM, *flags, "--dump-dom", page], capture_output=True, text=True, timeout=90).stdout
    assert "<h1>Geometry of micro at step 120</h1>" in dom
    assert dom.count('src="data:image/png;base64,') == 9
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *flags, "--window-size=1200,3000", f"--screenshot={shot}", page], capture_output=True, timeout=90)
    assert shot.exists() and shot.stat().st_size > 50_000
