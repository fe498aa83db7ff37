"""dev/cuda (one check-and-time script per CUDA kernel family, llm.c style) on the CPU: every script
imports without CuPy, declares a NumPy reference for each op and versions whose kernels exist in
their sources, every production kernel is covered by some script, each kernel family has its source,
launchers and script under one name, and run_all lists them all. The kernels themselves run only on
a GPU (`python3 dev/cuda/run_all.py` on the device); that part is skipped here."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEV = REPO / "dev" / "cuda"
sys.path.insert(0, str(DEV))  # the scripts import their shared helpers as `common`

import common  # noqa: E402

SCRIPTS = sorted(p.stem for p in DEV.glob("*.py") if p.stem not in ("common", "run_all"))


def load(name):
    spec = importlib.util.spec_from_file_location(f"dev_cuda_{name}", DEV / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def modules():
    return {name: load(name) for name in SCRIPTS}


def kernels_of(module, version):
    """The names `version` launches, as its source spells them now (attention_mma resolves the
    production kernels' names)."""
    resolved = getattr(module, "resolved", lambda v: v)(version)
    return resolved.kernels


def test_scripts_import_without_cupy(modules):
    for name, module in modules.items():
        assert callable(module.main), name
        assert module.__doc__ and f"dev/cuda/{name}.py" in module.__doc__, f"{name}: the docstring says how to run it"
    # importing every script loads no CuPy (it is imported inside main(), on the device)
    code = (f"import sys; sys.path.insert(0, {str(DEV)!r}); import importlib\n"
            f"for n in {SCRIPTS!r} + ['run_all']: importlib.import_module(n)\n"
            "assert 'cupy' not in sys.modules, 'a dev/cuda script imports cupy at module level'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_each_script_declares_references_and_versions(modules):
    for name, module in modules.items():
        refs, versions = module.REFERENCES, module.VERSIONS
        assert refs and versions, name
        assert all(callable(f) for f in refs.values()), name
        ops = {v.op for v in versions}
        assert ops == set(refs), f"{name}: ops with versions {sorted(ops)} != ops with references {sorted(refs)}"
        seen = set()
        for v in versions:
            assert isinstance(v, common.Version), name
            assert v.path().exists(), f"{name}: {v.name} reads {v.source}, which does not exist"
            assert set(v.precisions) <= set(common.UNIT_ROUNDOFF), f"{name}: {v.name} precisions {v.precisions}"
            defined = set(common.kernel_names(v.path()))
            missing = set(kernels_of(module, v)) - defined
            assert not missing, f"{name}: version {v.op}/{v.name} launches {sorted(missing)}, not defined in {v.source}"
            key = (v.op, v.name, v.precisions)
            assert key not in seen, f"{name}: version {key} declared twice"
            seen.add(key)


def test_numpy_backend_references_are_used(modules):
    """The references are numpy_backend's own functions wherever it has the op (a local helper only
    where numpy_backend computes the quantity inline or has no 16-bit counterpart)."""
    from andrea.engine import numpy_backend as nb

    used = {f for m in modules.values() for f in m.REFERENCES.values() if getattr(f, "__module__", "") == nb.__name__}
    for fn in ("embed_fwd", "embed_bwd", "layernorm_fwd", "add_layernorm_fwd", "layernorm_bwd", "attn_fwd", "attn_bwd",
               "gelu", "loss_fwd", "loss_bwd", "grad_norm_final", "grad_scale", "adamw"):
        assert getattr(nb, fn) in used, f"numpy_backend.{fn} is no script's reference"


def test_every_production_kernel_is_covered(modules):
    declared = {k for m in modules.values() for v in m.VERSIONS for k in kernels_of(m, v)}
    for cu in sorted(common.KERNELS.glob("*.cu")):
        missing = set(common.kernel_names(cu)) - declared
        assert not missing, f"{cu.name}: kernels {sorted(missing)} are checked by no dev/cuda script"


def test_the_wgmma_variants_marked_production_are_the_ones_the_engine_runs(modules):
    """dev/cuda/attention_wgmma.py marks (and times as production) the variants whose -D defines the
    engine dispatches on Hopper: attention_wgmma.PRODUCTION_FWD / PRODUCTION_BWD, read from the source
    (the module imports CuPy)."""
    import ast

    src = (REPO / "andrea" / "engine" / "cupy" / "attention_wgmma.py").read_text()
    engine = {t.id: ast.literal_eval(node.value) for node in ast.parse(src).body if isinstance(node, ast.Assign)
              for t in node.targets if isinstance(t, ast.Name) and t.id in ("PRODUCTION_FWD", "PRODUCTION_BWD")}
    dev = modules["attention_wgmma"]
    fwd = dict((n, d) for n, d, _ in dev.FWD_VARIANTS)[dev.PRODUCTION["fwd"]]
    bwd = dict((v[0], v[1]) for v in dev.BWD_VARIANTS)[dev.PRODUCTION["bwd"]]
    assert (fwd, bwd) == (engine["PRODUCTION_FWD"], engine["PRODUCTION_BWD"])
    marked = {(v.op, v.name) for v in dev.VERSIONS if v.production}
    assert marked == {("flash_fwd", dev.PRODUCTION["fwd"])} | {(op, dev.PRODUCTION["bwd"]) for op in dev.SPLIT_KERNELS}


def test_each_kernel_family_has_one_name_in_three_places(modules):
    """A family of kernels is andrea/kernels/X.cu, its launchers andrea/engine/cupy/X.py and its check
    and timing dev/cuda/X.py: a kernel added to a source is found by the one name everywhere."""
    families = sorted(p.stem for p in common.KERNELS.glob("*.cu"))
    assert families == SCRIPTS, f"kernel sources {families} != dev/cuda scripts {SCRIPTS}"
    launchers = REPO / "andrea" / "engine" / "cupy"
    for name in families:
        path = launchers / f"{name}.py"
        assert path.exists(), f"{name}.cu: no launcher module {path.relative_to(REPO)}"
        assert f'kernel("{name}"' in path.read_text(encoding="utf-8"), f"{path.name} launches no kernel of {name}.cu"
        sources = {v.source for v in modules[name].VERSIONS if not v.source.startswith("dev/")}
        assert sources == {f"{name}.cu"}, f"dev/cuda/{name}.py checks kernels of {sorted(sources)}, not only {name}.cu"


def test_run_all_lists_every_script():
    run_all = load("run_all")
    assert sorted(run_all.SCRIPTS) == SCRIPTS


def test_run_all_help_runs_on_the_cpu():
    proc = subprocess.run([sys.executable, str(DEV / "run_all.py"), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--quick" in proc.stdout


def test_model_shapes_follow_the_config():
    shapes = {s.name.split()[0]: s for s in common.model_shapes(quick=False)}
    assert set(shapes) == {"12M", "120M"}
    s = shapes["120M"]
    assert (s.C, s.H, s.T, s.D, s.L) == (768, 12, 1024, 64, 12)
    assert [s.name.split()[0] for s in common.model_shapes(quick=True)] == ["tiny"]


def test_h16_rounding_matches_ieee():
    """The host-side rounding that every 16-bit check relies on: nearest even, ties included."""
    import numpy as np

    # bf16 keeps 7 fraction bits: 1 + 2^-8 and 1 + 3·2^-8 are ties (to even); 65504 rounds up
    x = np.array([1.0, 1 + 2.0**-8, 1 + 3 * 2.0**-8, -2.5, 65504.0], dtype=np.float32)
    bf = common.from_h16(common.to_h16(x, "bf16"), "bf16")
    assert bf.tolist() == [1.0, 1.0, 1 + 2.0**-6, -2.5, 65536.0]
    small = np.float32(1e-6)
    assert abs(common.from_h16(common.to_h16(small, "bf16"), "bf16")[0] - small) <= common.u("bf16") * small
    fp = common.from_h16(common.to_h16(x, "fp16"), "fp16")
    assert fp.tolist() == x.astype(np.float16).astype(np.float64).tolist()


def test_compare_and_exact():
    import numpy as np

    ok = common.compare([1.0, 2.0], [1.0, 2.0 + 1e-7], rtol=1e-7)
    assert ok.ok and ok.ratio <= 1
    bad = common.compare([1.0, 2.5], [1.0, 2.0], rtol=1e-3)
    assert not bad.ok and bad.max_err == 0.5
    assert not common.compare([np.nan], [1.0], rtol=1.0).ok
    assert common.exact(np.arange(4), np.arange(4)).ok
    assert not common.exact(np.arange(4), np.arange(4)[::-1]).ok


@pytest.mark.gpu
@pytest.mark.slow
def test_kernels_on_the_gpu():
    try:
        import cupy as cp

        have_gpu = cp.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError, or CUDA without a device
        have_gpu = False
    if not have_gpu:
        pytest.skip("no CUDA GPU with CuPy here: run `python3 dev/cuda/run_all.py` on the device")
    proc = subprocess.run([sys.executable, str(DEV / "run_all.py"), "--quick", "--reps", "3"], capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
