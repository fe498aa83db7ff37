"""part_by_rule(): which Hermes-3 part (general, creative, roleplay) a conversation belongs to,
when its record carries no category (by the public evidence, the hub's copy of Hermes-3 has only
`conversations`: README, "Hermes-3's three parts"; SPEC §8).

The rule reads what sets a conversation's kind: the system prompt and the first user turn. It asks
what the first exchange is *about* (andrea/labelled/hermes3_parts_set.txt states the boundaries):
- roleplay: the user talks WITH a character the assistant plays, inside that character's world
  (a scene with actions between asterisks, a character card, a game master, an interview of a
  figure about its own life, a practice scenario);
- creative: the user asks for an imaginative work to be composed (poems, lyrics, stories,
  continuations, scripts, jokes, worldbuilding);
- general: the rest, including functional writing (emails, essays, code) and writing *about*
  stories and poems (analysis, summaries, critique).

In the spirit of the shape filter (andrea/shape.py), `features()` measures readable cues, each a
small pattern or word class with a name (a character card's "Personality:" fields, actions between
asterisks in the user turn, the user addressing the persona by its name, a composing verb with a
creative form as its object, a functional form such as an email or a function, questions about a
text …), and two logistic regressions over them decide, in cascade: roleplay when its probability
is ≥ 0.5, else creative when its probability is ≥ 0.5, else general. Their weights are fitted on the
labelled set by `fit()` and shipped in andrea/hermes3_parts_weights.py (`python -m
andrea.hermes3_parts fit` rewrites it); `evaluate()` on that set is in-sample, `cross_validate()`
refits the weights on the training folds only and scores the held-out fold.

Speed matters (~1M conversations): scoring needs no NumPy, and reads the head of a long system
prompt and the head and tail of a long user turn (SYSTEM_HEAD, USER_HEAD, USER_TAIL).
"""

from __future__ import annotations

import hashlib
import json
import math
import pprint
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from operator import mul
from pathlib import Path

from andrea.config import HERMES3_PARTS
from andrea.tokenizer import trie_pattern

GENERAL, CREATIVE, ROLEPLAY = HERMES3_PARTS
LABELS = {"general": GENERAL, "creative": CREATIVE, "roleplay": ROLEPLAY}
# What the rule reads of long texts: the head of a system prompt (a persona or tool list is
# declared first), the head and tail of a user turn (a request may come before or after a pasted text)
SYSTEM_HEAD, USER_HEAD, USER_TAIL = 2000, 1200, 400
L2 = 3.0  # ridge penalty on the standardised weights (fixed, not tuned on the set)
CV_FOLDS, CV_REPEATS, CV_SEED = 5, 5, 13

# ---------------------------------------------------------------------------------------------
# Cues. Patterns run on lowercased text unless they need capitals (names). Speed: word classes are
# compiled as tries (andrea.tokenizer.trie_pattern: Python's re tries the alternatives of a plain
# alternation one by one, a factored one is faster), and a pattern that starts with a word has no
# leading \b (which keeps re from skipping ahead to the characters the pattern can start with):
# _count() checks that a match starts a word instead.

_W = r"[^.?!\n]{0,60}?"  # a short stretch within one sentence


def _words(words, before: str = "", after: str = r"\b") -> str:
    """Regex source matching any of the literal `words` (longest first), ending at a word boundary
    (_count() checks the start)."""
    return before + "(?:" + trie_pattern(sorted(set(words))) + ")" + after


def _plurals(*words: str) -> tuple[str, ...]:
    return tuple(w for word in words for w in (word, word + "s"))


