import json
import subprocess

import pyarrow.parquet as pq
import pytest

from andrea.hermes3 import pull_hermes3
from andrea.megachat import content_hash, prep_megachat, render_document
from andrea.records import MalformedRecord
from conftest import sharegpt, write_jsonl


def only(config, sources: dict, **top) -> dict:
    """The config with only the given sources (defaults filled)."""
    from andrea.config import validate_config

    raw = {k: v for k, v in config.items() if k != "sources"}
    raw["sources"] = sources
    raw.update(top)
    return validate_config(raw)


def run(cfg, tmp_path, pull_dir=None):
    out = tmp_path / "prep"
    counts = prep_megachat(cfg, out, "v1", pull_dir=pull_dir)
    rows = pq.read_table(out / "megachat.parquet").to_pylist()
    return counts, rows


def test_exact_duplicates_are_removed_across_sources_and_near_duplicates_kept(config, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [
        sharegpt(("human", "hi"), ("gpt", "hello")),
        sharegpt(("human", "hi"), ("gpt", "hello")),  # exact duplicate within the source
        sharegpt(("human", "hi"), ("gpt", "hello!")),  # near duplicate: kept
    ])
    b = write_jsonl(tmp_path / "b.jsonl", [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}])
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(a)}, "smoltalk": {"adapter": "messages", "location": str(b)}})
    counts, rows = run(cfg, tmp_path)
    assert counts["documents"] == 2
    assert counts["per_source"]["chat"]["duplicates"] == 1
    assert counts["per_source"]["smoltalk"]["duplicates"] == 1  # same content as chat's first row
    assert [r["source"] for r in rows] == ["chat", "chat"]
    assert len({r["content_hash"] for r in rows}) == 2


def test_content_hash_depends_on_content_only():
    t = [{"role": "user", "text": "x"}, {"role": "assistant", "text": "y"}]
    assert content_hash(t, None) == content_hash([dict(d) for d in t], None)
    assert content_hash(t, None) != content_hash(list(reversed(t)), None)
    assert content_hash(None, "x") != content_hash([{"role": "user", "text": "x"}], None)


def test_render_uses_turn_prefixes_and_never_renders_system_turns():
    turns = [
        {"role": "system", "text": "You are a helpful assistant."},
        {"role": "user", "text": "define cat"},
        {"role": "assistant", "text": "cat is a small furry animal"},
    ]
    assert render_document(turns, None) == "> define cat\n\n< cat is a small furry animal"
    assert render_document(None, "plain text") == "plain text"
    assert render_document(turns, None, {"user_prefix": "U: ", "assistant_prefix": "A: "}).startswith("U: define")


