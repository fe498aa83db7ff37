from andrea.coherence import coherence_score
from conftest import REPO

PROSE = (REPO / "andrea" / "corpus" / "gutenberg" / "the-miller-of-hollow-brook.txt").read_text()[:1600]


def test_real_text_scores_high():
    s = coherence_score(PROSE)
    assert s.score >= 80 and s.english == 20.0 and s.chars == 10.0


def test_collapsed_text_scores_below_the_gate():
    collapsed = {
        "region": "region " * 120,
        "quotes": "''''' ''' '' " * 40,
        "one character": "e" * 420,
        "cjk drift": "的的的是是是在在在" * 40,
        "two-word loop": "the cat the cat the cat " * 30,
        "empty": "",
    }
    for name, text in collapsed.items():
        assert coherence_score(text).score < 30, name
    assert coherence_score("region " * 120).score < 5  # the original v1's failure


def test_parts_add_up_and_are_bounded():
    s = coherence_score(PROSE)
    assert abs(s.score - (s.bigram + s.trigram + s.english + s.chars)) < 1e-9
    assert 0 <= s.bigram <= 35 and 0 <= s.trigram <= 35 and 0 <= s.english <= 20 and 0 <= s.chars <= 10
