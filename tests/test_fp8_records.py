"""`precision: auto` and the fp8 record (andrea/engine/fp8_records.py): fp8 for a training run only on
an fp8 GPU, where the record measured it faster than bf16 for this GPU kind, model and nearest batch,
and the model passed the quality gate (6,000 steps, bits/byte within 1 %); bf16 otherwise, with the
reason. The record's writers (bench/gpu_bench.py, bench/fp8_gate.py --record). No GPU: the GPU's
name and compute capability are given."""

import importlib.util
import json
import subprocess
import sys
from dataclasses import asdict

import pytest

from andrea.engine import engine as engine_mod
from andrea.engine.fp8_records import (
    GATE_LIMIT,
    GATE_STEPS,
    MIN_SPEEDUP,
    RECORD_PATH,
    TrainShape,
    auto_precision,
    load_record,
    nearest_rows,
    update_record,
    with_gate,
    with_speed_rows,
)
from andrea.model import ModelConfig
from conftest import REPO, model_shards

H200 = ("NVIDIA H200", "90")
M120 = asdict(ModelConfig(vocab_size=8449, d_model=768, n_head=12, n_layer=12, context=1024))


def speed(B, bf16, fp8, gpu="NVIDIA H200", model="ANDREA-120M", config=M120, T=1024, date="2026-12-03"):
    return {"gpu": gpu, "compute_capability": "90", "model": model, "model_config": config, "batch_size": B,
            "seq_len": T, "bf16_tok_s": bf16, "fp8_tok_s": fp8, "date": date, "command": "python3 bench/gpu_bench.py ..."}


def gate(diff=0.0021, steps=6000, config=M120, date="2026-12-04"):
    return {"model_config": config, "steps": steps, "bf16_bpb": 1.0, "fp8_bpb": 1.0 + diff, "relative_difference": diff,
            "limit": GATE_LIMIT, "passed": abs(diff) <= GATE_LIMIT, "date": date, "command": "python3 bench/fp8_gate.py ..."}


@pytest.fixture
def record(tmp_path):
    """A record on disk, as the writers leave it: 120M at B=8 and 32 on the H200, its gate passed."""
    path = tmp_path / "fp8_records.json"
    update_record(path, lambda r: with_speed_rows(r, [speed(8, 594_348, 646_229), speed(32, 667_521, 769_654)]))
    update_record(path, lambda r: with_gate(r, "ANDREA-120M", gate()))
    return path


def decide(path, B=32, gpu=H200, model="ANDREA-120M", config=M120, T=1024):
    return auto_precision(load_record(path), *gpu, TrainShape(model, config, B, T))


def test_fp8_where_it_is_faster_and_passed_the_gate(record):
    assert decide(record) == ("fp8", "auto: fp8 (1.15× bf16 at B=32×1024 on NVIDIA H200, 2026-12-03; "
                                     "gate passed: +0.21 % bits/byte after 6,000 steps, 2026-12-04)")
    assert decide(record, B=8)[0] == "fp8"
    assert decide(record, gpu=("NVIDIA H200", "100"))[0] == "fp8"  # the kind is the name; any fp8 capability


def test_each_missing_condition_keeps_bf16_and_says_which(record, tmp_path):
    prec, why = decide(record, gpu=("NVIDIA A100-SXM4-80GB", "80"))
    assert prec == "bf16" and why == "auto: bf16 (NVIDIA A100-SXM4-80GB, compute capability 8.0, has no fp8 tensor cores)"
    prec, why = decide(record, gpu=("NVIDIA H100 80GB HBM3", "90"))  # fp8-capable, but not measured there
    assert prec == "bf16" and why == "auto: bf16 (no fp8 speed measured for ANDREA-120M on NVIDIA H100 80GB HBM3)"
    prec, why = decide(record, model="ANDREA-480M")
    assert prec == "bf16" and "no fp8 speed measured for ANDREA-480M on NVIDIA H200" in why
    prec, why = decide(record, config={**M120, "n_layer": 24})  # the name is 120M's, the model is not
    assert prec == "bf16" and "of another architecture" in why
    prec, why = decide(record, B=3, T=1000)  # no fp8 product takes 3,000 rows
    assert prec == "bf16" and why == "auto: bf16 (fp8 needs B·T (3000) to be a multiple of 16)"
    prec, why = decide(record, B=3, T=1000, config={**M120, "d_model": 760, "n_head": 8, "mlp_ratio": 3})
    assert why == "auto: bf16 (fp8 needs B·T (3000), d_model (760), the MLP width (2280) to be multiples of 16)"

    no_gate = tmp_path / "no_gate.json"
    update_record(no_gate, lambda r: with_speed_rows(r, load_record(record)["speed"]))
    assert decide(no_gate) == ("bf16", "auto: bf16 (fp8 1.15× bf16 at B=32×1024 on NVIDIA H200, 2026-12-03, "
                                       "but no fp8 gate run for ANDREA-120M)")
    update_record(record, lambda r: with_gate(r, "ANDREA-120M", gate(diff=0.0143)))
    prec, why = decide(record)
    assert prec == "bf16" and why.endswith("but the fp8 gate failed for ANDREA-120M: +1.43 % bits/byte after 6,000 steps, "
                                           "2026-12-04; limit ±1 %)")
    update_record(record, lambda r: with_gate(r, "ANDREA-120M", gate(diff=-0.0143)))  # within 1 % either way
    assert decide(record)[0] == "bf16"
    update_record(record, lambda r: with_gate(r, "ANDREA-120M", gate(steps=2000)))
    prec, why = decide(record)
    assert prec == "bf16" and "gate run for ANDREA-120M is too short: +0.21 % bits/byte after 2,000 steps" in why
    assert why.endswith(f"needs {GATE_STEPS:,} steps)")
    update_record(record, lambda r: with_gate(r, "ANDREA-120M", gate(config={**M120, "d_model": 1536})))
    assert "the fp8 gate run for ANDREA-120M was of another architecture" in decide(record)[1]


