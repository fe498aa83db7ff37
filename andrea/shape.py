"""has_system_prompt_shape(): recognise the *shape* of a system prompt (SPEC §7).

A system prompt is text that configures a conversational agent. It has a recognisable structure,
whatever its words: it declares an identity or role for the reader ("You are …", "Act as …",
"Your task is …"), it talks about the conversation itself (the user, the assistant, responses,
replies, characters, formats), and it is dense with directives addressed to the reader (must,
never, always, only, imperatives), often as a rule list. Ordinary text has some of these
(recipes are imperative, letters say "you", software docs mention "the user"), but not the
combination. So the score is built in two tiers:

* **agent evidence** — what only text addressed to a responding agent has: a role/identity
  declaration, references to the conversation's machinery (the user as someone to serve, the
  assistant, AI, replies, persona, character), response-format rules, conditional rules on what
  the user says, chat-template markers;
* **directive evidence** — directive density, second-person density, rule lists.

Directive evidence only counts in proportion to agent evidence (a recipe is all directives and
no agent, so it scores 0). The points map to a score in [0, 1); 0.5 is the decision threshold.
No word list decides alone: every feature is a pattern of structure (who is addressed, what is
asked of them, where in the text it stands), and the weights were set on the labelled set in
`andrea/labelled/shape_set.txt` (see tests/test_shape.py for precision and recall).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path

HALF_POINTS = 3.0  # points at which the score is 0.5

_F = re.IGNORECASE | re.MULTILINE  # patterns that need the original case (names)
_L = re.MULTILINE  # patterns matched against the lowercased text: much faster than IGNORECASE

# Roles an agent is given: conversation, service and expertise roles.
_ROLE_NOUNS = (
    r"assistant|ai|bot|chatbot|model|language model|agent|expert|specialist|tutor|teacher|coach|"
    r"mentor|guide|narrator|game ?master|dungeon master|character|persona|advisor|adviser|consultant|"
    r"writer|translator|editor|reviewer|critic|analyst|engineer|developer|programmer|scientist|"
    r"doctor|therapist|counsel+or|companion|storyteller|interviewer|representative|librarian|"
    r"interpreter|terminal|calculator|engine|classifier|concierge|receptionist|detective|"
    r"mathematician|accountant|lawyer|nutritionist|dermatologist|moderator|mediator"
)
# IDENTITY and CONVERSE_IMPERATIVE are matched only where a sentence (or a line, or a "Label:")
# starts: see sentence_starts().
_START = r"\W*"
BOUNDARY = re.compile(r"[.!?:>\]\n]\s*")

# Strong identity / role declarations addressed to the reader.
IDENTITY = re.compile(
    _START + r"(?:"
    r"you(?:'re| are)(?: now| currently| going to be| to be| no longer)?\s+(?:a|an|the|my|our)?\s*"
    r"(?:[\w'-]+[ ,]+){0,6}?(?:" + _ROLE_NOUNS + r")s?\b"
    r"|you(?:'re| are) (?:now )?(?:\w+ )?(?:named|called) (?-i:[A-Z])"
    r"|you(?:'re| are) (?:(?-i:[A-Z])[\w.-]*\s?){1,3}(?:,|\.\s|\s(?:an?|the)\b)"
    r"|ur an? "
    r"|(?:please )?(?:act|behave|respond|serve|function|speak|answer|write|reply|talk)(?: only)? (?:as|like) (?:a|an|the|if|my|though|\w+ would|(?-i:[A-Z]))\b"
    r"|i want you to (?:act|be|play|pretend|respond|behave|take|serve|roleplay)"
    r"|pretend (?:to be|you are|you're|that you are)"
    r"|imagine (?:you are|you're|that you are) (?:a|an|the)?\s*(?:[\w'-]+ ){0,4}?(?:" + _ROLE_NOUNS + r")s?\b"
    r"|think of yourself as"
    r"|(?:play|take on|assume|adopt|embody) (?:the )?(?:role|persona|character|part|identity|spirit)"
    r"|role-?play as"
    r"|from now on,? you"
    r"|in this (?:chat|conversation),? you"
    r"|you(?:'ll| will)(?: now)? (?:be )?(?:act|acting|play|playing|serve|serving) (?:as|the)\b"
    r"|you are to (?:act|behave|be|play|respond)"
    r"|(?:your|the assistant's|the ai's) (?:name|character|persona) is\b"
    r"|you have been (?:designed|created|trained|programmed|built|deployed)"
    r"|you (?:were|are) (?:created|developed|designed|built|trained|deployed|being used)"
    r"|you are (?:an? )?(?:helpful|harmless|honest|friendly|sarcastic|upbeat|witty)\b(?:[\w ,]+)(?:assistant|ai|bot)"
    r"|you are (?:now )?in \w+ mode"
    r"|as an ai\b|as a responsible ai|introduce yourself as|you, the (?:assistant|ai|bot|model)\b"
    r"|\{\{char\}\} (?:is|will)"
    r"|(?:this is|the following is|below is) (?:a conversation|an instruction|a dialogue|a chat)"
    r")",
    _F,
)

# Weaker declarations: a task or role is assigned, but people are given tasks too.
ROLE_ASSIGNMENT = re.compile(
    r"\b(?:"
    r"(?:your|the assistant's|the ai's) (?:role|task|job|goal|purpose|mission|objective|function|new instructions) (?:is|are)\b"
    r"|you(?:'ll| will)(?: now)? (?:be )?(?:respond|answer|assist|reply|act)\w*\b"
    r"|the (?:assistant|ai|model|bot) (?:is|should|must|will|always|never)\b"
    r"|you have access to (?:the following )?tools"
    r")",
    _L,
)

# Sentences that open by telling an agent how to converse.
CONVERSE_IMPERATIVE = re.compile(
    _START + r"(?:please |only |always )?(?:answer|respond|reply|speak|talk|greet|introduce yourself|"
    r"be (?:concise|brief|polite|friendly|helpful|honest|warm|fun|a supportive)|ask (?:the user|me|them|one|clarifying)|"
    r"help the user|cite|explain your|use (?:markdown|simple words|short sentences)|keep (?:your|each|every|it short))\b",
    _L,
)

# References to the machinery of a conversation with an agent.
AGENT_META = re.compile(
    r"\b(?:"
    r"(?:help|assist|answer|respond to|reply to|ask|greet|guide|serve|support|tell|remind|cheer|warn) (?:the )?users?\b"
    r"|(?:the )?user(?:'s)? (?:asks?|says?|requests?|wants?|writes?|types?|shares?|provides?|gives?|insists?|greets?|mentions?|claims?|questions?|query|queries|messages?|input|prompts?|request)\b"
    r"|user-provided|the user will|the user is|the users? (?:are|may|should|will|only)|the user's \w+"
    r"|ai (?:assistant|model|language model)|language model|chatbot|virtual (?:assistant|concierge)|\bai\b"
    r"|your (?:\w+ )?(?:responses?|answers?|replies|reply|output|messages?|tone|instructions|guidelines|system prompt)"
    r"|(?:by|from|to|for|with) the user\b"
    r"|(?:respond|reply|answer)(?:ing)? (?:only|in|with|as|to every|to each|to everything)\b"
    r"|in character|break(?:ing)? character|stay in character|persona|role-?play"
    r"|system prompt|these instructions|previous instructions|your instructions|new instructions"
    r"|\{\{user\}\}|\{\{char\}\}|the (?:player|person you're talking|person you are talking)"
    r"|this (?:chat|conversation)|the conversation|in every conversation|throughout the conversation"
    r")",
    _L,
)

# Rules about how to respond (format, language, length, scope, secrecy).
FORMAT_RULE = re.compile(
    r"\b(?:"
    r"(?:respond|reply|answer|write)(?: only)? (?:in|with|using) (?:valid )?(?:json|markdown|spanish|french|german|english|lowercase|the same language|one|a single|bullet|numbered|emojis|three|two|plain)"
    r"|(?:keep|limit) (?:your |each |every |all )?(?:responses?|answers?|replies|reply|messages?|it)(?: short| brief| concise| under| to| below| friendly)"
    r"|(?:responses?|answers?|replies) (?:should|must) (?:be|only|not|read)"
    r"|(?:only|just) (?:reply|respond|answer) (?:with|in)"
    r"|never (?:reveal|mention|admit|break|disclose|say that you|pretend)"
    r"|do not (?:reveal|mention|disclose|break character|add (?:notes|warnings|any)|include any text|write explanations|use emojis|use bullet)"
    r"|(?:don't|do not|never) (?:talk|discuss)"
    r"|(?:say|tell the user) (?:that )?you (?:can only|cannot|don't know)"
    r"|under no circumstances|nothing else|no explanation|and nothing else"
    r"|wait for (?:the player's|the user's|my|their) (?:answer|command|reply|response)"
    r"|(?:at the end of|in) (?:every|each) (?:response|reply|answer|message)"
    r"|every (?:response|answer|reply|message) (?:you give )?(?:must|should)"
    r"|out of scope|preferred response|output format|input:|output:"
    r"|(?:return|output|format|give) (?:\w+ ){0,3}as (?:an? )?(?:json|markdown|yaml|csv|table|numbered list|bulleted list)"
    r")",
    _L,
)

# Conditional rules triggered by what the other party says.
CONDITIONAL = re.compile(
    r"\b(?:if|when|whenever)\s+(?:the\s+)?(?:users?|someone|a user|they|the customer|the player|the person|the student|asked|the question|a question|i ask|the context)\b"
    r"(?:\W+\w+){0,3}?\W+(?:asks?|says?|requests?|wants?|writes?|types?|insists?|greets?|mentions?|claims?|shares?|seems?|is unclear|does not contain|about)\b",
    _L,
)

TEMPLATE = re.compile(
    r"<\|im_start\|>\s*system|<<\s*sys\s*>>|\[inst\]|^###\s*(?:instruction|system|response)\b|"
    r"^\s*system\s*:|^\s*<system>|^\s*##\s*(?:role|instructions|persona|output format)\b|"
    r"\bsystem prompt\s*:|\bnote to the ai\b|\binstructions for the (?:model|ai|assistant)\b|"
    r"\b(?:behaviou?r|identity|scope|persona)\s*:",
    _L,
)

DIRECTIVE = re.compile(
    r"\b(?:must(?: not)?|never|always|should(?: not)?|do not|don't|avoid|make sure|ensure|refrain|"
    r"only|at all times|strictly|are not allowed|may not|cannot|can't|refuse|decline|remember)\b",
    _L,
)
YOU_DIRECTIVE = re.compile(r"\byou(?:'ll)? (?:must|should|will|never|always|may not|cannot|can't|are not allowed|shall)\b", _L)
SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|you're|you'll|ur)\b", _L)
FIRST_PERSON = re.compile(r"\b(?:i|me|my|mine|i'm|i've|we|our)\b", _L)
WORD = re.compile(r"[^\W\d_]+(?:'[^\W\d_]+)?", re.UNICODE)
LIST_LINE = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+(.*)$", re.M)
QUOTED_SPAN = re.compile(r"\"[^\"\n]*\"?|“[^”]*”?|«[^»]*»?|^\s*[—–]\s.*$", re.M)
# A pattern can only match when one of these substrings is present; checking them first (C-speed
# `in`) skips most ordinary text. Keep them in step with the patterns above.
TEMPLATE_KEYS = ("<|im_start|>", "<<", "[inst]", "##", "system", "note to the ai", "instructions for the", "behavio", "identity", "scope", "persona", "<system>")
AGENT_META_KEYS = (
    "user", " ai", "ai ", "language model", "chatbot", "virtual", "your ", "respond", "reply", "answer", "character",
    "persona", "role", "prompt", "instructions", "{{", "player", "person you", "chat", "conversation",
)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass
class ShapeScore:
    score: float
    points: float
    features: dict = field(default_factory=dict)

    @property
    def is_system_prompt(self) -> bool:
        return self.score >= 0.5


def _at_starts(pattern: re.Pattern, text: str) -> list[re.Match]:
    """Matches of `pattern` anchored at the text's start and after each sentence boundary."""
    out = []
    for p in (0, *(m.end() for m in BOUNDARY.finditer(text))):
        m = pattern.match(text, p)
        if m:
            out.append(m)
    return out