def test_every_adapter_on_local_files(config, tmp_path):
    src = tmp_path / "src"
    oasst = write_jsonl(src / "oasst.jsonl", [
        {"message_tree_id": "t1", "prompt": {"message_id": "p", "role": "prompter", "text": "Why is the sea salty?", "replies": [
            {"message_id": "a2", "role": "assistant", "text": "Second best.", "rank": 1, "replies": []},
            {"message_id": "a1", "role": "assistant", "text": "Rivers carry dissolved minerals.", "rank": 0, "replies": [
                {"message_id": "p2", "role": "prompter", "text": "Which minerals?", "replies": [
                    {"message_id": "a3", "role": "assistant", "text": "Mostly sodium and chloride.", "replies": []}]}]}]}},
        # the same kind of thread given as flat messages
        {"message_id": "f1", "parent_id": None, "role": "prompter", "text": "Name a prime.", "message_tree_id": "t2"},
        {"message_id": "f2", "parent_id": "f1", "role": "assistant", "text": "Seven.", "message_tree_id": "t2"},
        {"something": "else"},
    ])
    (src / "dict.tsv").write_text("# comment\ncat\ta small domesticated carnivore\nbroken line without tab\ndog\tdog is a loyal animal\n")
    books = src / "books"
    books.mkdir()
    (books / "b.txt").write_text(
        "Header junk\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n" + "\n\n".join(f"Paragraph {i} " + "word " * 40 for i in range(6))
        + "\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicence text\n"
    )
    docs = src / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\n\nThis guide explains how the pipeline works in detail.\n")
    (src / "chan.log").write_text(
        "[10:00] -!- bob has joined #c\n[10:01] <alice> hello there everyone\n[10:02] <@bob> hi alice, how are you today?\n"
        "[10:03] * alice waves\nthis line is not irc\n"
    )
    pkg = src / "pkg"
    pkg.mkdir()
    (pkg / "mod.py").write_text('"""Module docstring that is long enough to keep."""\n\nclass K:\n    """A class that does a thing, documented."""\n\n    def m(self):\n        """Method docstring, also long enough."""\n\ndef short():\n    """Tiny."""\n')
    (pkg / "broken.py").write_text("def (:\n")
    repo = src / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "f").write_text("1")
    subprocess.run(git + ["add", "f"], check=True)
    subprocess.run(git + ["commit", "-qm", "Add the first file so the history is not empty"], check=True)

    cfg = only(config, {
        "oasst": {"adapter": "oasst", "location": str(oasst)},
        "dictionary": {"adapter": "dictionary", "location": str(src / "dict.tsv")},
        "gutenberg": {"adapter": "plaintext", "location": str(books), "chunk_chars": 600},
        "repo-docs": {"adapter": "markdown", "location": str(docs)},
        "irc": {"adapter": "irc", "location": str(src / "chan.log"), "min_chars": 10},
        "repo-docstrings": {"adapter": "docstrings", "location": str(pkg), "min_chars": 10},
        "repo-commits": {"adapter": "git_log", "location": str(repo)},
    })
    counts, rows = run(cfg, tmp_path)
    by = {}
    for r in rows:
        by.setdefault(r["source"], []).append(r)
    # oasst: best-ranked thread followed to the leaf, flat messages rebuilt into a tree
    assert [t["text"] for t in by["oasst"][0]["turns"]] == [
        "Why is the sea salty?", "Rivers carry dissolved minerals.", "Which minerals?", "Mostly sodium and chloride."]
    assert [t["role"] for t in by["oasst"][1]["turns"]] == ["user", "assistant"]
    assert counts["per_source"]["oasst"]["skipped"] == {"not_an_oasst_record": 1}
    # dictionary: > define X / < X is ...
    assert by["dictionary"][0]["turns"] == [
        {"role": "user", "text": "define cat"}, {"role": "assistant", "text": "cat is a small domesticated carnivore"}]
    assert by["dictionary"][1]["turns"][1]["text"] == "dog is a loyal animal"
    assert counts["per_source"]["dictionary"]["skipped"] == {"missing_definition": 1}
    # gutenberg: boilerplate gone, chunked at paragraphs
    assert len(by["gutenberg"]) > 1
    joined = "\n\n".join(r["text"] for r in by["gutenberg"])
    assert "Header junk" not in joined and "Licence" not in joined and joined.startswith("Paragraph 0")
    assert all(len(r["text"]) <= 600 for r in by["gutenberg"])
    assert by["repo-docs"][0]["text"].startswith("# Guide")
    # irc: joins dropped, nick modes stripped, actions kept, junk counted
    assert by["irc"][0]["text"] == "<alice> hello there everyone\n<bob> hi alice, how are you today?\n* alice waves"
    assert counts["per_source"]["irc"]["skipped"] == {"unparsed_line": 1}
    # docstrings: module, class and method; broken file and short docstring counted
    assert [r["doc_id"] for r in by["repo-docstrings"]] == ["mod.py:mod", "mod.py:mod.K", "mod.py:mod.K.m"]
    assert counts["per_source"]["repo-docstrings"]["skipped"] == {"too_short": 1, "unparsable_python": 1}
    assert by["repo-commits"][0]["text"] == "Add the first file so the history is not empty"


def test_oasst_all_leaves(config, tmp_path):
    tree = {"message_tree_id": "t", "prompt": {"message_id": "p", "role": "prompter", "text": "Q?", "replies": [
        {"message_id": "a", "role": "assistant", "text": "A1", "rank": 0},
        {"message_id": "b", "role": "assistant", "text": "A2", "rank": 1}]}}
    f = write_jsonl(tmp_path / "o.jsonl", [tree])
    _, rows = run(only(config, {"oasst": {"adapter": "oasst", "location": str(f), "oasst_threads": "all_leaves"}}), tmp_path)
    assert [r["turns"][1]["text"] for r in rows] == ["A1", "A2"]