def test_slower_or_barely_faster_keeps_bf16(tmp_path):
    path = tmp_path / "r.json"
    update_record(path, lambda r: with_gate(with_speed_rows(r, [speed(8, 2_471_588, 2_287_627), speed(32, 3_067_609, 3_068_638)]),
                                            "ANDREA-120M", gate()))
    prec, why = decide(path, B=8)
    assert prec == "bf16" and why == (f"auto: bf16 (fp8 0.93× bf16 at B=8×1024 on NVIDIA H200, 2026-12-03; "
                                      f"fp8 needs ≥ {MIN_SPEEDUP:.2f}×)")
    prec, why = decide(path, B=32)  # level (1.0003×) is not faster: within what a re-run moves
    assert prec == "bf16" and "fp8 1.00× bf16 at B=32×1024" in why


def test_nearest_is_by_tokens_per_micro_batch_and_a_tie_must_agree(record, tmp_path):
    rows = load_record(record)["speed"]
    assert [r["batch_size"] for r in nearest_rows(rows, 4 * 1024)] == [8]
    assert [r["batch_size"] for r in nearest_rows(rows, 12 * 1024)] == [8]  # 1.5× from 8, 2.7× from 32
    assert [r["batch_size"] for r in nearest_rows(rows, 20 * 1024)] == [32]
    assert [r["batch_size"] for r in nearest_rows(rows, 128 * 1024)] == [32]
    assert [r["batch_size"] for r in nearest_rows(rows, 16 * 1024)] == [8, 32]  # the same ratio each way
    assert [r["batch_size"] for r in nearest_rows(rows, 64 * 512)] == [32]  # B=64 of 512 tokens: B=32's B·T
    # B=16 lies as far from a slow B=8 as from a fast B=32: both must be faster
    path = tmp_path / "tie.json"
    update_record(path, lambda r: with_gate(with_speed_rows(r, [speed(8, 100.0, 90.0), speed(32, 100.0, 120.0)]),
                                            "ANDREA-120M", gate()))
    assert decide(path, B=16)[0] == "bf16" and "fp8 0.90× bf16 at B=8×1024" in decide(path, B=16)[1]
    assert decide(path, B=32)[0] == "fp8"


def test_the_writers_replace_their_own_rows_only_and_write_atomically(record):
    update_record(record, lambda r: with_speed_rows(r, [speed(32, 600_000, 700_000, date="2026-12-05"),
                                                         speed(32, 1.0, 2.0, gpu="NVIDIA H100 80GB HBM3")]))
    rows = load_record(record)["speed"]
    assert sorted((r["gpu"], r["batch_size"], r["date"]) for r in rows) == [
        ("NVIDIA H100 80GB HBM3", 32, "2026-12-03"), ("NVIDIA H200", 8, "2026-12-03"), ("NVIDIA H200", 32, "2026-12-05")]
    update_record(record, lambda r: with_gate(r, "ANDREA-480M", gate(diff=0.003)))
    g = load_record(record)["gate"]
    assert set(g) == {"ANDREA-120M", "ANDREA-480M"} and g["ANDREA-120M"]["relative_difference"] == 0.0021
    assert [p.name for p in record.parent.iterdir()] == [record.name]  # no temporary file left beside it