def shape_score(text: str) -> ShapeScore:
    """Score how much `text` has the shape of a system prompt, with the features that counted."""
    if not text or not text.strip():
        return ShapeScore(0.0, 0.0, {})
    t = text.strip()
    low = t.lower()
    spans = [m.span() for m in QUOTED_SPAN.finditer(t)]
    quoted = bool(spans)

    def unquoted(matches):
        # Lines inside quotation marks belong to characters in a story, not to the text's reader.
        return [m for m in matches if not any(a <= m.start() < b for a, b in spans)]

    ident = unquoted(_at_starts(IDENTITY, t))
    roles = unquoted(ROLE_ASSIGNMENT.finditer(low))
    converse = unquoted(_at_starts(CONVERSE_IMPERATIVE, low))
    ident_at_start = any(m.start() <= 20 for m in ident)
    meta = len(AGENT_META.findall(low)) if any(k in low for k in AGENT_META_KEYS) else 0
    fmt = len(FORMAT_RULE.findall(low))
    cond = len(CONDITIONAL.findall(low))
    template = bool(TEMPLATE.search(low)) if any(k in low for k in TEMPLATE_KEYS) else False

    agent = 0.0
    agent += 3.0 if ident_at_start else 0.0
    agent += min(2, len(ident) - (1 if ident_at_start else 0)) * 1.5
    agent += min(2, len(roles)) * 1.2
    agent += min(1.6, 0.8 * len(converse))
    agent += min(2.5, 0.8 * meta)
    agent += min(2.0, 1.0 * fmt)
    agent += min(2.0, 1.0 * cond)
    agent += 3.0 if template else 0.0
    feats = {
        "identity": len(ident),
        "identity_at_start": ident_at_start,
        "role_assignments": len(roles),
        "converse_imperatives": len(converse),
        "agent_meta": meta,
        "format_rules": fmt,
        "conditional_rules": cond,
        "template": template,
        "quoted": quoted,
        "agent_points": round(agent, 2),
    }
    if agent == 0.0:
        # No sign of an agent being addressed: directive evidence cannot count (see above).
        return ShapeScore(0.0, 0.0, feats)

    words = WORD.findall(t)
    n_words = max(1, len(words))
    sentences = [s for s in SENTENCE_END.split(t) if s.strip()]
    n_sent = max(1, len(sentences))
    questions = sum(s.rstrip().endswith("?") for s in sentences)

    directives = len(DIRECTIVE.findall(low))
    you_dir = len(YOU_DIRECTIVE.findall(low))
    second = len(SECOND_PERSON.findall(low)) / n_words
    first = len(FIRST_PERSON.findall(low)) / n_words
    list_rules = sum(bool(DIRECTIVE.search(m.group(1))) for m in LIST_LINE.finditer(t))

    support = 0.0
    support += min(1.6, 0.4 * directives * min(1.0, 3.0 / n_sent) if n_sent > 3 else 0.4 * directives)
    support += min(1.0, 0.5 * you_dir)
    support += 1.0 if list_rules >= 2 else 0.0
    support += 1.0 if second >= 0.08 else 0.5 if second >= 0.04 else 0.0
    # Text that is mostly questions, or written from the first person, is someone talking, not
    # someone configuring an agent.
    penalty = 1.0 * (questions / n_sent) + (1.0 if first > 0.08 and not ident else 0.0)

    points = agent + support * min(1.0, agent / 2.0) - penalty
    points = max(0.0, points)
    score = points / (points + HALF_POINTS)
    feats.update(
        {
            "directives": directives,
            "you_directives": you_dir,
            "rule_list_lines": list_rules,
            "second_person_rate": round(second, 3),
            "questions": questions,
            "support_points": round(support, 2),
        }
    )
    return ShapeScore(round(score, 4), round(points, 3), feats)