# Words that name roleplay itself and its machinery (in either text).
RP_TERMS = re.compile(_words((
    "roleplay", "role-play", "role play", "roleplaying", "rp", "in character", "break character", "breaks character",
    "breaking character", "out of character", "ooc", "interactive fiction", "interactive story", "text adventure",
    "game master", "dungeon master", "never speak for", "improv", "play pretend",
), after=r"\b") + r"|\{\{(?:char|user)\}\}|<char>")
# A user setting up a scene: "let's roleplay", "you be …", "pretend you're …", "act as a …", "I'll start".
RP_SETUP = re.compile(
    r"let'?s (?:do an? |play an? |play )?(?:roleplay|role-play|rp|pretend|improv|scene|text adventure)|rp with me|"
    r"pretend (?:to be|you'?re|you are)|(?:roleplay|role-play) as (?:a|an|my|the)\b|you be\b|be my\b|you play (?:a|an|my|the)\b|"
    r"(?:i'?ll|i will|i want to|i need to|let'?s|help me) practi[cs]e\b|"
    r"(?:scene starts|start the game|let'?s begin|i'?ll start|i'?ll go first|you'?re the narrator)\b|"
    r"you(?:'re| are) (?:a|an|my|the)\b" + _W + r"\b(?:and i|me)\b|i(?:'m| am) (?:a|an|the|your)\b" + _W + r"\band you(?:'re| are)\b"
)
# "Act as …", "I want you to act as …": a role handed over by the user, a character or a tool.
ACT_AS = re.compile(r"act as (?:a|an|my|the)\b|act as \w+\b")
# Labels of a character card at a line start ("Personality: …", "[Character: …").
CARD_FIELD = re.compile(
    r"^[ \t\[]*(name|age|species|personality|appearance|description|scenario|setting|backstory|likes|dislikes|"
    r"first message|example dialogue|character|occupation|speech|\{\{char\}\}|\{\{user\}\})[ \t]*:",
    re.M,
)
# The system prompt casting the reader as a character ("play the role of", "you narrate", "stay in character").
PERSONA = re.compile(_words((
    "you are to take on the role of", "play the role of", "roleplay as", "role-play as", "you play", "you control",
    "you narrate", "you are the narrator", "you are a narrator", "you are the game master", "you are a game master",
    "you are the dungeon master", "you are a dungeon master", "you are running", "you are playing", "continue the roleplay",
    "stay in character", "remain in character", "never break character", "respond in character", "reply in his voice",
    "reply in her voice", "reply in their voice",
)) + r"|answer as \w+ would\b")
YOU_ARE_NAME = re.compile(r"[Yy]ou are (?:now )?(?:the )?([A-Z][\w'.-]+(?: (?:of )?[A-Z][\w'.-]+){0,3})")
NAME_SOURCES = (
    YOU_ARE_NAME,
    re.compile(r"^[ \t\[]*(?:[Nn]ame|[Cc]haracter|\{\{char\}\})[ \t]*:[ \t]*([A-Z][\w'.-]+(?: [A-Z][\w'.-]+){0,2})", re.M),
    re.compile(r"\{\{char\}\} is ([A-Z][\w'.-]+)"),
    re.compile(r"(?:role of|roleplay as|[Pp]lay(?:ing)?|\bas|named|called) ([A-Z][\w'.-]+(?: [A-Z][\w'.-]+){0,2})"),
)
_NOT_NAMES = frozenset((
    "the", "of", "a", "an", "and", "ai", "i", "you", "hermes", "assistant", "chatgpt", "gpt", "json", "python", "english",
))
# The system prompt giving the user a part in the scene ("The user is a traveller", "{{user}}: a new intern").
USER_CAST = re.compile(
    r"(?:the (?:user|player)\b|\{\{user\}\})(?:'s| is| plays| will play| takes| controls|:)|your (?:companion|rival|friend|opponent)\b"
)
# The system prompt declaring an assistant, tool or professional role instead.
ASSISTANT = re.compile(_words((
    "assistant", "ai model", "language model", "chatbot", "function calling", "function", "functions", "tools", "json",
    "schema", "expert", "specialist", "tutor", "consultant", "counselor", "counsellor", "helpful", "answer questions",
    "answer the question", "answer the user's question", "customer", "customers", "support", "extraction", "task",
)) + r"|<tools>")
# Nouns of fiction's worlds (fantasy, historical, sci-fi, horror): a weak cue for both creative and roleplay.
FICTION = re.compile(_words(_plurals(
    "tavern", "inn", "innkeeper", "kingdom", "knight", "dragon", "wizard", "elf", "dwarf", "sword", "castle", "quest",
    "pirate", "captain", "vampire", "ghost", "sorcerer", "mage", "spell", "potion", "throne", "lord", "lady", "ranger",
    "starship", "colony", "zombie", "crypt", "dungeon", "realm", "demon", "curse", "villain", "princess", "prince",
    "queen", "king", "monster", "spirit",
) + ("witch", "witches", "elves", "elven", "dwarves", "sorceress", "sorcery", "majesty", "highness", "cryosleep", "apocalypse",
     "post-apocalyptic", "fae", "cursed", "magic", "haunted")))
