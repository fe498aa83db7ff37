"""has_system_prompt_shape(): recognise the *shape* of a system prompt (design §7).

A system prompt configures a conversational agent. Whatever its words, it has a recognisable
structure: it declares who the reader is ("You are …", "Act as …", "Role: …", "The assistant is
…", "Your job is …"), it refers to the machinery of a conversation (the user, the replies and
their format, messages arriving, the chat itself), and it is dense with directives addressed to
the reader (imperatives, must/never/always, rule lists). Ordinary text has some of these (recipes
are imperative, letters say "you", software docs mention "the user"), rarely the combination.

So `features()` measures structure — which grammatical shapes occur, where (a declaration counts
where a sentence, line or "Label:" value starts), how densely — and a logistic regression over
those features decides. No feature is a phrase to ban: each is a grammatical pattern (a
second-person copula with a noun phrase, an imperative verb with its object, a "Label: value"
field whose label names part of a configuration, a modal addressed to "you", a third-person
subject "the assistant/AI/model" with a present-tense verb, the other party as the object of what
the reader does …), a rate (second person, narrative past, questions …) or a conjunction of
those. Small closed word classes (determiners, modals, common imperative verbs, the nouns that
name the parts of a conversation) make up the patterns; no single word or phrase decides.

The weights and the decision threshold are fitted on the labelled set
(`andrea/labelled/shape_set.txt`, whose header says how borderline texts are labelled) by `fit()`
and shipped in `andrea/shape_weights.py`; `andrea shape fit` refits them. Because they are fitted
on that set, `evaluate()` on it is in-sample; `cross_validate()` is the honest measure: weights and
threshold are fitted on the training folds only and scored on the held-out fold.

The score is the fitted probability re-centred on the fitted threshold, so that 0.5 is the fitted
decision point whatever the threshold came out as: score = sigmoid(logit(p) - logit(threshold)).

Speed matters (the filter scores every user and assistant turn of ~600K conversations): scoring
needs no NumPy, sentence-initial patterns are tried only where sentences start, and a pattern is
skipped when none of the words it needs occurs in the text.
"""

from __future__ import annotations

import hashlib
import math
import pprint
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from itertools import repeat
from operator import mul
from pathlib import Path

from andrea.tokenizer import trie_pattern

# ---------------------------------------------------------------------------------------------
# Grammar shapes. Patterns run on the text with quoted spans blanked out (lines inside quotation
# marks belong to characters in a story, not to the text's reader) and lowercased (much faster
# than IGNORECASE), except the few that need capitals (names).

def _trie(words) -> str:
    """Regex source matching exactly the given literal words, factored by their common prefixes
    (Python's re tries alternatives one by one; a factored alternation is several times faster):
    the tokenizer's trie pattern, which prefers the longest word where one is a prefix of another."""
    return trie_pattern(list(words))


# Sentence-initial shapes are matched only where a sentence, a line, a list item or a "Label:"
# value starts (after any of . ! ? ; : or a newline): features() finds those places once and
# tries the patterns there with .match(). A start may carry list markers and a fronted clause
# ("When the user greets you, introduce yourself …").
_START = re.compile(r"[.!?;:\n]")
_FRONT_WORDS = (
    "if", "when", "whenever", "once", "before", "after", "unless", "for", "in", "at", "while", "during", "whatever", "each time",
    "every time", "as soon as",
)
# One marker character per repetition: `[-*•>#]+` inside the `*` could split a run of dashes (an
# underline, a rule) in exponentially many ways before failing, and hung the filter on such a line.
_MARKERS = r"[ \t]*(?:[-*•>#][ \t]*|\d+[.)][ \t]*)*"
_S = _MARKERS + r"(?:(?:" + _trie(_FRONT_WORDS) + r") [^.!?;:\n,]{1,80}, )?"
# Adverbs and greetings that may come before an imperative or a declaration.
_PRE_WORDS = (
    "please", "always", "never", "only", "just", "then", "first", "also", "now", "and", "so", "finally", "simply", "kindly", "remember",
    "ok", "okay", "hi", "hello", "hey",
)
_PRE = r"(?:(?:" + _trie(_PRE_WORDS) + r"),?[ \t]+)*"
_DET = r"(?:a|an|the|my|our|your|this|that|one|some)"
_MODALS = r"never|always|only|also|usually|often|don't|do not|can|cannot|can't|may|will|'ll|should|must|shall|won't"

# Closed word classes. Verbs of communication (what a responding agent does: answer, explain,
# greet …) against other base-form verbs common in directives (what anyone may be told to do).
_SPEECH_VERB_WORDS = (
    'answer', 'reply', 'respond', 'explain', 'tell', 'ask', 'greet', 'suggest', 'recommend', 'describe', 'chat', 'talk',
    'speak', 'say', 'quiz', 'correct', 'advise', 'clarify', 'summarise', 'summarize', 'translate', 'rewrite', 'introduce', 'narrate',
    'comment', 'cite', 'quote', 'apologise', 'apologize', 'acknowledge', 'reassure', 'encourage', 'praise', 'remind', 'warn', 'refuse',
    'decline', 'redirect', 'mention', 'list', 'rate', 'label', 'classify', 'output', 'return', 'format', 'write', 'propose',
    'present', 'offer', 'guide', 'help', 'assist', 'reflect', 'listen', 'confirm', 'flag', 'point out', 'check',
)
_OTHER_VERB_WORDS = (
    'act', 'add', 'address', 'adopt', 'allow', 'apply', 'assume', 'avoid', 'begin', 'behave', 'bring', 'build',
    'call', 'choose', 'close', 'collect', 'compare', 'consider', 'continue', 'convert', 'create', 'decide', 'define', 'detect',
    'determine', 'draft', 'emit', 'end', 'ensure', 'escalate', 'estimate', 'evaluate', 'extract', 'find', 'finish', 'fix',
    'focus', 'follow', 'gather', 'generate', 'give', 'handle', 'identify', 'ignore', 'include', 'keep', 'limit', 'make',
    'mark', 'match', 'name', 'note', 'pay', 'point', 'produce', 'provide', 'put', 'read', 'refer', 'report',
    'review', 'send', 'share', 'show', 'sign', 'start', 'stay', 'stick', 'take', 'teach', 'think', 'track',
    'treat', 'try', 'turn', 'use', 'verify', 'wait', 'walk', 'adapt', 'adjust', 'aim', 'assess', 'break',
    'calculate', 'cheer', 'clean', 'combine', 'complete', 'copy', 'cut', 'deal', 'delete', 'deliver', 'design', 'double',
    'edit', 'emphasise', 'engage', 'enter', 'expand', 'fill', 'go', 'grade', 'highlight', 'improve', 'insist', 'interpret',
    'judge', 'lead', 'let', 'link', 'log', 'look', 'maintain', 'mirror', 'move', 'notice', 'open', 'organise',
    'organize', 'pause', 'persuade', 'pick', 'plan', 'prefer', 'prepare', 'prioritise', 'protect', 'raise', 'recall', 'recap',
    'record', 'reject', 'remember', 'remove', 'repeat', 'replace', 'request', 'resolve', 'reveal', 'revise', 'save', 'search',
    'select', 'set', 'simplify', 'skip', 'solve', 'sort', 'spell', 'stop', 'structure', 'switch', 'tailor', 'test',
    'trace', 'update', 'validate', 'watch', 'weave', 'welcome', 'wrap',
)
_CLOSED_WORDS = (
    'i', 'you', 'he', 'she', 'it', 'we', 'they', 'me', 'him', 'her', 'us', 'them', 'this', 'that',
    'these', 'those', 'there', 'here', 'the', 'a', 'an', 'my', 'your', 'our', 'their', 'his', 'its', 'some',
    'any', 'each', 'every', 'all', 'no', 'most', 'many', 'few', 'both', 'is', 'are', 'was', 'were', 'am',
    'do', 'does', 'did', 'has', 'have', 'had', 'can', 'could', 'will', 'would', 'should', 'must', 'may', 'might',
    'shall', 'what', 'who', 'when', 'where', 'why', 'how', 'which', 'whether', 'if', 'unless', 'and', 'but', 'or',
    'so', 'because', 'as', 'in', 'on', 'at', 'for', 'with', 'from', 'to', 'of', 'by', 'after', 'before',
    'while', 'since', 'until', 'about', 'into', 'over', 'under', 'yes', 'not', 'thank', 'thanks', 'hi', 'hello', 'dear',
    'ok', 'well', 'oh', 'once', 'one',
)
_OBJ_WORDS = (
    'the', 'a', 'an', 'your', 'my', 'their', 'them', 'it', 'me', 'him', 'her', 'us', 'one', 'each',
    'every', 'all', 'any', 'this', 'that', 'these', 'those', 'up', 'out', 'with', 'only', 'if', 'what', 'how',
    'whether', 'back', 'off', 'down', 'no', 'some', 'yourself', 'everything', 'anything', 'nothing',
)
_SPEECH_VERBS = _trie(_SPEECH_VERB_WORDS)
_VERBS = _trie(_SPEECH_VERB_WORDS + _OTHER_VERB_WORDS)
_OTHER_VERBS = _trie(_OTHER_VERB_WORDS)
_CLOSED = _trie(_CLOSED_WORDS)
_OBJ = _trie(_OBJ_WORDS)
_AGENT_NOUN = r"assistant|ai|bot|chatbot|model|language model|agent|system|gpt|llm|companion|npc|helper"
# The other party of a conversation, as a subject.
_PARTY = (
    r"(?:they|people|someone|anyone|folks|users|customers|guests|visitors|players|students|patients|clients|children|kids|members|"
    r"tenants|parents|employees|beginners|the person|the user|the customer|[a-z]++(?<=ers))"
)
_CONFIG_NOUN = (
    r"role|task|job|goal|purpose|mission|objective|function|duty|duties|responsibility|responsibilities|"
    r"assignment|aim|work|brief|voice|personality|persona|character|name|tone|style|identity|"
    r"instructions|guidelines|rules|scope|audience|output|format|constraints|behaviou?r|background|context|"
    r"policy|limits|boundaries|tools?|capabilities|specialty|speciality|expertise|profile|temperament"
)

