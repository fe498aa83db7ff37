"""Bytes that are not UTF-8 cost the record that holds them, counted as `bad_encoding` with file
and line, in every adapter; strict mode stops with an error naming them."""

import json
import logging
import subprocess

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from andrea.hermes3 import pull_hermes3
from andrea.megachat import prep_megachat
from andrea.records import MalformedRecord
from conftest import run_prep, sharegpt, with_sources

LATIN1 = "café".encode("latin-1")  # b"caf\xe9": the é is one byte that UTF-8 cannot start a character with


def jsonl_bytes(*rows) -> bytes:
    """JSON lines; a row given as bytes is written as it is (for a bad byte inside a string)."""
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows)


def with_bad_byte(row: dict, marker: str = "MARK") -> bytes:
    """The row as a JSON line whose `marker` text is replaced by Latin-1 bytes."""
    line = json.dumps(row).encode()
    assert marker.encode() in line
    return line.replace(marker.encode(), LATIN1)


def prep(cfg, tmp_path):
    counts, rows, manifest = run_prep(cfg, tmp_path / "prep")
    return counts["per_source"], rows, manifest


def assert_counted(source_counts: dict, where: str, n: int = 1):
    assert source_counts["skipped"].get("bad_encoding") == n, source_counts
    assert source_counts["first_skipped_example"]["bad_encoding"].startswith(where), source_counts
    assert source_counts["bad_encoding_at"][0].startswith(where)


GOOD = sharegpt(("human", "What is a cell?"), ("gpt", "The smallest unit of life."))
BAD = sharegpt(("human", "Order a MARK au lait"), ("gpt", "Here it is."))


# ---------------------------------------------------------------- pull_hermes3


def hcfg(config, location):
    return {**config["hermes3"], "location": str(location)}