# Actions between single asterisks ("*draws my sword*"), the mark of a chat roleplay turn.
ACTION = re.compile(r"(?<!\*)\*(?![\s*])[^*\n]{2,200}(?<![\s*])\*(?!\*)")
# The user acting in first person present ("I walk into …"), or a text-adventure command ("> open the door").
FIRST_PERSON_ACT = re.compile(r"i " + _words(_plurals(
    "walk", "step", "look", "grab", "draw", "kick", "climb", "sit", "stand", "place", "open", "pull", "push", "kneel",
    "lean", "turn", "run", "reach", "hold", "raise", "whisper", "shout", "close", "nod", "smile", "glance", "wake",
    "stamp", "peer", "knock", "hug", "slide", "drop", "pick", "enter", "barricade", "check", "scan", "bow", "cough",
    "catch", "stare", "sigh", "wave",
), before="") + r"|^>\s*\w")
# The user turn opening with a line of dialogue.
QUOTE_OPEN = re.compile(r"^\s*[\"“]")
# The user addressing someone: a title, or a greeting with a name ("Captain, …", "Evening, Jack.").
TITLE_VOCATIVE = re.compile(_words((
    "mr", "mrs", "ms", "dr", "professor", "captain", "commander", "detective", "sergeant", "lieutenant", "sire", "madame",
    "madam", "maestro", "master", "lady", "lord", "sir", "your majesty", "your highness", "your grace", "your excellency",
    "your honor", "your honour", "witcher", "granny", "grandma",
)) + r"|great \w+")
NAME_VOCATIVE = re.compile(
    r"^(?:(?:hi|hello|hey|morning|evening|good (?:morning|evening|afternoon)|okay|ok|um),? )?([A-Z][\w'.-]+)[,!?]"
)
_NOT_VOCATIVES = frozenset((
    "okay", "ok", "hello", "hi", "hey", "yes", "no", "well", "so", "please", "thanks", "also", "now", "first", "here",
    "sure", "alright", "oh", "um", "wait", "ugh", "honestly", "actually", "look", "listen", "morning", "evening", "again",
    "premise", "hypothesis", "forget",
))
# A composing verb with a creative form as its object ("write a poem", "tell me a story").
_CREATIVE_FORMS = _plurals(
    "poem", "sonnet", "haiku", "limerick", "ballad", "ode", "verse", "villanelle", "song", "chorus", "tale", "fable",
    "fairy tale", "fairytale", "chapter", "scene", "myth", "legend", "joke", "pun", "horoscope", "sketch", "monologue",
    "dialogue", "conversation", "screenplay", "script", "novel", "prologue", "epilogue", "lyric", "rhyme", "parody",
) + ("poetry", "elegy", "elegies", "acrostic", "rhyming", "rap", "bridge", "lullaby", "carol", "shanty", "anthem",
     "story", "stories", "flash fiction", "fiction", "fan fiction", "fanfiction", "fanfic", "diary entry", "love letter",
     "letter from", "prose", "cold open", "radio play", "stage play", "play")
CREATIVE_FORM = re.compile(_words(_CREATIVE_FORMS))
_COMPOSE_VERBS = ("write", "compose", "pen", "create", "craft", "make up", "tell", "give", "come up with", "invent", "draft",
                  "sing", "rewrite", "retell", "turn", "continue", "finish", "need", "want")