def test_a_missing_record_is_empty_and_a_broken_one_is_named(tmp_path):
    assert load_record(tmp_path / "none.json") == {"speed": [], "gate": {}}
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="bad.json: the fp8 record is not valid JSON"):
        load_record(bad)
    bad.write_text(json.dumps({"speed": [{"gpu": "NVIDIA H200", "model": "ANDREA-12M"}]}))
    with pytest.raises(ValueError, match="bad.json: speed row 0 lacks model_config, batch_size, seq_len"):
        load_record(bad)


def test_the_shipped_record_holds_the_measured_speeds_and_gates():
    """Every shipped speed row and gate entry is a measurement kept in records/ (the gpu_bench or
    fp8_gate JSON its source names: the same tokens/s, the same bits/byte, the shipped model's
    architecture). What auto then picks on an H200: fp8 at ANDREA-120M (gate passed, fp8 1.10x and
    1.15x bf16), bf16 at ANDREA-12M (gate passed, but fp8 is no faster) and ANDREA-480M (no gate yet)."""
    from andrea.config import load_config

    rec = load_record(RECORD_PATH)
    assert {(r["model"], r["batch_size"]) for r in rec["speed"]} == {
        ("ANDREA-12M", 8), ("ANDREA-12M", 32), ("ANDREA-120M", 8), ("ANDREA-120M", 32), ("ANDREA-480M", 8)}
    cfg = load_config(REPO / "config" / "config.yaml")
    shipped = {m: asdict(ModelConfig.from_config(cfg["models"][m])) for m in ("ANDREA-12M", "ANDREA-120M", "ANDREA-480M")}
    for r in rec["speed"]:
        assert (r["gpu"], r["compute_capability"], r["seq_len"]) == ("NVIDIA H200", "90", 1024)
        assert r["model_config"] == shipped[r["model"]]
        measured = json.loads((REPO / r["source"].split(" ")[0]).read_text())  # gpu_bench --out's rows
        (row,) = [m for m in measured if (m["model"], m["B"], m["T"]) == (r["model"], r["batch_size"], r["seq_len"])]
        assert (round(row["ours_bf16"]["tok_s"]), round(row["ours_fp8"]["tok_s"])) == (r["bf16_tok_s"], r["fp8_tok_s"])
    assert set(rec["gate"]) == {"ANDREA-12M", "ANDREA-120M"}
    for model, g in rec["gate"].items():
        assert g["model_config"] == shipped[model] and g["steps"] >= GATE_STEPS and g["passed"]
        run = json.loads((REPO / g["source"].split(" ")[0]).read_text())  # fp8_gate's DIR/fp8_gate.json
        (verdict,) = [v for v in run["gates"] if v["run"] == "fp8"]
        assert (run["model"], run["steps"], verdict["reference"]) == (model, g["steps"], "bf16")
        assert (verdict["reference_bpb"], verdict["bpb"], verdict["relative_difference"], verdict["passed"]) == \
            (g["bf16_bpb"], g["fp8_bpb"], g["relative_difference"], g["passed"])
    expected = {("ANDREA-12M", 8): "bf16", ("ANDREA-12M", 32): "bf16", ("ANDREA-120M", 8): "fp8",
                ("ANDREA-120M", 32): "fp8", ("ANDREA-480M", 8): "bf16", ("ANDREA-480M", 32): "bf16"}
    for (model, B), precision in expected.items():
        picked, why = auto_precision(rec, *H200, TrainShape(model, shipped[model], B, 1024))
        assert picked == precision, why


# ------------------------------------------------------------------------ resolve_backend, the trainer's way in
@pytest.fixture
def h200(monkeypatch, record):
    monkeypatch.setattr(engine_mod, "gpu_status", lambda: (True, "CUDA GPU 0 of 1: NVIDIA H200 (compute capability 90)"))
    monkeypatch.setattr(engine_mod, "gpu_kind", lambda: H200)
    monkeypatch.setattr(engine_mod, "load_backend", lambda name: object)  # CuPy is not installed here
    monkeypatch.setenv("ANDREA_FP8_RECORDS", str(record))
    return TrainShape("ANDREA-120M", M120, 32, 1024)