# Declarations of who the reader is (sentence-initial).
# "You are a/the/my …", "You're now …", "ur a …": a second-person copula with a noun phrase.
YOU_ARE_NP = re.compile(
    _S + _PRE + r"(?:you(?:'re| are)(?: now| currently| no longer| going to be| to be| hereby| also)?[ \t]+" + _DET + r"\b|ur an?\b)"
)
# "You are now in …", "You're connected to …", "You are talking to …", "You embody …", "You'll
# be acting as …", "You were created …": other second-person declarations of what the reader is.
YOU_ARE_OTHER = re.compile(
    _S + _PRE + r"(?:you(?:'re| are| will be|'ll be| will|'ll)?(?: now| currently| also| always| only)? (?:"
    r"in|on|inside|connected|deployed|running|working|talking|speaking|chatting|"
    r"helping|answering|acting|playing|guiding|being used|"
    r"going to (?:act|play|be|help|answer)|to (?:act|behave|be|play|respond|answer|"
    r"help|stay)|designed|built|created|trained|programmed|configured|"
    r"embody|play|portray|impersonate|represent|operate|act|serve|function|speak with|"
    r"have the (?:voice|temperament|personality|manner)|have access|take on|become)\b"
    r"|you (?:were|have been) (?:designed|built|created|trained|programmed|configured|deployed|made|set up)\b)"
)
# "Act as …", "Operate as …", "Respond in the manner of …", "Impersonate …", "Be my …",
# "Pretend to be …", "Imagine you are …": an imperative that assigns a role.
ROLE_IMPERATIVE = re.compile(
    _S + _PRE + r"(?:"
    r"(?:act|behave|serve|function|operate|work|pose|respond|answer|reply|speak|"
    r"write|talk|stay|remain|continue|carry on)(?: only| always)?"
    r"(?: as| like| in the (?:capacity|manner|role|voice|style|character|persona) of| in character as)\b"
    r"|(?:play|take on|assume|adopt|embody|impersonate|channel|become|portray|"
    r"roleplay|role-play|step into|take the part of|carry out the duties of)\b"
    r"|be (?:my|our|a|an|the)\b"
    r"|pretend(?: to be| you are| you're| that you)"
    r"|imagine (?:you are|you're|that you are|yourself as)"
    r"|think of yourself as|treat (?:every|each|all) (?:message|question|input)"
    r"|let's (?:roleplay|role-play|play)"
    r"|as (?:a|an) [^,.;:\n]{1,60}, you\b"  # "As an AI model specialised in law, you should …"
    r")"
)
# "The assistant is a …", "This AI helps …", "The model never …": a third-person subject naming
# an agent, with a role noun phrase or a present-tense/modal verb after it.
THIRD_PERSON_AGENT = re.compile(
    _S + r"(?:the|this|our|your|my)(?: (?:ai|virtual|digital|chat|voice|language))? (?:" + _AGENT_NOUN + r")(?:, (?![a-z]+ed\b)[\w ]+,)?"
    r" (?:is (?:a|an|the|called|named|\w+ly\b|\w+,)|(?:always|never|only|also|"
    r"should|must|will|can|may|does not|doesn't|was built|was designed|was created|"
    r"was made)\b"
    r"|(?:knows|acts|plays|speaks|helps|answers|replies|responds|gives|takes|"
    r"uses|belongs|refuses|writes|talks|tries|remembers|asks|explains|outputs|"
    r"avoids|redirects|declines|keeps|follows|runs|receives|has access|is given|"
    r"is deployed)\b)"
)
# Imperative openers: a base-form verb, or any other word followed by an object determiner,
# after optional adverbs; "do not …", "don't …", "be …". Speech imperatives are counted apart.
SPEECH_IMPERATIVE = re.compile(_S + _PRE + r"(?:" + _SPEECH_VERBS + r")\b")
IMPERATIVE = re.compile(
    _S + _PRE + r"(?:(?:" + _VERBS + r")\b|do not\b|don't\b|never \w|be \w+\b|(?!(?:" + _CLOSED + r")\b)[a-z]+ (?:" + _OBJ + r")\b)"
)
# The first word at a start decides which of the patterns above can match there at all (a pure
# shortcut: a start whose first word opens none of them is skipped).
_FIRST_WORD = re.compile(_MARKERS + r"([a-z][\w']*)")
_LEAD_WORDS = frozenset(w.split()[0] for w in _PRE_WORDS + _FRONT_WORDS)
_YOU_OPENERS = frozenset(("you", "you're", "you'll", "ur"))
_ROLE_OPENERS = frozenset((
    "act", "behave", "serve", "function", "operate", "work", "pose", "respond", "answer", "reply", "speak", "write", "talk",
    "stay", "remain", "continue", "carry", "play", "take", "assume", "adopt", "embody", "impersonate", "channel", "become",
    "portray", "roleplay", "role", "step", "be", "pretend", "imagine", "think", "treat", "let's", "as",
))
_THIRD_OPENERS = frozenset(("the", "this", "our", "your", "my"))
_CLOSED_SET = frozenset(_CLOSED_WORDS) - {"do"}  # "do not …" is an imperative
# "You are Nova, …", "You're Dr. Lena Ortiz." — a copula with a name (on the original case).
YOU_ARE_NAME = re.compile(
    r"(?:^|(?<=[.!?;:\n]))" + _S
    + r"(?:[Yy]ou(?:'re| are)(?: now)?|[Yy]our name is) [A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,3}(?:,|\.| (?:an?|the|and|who)\b)",
    re.M,
)