COMPOSE = re.compile(_words(_COMPOSE_VERBS) + _W + _words(_CREATIVE_FORMS))
CONTINUE = re.compile(
    r"continue\b(?: (?:this|the|my) (?:story|tale|scene))?[:.]|continue (?:this|the|my) (?:story|tale)|"
    r"what happens next|next (?:chapter|paragraph)|pick up where|finish this story|keep the story going|go\.$"
)
INVENT = re.compile(
    _words(("invent", "create", "design", "come up with", "make up", "describe")) + _W + _words((
        "world", "kingdom", "kingdoms", "species", "creature", "civilization", "civilisation", "magic system", "pantheon",
        "gods", "city", "nation", "island", "legend", "myth", "history", "backstory", "character profile", "restaurant",
        "sport", "language", "planet",
    )) + r"|worldbuild"
)
IMAGINATIVE = re.compile(_words((
    "imagine", "in a world where", "once upon a time", "in the style of", "from the point of view of",
    "from the perspective of", "as if", "in the voice of", "fictional", "alternate history", "narrated by",
    "in the second person", "in second person", "vivid", "poetic",
)))
CREATIVE_SYSTEM = re.compile(_words((
    "creative writing", "creative writer", "storyteller", "poet", "novelist", "novelist's", "songwriter", "songwriting",
    "screenwriter", "worldbuilding", "fiction", "imaginative", "writing partner", "author", "authors", "author's", "bard",
    "shakespeare",
)))
# Functional writing and technical work: what a "write …" asks for when it is not creative.
FUNCTIONAL = re.compile(_words((
    "email", "e-mail", "cover letter", "resignation letter", "thank-you note", "note", "message", "letter to", "resume",
    "cv", "essay", "report", "blog", "article", "post", "review", "biography", "summary", "speech", "slogan", "tagline",
    "headline", "headlines", "ad", "product description", "proposal", "recipe", "instructions", "checklist", "plan",
    "outline", "system prompt", "invoice", "memo", "announcement",
)))
CODE = re.compile(_words((
    "code", "function", "python", "javascript", "java", "rust", "sql", "regex", "bash", "shell", "dockerfile", "class",
    "api", "program", "error", "bug", "unit test", "pytest", "query", "csv", "json", "html", "css", "algorithm",
    "script that", "script in", "scrape", "scrapes", "scraper",
)) + r"|```|\(\)|[=!<>]=")
# Questions about a text or a subject, and requests to work on a given text.
ANALYSIS = re.compile(_words((
    "analyze", "analyse", "summarize", "summarise", "explain", "interpret", "critique", "compare", "theme", "themes",
    "symbolism", "meaning", "who wrote", "difference between", "proofread", "translate", "classify", "categorize",
    "categorise", "recommend", "tips", "feedback", "what works", "correct", "how do", "how does", "how can",
    "how should", "how long", "how many", "how much", "what is", "what are", "what was", "what were", "what does",
    "what makes", "what should", "why is", "why are", "why do", "why does", "why did",
)))
QUESTION_OPEN = re.compile(r"^(?:what|why|how|who|when|where|which|is|are|can|could|do|does|should|would|will)\b")
MATH = re.compile(r"\d\s*[-+*/^=]\s*\d|" + _words(("solve", "prove", "probability", "derivative", "equation")))
YOU_PERSONAL = re.compile(
    r"(?:your (?:life|research|family|ship|crew|kingdom|people|home|past|childhood|journey|quest|village|shop|orders|"
    r"plays|notebooks|bridge|majesty|highness|day)|do you (?:miss|remember|regret|really|truly)|did you (?:ever|feel)|"
    r"how did you (?:feel|build|become)|what do you (?:truly|really) think|you feel that|are you (?:the one|still|really))\b"
)

FEATURES = (
    "has_system",
    "rp_terms_system",
    "rp_terms_user",
    "rp_setup_user",
    "act_as_user",
    "card_fields",
    "persona_system",
    "persona_named",
    "user_cast_in_system",
    "assistant_system",
    "fiction_words",
    "user_actions",
    "user_first_person_act",
    "user_opens_with_quote",
    "user_title_vocative",
    "user_name_vocative",
    "user_names_persona",
    "user_you_personal",
    "creative_forms",
    "compose_request",
    "continue_request",
    "invent_request",
    "imaginative",
    "creative_system",
    "functional_form",
    "code",
    "analysis",
    "question_open",
    "math",
    "log_user_words",
    "persona_and_engaged",
    "compose_not_functional",
)


