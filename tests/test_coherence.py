"""The coherence score (design §6.6) on a labelled set, and on small texts worked out by hand."""

import time
from collections import Counter

import pytest

from andrea.coherence import coherence_score, distinct_n, real_word_share
from conftest import REPO

PROSE = (REPO / "andrea" / "corpus" / "gutenberg" / "the-miller-of-hollow-brook.txt").read_text()[:1600]
LABELLED = REPO / "tests" / "data" / "coherence_set.txt"


def load_labelled(path=LABELLED) -> list[tuple[str, str, str]]:
    """(label, kind, text) per "%%% label | kind" header; lines split on "\\n" only, since the
    byte-soup entries may hold characters that str.splitlines() would break at."""
    entries, head, lines = [], None, []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.startswith("%%% "):
            if head:
                entries.append((*head, "\n".join(lines).strip()))
            head, lines = tuple(s.strip() for s in line[4:].split("|")), []
        elif head:
            lines.append(line)
    if head:
        entries.append((*head, "\n".join(lines).strip()))
    return entries


def test_the_labelled_set_is_what_it_says():
    entries = load_labelled()
    counts = Counter(label for label, _, _ in entries)
    assert set(counts) == {"coherent", "incoherent"} and counts["coherent"] >= 100 and counts["incoherent"] >= 100
    assert all(200 <= len(text) <= 2000 for _, _, text in entries)
    kinds = {kind for _, kind, _ in entries}
    assert {"prose", "dialogue", "definitions", "documentation", "code comments"} <= kinds
    assert {"keyboard mash", "pseudo-words", "letter salad", "digit salad", "repetition of a word",
            "loop of a real phrase", "early model: letter statistics", "byte soup"} <= kinds


def test_coherent_texts_score_50_or_more_and_incoherent_ones_below_30():
    wrong = []
    for label, kind, text in load_labelled():
        s = coherence_score(text)
        if (label == "coherent") != (s.score >= 50) or (label == "incoherent" and s.score >= 30):
            wrong.append(f"{label}/{kind}: {s.score:.1f} (share {s.share:.2f}) {text[:80]!r}")
    assert not wrong, f"{len(wrong)} misclassified:\n" + "\n".join(wrong)


def test_the_example_from_the_issue():
    mash = "qzx vbnm plokij wertyu asdfgh zxcvb poiuy lkjhg mnbvc qwerty"
    s = coherence_score(mash)
    # 51 letters, of which only "qwerty" (6) is a word: far below the 40 % where the gate opens.
    assert s.share == pytest.approx(6 / 51) and s.score == 0  # it scored 80.0 as a plain sum
    assert coherence_score(PROSE).score >= 90


# Worked by hand. Letters in real words: rivers 6, carry 5, salt 4, down 4, to 2, the 3, sea 3;
# qzxwv and pkjqx are in no word list.


def test_worked_example_all_real_and_new():
    s = coherence_score("rivers carry salt down to the sea")
    # 7 words: 6 bigrams and 5 trigrams, all distinct -> 35 + 35, novelty 1. Distinct characters:
    # r i v e s, c a y, l t, d o w n, h, and the space = 16 -> 10 × 16 / 25 = 6.4.
    assert (s.share, s.gate, s.bigram, s.trigram, s.words) == (1.0, 1.0, 35.0, 35.0, 7)
    assert s.chars == pytest.approx(6.4) and s.score == pytest.approx(96.4)


def test_worked_example_the_gate():
    s = coherence_score("rivers carry salt qzxwv pkjqx")
    # Real letters 6 + 5 + 4 = 15 of 25 -> share 0.6, gate (0.6 - 0.4) / 0.4 = 0.5. Distinct
    # characters: rivers carry salt give 10, qzxwv adds q z x w, pkjqx adds p k j, and the space = 18.
    assert s.share == pytest.approx(0.6) and s.gate == pytest.approx(0.5) and s.chars == pytest.approx(7.2)
    assert s.score == pytest.approx(0.5 * (35 + 35 + 7.2 + 20))  # 48.6
    # Below 40 % real letters nothing gets through: salt is 4 of 14 letters.
    assert coherence_score("salt qzxwv pkjqx").score == 0