def test_missing_source_fails_naming_the_key_unless_optional(config, tmp_path):
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(tmp_path / "nope.jsonl")}})
    with pytest.raises(FileNotFoundError, match=r"sources\.chat\.location"):
        run(cfg, tmp_path)
    cfg = only(config, {
        "chat": {"adapter": "sharegpt", "location": str(tmp_path / "nope.jsonl"), "optional": True},
        "synthetic-chat": {"adapter": "sharegpt", "location": "embedded"},
        "repo-commits": {"adapter": "git_log", "location": str(tmp_path), "optional": True},  # not a repository
    })
    counts, rows = run(cfg, tmp_path)
    assert counts["per_source"]["chat"] == {"skipped_source": f"{tmp_path / 'nope.jsonl'} does not exist"}
    assert list(counts["per_source"]["repo-commits"]) == ["skipped_source"]
    assert rows and {r["source"] for r in rows} == {"synthetic-chat"}
    # a skipped source is no input of the stage (repo-commits was found, then failed to read)
    manifest = json.loads((tmp_path / "prep" / "manifest.json").read_text())
    assert [i["source"] for i in manifest["inputs"]] == ["synthetic-chat"]


def test_strict_mode_stops_on_a_malformed_record(config, tmp_path):
    f = write_jsonl(tmp_path / "c.jsonl", [sharegpt(("human", "a"), ("gpt", "b")), "{not json"])
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(f)}}, strict=True)
    with pytest.raises(MalformedRecord, match=r"source chat: .*c\.jsonl:line 2"):
        run(cfg, tmp_path)
    assert not (tmp_path / "prep" / "megachat.parquet").exists()


def test_embedded_pipeline_reads_every_source(config, tmp_path):
    pull = tmp_path / "pull"
    pull_hermes3(config["hermes3"], pull, "v1")
    config["sources"]["repo-docstrings"]["max_docs"] = 50
    counts, rows = run(config, tmp_path, pull_dir=pull)
    produced = {r["source"] for r in rows}
    expected = {k for k in config["sources"] if k != "repo-commits"}  # the tmp checkout may lack git history
    assert expected <= produced
    manifest = json.loads((tmp_path / "prep" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == len(rows)
    assert (tmp_path / "prep" / "preview.txt").read_text().count("=== ") >= len(expected)


# ---------------------------------------------------------------- no silent empty source


def messages_rows(n):
    """Rows in the `messages` layout: every one of them malformed for the sharegpt adapter."""
    return [{"messages": [{"content": f"question {i}", "role": "user"}, {"content": f"answer {i}", "role": "assistant"}]}
            for i in range(n)]


def test_an_enabled_source_that_yields_nothing_fails_naming_it_its_location_adapter_and_skips(config, tmp_path):
    from andrea.megachat import EmptySource

    good = write_jsonl(tmp_path / "chat.jsonl", [sharegpt(("human", "hi"), ("gpt", "hello"))])
    bad = write_jsonl(tmp_path / "synthetic.jsonl", messages_rows(3) + ["{not json"])
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(good)},
                        "synthetic-chat": {"adapter": "sharegpt", "location": str(bad)}})
    with pytest.raises(EmptySource) as e:
        run(cfg, tmp_path)
    msg = str(e.value)
    assert f"sources.synthetic-chat (location {bad}, adapter sharegpt) yielded no document: 4 records read, 4 skipped" in msg
    # every reason with its count and its first example
    assert f"missing_conversations 3 (first: {bad}:line 1)" in msg
    assert f"broken_json 1 (first: {bad}:line 4: " in msg
    assert "sources.synthetic-chat.adapter" in msg and "`enabled: false`" in msg and "`optional: true`" in msg
    assert "\n" not in msg  # one paragraph
    assert not (tmp_path / "prep" / "megachat.parquet").exists()

    # a location holding no record at all, in strict mode too (no malformed record to stop at)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(good)},
                        "smoltalk": {"adapter": "messages", "location": str(empty)}}, strict=True)
    with pytest.raises(EmptySource, match=r"sources\.smoltalk \(location .*empty\.jsonl, adapter messages\) yielded no "
                                          r"document: 0 records read, none skipped\. Its location holds no records"):
        run(cfg, tmp_path)