def persona_names(system: str) -> set[str]:
    """Lowercased words of the names a system prompt gives the reader ("You are Captain Redbeard",
    "Name: Elara", "{{char}} is Vex", "play Theo")."""
    names: set[str] = set()
    for pat in NAME_SOURCES:
        for m in pat.finditer(system):
            names.update(w.strip(".'-").lower() for w in m.group(1).split())
    return {n for n in names if len(n) > 2 and n not in _NOT_NAMES}


def _count(pat: re.Pattern, text: str, cap: int) -> float:
    """Matches of `pat` in `text` that start a word (or start with a non-word character), up to `cap`."""
    n = 0
    for m in pat.finditer(text):
        i = m.start()
        if i and text[i].isalnum() and (text[i - 1].isalnum() or text[i - 1] == "_"):
            continue
        n += 1
        if n == cap:
            break
    return float(n)


def features(system: str, user: str) -> list[float]:
    """The cue values of one conversation's system prompt and first user turn, in FEATURES order."""
    s_raw = (system or "")[:SYSTEM_HEAD]
    u_raw = user or ""
    if len(u_raw) > USER_HEAD + USER_TAIL:
        u_raw = u_raw[:USER_HEAD] + "\n" + u_raw[-USER_TAIL:]
    s, u = s_raw.lower(), u_raw.lower()
    u_stripped = u_raw.strip()
    names = persona_names(s_raw) if s_raw else set()
    persona = float(bool(_count(PERSONA, s, 1)) or bool(CARD_FIELD.search(s)) or "{{char}}" in s)
    actions = _count(ACTION, u_raw, 3)
    first_person = _count(FIRST_PERSON_ACT, u, 2)
    quote = float(bool(QUOTE_OPEN.match(u_raw)))
    title_voc = _count(TITLE_VOCATIVE, u[:200], 1)
    m = NAME_VOCATIVE.match(u_stripped)
    name_voc = float(bool(m) and m.group(1).lower() not in _NOT_VOCATIVES)
    names_persona = float(bool(names) and not names.isdisjoint(re.findall(r"[\w'-]+", u)))
    you_personal = _count(YOU_PERSONAL, u, 2)
    engaged = float(bool(actions or first_person or quote or title_voc or name_voc or names_persona or you_personal))
    compose = _count(COMPOSE, u, 2)
    functional = _count(FUNCTIONAL, u, 2)
    n_words = len(u.split())
    return [
        float(bool(s.strip())),
        _count(RP_TERMS, s, 2),
        _count(RP_TERMS, u, 2),
        _count(RP_SETUP, u, 2),
        _count(ACT_AS, u, 1),
        float(min(len({f.group(1) for f in CARD_FIELD.finditer(s)}), 4)),
        persona,
        float(bool(names)),
        _count(USER_CAST, s, 2),
        _count(ASSISTANT, s, 3),
        _count(FICTION, s + "\n" + u, 4) / 2,
        actions,
        first_person,
        quote,
        title_voc,
        name_voc,
        names_persona,
        you_personal,
        _count(CREATIVE_FORM, u, 3),
        compose,
        _count(CONTINUE, u, 1),
        _count(INVENT, u, 1),
        _count(IMAGINATIVE, u, 2),
        _count(CREATIVE_SYSTEM, s, 2),
        functional,
        _count(CODE, u, 3),
        _count(ANALYSIS, u, 3),
        float(bool(QUESTION_OPEN.match(u_stripped.lower()))),
        _count(MATH, u, 2),
        math.log1p(n_words),
        float(bool(persona or names) and engaged),
        float(compose > 0 and functional == 0),
    ]


