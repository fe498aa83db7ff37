"""Writes the incoherent half of tests/data/coherence_set.txt: seeded, so the same every run.

    python tests/data/make_incoherent.py > /tmp/incoherent.txt   (then paste below the coherent half)

Each kind imitates a way a sampler fails. The early-model kinds learn their statistics from the
project's own embedded corpus (andrea/corpus), as a model in its first few hundred steps would.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LENGTH = (200, 2000)  # characters, as the labelled set requires

ROWS = ["qwertyuiop", "asdfghjkl", "zxcvbnm"]
ONSETS = "b bl br ch cl cr d dr f fl fr g gl gr h j k kl l m n p pl pr qu r s sc sh sk sl sm sn sp st str t th tr v w wh z".split()
VOWELS = "a e i o u y ai au ea ee ei ie oa oo ou".split()
CODAS = [""] * 3 + "b ck d f g k l ld lk m mp n nd ng nk nt p r rd rk rn rt s sh sk st t th x z".split()
SUFFIXES = ["", "", "", "er", "ing", "ed", "ly", "ion", "ous", "ent", "ish", "ance"]
GLUE = "the of and a to in is it that was for on as with by at from".split()


def fit(rng: random.Random, make_token, sep=" ") -> str:
    """Tokens from make_token() joined by sep until a length drawn from LENGTH."""
    target = rng.randint(LENGTH[0] + 20, min(LENGTH[1] - 50, 1400))
    out = []
    while len(sep.join(out)) < target:
        out.append(make_token())
    text = sep.join(out)
    return text[: LENGTH[1] - 1]


def sentences(rng: random.Random, word) -> str:
    """Words from word() in capitalised sentences with commas and full stops."""
    def sentence():
        ws = [word() for _ in range(rng.randint(4, 14))]
        for i in range(1, len(ws) - 1):
            if rng.random() < 0.12:
                ws[i] += ","
        return ws[0][:1].upper() + " ".join(ws)[1:] + rng.choice(".....?!")
    return fit(rng, sentence)


def keyboard_mash(rng: random.Random) -> str:
    def run():
        row = rng.choice(ROWS)
        i = rng.randrange(len(row) - 2)
        piece = row[i : i + rng.randint(3, 7)]
        return piece[::-1] if rng.random() < 0.3 else piece
    def token():
        t = "".join(run() for _ in range(rng.randint(1, 2)))
        return t.upper() if rng.random() < 0.05 else t
    return fit(rng, token)


def pseudo_word(rng: random.Random) -> str:
    syllables = [rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(rng.choice([1, 1, 2, 2, 3]))]
    return "".join(syllables) + rng.choice(SUFFIXES)


def pseudo_words(rng: random.Random) -> str:
    return sentences(rng, lambda: pseudo_word(rng))


def jabberwocky(rng: random.Random) -> str:
    """Invented content words with real glue words between them, a third of the tokens."""
    return sentences(rng, lambda: rng.choice(GLUE) if rng.random() < 1 / 3 else pseudo_word(rng))


def letter_salad(rng: random.Random) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    short = rng.random() < 0.4  # two- and three-letter chunks, the ones most likely to be words by chance
    def token():
        n = rng.randint(2, 3) if short else rng.randint(1, 10)
        return "".join(rng.choice(letters) for _ in range(n)) + ("," if rng.random() < 0.05 else "")
    return fit(rng, token)


def digit_salad(rng: random.Random) -> str:
    pool = "abcdefghijklmnopqrstuvwxyz0123456789" if rng.random() < 0.6 else "0123456789.,:-/%"
    return fit(rng, lambda: "".join(rng.choice(pool) for _ in range(rng.randint(2, 9))))


def word_repetition(rng: random.Random) -> str:
    word = rng.choice(["region", "the", "assistant", "yes", "and then", "I", "model", "data", "of the", "very"])
    sep = rng.choice([" ", " ", ", ", "\n", ". "])
    return fit(rng, lambda: word, sep)


LOOPS = [
    "I am not sure what you mean.",
    "The answer is the answer is",
    "Thank you for your question. I hope this helps!",
    "and the water flows down to the river and the river flows to the sea",
    "> user\nWhat is the capital of France?\n\n< assistant\nThe capital of France is Paris.\n\n",
    "It is important to note that it is important to note that",
    "The function returns the value of the function.",
    "She looked at the door and then she looked at the window and then she looked at the door again.",
    "Step 1: Open the file. Step 2: Read the file. Step 3: Close the file.",
    "You can use the following code to do this:",
    "This is a very good question, and there are many ways to answer it.",
    "def get(self):\n    return self.get()\n",
]


def phrase_loop(rng: random.Random) -> str:
    """A real phrase repeated at least four times, sometimes after one sensible opening sentence."""
    phrase = rng.choice(LOOPS)
    opening = rng.choice(["", "", "Sure, here is what I found about your question. "])
    reps = max(4, (rng.randint(LENGTH[0] + 20, 1400) - len(opening)) // len(phrase))
    sep = "" if phrase.endswith(("\n", " ")) else " "
    return (opening + sep.join([phrase] * reps))[: LENGTH[1] - 1]


def corpus_text() -> str:
    """Prose and chat text of the project's embedded corpus, the only text an early model knows."""
    import json

    texts = []
    for p in sorted((REPO / "andrea" / "corpus").rglob("*")):
        if p.suffix == ".jsonl":
            for line in p.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                for t in row.get("conversations", []):
                    texts.append(("> " if t["from"] in ("human", "user") else "< ") + t["value"])
        elif p.suffix in (".txt", ".md", ".log", ".tsv"):
            texts.append(p.read_text(encoding="utf-8"))
    return "\n\n".join(texts)