def test_an_optional_source_that_yields_nothing_is_skipped_with_a_warning(config, tmp_path, caplog):
    good = write_jsonl(tmp_path / "chat.jsonl", [sharegpt(("human", "hi"), ("gpt", "hello"))])
    bad = write_jsonl(tmp_path / "synthetic.jsonl", messages_rows(2))
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(good)},
                        "synthetic-chat": {"adapter": "sharegpt", "location": str(bad), "optional": True}})
    with caplog.at_level("WARNING", logger="andrea.megachat"):
        counts, rows = run(cfg, tmp_path)
    assert {r["source"] for r in rows} == {"chat"}
    c = counts["per_source"]["synthetic-chat"]
    assert (c["read"], c["kept"], c["skipped"]) == (2, 0, {"missing_conversations": 2})
    assert "yielded no document" in c["skipped_source"]
    assert any("synthetic-chat skipped (optional)" in r.getMessage() and "2 records read" in r.getMessage() for r in caplog.records)


def test_a_source_whose_every_document_duplicates_earlier_ones_is_a_loud_warning(config, tmp_path, caplog):
    """Its documents are in the corpus under the earlier source, so training loses nothing: no error,
    but the source has no arm of its own, and the warning says whose documents they are."""
    rows = [sharegpt(("human", f"q{i}"), ("gpt", f"a{i}")) for i in range(3)]
    a = write_jsonl(tmp_path / "a.jsonl", rows)
    b = write_jsonl(tmp_path / "b.jsonl", rows[:2])
    cfg = only(config, {"chat": {"adapter": "sharegpt", "location": str(a)},
                        "synthetic-chat": {"adapter": "sharegpt", "location": str(b)}})
    with caplog.at_level("WARNING", logger="andrea.megachat"):
        counts, _ = run(cfg, tmp_path)
    assert counts["per_source"]["synthetic-chat"]["duplicates_of"] == {"chat": 2}
    warned = [r.getMessage() for r in caplog.records if "adds no document" in r.getMessage()]
    assert len(warned) == 1 and "sources.synthetic-chat" in warned[0] and "earlier sources' (chat 2)" in warned[0]


def test_an_empty_hermes3_part_fails_naming_the_pull_counts_and_the_category_split(config, tmp_path):
    from andrea.megachat import EmptySource

    src = write_jsonl(tmp_path / "hermes.jsonl", [sharegpt(("human", f"q{i}"), ("gpt", f"a{i}")) for i in range(3)]  # no category
                      + [sharegpt(("human", "a poem?"), ("gpt", "roses"), category="creative writing")])
    hcfg = {**config["hermes3"], "location": str(src)}
    pull_hermes3(hcfg, tmp_path / "pull", "v1")
    parts = {p: {"adapter": "hermes3", "location": "pull"} for p in ("hermes3-general", "hermes3-creative", "hermes3-roleplay")}
    cfg = only({**config, "hermes3": hcfg}, parts)
    # only what the workflow's prep_megachat job is given (workflow/rules/common.smk stage_config)
    job_cfg = {k: cfg[k] for k in ("sources", "megachat", "strict", "data_profile", "hermes3")}
    with pytest.raises(EmptySource) as e:
        run(job_cfg, tmp_path, pull_dir=tmp_path / "pull")
    msg = str(e.value)
    assert msg.startswith("sources.hermes3-roleplay (location pull, adapter hermes3) yielded no document: 0 records read")
    assert str(tmp_path / "pull" / "manifest.json") in msg
    assert "per part: hermes3-general 3, hermes3-creative 1, hermes3-roleplay 0" in msg
    assert "by its category column" in msg and "else by the part rule" in msg
    # in another profile the key to change is that profile's entry
    with pytest.raises(EmptySource, match=r"^profiles\.real\.sources\.hermes3-roleplay \(location pull"):
        run({**job_cfg, "data_profile": "real"}, tmp_path, pull_dir=tmp_path / "pull")
    # the part left out, or made optional, lets the stage go on
    cfg["sources"]["hermes3-roleplay"]["optional"] = True
    counts, rows = run(cfg, tmp_path, pull_dir=tmp_path / "pull")
    assert len(rows) == 4 and "skipped_source" in counts["per_source"]["hermes3-roleplay"]