def first_exchange(conversations: list[dict]) -> tuple[str, str]:
    """The system prompt (the system turns before the first user turn, joined) and the first user
    turn of a ShareGPT conversation."""
    system: list[str] = []
    for turn in conversations:
        if turn["from"] == "human":
            return "\n".join(system), turn["value"]
        if turn["from"] == "system":
            system.append(turn["value"])
    return "\n".join(system), ""


# ---------------------------------------------------------------------------------------------
# Scoring with the shipped weights.


@lru_cache(maxsize=1)
def _model() -> dict[str, tuple[list[float], float]]:
    from andrea import hermes3_parts_weights as pw

    if tuple(pw.FEATURES) != FEATURES:
        raise RuntimeError("andrea/hermes3_parts_weights.py was fitted on other features; run `python -m andrea.hermes3_parts fit`")
    return {
        "roleplay": (list(pw.ROLEPLAY_WEIGHTS), pw.ROLEPLAY_INTERCEPT),
        "creative": (list(pw.CREATIVE_WEIGHTS), pw.CREATIVE_INTERCEPT),
    }


def _decide(x: list[float], model: dict) -> str:
    w, b = model["roleplay"]
    if b + sum(map(mul, w, x)) >= 0.0:  # probability ≥ 0.5
        return ROLEPLAY
    w, b = model["creative"]
    if b + sum(map(mul, w, x)) >= 0.0:
        return CREATIVE
    return GENERAL


def part_by_rule(system: str, user: str) -> str:
    """The part (hermes3-general, -creative or -roleplay) the rule gives a conversation with this
    system prompt ("" for none) and first user turn."""
    return _decide(features(system, user), _model())


def part_of_conversation(conversations: list[dict]) -> str:
    """part_by_rule() on a validated ShareGPT conversation."""
    return part_by_rule(*first_exchange(conversations))


def explain(system: str, user: str) -> dict:
    """The part, each model's probability, and the cues that counted (value and points)."""
    x = features(system, user)
    model = _model()
    out = {"part": _decide(x, model)}
    for name, (w, b) in model.items():
        z = b + sum(map(mul, w, x))
        out[name] = {
            "probability": round(1 / (1 + math.exp(-max(-700.0, min(700.0, z)))), 4),
            "cues": {n: {"value": round(xi, 3), "points": round(wi * xi, 2)} for n, wi, xi in zip(FEATURES, w, x) if xi},
        }
    return out


# ---------------------------------------------------------------------------------------------
# The labelled set.


@dataclass(frozen=True)
class Labelled:
    system: str
    user: str
    part: str  # hermes3-general, -creative or -roleplay
    kind: str


def labelled_set_path() -> Path:
    return Path(str(resources.files("andrea") / "labelled" / "hermes3_parts_set.txt"))


@lru_cache(maxsize=4)
def labelled_set(path: str | None = None) -> tuple[Labelled, ...]:
    """The labelled set shipped with the package (its header says how entries are written)."""
    p = Path(path) if path else labelled_set_path()
    items: list[Labelled] = []
    header: tuple[str, str, int] | None = None
    blocks: dict[str, list[str]] = {}
    block = None

    def flush() -> None:
        if header is None:
            return
        user = "\n".join(blocks.get("user", [])).strip()
        if not user:
            raise ValueError(f"{p}:{header[2]}: entry without an @user block")
        items.append(Labelled("\n".join(blocks.get("system", [])).strip(), user, header[0], header[1]))

    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("%%% "):
            flush()
            label, _, kind = line[4:].partition("|")
            if label.strip() not in LABELS or not kind.strip():
                raise ValueError(f"{p}:{n}: bad header {line!r} (want '%%% general|creative|roleplay | kind')")
            header, blocks, block = (LABELS[label.strip()], kind.strip(), n), {}, None
        elif header is not None and line.strip() in ("@system", "@user"):
            block = line.strip()[1:]
            if block in blocks:
                raise ValueError(f"{p}:{n}: a second {line.strip()} block in one entry")
            blocks[block] = []
        elif header is not None:
            if block is None:
                if line.strip():
                    raise ValueError(f"{p}:{n}: text before @system or @user")
                continue
            blocks[block].append(line)
    flush()
    return tuple(items)


