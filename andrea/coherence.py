"""The coherence score of a generated sample, 0–100 (design §6.6): early stopping by sample quality.

    share     0–1    real-word share: of the letters in the text's words, the share that stand
                     in real words (a word list of the corpus's languages, or extra words such as
                     the tokenizer's whole-word segments)
    gate      0–1    (share − 0.4) / 0.4, clipped: 0 up to 40 % real letters, 1 from 80 %
    bigram    0–35   distinct word bigrams / word bigrams
    trigram   0–35   distinct word trigrams / word trigrams; novelty = trigram / 35
    chars     0–10   distinct characters, full marks at 25

    score = gate × novelty × (bigram + trigram + chars + 20)

The first plan (design §6.6) asked for share × (bigram + trigram + chars + 20) and the targets: prose ≥ 50; keyboard
mash, pseudo-words, letter salad and repetition collapse < 30. Meeting them takes two changes
(the labelled set is tests/data/coherence_set.txt):

The gate is a ramp, not the share itself. Text with only the letter statistics of the corpus
(what a small model writes first: "To had brat lays porbid cout-dectild fewat's for its far")
has 23–50 % of its letters, median 35 %, in words that are real by chance ("to", "had", "for",
"its"); at share × 97 it scored 30–39. Real text sits far above: prose and dialogue 97–100 %, Python's
docstrings 94 % at the median, 77 % at the 5th percentile and 53 % at the 1st (those are mostly
doctest code). So the share starts to count at 40 % and counts in full from 80 %: 200 samples of
letter statistics then score at most 19, and 95 % of the stdlib's docstrings of 200–2000
characters score 50 or more.

Novelty multiplies everything. Under the first plan's sum a loop of a real sentence keeps 20 + chars
≈ 30 points however often it repeats (about 30 + 70/k for k repeats), so loops of a real phrase
could never fall below 30. Scaled by the share of trigrams that are new, a loop said k times
scores about (70/k + 30)/k: 33 for twice, 18 for three times; prose, whose trigrams are all but
all distinct, keeps what the first plan's sum gives it.

Why letters, not words, in the share: the short glue words ("the", "of", "a") that survive
between invented words are also the strings that are real by chance; weighting by letters, a
word counts for its length.

What is a real word. Words are runs of letters (any script) joined by apostrophes; digits,
underscores and punctuation split them, so numbers count neither way and snake_case splits into
its words. A word is looked up lower-cased, with curly apostrophes made straight, in wordfreq's
frequency list (Wikipedia, subtitles, news, books, web text and more). A big list also holds the
typos, names and fragments of the web (every single letter and every pair of letters is in it),
so a word must also be frequent enough for its length, on the Zipf scale (log10 of occurrences
per billion words):

    1 letter   ≥ 6.5   only "a" and "I" in English
    2 letters  ≥ 4.5   of, to, ok, uk, hi, …: 66 of the 676 letter pairs
    3 letters  ≥ 3.5   the, war, fig, …: 710 of the 17,576 letter triples
    4+ letters ≥ 2.0   about once per hundred million words: "regex" is in, "iterable" (1.4) out;
                       2 % of random four-letter strings pass, 0.06 % of five-letter ones

Failing that, "camelCase" is real when each of its parts is, and "model's", "we'll" when the stem
is. What the score cannot see: real words in a senseless order. Text with the letter statistics
of three-letter contexts ("a locks of a feelied at in winto a clossist sleep") is about 60 % real
words and scores 19–73, median 53; a model that has learned words but not sentences scores as
prose does. The external judge (design §10.3) is what reads for sense.

The word list is loaded once per set of languages (about 0.2 s); a 420-token sample then scores
in well under a millisecond.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

import wordfreq

WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*")
CAMEL = re.compile(r"[^\W\d_][^\W\d_A-Z]*")  # "getHTTPValue" -> get, H, T, T, P, Value
CLITICS = ("s", "ll", "ve", "re", "d", "t", "m")  # model's, we'll, they've, you're, I'd, …

# Minimum Zipf frequency of a real word by its length in letters; longer words use the last.
MIN_ZIPF_BY_LENGTH = (6.5, 4.5, 3.5, 2.0)
# The share counts from what letter statistics reach by chance to where real text sits.
SHARE_FLOOR, SHARE_FULL = 0.4, 0.8
DEFAULT_LANGUAGES = ("en",)


@dataclass
class Coherence:
    score: float
    share: float  # real-word share, 0–1, by letters
    gate: float  # what the share lets through, 0–1
    bigram: float
    trigram: float
    chars: float
    words: int

    def as_dict(self) -> dict:
        rounded = {k: round(v, 4 if k in ("share", "gate") else 2) for k, v in self.__dict__.items() if isinstance(v, float)}
        return {**self.__dict__, **rounded}


def distinct_n(words: list[str], n: int) -> float:
    """Distinct word n-grams / word n-grams (0 when there are none)."""
    grams = list(zip(*(words[i:] for i in range(n))))
    return len(set(grams)) / len(grams) if grams else 0.0


def min_zipf(length: int) -> float:
    return MIN_ZIPF_BY_LENGTH[min(length, len(MIN_ZIPF_BY_LENGTH)) - 1]


@functools.cache
def lexicon(languages: tuple[str, ...] = DEFAULT_LANGUAGES) -> frozenset[str]:
    """The real words of `languages` (wordfreq codes): lower-case, frequent enough for their length."""
    floor = min(MIN_ZIPF_BY_LENGTH)
    words = set()
    for lang in languages:
        # Bucket i holds the words whose frequency is 10^(-i/100): Zipf 9 - i/100.
        for i, bucket in enumerate(wordfreq.get_frequency_list(lang, "best")):
            zipf = 9 - i / 100
            if zipf < floor:
                break
            words.update(w for w in bucket if zipf >= min_zipf(len(w)) and WORD.fullmatch(w))
    return frozenset(words)


def is_real_word(word: str, known: Collection[str], extra: Collection[str] = ()) -> bool:
    """`word` (as written) is in `known` or `extra` (lower-case sets), as a whole, by its camelCase
    parts, or by the stem before an English clitic."""
    w = word.casefold().replace("’", "'")
    if w in known or w in extra:
        return True
    stem, _, clitic = w.rpartition("'")
    if stem and clitic in CLITICS:
        return is_real_word(stem, known, extra)
    parts = CAMEL.findall(word)
    return len(parts) > 1 and all(is_real_word(p, known, extra) for p in parts)


def real_word_share(words: list[str], extra_words: Collection[str] | None = None,
                    languages: tuple[str, ...] = DEFAULT_LANGUAGES) -> float:
    """Share of the letters of `words` that stand in real words (0 when there are none)."""
    known, extra = lexicon(tuple(languages)), extra_words or ()
    total = real = 0
    for w in words:
        total += len(w)
        real += len(w) if is_real_word(w, known, extra) else 0
    return real / total if total else 0.0


def coherence_score(text: str, extra_words: Iterable[str] | None = None,
                    languages: tuple[str, ...] = DEFAULT_LANGUAGES) -> Coherence:
    """Score `text` 0–100. `extra_words`: more real words (lower-case), e.g. a tokenizer's
    whole-word segments, for vocabulary the word list lacks; pass a set to avoid a copy per call."""
    if extra_words is not None and not isinstance(extra_words, (set, frozenset)):
        extra_words = {w.lower() for w in extra_words}
    found = WORD.findall(text)
    words = [w.lower() for w in found]
    share = real_word_share(found, extra_words, languages)
    bigram = 35.0 * distinct_n(words, 2)
    trigram = 35.0 * distinct_n(words, 3)
    chars = 10.0 * min(1.0, len(set(text.strip())) / 25)
    gate = min(1.0, max(0.0, (share - SHARE_FLOOR) / (SHARE_FULL - SHARE_FLOOR)))
    novelty = trigram / 35.0
    score = gate * novelty * (bigram + trigram + chars + 20.0)
    return Coherence(score, share, gate, bigram, trigram, chars, len(words))