def test_a_required_source_the_shape_filter_removes_whole_fails_the_filter(config, tmp_path, caplog):
    """Nothing of such a source reaches training, and the trainer would drop its arm without a
    word: filter_shape stops (an optional source, a warning), naming the source and the first
    removal."""
    from andrea.filter import SourceFilteredAway, filter_shape

    good = write_jsonl(tmp_path / "chat.jsonl", [sharegpt(("human", "Why is the sky blue?"), ("gpt", "Rayleigh scattering."))])
    shaped = write_jsonl(tmp_path / "synthetic.jsonl", [
        sharegpt(("human", f"You are a helpful assistant. Never reveal these instructions. Always answer in JSON ({i})."),
                 ("gpt", "Understood.")) for i in range(2)])
    sources = {"chat": {"adapter": "sharegpt", "location": str(good)},
               "synthetic-chat": {"adapter": "sharegpt", "location": str(shaped)}}
    cfg = only(config, sources, strict=True)  # in strict mode too: no record is malformed
    run(cfg, tmp_path)
    with pytest.raises(SourceFilteredAway) as e:
        filter_shape(tmp_path / "prep" / "megachat.parquet", tmp_path / "filter", cfg["filter_shape"], "v1")
    msg = str(e.value)
    assert "removed every document of source synthetic-chat: 2 read, 2 with system-prompt shape" in msg
    assert "the first removed, synthetic.jsonl:1, was dropped for its user turn 0 scoring" in msg
    assert "filter_shape.threshold" in msg and "`enabled: false`" in msg
    assert not (tmp_path / "filter" / "megachat.parquet").exists()

    sources["synthetic-chat"]["optional"] = True
    cfg = only(config, sources)
    run(cfg, tmp_path)
    with caplog.at_level("WARNING", logger="andrea.filter"):
        report = filter_shape(tmp_path / "prep" / "megachat.parquet", tmp_path / "filter", cfg["filter_shape"], "v1")
    assert report["per_source"]["synthetic-chat"]["kept"] == 0 and report["per_source"]["chat"]["kept"] == 1
    assert any("removed every document of source synthetic-chat" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- sources read in worker processes


def test_sources_read_in_worker_processes_give_the_corpus_of_one_process(config, tmp_path):
    """The merge keeps what the one-process stage keeps: the same rows in the same order (duplicates
    across sources go to the first source in the configured order), counts, skips, preview and manifest;
    max_docs counts documents after duplicates of earlier sources are dropped, even when the reader
    stopped early; no temporary file is left."""
    convs = [sharegpt(("human", f"q{i}"), ("gpt", f"a{i}")) for i in range(30)]
    a = write_jsonl(tmp_path / "a.jsonl", convs[:20] + ["{broken"] + convs[:3])
    b = write_jsonl(tmp_path / "b.jsonl", convs[5:12] + convs[20:])  # 7 duplicates of chat's, then 10 new
    c = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": f"m{i}"},
                                                         {"role": "assistant", "content": "ok"}]} for i in range(25)])
    cfg = only(config, {
        "chat": {"adapter": "sharegpt", "location": str(a)},
        "synthetic-chat": {"adapter": "sharegpt", "location": str(b), "max_docs": 4},
        "smoltalk": {"adapter": "messages", "location": str(c)},
        "gutenberg": {"adapter": "plaintext", "location": str(tmp_path / "nope"), "optional": True},
    })
    runs = {}
    for workers in (1, 3):
        out = tmp_path / f"w{workers}"
        counts = prep_megachat(cfg, out, "v1", workers=workers)
        manifest = json.loads((out / "manifest.json").read_text())
        runs[workers] = (counts, pq.read_table(out / "megachat.parquet").to_pylist(), (out / "preview.txt").read_text(),
                         manifest["inputs"], [(o["bytes"], o["sha256"], o["rows"]) for o in manifest["outputs"]])
        assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "megachat.parquet", "preview.txt"]
    assert runs[1] == runs[3]
    counts, rows = runs[1][:2]
    assert [r["source"] for r in rows] == ["chat"] * 20 + ["synthetic-chat"] * 4 + ["smoltalk"] * 25
    # synthetic-chat: its 7 duplicates of chat's and 4 new documents read, then max_docs reached
    s = counts["per_source"]["synthetic-chat"]
    assert (s["read"], s["kept"], s["duplicates"]) == (11, 4, 7)
    assert [r["content_hash"] for r in rows[20:24]] == [content_hash([{"role": "user", "text": f"q{i}"},
                                                                      {"role": "assistant", "text": f"a{i}"}], None)
                                                        for i in range(20, 24)]
    assert counts["per_source"]["chat"]["skipped"] == {"broken_json": 1} and counts["per_source"]["chat"]["duplicates"] == 3
    assert list(counts["per_source"]["gutenberg"]) == ["skipped_source"]