# Patterns found anywhere. Each comes with the substrings one of which it cannot match without:
# checking those first (C-speed `in`) skips most patterns on most text.
# "… as Holmes would", "… as a helpful assistant would", "… as if you were a cat": a role given
# by comparison with a named or described character (on the original case; "as they would" is not one).
AS_WOULD = re.compile(
    r"\b[Aa]s (?:(?:a|an|the) (?:[\w.'-]+ ){0,3}|[A-Z][\w.'-]* (?:[A-Z][\w.'-]* )?)would\b|"
    r"\b[Aa]s (?:if|though) you were (?:a|an|the)\b"
)
# "I want you to act …", "I'd like you to be …": a user handing the reader a standing role.
WANT_YOU_TO = re.compile(
    r"\bi(?:'d| would)? (?:want|like|need) you to (?:act|be|play|pretend|take|"
    r"become|stay|respond|reply|answer|only|serve|work|behave|roleplay|imagine)\b"
)
# "Your job/task/role is …", "The assistant's purpose: …", "The character you play is …": a
# possessive subject naming a part of the reader's configuration, then a copula or colon.
POSSESSIVE_CONFIG = re.compile(
    r"\b(?:your|the assistant's|the ai's|the model's|the bot's|the agent's)(?: (?:one and only|"
    r"only|main|primary|sole|first|new|whole|core|overall|single))?"
    r" (?:" + _CONFIG_NOUN + r")(?: (?:here|now|today|in|for|during|throughout)(?: [\w-]+){0,3})?\s*(?:is|are|will be|includes?|[:=—–])"
    r"|\bthe (?:role|character|persona|part|job|task|voice) (?:that )?you (?:play|"
    r"take|have|are playing|will play|are given|will take)\b"
    r"|\b(?:the )?(?:job|task|work) (?:here|for you) is\b"
    r"|\b(?:tools|functions|actions|commands)(?: that)? (?:you (?:can|may) (?:use|"
    r"call)|you have|available to you)\b|\bavailable (?:tools|functions|actions)\b"
)
# "Role: …", "PERSONA", "Task — …", "role = …": a field whose label names a part of a configuration.
CONFIG_LABEL = re.compile(
    r"(?:^|(?<=[.;]) )[ \t]*(?:[-*•#]+[ \t]*)?(?:(?:your|the|assistant|assistant's|"
    r"agent|bot|ai|model|chatbot|response|reply|answer|output|house|ground|core|"
    r"important|general|additional|key|main|strict|basic) )?"
    r"(?:" + _CONFIG_NOUN + r"|do|don't|dos|don'ts|allowed topics|out of scope|escalate|speaker|listener|manner|length|language|occupation|attitude|vocabulary|catchphrase)s?"
    r"(?: \w+| of \w+| for (?:you|(?:this|the|all|your|every|each) \w+|\w+))?[ \t]*(?:[:=—–]|\(|$| -)",
    re.M,
)
# "Kai is a friendly assistant …", "Max, the assistant, …": a name given an agent's role (original case).
_AGENT_NOUN_NAMED = r"assistant|ai|bot|chatbot|language model|agent|gpt|companion|helper|guide"
NAMED_AGENT = re.compile(
    r"\b(?!(?:What|This|That|It|There|Here|Which|Who|The|A|An|He|She|They)\b)[A-Z][\w'-]+"
    r"(?:, the (?:" + _AGENT_NOUN_NAMED + r"),| is (?:a|an|the) (?:(?!between|of|for|with|from|to|in|on)[\w-]+,? ){0,3}(?:" + _AGENT_NOUN_NAMED + r")s?\b)"
)
# Frames that announce an exchange: "The following is a conversation with …", "Below is an
# instruction …", "Notes for the assistant:", chat-template markup.
FRAME_ANNOUNCE = re.compile(
    r"\b(?:this is|the following is|below is|here is|what follows is) (?:a|an) (?:\w+ ){0,2}(?:conversation|"
    r"dialogue|chat|instruction|transcript|exchange)\b"
    r"|\b(?:notes|instructions|guidelines|rules|context|directions) for (?:the|this|our) (?:" + _AGENT_NOUN + r")\b"
)
FRAME_MARKUP = re.compile(
    r"<\|[a-z_]+\|>|<<\s*/?sys\s*>>|\[/?(?:inst|system)\]|^#{2,3}\s*(?:instruction|"
    r"system|response|input|persona|role|task|rules|output format)\b"
    r"|^\s*system\s*:|</?system>|^system note\b|\{\{char\}\}",
    re.M,
)