def test_resolve_backend_asks_the_record_for_a_training_run_only(h200):
    be, prec, why = engine_mod.resolve_backend("auto", "auto", shape=h200)
    assert (be, prec) == ("cupy", "fp8")
    assert why.startswith("auto: CUDA GPU 0 of 1: NVIDIA H200 (compute capability 90); precision auto: fp8 (1.15× bf16")
    assert engine_mod.resolve_backend("cupy", "auto", shape=h200)[1] == "fp8"
    # generation, validation, the audit, geometry: no shape, bf16 as before
    assert engine_mod.resolve_backend("auto", "auto") == ("cupy", "bf16", "auto: CUDA GPU 0 of 1: NVIDIA H200 (compute capability 90)")
    assert engine_mod.resolve_backend("auto", "bf16", shape=h200)[1] == "bf16"  # a precision set is kept


def test_backend_cupy_without_cupy_is_the_backends_clear_error_not_the_records(h200, monkeypatch):
    """backend: cupy set where CuPy cannot run: the error names the missing backend (as before the record
    existed), and a GPU CuPy cannot ask leaves auto at bf16 with the reason (the backend reports the GPU)."""
    def no_cupy(name):
        raise RuntimeError(f"backend {name!r} is not available here (No module named 'cupy')")

    monkeypatch.setattr(engine_mod, "load_backend", no_cupy)
    with pytest.raises(RuntimeError, match="backend 'cupy' is not available here"):
        engine_mod.resolve_backend("cupy", "auto", shape=h200)
    monkeypatch.setattr(engine_mod, "load_backend", lambda name: object)

    def no_gpu():
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    monkeypatch.setattr(engine_mod, "gpu_kind", no_gpu)
    be, prec, why = engine_mod.resolve_backend("cupy", "auto", shape=h200)
    assert (be, prec) == ("cupy", "bf16") and "could not be asked its kind for the fp8 record: RuntimeError: cudaErrorNoDevice" in why


def test_resolve_backend_on_numpy_is_fp32_whatever_the_record(h200, monkeypatch):
    assert engine_mod.resolve_backend("numpy", "auto", shape=h200) == ("numpy", "fp32", "set in the config")
    monkeypatch.setattr(engine_mod, "gpu_status", lambda: (False, "CuPy is not installed"))
    assert engine_mod.resolve_backend("auto", "auto", shape=h200) == ("numpy", "fp32", "auto: CuPy is not installed")


def test_a_resumed_run_keeps_the_precision_its_checkpoints_trained_in(h200, monkeypatch):
    be, prec, why = engine_mod.resolve_backend("auto", "auto", shape=h200, trained=("cupy", "bf16"))
    assert (be, prec) == ("cupy", "bf16") and why.endswith("precision auto: bf16 (the precision the run's checkpoints were trained in)")
    assert engine_mod.resolve_backend("auto", "auto", shape=h200, trained=("cupy", "fp8"))[1] == "fp8"
    # a CPU run going on on the GPU: nothing to keep (NumPy had fp32 alone); the record decides
    assert engine_mod.resolve_backend("auto", "auto", shape=h200, trained=("numpy", "fp32"))[1] == "fp8"
    # an fp8 run going on on a GPU without fp8: bf16, the precision fp8 is built on
    monkeypatch.setattr(engine_mod, "gpu_kind", lambda: ("NVIDIA A100-SXM4-80GB", "80"))
    be, prec, why = engine_mod.resolve_backend("cupy", "auto", shape=h200, trained=("cupy", "fp8"))
    assert prec == "bf16" and "trained in fp8, which NVIDIA A100-SXM4-80GB cannot run" in why


# ------------------------------------------------------------------------ the tools that write the record
def _bench(name):
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_bench_tools_rows_and_gate_entries_are_what_the_rule_reads(tmp_path):
    gb, fg = _bench("gpu_bench"), _bench("fp8_gate")
    results = [{"model": "ANDREA-120M", "params": 1, "B": 32, "T": 1024, "ours_bf16": {"tok_s": 667_521.4},
                "ours_fp8": {"tok_s": 769_654.2}, "ours_fp16": {"tok_s": 1.0}},
               {"model": "ANDREA-120M", "params": 1, "B": 8, "T": 1024, "ours_bf16": {"tok_s": 594_348.0}}]  # no fp8 run
    rows = gb.speed_rows(results, *H200, "python3 bench/gpu_bench.py --record r.json", "2026-12-05", "0.1.0+gabc")
    assert len(rows) == 1 and rows[0]["bf16_tok_s"] == 667_521 and rows[0]["fp8_tok_s"] == 769_654
    assert rows[0]["model_config"] == M120  # gpu_bench's model table is the config's
    runs = {"bf16": {"val_bpb_bf16_eval": 1.25, "val_loss_bf16_eval": 3.5},
            "fp8": {"val_bpb_bf16_eval": 1.2625, "val_loss_bf16_eval": 3.535}}
    verdict = fg.compare("bf16", "fp8", runs, GATE_LIMIT)
    assert verdict["relative_difference"] == pytest.approx(0.01) and verdict["passed"]  # 1 % is within
    assert verdict["loss_relative_difference"] == pytest.approx(0.01)
    assert not fg.compare("bf16", "fp8", {**runs, "fp8": {"val_bpb_bf16_eval": 1.27, "val_loss_bf16_eval": 3.55}},
                          GATE_LIMIT)["passed"]
    result = {"steps": GATE_STEPS, "batch": 8, "seq": 1024, "lr": 6e-4, "warmup": 100, "seed": 0, "eval_windows": 224}
    entry = fg.gate_entry(result, verdict, M120, {"shards": "results/ANDREA-120M/shards.json"}, *H200,
                          "python3 bench/fp8_gate.py --record r.json", "2026-12-05", "0.1.0+gabc")
    path = tmp_path / "r.json"
    update_record(path, lambda r: with_gate(with_speed_rows(r, rows), "ANDREA-120M", entry))
    prec, why = decide(path)
    assert prec == "fp8" and why.endswith("gate passed: +1.00 % bits/byte after 6,000 steps, 2026-12-05)")