def labelled_set_digest(path: str | None = None) -> str:
    return hashlib.sha256((Path(path) if path else labelled_set_path()).read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Fitting and measuring (NumPy, imported here only).


def _design(items):
    import numpy as np

    X = np.array([features(it.system, it.user) for it in items], dtype=np.float64)
    y = np.array([HERMES3_PARTS.index(it.part) for it in items])
    return X, y


def _fit_design(X, y) -> dict:
    """The two cascade models fitted on (X, y): roleplay against the rest, creative against the rest."""
    from andrea.shape import _fit_logistic

    rw, rb = _fit_logistic(X, (y == HERMES3_PARTS.index(ROLEPLAY)).astype(float), L2)
    cw, cb = _fit_logistic(X, (y == HERMES3_PARTS.index(CREATIVE)).astype(float), L2)
    return {"roleplay": ([float(v) for v in rw], float(rb)), "creative": ([float(v) for v in cw], float(cb))}


def fit(items=None) -> dict:
    """Weights of both models fitted on `items` (default: the labelled set)."""
    X, y = _design(labelled_set() if items is None else items)
    return _fit_design(X, y)


def _predict(X, model) -> list[str]:
    return [_decide(list(row), model) for row in X]


def _per_part(pred: list[str], truth: list[str]) -> dict:
    out = {}
    for part in HERMES3_PARTS:
        tp = sum(p == part and t == part for p, t in zip(pred, truth))
        fp = sum(p == part and t != part for p, t in zip(pred, truth))
        fn = sum(p != part and t == part for p, t in zip(pred, truth))
        out[part] = {
            "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
            "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
            "tp": tp, "fp": fp, "fn": fn,
        }
    return out


def evaluate(items=None) -> dict:
    """Per-part precision and recall of the shipped weights on the labelled set, and what they get
    wrong. In-sample (the weights were fitted on this set): cross_validate() gives held-out figures."""
    items = labelled_set() if items is None else items
    pred = [_decide(features(it.system, it.user), _model()) for it in items]
    wrong = [{"kind": it.kind, "label": it.part, "predicted": p, "user": it.user[:120]}
             for it, p in zip(items, pred) if p != it.part]
    return {"n": len(items), **_per_part(pred, [it.part for it in items]), "misclassified": wrong}


def cross_validate(items=None, k: int = CV_FOLDS, repeats: int = CV_REPEATS, seed: int = CV_SEED) -> dict:
    """Held-out per-part precision and recall: `repeats` rounds of k-fold cross-validation,
    stratified by part and kind, seeded; in each fold both models are fitted on the other k-1
    folds only and the held-out fold is scored with them. Figures are pooled over all rounds."""
    import numpy as np

    from andrea.shape import _folds

    items = labelled_set() if items is None else items
    X, y = _design(items)
    kinds = [it.kind for it in items]
    truth = [it.part for it in items]
    preds: list[str] = []
    missed: dict[int, int] = {}
    for r in range(repeats):
        fold = _folds(y, kinds, k, seed + r)
        pred = [""] * len(items)
        for f in range(k):
            model = _fit_design(X[fold != f], y[fold != f])
            for i in np.nonzero(fold == f)[0]:
                pred[i] = _decide(list(X[i]), model)
        preds += pred
        for i, p in enumerate(pred):
            if p != truth[i]:
                missed[i] = missed.get(i, 0) + 1
    wrong = [{"kind": items[i].kind, "label": truth[i], "rounds_missed": n, "user": items[i].user[:120]}
             for i, n in sorted(missed.items(), key=lambda kv: -kv[1])]
    return {"method": f"{repeats} x {k}-fold stratified cross-validation (seed {seed})", "n": len(items),
            **_per_part(preds, truth * repeats), "misclassified": wrong}


def _figures(result: dict) -> dict:
    return {p: {"precision": result[p]["precision"], "recall": result[p]["recall"]} for p in HERMES3_PARTS}


@lru_cache(maxsize=1)
def quality() -> dict:
    """What the manifest reports about the rule: the labelled set, and per-part precision and recall
    in-sample and cross-validated (stored beside the weights; recomputed when the set has changed)."""
    from andrea import hermes3_parts_weights as pw

    if pw.LABELLED_SET_SHA256 == labelled_set_digest():
        in_sample, held_out, method = pw.IN_SAMPLE, pw.CROSS_VALIDATED, pw.CV_METHOD
    else:
        in_sample, cv = _figures(evaluate()), cross_validate()
        held_out, method = _figures(cv), cv["method"]
    return {
        "rule": "andrea/hermes3_parts.py: roleplay if P(roleplay) >= 0.5, else creative if P(creative) >= 0.5, else general",
        "labelled_set": {"path": "andrea/labelled/hermes3_parts_set.txt", "n": len(labelled_set()),
                         "sha256": labelled_set_digest()},
        "in_sample": in_sample,
        "cross_validated": {"method": method, **held_out},
    }


def weights_module(model: dict, in_sample: dict, cv: dict, digest: str) -> str:
    """Python source of andrea/hermes3_parts_weights.py."""
    def rows(ws):
        return "\n".join(f"    {w!r},  # {n}" for n, w in zip(FEATURES, ws))

    names = "\n".join(f"    {n!r}," for n in FEATURES)
    return (
        '"""Weights of the Hermes-3 part rule (andrea/hermes3_parts.py): two L2-regularised logistic\n'
        "regressions over hermes3_parts.FEATURES, fitted on andrea/labelled/hermes3_parts_set.txt by\n"
        '`python -m andrea.hermes3_parts fit`, which rewrites this file. Do not edit by hand."""\n\n'
        f"FEATURES = (\n{names}\n)\n"
        f"ROLEPLAY_WEIGHTS = (\n{rows(model['roleplay'][0])}\n)\nROLEPLAY_INTERCEPT = {model['roleplay'][1]!r}\n"
        f"CREATIVE_WEIGHTS = (\n{rows(model['creative'][0])}\n)\nCREATIVE_INTERCEPT = {model['creative'][1]!r}\n\n"
        "# The set these were fitted on, and per-part precision and recall on it\n"
        f"LABELLED_SET_SHA256 = {digest!r}\n"
        f"IN_SAMPLE = {pprint.pformat(_figures(in_sample), width=110, sort_dicts=False)}\n"
        f"CV_METHOD = {cv['method']!r}\n"
        f"CROSS_VALIDATED = {pprint.pformat(_figures(cv), width=110, sort_dicts=False)}\n"
    )


def write_weights(path: str | Path | None = None) -> Path:
    """Fit on the labelled set, measure, and write andrea/hermes3_parts_weights.py (or `path`) atomically."""
    from andrea.io import write_text_atomic

    model = fit()
    cv = cross_validate()
    p = Path(path) if path else Path(__file__).with_name("hermes3_parts_weights.py")
    # in-sample figures of the new weights: score the set with them before they are shipped
    items = labelled_set()
    pred = [_decide(features(it.system, it.user), model) for it in items]
    in_sample = _per_part(pred, [it.part for it in items])
    write_text_atomic(p, weights_module(model, in_sample, cv, labelled_set_digest()))
    if path is None:
        import importlib

        from andrea import hermes3_parts_weights

        importlib.reload(hermes3_parts_weights)
        _model.cache_clear()
        quality.cache_clear()
    return p


def main(argv: list[str] | None = None) -> int:
    """python -m andrea.hermes3_parts eval | fit | explain SYSTEM USER"""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["fit"]:
        print(f"wrote {write_weights()}")
        args = ["eval"]
    if args[:1] == ["eval"]:
        ins, cv = evaluate(), cross_validate()
        for name, res in (("in-sample", ins), (f"held out ({cv['method']})", cv)):
            print(name)
            for p in HERMES3_PARTS:
                print(f"  {p:17s} precision {res[p]['precision']:.3f}  recall {res[p]['recall']:.3f}")
        print(json.dumps(cv["misclassified"], indent=1))
        return 0
    if args[:1] == ["explain"] and len(args) == 3:
        print(json.dumps(explain(args[1], args[2]), indent=2))
        return 0
    print(main.__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