# The conversation the reader takes part in.
# (counted from the words: "user", "users", "{{user}}" …, and "the person you're talking to")
_USER_WORDS = ("user", "users", "user's", "users'")
META_USER = re.compile(r"the (?:person|human) you(?:'re| are) (?:talking|speaking|chatting)")
JOB_TITLE_AGENT = re.compile(r"\b[A-Z][a-z]+ (?:Assistant|Agent|Model)s?\b")
# The other party as the object of what the reader does: "help the user", "remind them", "greet each guest".
SERVE_PARTY = re.compile(
    r"\b(?:help|helps|assist|guide|remind|tell|ask|greet|thank|encourage|support|"
    r"answer|serve|warn|direct|refer|invite|cheer|reassure|congratulate|quiz|"
    r"correct|praise|walk|talk)"
    r" (?:the |each |every |a |any )?(?:user|users|user's|customer|customers|"
    r"person|people|student|students|player|players|guest|guests|visitor|visitors|"
    r""
    r"caller|callers|learner|learners|patient|patients|client|clients|traveller|"
    r"travellers|child|children|kids|them|{{user}})\b"
)
# Messages as the object of what the reader does: "answer questions about …", "classify each incoming ticket".
HANDLE_MESSAGES = re.compile(
    r"\b(?:answer|answers|answering|respond to|responds to|reply to|replies to|"
    r"handle|read|review|classify|translate|summarise|summarize|rewrite|"
    r"correct|check|rate|label|grade|evaluate|detect|route|triage|moderate)"
    r" (?:the |each |every |any |all |their |incoming |new )*(?:user's |customer's |"
    r"person's |incoming |submitted |following )?"
    r"(?:question|questions|message|messages|request|requests|query|queries|input|"
    r"prompt|prompts|ticket|tickets|email|emails|claim|claims|draft|drafts|submission|"
    r"submissions)\b"
)
_AGENT_WORDS = tuple(w + s for w in ("assistant", "ai", "bot", "chatbot", "model", "agent", "gpt", "llm", "companion", "npc") for s in ("", "s"))
# "respond in JSON", "reply with one word": the verb addressed to the reader — opening a sentence
# or clause, or after "you" or a modal (REPLY_OPENERS, checked in reply_format()); not "cells
# respond as they would".
REPLY_FORMAT = re.compile(
    r"(?:reply|respond|answer|output|return|speak)(?: only| always)? (?:in|with|using|as) "
    r"(?!they\b|it\b|he\b|she\b|we\b|i\b)(?:a |an |the |one |valid |plain |exactly )?\w+"
)
REPLY_OPENERS = (
    ". ", ": ", "; ", ", ", "! ", "? ", "\n", "you ", "'ll ", "must ", "should ", "always ", "only ", "ever ", "never ", "just ",
    "please ", "and ", " to ",
)
META_REPLY = re.compile(
    r"\b(?:your|each of your|every one of your|all of your|all your) (?:\w+ )?(?:reply|"
    r"replies|response|responses|answer|answers|output|message|messages)\b"
    r"|\b(?:each|every) (?:reply|response|answer)\b|\ball (?:replies|responses|answers)\b"
    r"|\bkeep (?:it|them) (?:short|brief|under|to|below)\b|\bkeep (?:answers|"
    r"replies|responses|(?:each|every|all|your) \w+) (?:short|brief|simple|concise|"
    r"under|to|below|friendly|light|clear)\b"
    r"|\b(?:nothing else|nothing more|no explanations?|no commentary|no pleasantries|"
    r"no preamble|no prose|and nothing else)\b"
    r"|\b(?:under|at most|no more than|maximum of|max|fewer than|less than|up to|"
    r"exactly) \d+ (?:words|sentences|lines|characters|paragraphs|bullet points|"
    r"items)\b"
)
META_CONV = re.compile(
    r"\b(?:this|the|our|each|every|the whole) (?:conversation|chat|session|dialogue|exchange)\b"
    r"|\b(?:in|out of|break|breaking|stay in|stays in) (?:character|role)\b|\brole-?play|\bpersona\b"
    r"|\b(?:system prompt|these instructions|previous instructions|your instructions|"
    r"earlier instructions|your guidelines|this prompt)\b"
)
# "people ask you …", "customers message you …", "the user will paste …", "whatever I send …":
# someone else's messages arriving — the loop a responding agent lives in.
INCOMING_YOU = re.compile(
    r"\b" + _PARTY + r" (?:will |may |might |often |usually |can )?(?:ask|message|write to|come to|bring|tell|contact|talk to|chat with|radio)s? you\b"
    r"|\byou(?: are|'re|'ll be| will be) (?:given|sent|shown|asked|provided with|handed)\b"
)
INCOMING_PARTY = re.compile(
    r"\b" + _PARTY + r" (?:will |may |might |often |usually |can )?(?:ask|message|write|come|call|contact)s? (?:about|for|with|in)\b"
    r"|\b(?:the user|users|the customer|customers|the person|people|the player|"
    r"players|the student|students|the guest|guests|visitors|i) (?:will |may |"
    r"might |then |can )?(?:paste|pastes|type|types|send|sends|share|shares|describe|"
    r"describes|provide|provides|submit|submits|enter|enters|write|writes|ask|"
    r"asks|say|says|mention|mentions|greet|greets)\b"
    r"|\b(?:each|every|any|whatever|the) (?:\w+ )?(?:message|question|request|"
    r"input|text|word|claim|argument|draft|sentence|email|ticket|dish|meal|quantity|"
    r"expression|command)s? (?:you|the user|i|they|someone|the person|the customer) (?:receive|"
    r"receives|get|gets|send|sends|paste|pastes|type|types|describe|describes|"
    r"give|gives|ask|asks|write|writes|name|names|mention|mentions)\b"
    r"|\bwhatever (?:i|the user|they|the person|people|someone|anyone) (?:ask|"
    r"asks|say|says|write|writes|send|sends|type|types)\b"
)
# Conditional rules keyed on what the other party does: "If the user asks …", "When they greet you …".
CONDITIONAL = re.compile(
    r"\b(?:if|when|whenever|unless|once) (?:the |a |an )?(?:user|users|someone|"
    r"anyone|they|the person|customer|player|guest|student|learner|child|visitor|"
    r"caller|patron|trainee|i|asked|a question|the question|the request|you(?:'re|"
    r" are) (?:not sure|unsure|asked|uncertain|in doubt))"
    r"(?:\W+\w+){0,3}?\W+(?:ask|asks|asked|say|says|mention|mentions|request|"
    r"requests|want|wants|write|writes|type|types|send|sends|share|shares|seem|"
    r"seems|insist|insists|greet|greets|give|gives|provide|provides|paste|pastes|"
    r"describe|describes|claim|claims)\b"
)
# Scope that makes a rule standing rather than one-off.
STANDING = re.compile(
    r"\b(?:from now on|from here on|from this (?:point|message)|for the (?:rest|"
    r"remainder|duration) of|going forward|until i (?:say|type|tell)"
    r"|(?:for|in|during) (?:this|our|the whole|the entire|this whole|this entire) (?:session|"
    r"chat|conversation)\b(?! api)|throughout (?:the|this|our)|no matter what|"
    r"whatever (?:i|the user|they|the person|anyone) (?:ask|say|write|send)s?"
    r"|(?:in|to|for|at the end of|at the start of) (?:every|each|all(?: of)?(?: your)?) (?:reply|"
    r"replies|response|responses|answer|answers|message|messages|turn))\b"
)
REFUSAL = re.compile(
    r"\b(?:refuse|decline|politely decline|redirect|hand (?:off|over)|escalate|"
    r"never (?:reveal|mention|admit|disclose|break|share|say|tell|pretend|invent|promise|"
    r"guess|store|make up|give|ask|decide|use|sell)"
    r"|do not (?:reveal|mention|disclose|discuss|answer|add|include|write|give|"
    r"use|speculate|promise|lecture|translate|comment|greet)"
    r"|don't (?:reveal|mention|disclose|discuss|add|include|give|use|speculate|lecture))\b"
)

# Directives and who they address.
# Imperative clauses joined to another: "…, explain the pairing, and stay within the budget".
IMPERATIVE_CLAUSE = re.compile(r",(?: and| then| but| or)? (?:(?:" + _VERBS + r")|do not|don't|never) (?:" + _OBJ + r"|to|in|with|for|about|on|at)\b")
# "you answer …", "you never reveal …", "you haggle": the reader's behaviour in the present tense.
# (Patterns that begin with the literal "you" omit the leading \b: re then finds "you" by a fast
# literal search instead of trying every position; "bayou" is not worth the slowdown.)
YOU_SPEECH = re.compile(r"you(?: (?:" + _MODALS + r"))? (?:" + _SPEECH_VERBS + r")\b")
YOU_PRESENT = re.compile(
    r"you(?: (?:" + _MODALS + r"))? (?:" + _OTHER_VERBS + r"|know|like|love|hate|live|haggle|grumble|blush|adore|enjoy|dislike|care|believe|prefer)\b"
)
YOU_MODAL = re.compile(
    r"you(?:'ll|'re)? (?:must|should|will|shall|may|can|cannot|can't|need to|have to|are to|are not|do not|don't|never|always|only|won't)\b"
)
REQUEST_QUESTION = re.compile(r"\b(?:can|could|would|will) you\b[^.!?\n]*\?")
# Word classes counted from the text's words (a Counter, not a regex per class).
_MODAL_WORDS = ("must", "never", "always", "should", "only", "avoid", "ensure", "refrain", "strictly", "cannot", "can't", "shall", "don't")
_MODAL_PHRASES = ("do not", "make sure", "at all times", "are not allowed", "may not", "under no circumstances")
_SECOND_PERSON = ("you", "your", "yours", "yourself", "you're", "you'll", "you've", "ur")
_FIRST_PLURAL = ("we", "us", "our", "ours", "we're", "we've", "we'll")
_THIRD_PERSON = ("he", "she", "his", "him", "her", "hers", "they", "them", "their", "himself", "herself")
# Narrative past: past forms of common verbs, and "-ed" forms right after a subject pronoun.
_PAST_WORDS = (
    "was", "were", "had", "did", "said", "told", "went", "came", "saw", "thought", "felt", "knew", "took", "made", "got",
    "gave", "found", "left", "began", "stood", "sat", "ran", "fell", "heard",
)
PRONOUN_ED = re.compile(r"\b(?:he|she|they|i|we|it) [a-z]{2,}ed\b")
_SOCIAL_WORDS = ("thanks", "sorry", "dear", "congratulations", "cheers", "regards", "sincerely", "lol")
_SOCIAL_PHRASES = ("thank you", "best wishes", "love,")
QUESTION_OPEN = re.compile(
    r"\W*(?:can|could|would|will|do|does|did|is|are|was|were|what|how|why|who|when|where|which|should|may|have|has)\b[^.!?\n]*\?"
)
LIST_ITEM = re.compile(r"^[ \t]*(?:\d+[.)]|[-*•])[ \t]+(.*)$", re.M)
NUMBERED_MARKER = re.compile(r"^[ \t]*\d+[.)][ \t]", re.M)
FIELD_LINE = re.compile(r"^[ \t]*(?:[-*•][ \t]*)?([A-Za-z][\w' ]{0,24}?)[ \t]*[:=—–][ \t]+\S", re.M)
WORD = re.compile(r"\w+(?:'\w+)?")
NUMBER = re.compile(r"\d+")
# A line that runs on into the next ("…the hill,\nthe quiet…"): verse, not a list of rules.
ENJAMBMENT = re.compile(r"[,;]\n[ \t]*[a-z]")
# A group of people addressed by name at the start: "New volunteers:", "Hi team,", "Dear parents,".
HUMAN_VOCATIVE = re.compile(
    r"\W*(?:(?:dear|hi|hello|hey|attention|calling all|to all)[ ,]+)?(?:[\w-]+ ){0,2}"
    r"(?:team|all|everyone|everybody|parents|volunteers|scouts|students|residents|"
    r"neighbours|neighbors|staff|colleagues|folks|guys|"
    r"friends|members|players|kids|class|campers|recruits|employees|guests|tenants|"
    r"participants|runners|drivers|visitors)\b[ ]*[,:!]"
)
# A sentence ends at . ! ? or a line break; "done.\n" ends one sentence, not two.
SENTENCE_END = re.compile(r"[.!?]+(?:[ \t]*\n+|(?=\s|$))|\n+")
QUESTION_END = re.compile(r"\?(?=\s|$)")
EXCLAIM_END = re.compile(r"!(?=\s|$)")
SPEECH_TAG = re.compile(
    r"[\"”]\s*,?\s*(?:\w+ )?(?:said|asked|replied|shouted|whispered|cried|called|hissed|added|muttered|answered|told)\b"
    r"|\b(?:said|asked|replied|shouted|whispered|cried|hissed|added|muttered|"
    r"answered)[^.!?\"]{0,30}[,:.]\s*[\"“]|^[ \t]*[\"“—–]",
    re.M,
)
QUOTED_SPAN = re.compile(r"\"[^\"\n]*\"|“[^”]*”|«[^»]*»|^[ \t]*[—–][ \t].*$", re.M)
_FIRST_END = re.compile(r"[.!?;:]\s|\n")