def test_pull_hermes3_jsonl_skips_the_line_and_names_it(config, tmp_path, caplog):
    src = tmp_path / "h.jsonl"
    src.write_bytes(jsonl_bytes(GOOD, with_bad_byte(BAD), sharegpt(("human", "hi"), ("gpt", "hello"))))
    with caplog.at_level(logging.WARNING):
        counts = pull_hermes3(hcfg(config, src), tmp_path / "out", "v1")
    assert counts["read"] == 3 and counts["kept"] == 2
    assert counts["skipped"] == {"bad_encoding": 1}
    column = with_bad_byte(BAD).index(b"\xe9") + 1
    assert counts["first_skipped_example"]["bad_encoding"] == f"{src}:line 2: byte 0xe9 at column {column} is not valid UTF-8"
    assert counts["bad_encoding_at"] == [f"{src}:line 2"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["bad_encoding_at"] == [f"{src}:line 2"]
    assert f"{src}:line 2" in caplog.text and "bad_encoding" in caplog.text


def test_pull_hermes3_strict_names_file_and_line(config, tmp_path):
    src = tmp_path / "h.jsonl"
    src.write_bytes(jsonl_bytes(GOOD, with_bad_byte(BAD)))
    with pytest.raises(MalformedRecord, match=r"h\.jsonl:line 2: bad_encoding: byte 0xe9"):
        pull_hermes3(hcfg(config, src), tmp_path / "out", "v1", strict=True)
    assert not list((tmp_path / "out").glob("*.parquet"))


def test_pull_hermes3_json_array_skips_the_item_with_its_line(config, tmp_path):
    src = tmp_path / "h.json"
    src.write_bytes(b"[\n" + json.dumps(GOOD).encode() + b",\n" + with_bad_byte(BAD) + b"\n]\n")
    counts = pull_hermes3(hcfg(config, src), tmp_path / "out", "v1")
    assert counts["kept"] == 1 and counts["skipped"] == {"bad_encoding": 1}
    assert counts["first_skipped_example"]["bad_encoding"] == f"{src}:item 1: byte 0xe9 on line 3 is not valid UTF-8"


def test_pull_hermes3_lone_surrogate_escape_is_bad_encoding(config, tmp_path):
    # valid UTF-8 (plain ASCII), but \udce9 is half a surrogate pair: no UTF-8 file can hold it
    src = tmp_path / "h.jsonl"
    src.write_bytes(jsonl_bytes(GOOD, json.dumps(BAD).replace("MARK", "caf\\udce9").encode(),
                                sharegpt(("human", "emoji \U0001f600 ok"), ("gpt", "yes"))))
    counts = pull_hermes3(hcfg(config, src), tmp_path / "out", "v1")
    assert counts["kept"] == 2 and counts["skipped"] == {"bad_encoding": 1}  # the escaped pair (emoji) is fine
    assert counts["bad_encoding_at"] == [f"{src}:line 2"]


def test_pull_hermes3_parquet_with_invalid_utf8_skips_the_row(config, tmp_path):
    # Arrow does not check that strings are UTF-8, neither when writing nor when reading: a Parquet
    # file from another tool can hold bytes that are not (a string array built from raw buffers)
    texts = [b"What is a cell?", b"The smallest unit of life.", b"Order a " + LATIN1, b"Here it is."]
    values = pa.Array.from_buffers(pa.string(), len(texts), pa.array(texts, pa.binary()).buffers())
    turns = pa.StructArray.from_arrays([pa.array(["human", "gpt", "human", "gpt"]), values], names=["from", "value"])
    src = tmp_path / "h.parquet"
    pq.write_table(pa.table({"conversations": pa.ListArray.from_arrays(pa.array([0, 2, 4], pa.int32()), turns)}), src)
    counts = pull_hermes3(hcfg(config, src), tmp_path / "out", "v1")
    assert counts["kept"] == 1 and counts["skipped"] == {"bad_encoding": 1}
    assert counts["bad_encoding_at"] == [f"{src}:row 1"]


# ---------------------------------------------------------------- prep_megachat adapters


def test_sharegpt_adapter(config, tmp_path):
    src = tmp_path / "chat.jsonl"
    src.write_bytes(jsonl_bytes(with_bad_byte(BAD), GOOD))
    per_source, rows, manifest = prep(with_sources(config, {"chat": {"adapter": "sharegpt", "location": str(src)}}), tmp_path)
    assert_counted(per_source["chat"], f"{src}:line 1")
    assert len(rows) == 1
    assert manifest["counts"]["per_source"]["chat"]["bad_encoding_at"] == [f"{src}:line 1"]


def test_messages_adapter(config, tmp_path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    bad = {"messages": [{"role": "user", "content": "a MARK please"}, {"role": "assistant", "content": "here"}]}
    src = tmp_path / "smol.jsonl"
    src.write_bytes(jsonl_bytes(good, with_bad_byte(bad)))
    per_source, rows, _ = prep(with_sources(config, {"smoltalk": {"adapter": "messages", "location": str(src)}}), tmp_path)
    assert_counted(per_source["smoltalk"], f"{src}:line 2")
    assert len(rows) == 1


def test_oasst_adapter(config, tmp_path):
    def tree(i, text):
        return {"message_tree_id": f"t{i}", "prompt": {"message_id": f"p{i}", "role": "prompter", "text": text,
                                                      "replies": [{"message_id": f"a{i}", "role": "assistant", "text": "Sure."}]}}

    src = tmp_path / "oasst.trees.jsonl"
    src.write_bytes(jsonl_bytes(tree(1, "Why?"), with_bad_byte(tree(2, "A MARK?")), tree(3, "How?")))
    per_source, rows, _ = prep(with_sources(config, {"oasst": {"adapter": "oasst", "location": str(src)}}), tmp_path)
    assert_counted(per_source["oasst"], f"{src}:line 2")
    assert [r["doc_id"] for r in rows] == ["t1#0", "t3#0"]


def test_dictionary_adapter_tsv_lines(config, tmp_path):
    src = tmp_path / "dict.tsv"
    src.write_bytes(b"cat\ta small animal\n" + LATIN1 + b"\ta drink made from coffee\ndog\ta loyal animal\n")
    per_source, rows, _ = prep(with_sources(config, {"dictionary": {"adapter": "dictionary", "location": str(src)}}), tmp_path)
    assert_counted(per_source["dictionary"], f"{src}:line 2")
    assert per_source["dictionary"]["first_skipped_example"]["bad_encoding"].endswith("byte 0xe9 at column 4 is not valid UTF-8")
    assert [r["turns"][0]["text"] for r in rows] == ["define cat", "define dog"]


def test_plaintext_adapter_skips_the_chunk_not_the_book(config, tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    paragraphs = [f"Paragraph {i} ".encode() + b"word " * 30 for i in range(4)]
    paragraphs[2] = paragraphs[2].replace(b"word", LATIN1, 1)
    header = b"Header with a stray \xff byte\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n"
    (books / "b.txt").write_bytes(header + b"\n\n".join(paragraphs) + b"\n")
    cfg = with_sources(config, {"gutenberg": {"adapter": "plaintext", "location": str(books), "chunk_chars": 200}})
    per_source, rows, _ = prep(cfg, tmp_path)
    # the header's bad byte is cut with the header; paragraph 2 (line 8 of the file) is lost alone
    assert_counted(per_source["gutenberg"], f"{books / 'b.txt'} chunk 2 (line 8)")
    assert [r["text"].split()[1] for r in rows] == ["0", "1", "3"]


def test_markdown_adapter(config, tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Guide\n\nThis guide explains how the pipeline works in detail.\n")
    (docs / "bad.md").write_bytes(b"# Menu\n\nThe " + LATIN1 + b" serves coffee every morning of the week.\n")
    per_source, rows, _ = prep(with_sources(config, {"repo-docs": {"adapter": "markdown", "location": str(docs)}}), tmp_path)
    assert_counted(per_source["repo-docs"], f"{docs / 'bad.md'} chunk 0 (line 3)")
    assert [r["doc_id"] for r in rows] == ["good.md#0"]


def test_irc_adapter_skips_the_line(config, tmp_path):
    src = tmp_path / "chan.log"
    src.write_bytes(b"[10:01] <alice> hello there everyone\n[10:02] <bob> a " + LATIN1 + b" for me\n[10:03] <bob> hi alice\n")
    per_source, rows, _ = prep(with_sources(config, {"irc": {"adapter": "irc", "location": str(src), "min_chars": 10}}), tmp_path)
    assert_counted(per_source["irc"], f"{src}:line 2")
    assert rows[0]["text"] == "<alice> hello there everyone\n<bob> hi alice"


def test_docstrings_adapter_skips_the_file(config, tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "good.py").write_text('"""A module docstring long enough to keep."""\n')
    (pkg / "bad.py").write_bytes(b'"""A module docstring long enough to keep."""\n\nNAME = "' + LATIN1 + b'"\n')
    # a file that declares Latin-1 is valid Python and read as such
    (pkg / "latin.py").write_bytes(b'# -*- coding: latin-1 -*-\n"""Le ' + LATIN1 + b' du coin, assez long."""\n')
    cfg = with_sources(config, {"repo-docstrings": {"adapter": "docstrings", "location": str(pkg), "min_chars": 10}})
    per_source, rows, _ = prep(cfg, tmp_path)
    assert_counted(per_source["repo-docstrings"], f"{pkg / 'bad.py'}:line 3")
    assert {r["doc_id"]: r["text"] for r in rows} == {
        "good.py:good": "good\n\nA module docstring long enough to keep.",
        "latin.py:latin": "latin\n\nLe café du coin, assez long.",
    }


def test_git_log_adapter_skips_the_commit(config, tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]

    def run(*args, stdin=None):
        return subprocess.run(git + list(args), check=True, capture_output=True, input=stdin).stdout.decode().strip()

    (repo / "f").write_text("1")
    run("add", "f")
    run("commit", "-q", "-m", "Add the first file of the history")
    # `git commit` turns a message's Latin-1 bytes into UTF-8; commits imported from elsewhere
    # (fast-import, old history) keep them as they are: write one such commit object directly
    head, tree = run("rev-parse", "HEAD"), run("write-tree")
    obj = (f"tree {tree}\nparent {head}\nauthor t <t@t> 1700000000 +0000\ncommitter t <t@t> 1700000000 +0000\n\n"
           .encode() + b"Serve a " + LATIN1 + b" to every visitor\n")
    bad_sha = run("hash-object", "-t", "commit", "-w", "--stdin", stdin=obj)
    run("update-ref", "HEAD", bad_sha)
    (repo / "g").write_text("2")
    run("add", "g")
    run("commit", "-q", "-m", "Add the third file of the history")
    cfg = with_sources(config, {"repo-commits": {"adapter": "git_log", "location": str(repo), "min_chars": 10}})
    per_source, rows, _ = prep(cfg, tmp_path)
    assert_counted(per_source["repo-commits"], f"{repo} commit {bad_sha[:12]}")
    assert [r["text"] for r in rows] == ["Add the third file of the history", "Add the first file of the history"]


def test_strict_prep_names_the_source_file_and_line(config, tmp_path):
    src = tmp_path / "dict.tsv"
    src.write_bytes(b"cat\ta small animal\n" + LATIN1 + b"\ta drink\n")
    cfg = with_sources(config, {"dictionary": {"adapter": "dictionary", "location": str(src)}}, strict=True)
    with pytest.raises(MalformedRecord, match=r"source dictionary: .*dict\.tsv:line 2: bad_encoding: byte 0xe9"):
        prep_megachat(cfg, tmp_path / "prep", "v1")
    assert not (tmp_path / "prep" / "megachat.parquet").exists()


# ---------------------------------------------------------------- every reason, named in the log


def test_truncated_json_and_bad_encoding_logged_whole_with_file_and_line(config, tmp_path, caplog):
    """The first records skipped for each reason are logged with their file, line and whole
    message (not only counted), and the manifest keeps the whole message too."""
    src = tmp_path / "chat.jsonl"
    truncated = json.dumps(sharegpt(("human", "Where does the line end"), ("gpt", "nowhere")))[:40].encode()
    bad_lines = [with_bad_byte(BAD)] * 7  # more than the logged few: the rest are counted
    src.write_bytes(jsonl_bytes(GOOD, truncated, *bad_lines, GOOD))
    with caplog.at_level(logging.WARNING, logger="andrea"):
        per_source, rows, manifest = prep(with_sources(config, {"chat": {"adapter": "sharegpt", "location": str(src)}}), tmp_path)
    counts = per_source["chat"]
    assert counts["skipped"] == {"bad_encoding": 7, "broken_json": 1}
    whole = "the line ends unfinished after 40 characters (Invalid control character at column 41)"
    message = f"{src}:line 2: {whole}"
    assert counts["first_skipped_example"]["broken_json"] == message
    assert manifest["counts"]["per_source"]["chat"]["skipped_examples"]["broken_json"] == [message]
    logged = [r.getMessage() for r in caplog.records]
    assert f"skipped {src}:line 2: broken_json: {whole}" in logged, logged
    column = with_bad_byte(BAD).index(b"\xe9") + 1
    bad_logged = [m for m in logged if m.startswith(f"skipped {src}:line ") and "bad_encoding" in m]
    assert bad_logged == [f"skipped {src}:line {n}: bad_encoding: byte 0xe9 at column {column} is not valid UTF-8"
                          for n in range(3, 8)]  # the first five of the seven
    assert len(manifest["counts"]["per_source"]["chat"]["skipped_examples"]["bad_encoding"]) == 5
    assert any("further bad_encoding records are counted" in m for m in logged)