def char_markov(rng: random.Random, order: int) -> str:
    """A character n-gram sampler: what a model that has learned only letter statistics writes."""
    text = corpus_text()
    follow: dict[str, list[str]] = {}
    for i in range(len(text) - order):
        follow.setdefault(text[i : i + order], []).append(text[i + order])
    state = rng.choice(list(follow))
    out = [state]
    target = rng.randint(LENGTH[0] + 20, 1400)
    while sum(map(len, out)) < target:
        nxt = rng.choice(follow.get(state) or [" "])
        out.append(nxt)
        state = (state + nxt)[-order:]
    return "".join(out)[: LENGTH[1] - 1]


def early_model(rng: random.Random) -> str:
    return char_markov(rng, 2)


def segment_soup(rng: random.Random) -> str:
    """Word pieces glued in random order, with punctuation: a subword model's first steps."""
    pieces = re.findall(r" ?[a-z]{2,5}|[.,!?] ?|\n", corpus_text().lower())
    pieces = [pieces[i] for i in range(0, len(pieces), 7)]  # a spread-out sample of pieces
    target = rng.randint(LENGTH[0] + 20, 1400)
    out = ""
    while len(out) < target:
        p = rng.choice(pieces)
        out += p if not p.startswith(" ") or rng.random() < 0.3 else p[1:]
    return out[: LENGTH[1] - 1]


def byte_soup(rng: random.Random) -> str:
    """Random bytes decoded as a sampler decodes them (errors="replace"), mostly printable ASCII;
    control and unassigned characters also become U+FFFD, to keep this file plain text."""
    n = rng.randint(LENGTH[0] + 20, 1200)
    data = bytes(rng.randrange(32, 127) if rng.random() < 0.7 else rng.randrange(128, 256) for _ in range(n))
    text = data.decode("utf-8", "replace")
    return "".join(ch if ch.isprintable() else "\ufffd" for ch in text)[: LENGTH[1] - 1]


KINDS = {  # kind: (generator, how many)
    "keyboard mash": (keyboard_mash, 14),
    "pseudo-words": (pseudo_words, 14),
    "pseudo-words with real glue words": (jabberwocky, 12),
    "letter salad": (letter_salad, 12),
    "digit salad": (digit_salad, 8),
    "repetition of a word": (word_repetition, 10),
    "loop of a real phrase": (phrase_loop, 14),
    "early model: letter statistics": (early_model, 12),
    "early model: segment soup": (segment_soup, 8),
    "byte soup": (byte_soup, 6),
}

FIXED = [  # the examples that showed the problem (issue 13), kept verbatim
    ("keyboard mash", "qzx vbnm plokij wertyu asdfgh " * 8),
]


def main():
    rng = random.Random(13)
    for kind, text in FIXED:
        print(f"%%% incoherent | {kind}\n{text.strip()}")
    for kind, (make, count) in KINDS.items():
        for _ in range(count):
            text = make(rng).strip()
            text = re.sub(r"^%%%", "%%", text, flags=re.M)  # never a header by accident
            assert LENGTH[0] <= len(text) <= LENGTH[1], (kind, len(text))
            print(f"%%% incoherent | {kind}\n{text}")


if __name__ == "__main__":
    main()