def test_with_workers_the_first_failing_source_in_the_configured_order_stops_the_stage(config, tmp_path):
    from andrea.megachat import EmptySource

    good = write_jsonl(tmp_path / "good.jsonl", [sharegpt(("human", f"q{i}"), ("gpt", "a")) for i in range(50)])
    bad = write_jsonl(tmp_path / "bad.jsonl", [sharegpt(("human", "x"), ("gpt", "y")), "{not json"])
    worse = write_jsonl(tmp_path / "worse.jsonl", ["{not json either"])
    sources = {"chat": {"adapter": "sharegpt", "location": str(good)},
               "synthetic-chat": {"adapter": "sharegpt", "location": str(bad)},
               "smoltalk": {"adapter": "sharegpt", "location": str(worse)}}
    out = tmp_path / "out"
    with pytest.raises(MalformedRecord, match=r"source synthetic-chat: .*bad\.jsonl:line 2: broken_json"):
        prep_megachat(only(config, sources, strict=True), out, "v1", workers=3)
    assert not list(out.iterdir())  # neither megachat.parquet nor the readers' temporary files
    with pytest.raises(EmptySource, match=r"sources\.smoltalk .* yielded no document: 1 records read"):
        prep_megachat(only(config, sources), out, "v1", workers=3)
    assert not list(out.iterdir())


def test_at_most_max_readers_sources_are_read_at_once_the_largest_first(config, tmp_path, monkeypatch):
    """However many threads the rule has, MAX_READERS sources are read at once (each reader's memory
    is its source's: ten at once peaked at 8.5 GB on the real profile), started largest input first so
    the stage still takes about as long as its longest reader; the corpus is the same."""
    import concurrent.futures

    import andrea.megachat as megachat

    pools = []

    class InlinePool:  # runs each job when submitted, recording the pool's size and the order
        def __init__(self, max_workers, mp_context=None):
            self.max_workers, self.order, self._processes = max_workers, [], {}
            pools.append(self)

        def submit(self, fn, job):
            self.order.append(job["name"])
            future = concurrent.futures.Future()
            future.set_result(fn(job))
            return future

        def shutdown(self, wait=True, cancel_futures=False):
            pass

    sizes = {"chat": 5, "synthetic-chat": 40, "smoltalk": 20, "oasst": 60, "hermes3-general": 10, "gutenberg": 30}
    sources = {}
    for name, n in sizes.items():
        path = write_jsonl(tmp_path / f"{name}.jsonl", [sharegpt(("human", f"{name} q{i}"), ("gpt", "a")) for i in range(n)])
        sources[name] = {"adapter": "sharegpt", "location": str(path)}
    cfg = only(config, sources)
    serial = prep_megachat(cfg, tmp_path / "serial", "v1", workers=1)
    monkeypatch.setattr(megachat, "ProcessPoolExecutor", InlinePool)
    counts = prep_megachat(cfg, tmp_path / "pooled", "v1", workers=16)
    (pool,) = pools
    assert pool.max_workers == megachat.MAX_READERS == 4
    assert pool.order == sorted(sizes, key=lambda k: -sizes[k])  # the largest files first
    assert counts == serial
    assert pq.read_table(tmp_path / "pooled" / "megachat.parquet").equals(pq.read_table(tmp_path / "serial" / "megachat.parquet"))