# The features, in the order of the weight vector. Counts are capped (a long text earns nothing
# for repeating one shape) or taken per sentence or per word (length normalisation).
FEATURES = (
    # who the reader is
    "declaration_first",  # the first sentence declares the reader's identity, role or job
    "you_are_np",  # "you are a/the …"
    "you_are_name",  # "You are Nova, …"
    "you_are_other",  # "You are now in …", "You embody …", "You'll be acting as …"
    "role_imperative",  # "Act as …", "Operate in the capacity of …", "Be my …"
    "want_you_to",  # "I want you to act …"
    "possessive_config",  # "Your job is …", "The character you play is …"
    "config_labels",  # "Role:", "Persona:", "Task —"
    "third_person_agent",  # "The assistant is …", "This AI helps …"
    "named_agent",  # "Kai is a friendly assistant", "… as Holmes would"
    "frame",  # "The following is a conversation …", chat-template markup
    # the conversation it takes part in
    "meta_user",
    "serve_party",  # "help the user", "remind them", "greet each guest"
    "handle_messages",  # "answer questions about …", "classify each ticket"
    "meta_agent",
    "meta_reply",  # rules about the replies: "your answers", "respond in JSON", "nothing else"
    "meta_conversation",
    "incoming",  # "people ask you …", "the user will paste …"
    "conditional_rules",  # "if the user asks …"
    "standing_scope",  # "from now on", "in every reply"
    "speech_directive_density",  # "answer/explain/greet …" addressed to the reader, per sentence
    # directives
    "imperative_share",  # imperative sentences / sentences
    "modal_density",  # must/never/always … per sentence
    "you_modal_density",  # "you must/should/will …" per sentence
    "you_present_density",  # "you keep/use/haggle …" per sentence
    "refusal_rules",
    "rule_lines",  # list items that are directives
    # genre: who is writing to whom, and how
    "second_person_rate",
    "first_plural_rate",
    "third_person_rate",
    "past_narrative_rate",
    "question_share",
    "opens_with_question",
    "request_question",  # "can/could/would you …?"
    "exclaim_share",
    "social",  # thanks, sorry, dear, regards
    "human_vocative",  # "New volunteers: …", "Hi team, …"
    "enjambment",  # lines that run on into the next (verse)
    "dialogue_share",  # text inside quotation marks, when speech tags show it is dialogue
    "field_lines",  # "Label: value" lines
    "repeated_labels",  # a label used again (the speakers of a transcript)
    "number_rate",
    "log_words",
    # conjunctions (a linear model cannot form them): the whole shape, not one part of it
    "declared_and_directed",
    "declared_and_interacting",
    "directed_and_interacting",
    "declared_and_agent",  # "You are a sarcastic assistant."
)


def _first_sentence_end(low: str) -> int:
    """Where the first sentence ends; a "Label:" or a short greeting before it does not count as
    one ("System: You are …", "Hi! For this session be …")."""
    m = _FIRST_END.search(low)
    if m is None:
        return len(low)
    if low[m.start()] == ":" or m.start() < 12:
        m2 = _FIRST_END.search(low, m.end())
        return m2.start() + 1 if m2 else len(low)
    return m.start() + 1


def _any(keys, s: str) -> bool:
    for k in keys:
        if k in s:
            return True
    return False


def _has(counts: Counter, words: frozenset) -> bool:
    return not counts.keys().isdisjoint(words)  # C-speed set operation


def _total(counts: Counter, words: tuple) -> int:
    """How many of the text's words are in `words`."""
    return sum(map(counts.get, words, repeat(0)))


def _count(pattern: re.Pattern, s: str, counts: Counter, anchors) -> int:
    """Matches of `pattern` in `s`; 0 at once when none of its anchor words (words it cannot match
    without) is among the text's words."""
    return len(pattern.findall(s)) if _has(counts, anchors) else 0


# Anchor words of the patterns found anywhere (see _count). Keep them in step with the patterns.
_A_AGENT = frozenset((
    "assistant", "assistants", "ai", "bot", "bots", "chatbot", "chatbots", "model", "models", "language", "agent", "agents", "gpt",
    "llm", "llms", "companion", "companions", "npc", "npcs", "helper", "guide", "system",
))
_A_CONFIG = frozenset(
    w for n in _CONFIG_NOUN.replace("behaviou?r", "behaviour|behavior").replace("tools?", "tool|tools").split("|") for w in (n, n + "s")
) | frozenset((
    "functions", "actions", "commands", "available", "do", "don't", "dos", "don'ts", "topics", "scope", "escalate", "speaker", "listener",
    "manner", "length", "language", "occupation", "attitude", "vocabulary", "catchphrase", "part",
))
_A_REPLY = frozenset((
    "reply", "replies", "response", "responses", "answer", "answers", "output", "message", "messages", "respond", "return", "speak",
    "nothing", "explanation", "explanations", "commentary", "pleasantries", "preamble", "prose", "keep", "words", "sentences", "lines",
    "characters", "paragraphs", "points", "items",
))
_A_CONV = frozenset((
    "conversation", "chat", "session", "dialogue", "exchange", "character", "role", "roleplay", "persona", "prompt", "instructions",
    "guidelines",
))
_A_STANDING = frozenset((
    "now", "here", "point", "message", "rest", "remainder", "duration", "forward", "until", "session", "chat", "conversation", "throughout",
    "matter", "whatever", "reply", "replies", "response", "responses", "answer", "answers", "messages", "turn",
))
_A_INCOMING_YOU = frozenset((
    "ask", "asks", "message", "messages", "write", "writes", "come", "comes", "bring", "brings", "tell", "tells", "contact", "contacts",
    "talk", "talks", "chat", "chats", "radio", "given", "sent", "shown", "asked", "provided", "handed",
))
_A_INCOMING_PARTY = frozenset((
    "ask", "asks", "message", "messages", "write", "writes", "come", "comes", "call", "calls", "contact", "contacts", "paste", "pastes",
    "type", "types", "send", "sends", "share", "shares", "describe", "describes", "provide", "provides", "submit", "submits", "enter",
    "enters", "say", "says", "mention", "mentions", "greet", "greets", "receive", "receives", "get", "gets", "give", "gives", "name", "names",
))
_A_SERVE = frozenset((
    "user", "users", "user's", "customer", "customers", "person", "people", "student", "students", "player", "players", "guest", "guests",
    "visitor", "visitors", "caller", "callers", "learner", "learners", "patient", "patients", "client", "clients", "traveller",
    "travellers", "child", "children", "kids", "them",
))
_A_MESSAGES = frozenset((
    "question", "questions", "message", "messages", "request", "requests", "query", "queries", "input", "prompt", "prompts", "ticket",
    "tickets", "email", "emails", "claim", "claims", "draft", "drafts", "submission", "submissions",
))
_A_REFUSAL = frozenset(("refuse", "decline", "redirect", "hand", "escalate", "never", "do", "don't"))
_A_WANT = frozenset(("want", "like", "need"))
_A_CONDITIONAL = frozenset(("if", "when", "whenever", "unless", "once"))
_A_FRAME = frozenset((
    "conversation", "dialogue", "chat", "instruction", "transcript", "exchange", "notes", "instructions", "guidelines", "rules", "context",
    "directions",
))


