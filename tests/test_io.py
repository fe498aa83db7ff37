import json
import os

import pyarrow as pa
import pytest

from andrea.io import AtomicParquetWriter, Manifest, atomic_dir, atomic_path, write_json_atomic


def test_atomic_path_leaves_nothing_when_the_block_fails(tmp_path):
    target = tmp_path / "a.txt"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_path_replaces_only_on_success(tmp_path):
    target = tmp_path / "a.json"
    write_json_atomic(target, {"v": 1})
    with pytest.raises(ValueError):
        with atomic_path(target) as tmp:
            tmp.write_text("{broken")
            raise ValueError
    assert json.loads(target.read_text()) == {"v": 1}


def test_atomic_dir_replaces_only_its_own_outputs(tmp_path):
    """An output directory replaces a previous one of its kind (holding the marker), an empty one or
    nothing; a directory of something else (`--out results/<model>`, a ckpt directory) or a file is
    refused before the block runs, and left as it was."""
    for name, before in [("new", None), ("empty", []), ("previous", ["report.json", "old.png"])]:
        d = tmp_path / name
        if before is not None:
            d.mkdir()
            for f in before:
                (d / f).write_text("old")
        with atomic_dir(d, "report.json") as tmp:
            (tmp / "report.json").write_text("new")
        assert sorted(os.listdir(d)) == ["report.json"] and (d / "report.json").read_text() == "new"
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "final.bin").write_bytes(b"weights")
    (tmp_path / "file").write_text("x")
    for target in (ckpt, tmp_path / "file"):
        ran = []
        with pytest.raises(FileExistsError, match=f"{target}: exists and is .*not a previous output"):
            with atomic_dir(target, "report.json"):
                ran.append(1)
        assert not ran
    assert (ckpt / "final.bin").read_bytes() == b"weights" and (tmp_path / "file").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "empty", "file", "new", "previous"]  # no temporary left


def test_parquet_writer_abort_keeps_previous_file(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    target = tmp_path / "t.parquet"
    with AtomicParquetWriter(target, schema, batch_rows=2) as w:
        for i in range(5):
            w.write({"x": i})
    assert w.rows == 5
    before = target.read_bytes()
    with pytest.raises(KeyError):
        with AtomicParquetWriter(target, schema, batch_rows=2) as w:
            for i in range(3):
                w.write({"x": i})
            raise KeyError("crash mid-stream")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_manifest_records_inputs_outputs_and_timing(tmp_path):
    f = tmp_path / "in.txt"
    f.write_text("abc")
    d = tmp_path / "dir"
    d.mkdir()
    (d / "x").write_text("1")
    m = Manifest("stage", "v9", {"p": 1})
    m.add_input(f)
    m.add_input(d)
    m.add_output(f, rows=3)
    m.data["counts"] = {"n": 1}
    m.write(tmp_path / "manifest.json")
    data = json.loads((tmp_path / "manifest.json").read_text())
    assert data["stage"] == "stage" and data["version"] == "v9" and data["params"] == {"p": 1}
    assert data["inputs"][0]["sha256"] == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert data["inputs"][1]["files"] == 1
    assert data["outputs"][0]["rows"] == 3
    assert data["timings"]["seconds"] >= 0 and data["code_version"]


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_atomic_writes_get_the_modes_the_umask_gives(tmp_path, umask, file_mode, dir_mode):
    """On a shared cluster the umask decides who may read the results, as for any plain open()."""
    import stat

    schema = pa.schema([("x", pa.int64())])
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "made" / "a.json", {"v": 1})
        with AtomicParquetWriter(tmp_path / "made" / "deeper" / "t.parquet", schema) as w:
            w.write({"x": 1})
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    mode = lambda p: stat.S_IMODE(p.stat().st_mode)  # noqa: E731
    assert mode(plain) == file_mode  # what open() gives: the reference
    assert mode(tmp_path / "made" / "a.json") == file_mode
    assert mode(tmp_path / "made" / "deeper" / "t.parquet") == file_mode
    assert mode(tmp_path / "made") == dir_mode and mode(tmp_path / "made" / "deeper") == dir_mode


def test_a_stage_failing_on_bad_input_says_it_in_one_paragraph_and_logs_the_traceback(tmp_path, capsys):
    """A job script's uncaught error the user can fix (here strict mode's malformed record) is one
    paragraph on the terminal; the log file keeps where it was raised. A bug keeps its traceback."""
    import logging
    import sys

    from andrea.io import setup_logging
    from andrea.records import MalformedRecord, Tally

    log_file = tmp_path / "stage.log"
    setup_logging(log_file)
    try:
        try:
            Tally().skip("broken_json", "chat.jsonl:line 5", strict=True, detail="the line ends unfinished")
        except MalformedRecord:
            sys.excepthook(*sys.exc_info())
        err = capsys.readouterr().err
        assert "stage failed: chat.jsonl:line 5: broken_json: the line ends unfinished (strict mode)" in err
        assert "Traceback" not in err
        assert "Traceback" in log_file.read_text() and "records.py" in log_file.read_text()
        try:
            {}["a bug"]  # raised here, not by the package: a traceback on the terminal too
        except KeyError:
            sys.excepthook(*sys.exc_info())
        assert "Traceback" in capsys.readouterr().err
    finally:
        sys.excepthook = sys.__excepthook__
        logging.basicConfig(force=True, handlers=[logging.NullHandler()])