def test_worked_example_a_loop():
    s = coherence_score("rivers carry salt " * 4)
    # 12 words. Bigrams: 11, distinct 3 (rivers carry, carry salt, salt rivers) -> 35 × 3/11.
    # Trigrams: 10, distinct 3 -> 35 × 3/10 = 10.5, novelty 0.3. Characters: 10 letters + space = 11.
    assert s.bigram == pytest.approx(35 * 3 / 11) and s.trigram == pytest.approx(10.5) and s.chars == pytest.approx(4.4)
    assert s.score == pytest.approx(0.3 * (35 * 3 / 11 + 10.5 + 4.4 + 20))  # 13.3
    # One word 120 times: 118 trigrams, 1 distinct; 7 characters (r e g i o n, space).
    region = coherence_score("region " * 120)
    assert region.score == pytest.approx((35 / 119 + 35 / 118 + 2.8 + 20) / 118)  # 0.2


def test_collapsed_and_empty_text_scores_below_the_gate():
    collapsed = {
        "quotes": "''''' ''' '' " * 40,
        "one character": "e" * 420,
        "cjk drift": "的的的是是是在在在" * 40,
        "two-word loop": "the cat the cat the cat " * 30,
        "empty": "",
    }
    for name, text in collapsed.items():
        assert coherence_score(text).score < 30, name


def test_what_counts_as_a_real_word():
    assert real_word_share(["I", "a"]) == 1.0 and real_word_share(["b"]) == 0.0  # single letters: only a and I
    assert real_word_share(["don’t", "model's", "we'll"]) == 1.0  # curly apostrophe, clitics on a real stem
    assert real_word_share(["getValue"]) == 1.0 and real_word_share(["getQzxwv"]) == 0.0  # camelCase by its parts
    assert real_word_share(["Qzxwv"]) == 0.0 and real_word_share(["LONDON"]) == 1.0
    # Digits and underscores split words; numbers count neither way.
    s = coherence_score("load_config reads 3 files in 2.5 seconds")
    assert s.words == 6 and s.share == 1.0  # load config reads files in seconds


def test_extra_words_from_a_tokenizer():
    text = "the tokenizer splits words"  # tokenizer is not in the word list: 9 of 23 letters
    assert coherence_score(text).share == pytest.approx(14 / 23)
    assert coherence_score(text, extra_words=["Tokenizer"]).share == 1.0
    assert coherence_score(text, extra_words=frozenset({"tokenizer"})).share == 1.0


def test_other_languages_need_their_word_list():
    for lang, text in [
        ("id", "sungai membawa garam sampai ke laut dan para nelayan menunggu di pantai setiap pagi"),
        ("vi", "dòng sông mang muối ra biển và những người đánh cá chờ đợi trên bãi biển mỗi buổi sáng"),
    ]:
        assert coherence_score(text).score == 0, lang
        assert coherence_score(text, languages=("en", lang)).share == 1.0, lang


def test_distinct_n():
    assert distinct_n("a b a b".split(), 2) == pytest.approx(2 / 3)
    assert distinct_n("a b".split(), 3) == 0.0


def test_as_dict_carries_every_part():
    d = coherence_score(PROSE).as_dict()
    assert set(d) == {"score", "share", "gate", "bigram", "trigram", "chars", "words"}
    assert 0 <= d["share"] <= 1 and 0 <= d["bigram"] <= 35 and 0 <= d["trigram"] <= 35 and 0 <= d["chars"] <= 10


def test_a_sample_scores_in_milliseconds():
    sample = (PROSE * 2)[:1500]  # about what 420 tokens decode to
    coherence_score(sample)  # the word list loads once
    t = time.perf_counter()
    for _ in range(20):
        coherence_score(sample)
    assert (time.perf_counter() - t) / 20 < 0.01