def features(text: str) -> list[float]:
    """The structural features of `text`, in FEATURES order."""
    t = text.strip()
    quoted = QUOTED_SPAN.findall(t) if ('"' in t or "“" in t or "«" in t or "—" in t or "–" in t) else ()
    unq = QUOTED_SPAN.sub('"…"', t) if quoted else t
    low = unq.lower()
    words = WORD.findall(low)
    counts = Counter(words)
    n_words = len(words)
    per_word = 1.0 / (n_words + 10)  # smoothed: a five-word text is not "all second person"
    markers = len(NUMBERED_MARKER.findall(low)) if "." in low and "\n" in low else 0  # "2. " ends no sentence
    n_sent = max(1, len(SENTENCE_END.findall(low.rstrip(".!? \n"))) + 1 - markers)
    first_end = _first_sentence_end(low)
    has_you = "you" in counts or "you're" in counts or "you'll" in counts or "ur" in counts

    # Sentence-initial shapes, tried where sentences start; each keeps where its match ends.
    you_np, you_other, role_imp, third_agent, speech_imp, imperatives = [], [], [], [], [], []
    agent_text = _has(counts, _A_AGENT)
    for pos in (0, *(m.end() for m in _START.finditer(low))):
        fw = _FIRST_WORD.match(low, pos)
        if fw is None:
            continue
        w = fw.group(1)
        lead = w in _LEAD_WORDS
        if lead or w in _YOU_OPENERS:
            m = YOU_ARE_NP.match(low, pos)
            if m:
                you_np.append(m.end())
            m = YOU_ARE_OTHER.match(low, pos)
            if m:
                you_other.append(m.end())
        if lead or w in _ROLE_OPENERS:
            m = ROLE_IMPERATIVE.match(low, pos)
            if m:
                role_imp.append(m.end())
        if agent_text and (lead or w in _THIRD_OPENERS):
            m = THIRD_PERSON_AGENT.match(low, pos)
            if m:
                third_agent.append(m.end())
        if lead or w not in _CLOSED_SET:
            m = IMPERATIVE.match(low, pos)
            if m:
                imperatives.append(m.end())
                if SPEECH_IMPERATIVE.match(low, pos):
                    speech_imp.append(m.end())
    you_name = [m.end() for m in YOU_ARE_NAME.finditer(unq)] if has_you else []
    config_text = _has(counts, _A_CONFIG)
    possessive = [m.end() for m in POSSESSIVE_CONFIG.finditer(low)] if config_text else []
    config_labels = [m.end() for m in CONFIG_LABEL.finditer(low)] if config_text else []
    frame = [m.end() for m in FRAME_ANNOUNCE.finditer(low)] if _has(counts, _A_FRAME) else []
    if _any(("<", "[", "#", "system", "{{"), low):
        frame += [m.end() for m in FRAME_MARKUP.finditer(low)]
    want = len(WANT_YOU_TO.findall(low)) if has_you and _has(counts, _A_WANT) else 0
    named = len(NAMED_AGENT.findall(unq)) if agent_text else 0
    if "as" in counts and ("would" in counts or "were" in counts):
        named += len(AS_WOULD.findall(unq))
    decl_ends = you_np + you_other + role_imp + you_name + third_agent + possessive + config_labels + frame
    declared = min(1, len(decl_ends) + want + named)

    meta_user = _total(counts, _USER_WORDS) + (len(META_USER.findall(low)) if has_you else 0)
    agent = max(0, _total(counts, _AGENT_WORDS) - len(JOB_TITLE_AGENT.findall(unq))) if agent_text else 0
    meta_reply = 0
    if _has(counts, _A_REPLY):
        meta_reply = len(META_REPLY.findall(low))
        meta_reply += sum(1 for m in REPLY_FORMAT.finditer(low) if m.start() == 0 or low.endswith(REPLY_OPENERS, 0, m.start()))
    incoming = _count(INCOMING_PARTY, low, counts, _A_INCOMING_PARTY)
    if has_you:
        incoming += _count(INCOMING_YOU, low, counts, _A_INCOMING_YOU)
    conditional = _count(CONDITIONAL, low, counts, _A_CONDITIONAL)
    speech = (len(speech_imp) + (len(YOU_SPEECH.findall(low)) if has_you else 0)) / n_sent
    interacting = min(1.0, meta_user + meta_reply + incoming + conditional + speech)

    clauses = len(IMPERATIVE_CLAUSE.findall(low)) if ", " in low else 0
    imperative_share = min(1.0, (len(imperatives) + 0.5 * clauses) / n_sent)
    you_modal = min(2.0, len(YOU_MODAL.findall(low)) / n_sent) if has_you else 0.0
    you_present = min(2.0, len(YOU_PRESENT.findall(low)) / n_sent) if has_you else 0.0
    directed = min(1.0, imperative_share + you_modal + you_present + speech)
    modals = _total(counts, _MODAL_WORDS) + sum(low.count(p) for p in _MODAL_PHRASES)

    multiline = "\n" in low
    items = LIST_ITEM.findall(low) if multiline or low[:1] in "-*•0123456789" else []
    rule_items = sum(1 for it in items if IMPERATIVE.match(it) or any(w in it for w in _MODAL_WORDS if w in counts))
    labels = FIELD_LINE.findall(unq) if _any((":", "=", "—", "–"), unq) else []
    seen: dict[str, int] = {}
    for lab in labels:
        k = lab.strip().lower()
        seen[k] = seen.get(k, 0) + 1
    repeated = sum(c for c in seen.values() if c > 1)
    numbers = len(NUMBER.findall(low)) - len(NUMBERED_MARKER.findall(low)) if _any("0123456789", low) else 0
    social = _total(counts, _SOCIAL_WORDS) + sum(low.count(p) for p in _SOCIAL_PHRASES)
    past = _total(counts, _PAST_WORDS) + len(PRONOUN_ED.findall(low))

    return [
        float(any(e <= first_end for e in decl_ends) or (want > 0 and first_end >= len(low) - 1)),
        min(len(you_np), 3),
        min(len(you_name), 2),
        min(len(you_other), 3),
        min(len(role_imp), 3),
        min(want, 2),
        min(len(possessive), 3),
        min(len(config_labels), 4),
        min(len(third_agent), 3),
        min(named, 2),
        min(len(frame), 2),
        min(2.0, meta_user / n_sent),
        min(_count(SERVE_PARTY, low, counts, _A_SERVE), 3),
        min(_count(HANDLE_MESSAGES, low, counts, _A_MESSAGES), 3),
        min(2.0, agent / n_sent),
        min(2.0, meta_reply / n_sent),
        min(2.0, _count(META_CONV, low, counts, _A_CONV) / n_sent),
        min(incoming, 3),
        min(conditional, 3),
        min(_count(STANDING, low, counts, _A_STANDING), 3),
        min(2.0, speech),
        imperative_share,
        min(3.0, modals / n_sent),
        you_modal,
        you_present,
        min(_count(REFUSAL, low, counts, _A_REFUSAL), 3),
        min(rule_items, 6),
        _total(counts, _SECOND_PERSON) * per_word,
        _total(counts, _FIRST_PLURAL) * per_word,
        _total(counts, _THIRD_PERSON) * per_word,
        past * per_word,
        len(QUESTION_END.findall(low)) / n_sent,
        float(bool(QUESTION_OPEN.match(low))),
        min(len(REQUEST_QUESTION.findall(low)) if has_you and "?" in low else 0, 2),
        len(EXCLAIM_END.findall(low)) / n_sent,
        min(social, 2),
        float(bool(HUMAN_VOCATIVE.match(low))),
        min(len(ENJAMBMENT.findall(low)) if multiline else 0, 3),
        sum(map(len, quoted)) / max(1, len(t)) if quoted and SPEECH_TAG.search(t) else 0.0,
        min(len(labels), 6),
        min(repeated, 6),
        numbers * per_word,
        math.log1p(n_words),
        declared * directed,
        declared * interacting,
        directed * interacting,
        float(declared and agent > 0),
    ]