def has_system_prompt_shape(text: str, threshold: float = 0.5) -> bool:
    """True when `text` has the shape of a system prompt (score ≥ threshold)."""
    return shape_score(text).score >= threshold


@dataclass
class Labelled:
    text: str
    label: bool
    kind: str


@lru_cache(maxsize=1)
def labelled_set(path: str | None = None) -> tuple[Labelled, ...]:
    """The labelled evaluation set shipped with the package."""
    p = Path(path) if path else Path(str(resources.files("andrea") / "labelled" / "shape_set.txt"))
    items: list[Labelled] = []
    header = None
    body: list[str] = []

    def flush() -> None:
        if header is not None:
            items.append(Labelled("\n".join(body).strip(), header[0], header[1]))

    for line in p.read_text(encoding="utf-8").splitlines():
        if line.startswith("%%% "):
            flush()
            label, _, kind = line[4:].partition("|")
            label = label.strip()
            if label not in ("positive", "negative"):
                raise ValueError(f"{p}: bad header {line!r} (want '%%% positive|negative | kind')")
            header, body = (label == "positive", kind.strip()), []
        elif header is not None:
            body.append(line)
    flush()
    return tuple(items)


def evaluate(threshold: float = 0.5, items=None) -> dict:
    """Precision, recall and the misclassified examples on the labelled set."""
    items = labelled_set() if items is None else items
    tp = fp = fn = tn = 0
    wrong = []
    for it in items:
        pred = shape_score(it.text).score >= threshold
        if pred and it.label:
            tp += 1
        elif pred:
            fp += 1
            wrong.append({"kind": it.kind, "label": "negative", "text": it.text[:160]})
        elif it.label:
            fn += 1
            wrong.append({"kind": it.kind, "label": "positive", "text": it.text[:160]})
        else:
            tn += 1
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return {
        "n": len(items),
        "positives": tp + fn,
        "negatives": tn + fp,
        "precision": round(precision, 4),
        "recall": round(recall, 4),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "misclassified": wrong,
    }