@pytest.fixture(scope="module")
def shards_12m(embedded_megachat, tmp_path_factory):
    """ANDREA-12M's shards of the embedded corpus (its tokenizer: 4,096 segments)."""
    return model_shards(embedded_megachat, tmp_path_factory.mktemp("shards12m"), "ANDREA-12M", 4096)


def test_fp8_gate_runs_in_two_calls_that_share_only_the_kept_figures(shards_12m, tmp_path):
    """A large model's gate runs its two trainings in two device calls (each under the device's 10
    minutes), on machines that share nothing but the small files a call brings back: the first call's
    kept run is figures only, and the second call, given them, trains the other run alone and gates
    both, with the verdict one call gives. Here on the CPU (NumPy backend) at a tiny shape."""
    base = [sys.executable, str(REPO / "bench" / "fp8_gate.py"), "--shards", str(shards_12m), "--model", "ANDREA-12M",
            "--backend", "numpy", "--steps", "3", "--batch", "2", "--seq", "32", "--warmup", "1", "--eval-every", "3",
            "--eval-windows", "1", "--reuse-runs"]
    first, second, single = tmp_path / "call1", tmp_path / "call2", tmp_path / "one-call"

    def gate(out, *precisions):
        p = subprocess.run([*base, "--out", str(out), "--precisions", *precisions], capture_output=True, text=True,
                           timeout=600, cwd=REPO)
        assert "Traceback" not in p.stderr, p.stderr[-3000:]
        assert p.returncode == (0 if len(precisions) == 1 or "PASS" in p.stdout else 1)  # 1: a failed gate
        return p.stdout

    out1 = gate(first, "fp32")
    kept = first / "runs" / "fp32.json"
    assert sorted(p.name for p in (first / "runs").iterdir()) == ["fp32.json"]  # no weights: figures only
    assert kept.stat().st_size < 200_000
    assert "fp32 step 3:" in out1
    (second / "runs").mkdir(parents=True)
    (second / "runs" / "fp32.json").write_bytes(kept.read_bytes())  # what the next call carries
    out2 = gate(second, "fp32", "fp8")
    assert f"fp32: taken from {second / 'runs' / 'fp32.json'}" in out2
    assert "fp32 step" not in out2 and "fp8 step 3:" in out2  # only fp8 trained
    assert "validation after 3 steps: fp32 " in out2
    result = json.loads((second / "fp8_gate.json").read_text())
    (verdict,) = result["gates"]
    assert (verdict["reference"], verdict["run"]) == ("fp32", "fp8")
    assert result["runs"]["fp8"]["fp8_counts"]["values"] > 0
    # the final scores are the scorer's (fp32), not the fp8 engine's own evaluation
    assert result["runs"]["fp8"]["val_bpb_bf16_eval"] != result["runs"]["fp8"]["val_bpb_own"]
    gate(single, "fp32", "fp8")  # both runs in one call: the same verdict, the same figures
    assert json.loads((single / "fp8_gate.json").read_text())["gates"] == result["gates"]

    # a kept run of other settings is trained again, not taken
    doc = json.loads(kept.read_text())
    doc["settings"]["steps"] = 4
    (second / "runs" / "fp32.json").write_text(json.dumps(doc))
    out3 = gate(second, "fp32")
    assert "was trained with other settings, code or machine; training again" in out3 and "fp32 step 3:" in out3