# ---------------------------------------------------------------------------------------------
# Scoring with the shipped weights.


@dataclass
class ShapeScore:
    score: float
    points: float  # the logit, centred on the decision threshold (> 0 means system-prompt shape)
    features: dict = field(default_factory=dict)

    @property
    def is_system_prompt(self) -> bool:
        return self.score >= 0.5


@lru_cache(maxsize=1)
def _model() -> tuple[list[float], float, float]:
    from andrea import shape_weights as sw

    if tuple(sw.FEATURES) != FEATURES:
        raise RuntimeError("andrea/shape_weights.py was fitted on other features; run `andrea shape fit`")
    centred = sw.INTERCEPT - _logit(sw.THRESHOLD)
    return list(sw.WEIGHTS), centred, sw.THRESHOLD


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= -700 else 0.0


def shape_score(text: str) -> ShapeScore:
    """Score how much `text` has the shape of a system prompt, with the features that counted
    (each non-zero feature's value and its contribution to the logit)."""
    if not text or not text.strip():
        return ShapeScore(0.0, -math.inf, {})
    w, b, _ = _model()
    x = features(text)
    z = b + sum(map(mul, w, x))
    feats = {n: {"value": round(xi, 3), "points": round(wi * xi, 2)} for n, wi, xi in zip(FEATURES, w, x) if xi}
    return ShapeScore(round(_sigmoid(z), 4), round(z, 3), feats)


def has_system_prompt_shape(text: str, threshold: float = 0.5) -> bool:
    """True when `text` has the shape of a system prompt (score ≥ threshold; 0.5 is the fitted
    decision point)."""
    if not text or not text.strip():
        return False
    w, b, _ = _model()
    return _sigmoid(b + sum(map(mul, w, features(text)))) >= threshold


# ---------------------------------------------------------------------------------------------
# The labelled set.


@dataclass
class Labelled:
    text: str
    label: bool
    kind: str


@lru_cache(maxsize=4)
def labelled_set(path: str | None = None) -> tuple[Labelled, ...]:
    """The labelled evaluation set shipped with the package."""
    p = Path(path) if path else Path(str(resources.files("andrea") / "labelled" / "shape_set.txt"))
    items: list[Labelled] = []
    header = None
    body: list[str] = []

    def flush() -> None:
        if header is not None:
            text = "\n".join(body).strip()
            if not text:
                raise ValueError(f"{p}: empty entry under header '{header[2]}'")
            items.append(Labelled(text, header[0], header[1]))

    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("%%% "):
            flush()
            label, _, kind = line[4:].partition("|")
            label = label.strip()
            if label not in ("positive", "negative") or not kind.strip():
                raise ValueError(f"{p}:{n}: bad header {line!r} (want '%%% positive|negative | kind')")
            header, body = (label == "positive", kind.strip(), f"line {n}"), []
        elif header is not None:
            body.append(line)
    flush()
    return tuple(items)


# ---------------------------------------------------------------------------------------------
# Fitting: an L2-regularised logistic regression over FEATURES (NumPy, Newton's method), and a
# threshold chosen on out-of-fold probabilities. NumPy is imported here only: scoring needs none.

L2_GRID = (3.0, 6.0, 12.0)  # ridge penalties on the standardised weights; a fit picks one by inner CV
TARGET_PRECISION = 0.975  # the threshold is the lowest whose out-of-fold precision reaches this
INNER_FOLDS, INNER_REPEATS = 5, 3  # the cross-validation inside a fit that picks the threshold
CV_FOLDS, CV_REPEATS, CV_SEED = 5, 5, 13  # the reported cross-validation (5 rounds: a steadier estimate than 1)


def _design(items):
    import numpy as np

    X = np.array([features(it.text) for it in items], dtype=np.float64)
    y = np.array([it.label for it in items], dtype=np.float64)
    return X, y


def _fit_logistic(X, y, l2: float):
    """Weights and intercept for the raw features; fitted on standardised ones."""
    import numpy as np

    mu, sd = X.mean(0), X.std(0)
    sd[sd == 0] = 1.0
    Z = np.hstack([np.ones((len(X), 1)), (X - mu) / sd])
    reg = np.full(Z.shape[1], l2)
    reg[0] = 0.0
    beta = np.zeros(Z.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-(Z @ beta)))
        grad = Z.T @ (p - y) + reg * beta
        # einsum, not a BLAS matrix product: a threaded GEMM this small stalls for milliseconds on
        # a busy machine (measured 100x slower on 2 shared cores)
        hess = np.einsum("ni,nj->ij", Z * (p * (1 - p))[:, None], Z) + np.diag(reg) + 1e-9 * np.eye(Z.shape[1])
        step = np.linalg.solve(hess, grad)
        beta -= step
        if np.abs(step).max() < 1e-10:
            break
    w = beta[1:] / sd
    return w, float(beta[0] - (beta[1:] * mu / sd).sum())


def _logits(X, w, b):
    return X @ w + b


def _folds(y, kinds, k: int, seed: int):
    """Fold index per item, stratified by label and kind: each (label, kind) group is shuffled and
    dealt round-robin, continuing where the previous group stopped."""
    import numpy as np

    rng = np.random.default_rng(seed)
    fold = np.empty(len(y), dtype=int)
    nxt = 0
    for key in sorted(set(zip(y.tolist(), kinds))):
        idx = [i for i in range(len(y)) if (y[i], kinds[i]) == key]
        for i in rng.permutation(idx):
            fold[i] = nxt % k
            nxt += 1
    return fold


def _choose_threshold(z, y, target: float = TARGET_PRECISION) -> float:
    """The lowest logit cut at which precision on (z, y) is ≥ target (so recall is highest there);
    the cut of best F1 if no cut reaches the target."""
    import numpy as np

    order = np.argsort(-z, kind="stable")
    zs, ys = z[order], y[order]
    tp = np.cumsum(ys)
    fp = np.cumsum(1 - ys)
    precision = tp / (tp + fp)
    cut = np.append((zs[:-1] + zs[1:]) / 2, zs[-1] - 1.0)  # cut i keeps items 0..i
    ok = np.nonzero(precision >= target)[0]
    if len(ok):
        i = ok[-1]
    else:
        recall = tp / max(1.0, ys.sum())
        i = int(np.argmax(2 * precision * recall / np.maximum(1e-12, precision + recall)))
    return float(cut[i])


