"""The coherence score of a generated sample, 0–100 (SPEC §6): early stopping by sample quality.

    bigram diversity     0–35   distinct word bigrams / word bigrams
    trigram diversity    0–35   distinct word trigrams / word trigrams
    English-word presence 0–20  share of words that are common English words: 0 up to 30 %,
                                full marks from 60 % (English prose measures 50–70 % here)
    character diversity  0–10   distinct characters, full marks at 25

Words are runs of Latin letters (with an apostrophe), so text that drifts into another script
has no words and scores on character diversity alone. Loss cannot see collapse — repeating one
common token scores well on cross-entropy — this can: "region region region" scores about 3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")

# The most frequent English words (function words and common verbs/nouns), enough to tell
# English from noise; written for this project.
COMMON_WORDS = frozenset(
    """
    a about above after again against all also always am an and any are around as ask at away back be
    because been before being below best better between big both but by call came can come could day
    did different do does doing done down during each early end enough even every few find first for
    found from full get give go going good great had has have having he help her here hers herself
    high him himself his home house how however i if important in into is it its itself just keep
    kind know large last later leave left less let life like line little long look made make man
    many may me might more most much must my myself name need never new next no nor not now number
    of off often old on once one only or other our ours ourselves out over own part people place
    point put right same say said see seem she should show side since small so some something
    sometimes still such take tell than that the their theirs them themselves then there these they
    thing things think this those though three through time to today together too two under until
    up upon us use used very want was water way we well went were what when where which while who
    whom why will with without word words work world would write year years yes yet you your yours
    yourself yourselves called each form found light long make many most night often play read
    really run sea set small sound start still story study such sun tree turn while white why
    answer because become began begin body book change children city close country cut does earth
    eat example eye face far father feet food four head hear heard hand its keep land later learn
    letter live mean men mile mother move near never next open own page paper plant question real
    river school second seen several should simple something soon state stop talk thought together
    took under until walk watch week went whole wind within without young
    """.split()
)


@dataclass
class Coherence:
    score: float
    bigram: float
    trigram: float
    english: float
    chars: float
    words: int

    def as_dict(self) -> dict:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def _diversity(words: list[str], n: int) -> float:
    grams = list(zip(*(words[i:] for i in range(n))))
    return len(set(grams)) / len(grams) if grams else 0.0


def coherence_score(text: str) -> Coherence:
    words = [w.lower() for w in WORD.findall(text)]
    bigram = 35.0 * _diversity(words, 2)
    trigram = 35.0 * _diversity(words, 3)
    common = sum(w in COMMON_WORDS for w in words) / len(words) if words else 0.0
    english = 20.0 * min(1.0, max(0.0, (common - 0.3) / 0.3))
    chars = 10.0 * min(1.0, len(set(text.strip())) / 25)
    return Coherence(bigram + trigram + english + chars, bigram, trigram, english, chars, len(words))