def _fit_design(X, y, kinds, seed: int) -> dict:
    """Weights from all of (X, y). The ridge penalty and the threshold are chosen on out-of-fold
    logits of a repeated inner cross-validation on the same items (in-sample logits would flatter
    both), by the measure the scorer is held to: for each penalty the threshold that reaches
    TARGET_PRECISION out of fold, and the penalty whose threshold keeps the most recall."""
    import numpy as np

    best = None
    for l2 in L2_GRID:
        oof = np.zeros(len(y))
        for r in range(INNER_REPEATS):
            fold = _folds(y, kinds, INNER_FOLDS, seed * 1000 + r + 1)
            for f in range(INNER_FOLDS):
                tr, te = fold != f, fold == f
                w, b = _fit_logistic(X[tr], y[tr], l2)
                oof[te] += _logits(X[te], w, b) / INNER_REPEATS
        cut = _choose_threshold(oof, y)
        recall = float(((oof >= cut) & (y == 1)).sum() / y.sum())
        if best is None or recall >= best[0]:  # ties go to the stronger penalty
            best = (recall, l2, cut)
    _, l2, cut = best
    w, b = _fit_logistic(X, y, l2)
    return {"features": list(FEATURES), "weights": [float(v) for v in w], "intercept": b, "threshold": _sigmoid(cut), "l2": l2}


def fit(items=None, seed: int = 0) -> dict:
    """Fit the scorer on `items` (default: the labelled set): feature weights, intercept, and the
    probability threshold. `andrea shape fit` writes the result to andrea/shape_weights.py."""
    items = labelled_set() if items is None else items
    X, y = _design(items)
    return _fit_design(X, y, [it.kind for it in items], seed)


def _counts(pred, y) -> dict:
    tp = int((pred & (y == 1)).sum())
    fp = int((pred & (y == 0)).sum())
    fn = int((~pred & (y == 1)).sum())
    tn = int((~pred & (y == 0)).sum())
    return {
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "tp": tp, "fp": fp, "fn": fn, "tn": tn,
    }


def cross_validate(items=None, k: int = CV_FOLDS, repeats: int = CV_REPEATS, seed: int = CV_SEED) -> dict:
    """Held-out precision and recall: `repeats` rounds of k-fold cross-validation, stratified by
    label and kind, with the fold assignment seeded. In each fold the weights and the threshold are
    fitted on the other k-1 folds only (see fit()) and the held-out fold is scored with them.
    Precision and recall are pooled over all rounds; each round's are listed too, with every
    fold's threshold, and the items misclassified when held out (with how many rounds missed them)."""
    import numpy as np

    items = labelled_set() if items is None else items
    X, y = _design(items)
    kinds = [it.kind for it in items]
    preds, rounds = [], []
    missed = np.zeros(len(y), dtype=int)
    for r in range(repeats):
        fold = _folds(y, kinds, k, seed + r)
        pred = np.zeros(len(y), dtype=bool)
        thresholds = []
        for f in range(k):
            tr, te = fold != f, fold == f
            m = _fit_design(X[tr], y[tr], [kinds[i] for i in np.nonzero(tr)[0]], seed + r)
            pred[te] = _logits(X[te], np.array(m["weights"]), m["intercept"]) >= _logit(m["threshold"])
            thresholds.append(round(m["threshold"], 4))
        preds.append(pred)
        missed += pred != (y == 1)
        rounds.append({"seed": seed + r, "thresholds": thresholds, **_counts(pred, y)})
    pooled = _counts(np.concatenate(preds), np.tile(y, repeats))
    wrong = [
        {"kind": items[i].kind, "label": "positive" if y[i] else "negative", "rounds_missed": int(missed[i]), "text": items[i].text[:160]}
        for i in np.argsort(-missed, kind="stable") if missed[i]
    ]
    return {"method": f"{repeats} x {k}-fold stratified cross-validation (seed {seed})", "k": k, "repeats": repeats, "seed": seed,
            "n": len(items), **pooled, "rounds": rounds, "misclassified": wrong}


def labelled_set_digest(path: str | None = None) -> str:
    p = Path(path) if path else Path(str(resources.files("andrea") / "labelled" / "shape_set.txt"))
    return hashlib.sha256(p.read_bytes()).hexdigest()


@lru_cache(maxsize=1)
def cross_validated_quality() -> dict:
    """cross_validate() on the shipped labelled set, without the misclassified texts. `andrea shape
    fit` stores it beside the weights (it takes seconds); it is recomputed here only when the set
    has changed since."""
    from andrea import shape_weights as sw

    if getattr(sw, "LABELLED_SET_SHA256", None) == labelled_set_digest():
        return dict(sw.CROSS_VALIDATED)
    return {k: v for k, v in cross_validate().items() if k != "misclassified"}


def evaluate(threshold: float = 0.5, items=None) -> dict:
    """Precision, recall and the misclassified examples of the shipped scorer on the labelled set
    (score ≥ threshold). The shipped weights were fitted on this very set, so these figures are
    in-sample and flatter the scorer: cross_validate() gives the held-out ones."""
    items = labelled_set() if items is None else items
    tp = fp = fn = tn = 0
    wrong = []
    for it in items:
        pred = has_system_prompt_shape(it.text, threshold)
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
    return {
        "n": len(items),
        "positives": tp + fn,
        "negatives": tn + fp,
        "precision": round(tp / (tp + fp), 4) if tp + fp else 1.0,
        "recall": round(tp / (tp + fn), 4) if tp + fn else 1.0,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "misclassified": wrong,
    }


def weights_module(model: dict, cross_validated: dict, digest: str) -> str:
    """Python source of andrea/shape_weights.py for a fitted model and its cross-validation."""
    rows = "\n".join(f"    {w!r},  # {n}" for n, w in zip(model["features"], model["weights"]))
    names = "\n".join(f"    {n!r}," for n in model["features"])
    return (
        '"""Weights of the system-prompt-shape scorer (andrea/shape.py): an L2-regularised logistic\n'
        "regression over shape.FEATURES, fitted on andrea/labelled/shape_set.txt by `andrea shape fit`,\n"
        'which rewrites this file. Do not edit by hand."""\n\n'
        f"FEATURES = (\n{names}\n)\nWEIGHTS = (\n{rows}\n)\n"
        f"INTERCEPT = {model['intercept']!r}\n"
        "# probability at which a text is called system-prompt shaped (shape_score() maps it to 0.5)\n"
        f"THRESHOLD = {model['threshold']!r}\n"
        f"L2 = {model['l2']!r}  # the ridge penalty the fit chose\n\n"
        "# The set these were fitted on, and cross_validate() on it (held-out precision and recall)\n"
        f"LABELLED_SET_SHA256 = {digest!r}\n"
        f"CROSS_VALIDATED = {pprint.pformat({k: v for k, v in cross_validated.items() if k != 'misclassified'}, width=100, sort_dicts=False)}\n"
    )


def write_weights(model: dict, cross_validated: dict, path: str | Path | None = None) -> Path:
    """Write `model` and its cross-validation as andrea/shape_weights.py (or `path`), atomically,
    and use them from now on."""
    from andrea.io import write_text_atomic

    p = Path(path) if path else Path(__file__).with_name("shape_weights.py")
    write_text_atomic(p, weights_module(model, cross_validated, labelled_set_digest()))
    if path is None:
        import importlib

        from andrea import shape_weights

        importlib.reload(shape_weights)
        _model.cache_clear()
        cross_validated_quality.cache_clear()
    return p
