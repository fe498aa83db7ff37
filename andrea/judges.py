"""Judges of generated samples (design §10).

Built in, no network: the coherence score (andrea/coherence.py), distinct-1/2/3, repetition
rate, real-word rate (`english_rate`: the coherence score's real-word share, by letters). The
model's loss on held-out documents is andrea/evaluation.py's.

External: any OpenAI-compatible chat-completions endpoint, given a written rubric, returns a
0–10 score and a reason per sample. Time-outs, connection errors, rate limits (429 and 408, with
the server's Retry-After honoured up to 30 s), server errors (5xx) and unparseable replies are
retried with exponential back-off and then recorded as unscored, with the error: never a crash,
never a made-up score. Other client errors (400, 401, 404, ...) are not retried: they will not
mend themselves.

The HTTP is httpx2 (time-outs, connection reuse, typed errors) and the retry policy tenacity.
Both were installed already (datasets -> huggingface_hub needs httpx2, snakemake needs tenacity),
so the judge adds no package. The official `openai` client fits worse: its back-off is fixed
(0.5 s doubling to 8 s, not the configured `backoff_s`), it does not retry an unparseable reply,
so our own retry loop would wrap its loop anyway, it wants a key even for an endpoint that takes
none, and given no key it falls back to OPENAI_API_KEY, which would send a user's OpenAI key to
whatever endpoint the judge points at; it would also add three packages (openai, jiter, sniffio).

The API key travels only in the client's Authorization header (which httpx2 shows as
"[secure]"); whatever the server sends back (error messages, reasons) has the key replaced by
"[redacted]" before it reaches a log line, a Verdict or the audit's files.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone

import httpx2
import tenacity

from andrea.coherence import WORD, coherence_score, distinct_n

log = logging.getLogger("andrea.judges")

RUBRIC = """You grade one answer written by a small language model in training.
Score it from 0 to 10:
- 0-2: not language: repetition loops, random characters, another script, or empty.
- 3-4: words and phrases but no sentences that make sense together.
- 5-6: grammatical sentences, loosely related to the prompt, with errors of fact or logic.
- 7-8: a coherent, relevant answer with minor errors.
- 9-10: a correct, clear, well-organised answer a knowledgeable person would accept.
Judge only the answer's quality for the prompt; ignore its length unless it stops mid-thought.
Reply with JSON only: {"score": <integer 0-10>, "reason": "<one sentence>"}"""


# ---------------------------------------------------------------------- built-in


def repetition_rate(words: list[str], n: int = 4) -> float:
    """Share of word n-grams that already occurred earlier in the text: every n-gram but the first
    of each kind, 1 − distinct-n (0 when there are none)."""
    return 1.0 - distinct_n(words, n) if len(words) >= n else 0.0


def builtin_scores(text: str) -> dict:
    """The built-in judges of one sample. The coherence score's parts come with it (its bigram and
    trigram points are 35 x distinct-2 and distinct-3; its real-word share is `english_rate`)."""
    words = [w.lower() for w in WORD.findall(text)]
    c = coherence_score(text)
    return {
        "coherence": round(c.score, 2),
        # the coherence score's parts (andrea/coherence.py): gate(real-word share) x novelty x (…)
        "coh_gate": round(c.gate, 4),
        "coh_bigram": round(c.bigram, 2),
        "coh_trigram": round(c.trigram, 2),
        "coh_chars": round(c.chars, 2),
        "distinct_1": round(distinct_n(words, 1), 4),
        "distinct_2": round(c.bigram / 35.0, 4),
        "distinct_3": round(c.trigram / 35.0, 4),
        "repetition": round(repetition_rate(words), 4),
        "english_rate": round(c.share, 4),  # real words' share of the letters
        "n_words": len(words),
        "n_chars": len(text),
    }


# ---------------------------------------------------------------------- external


@dataclass
class Verdict:
    score: float | None
    reason: str
    attempts: int
    error: str | None = None


def parse_verdict(content: str) -> tuple[float, str]:
    """{"score": n, "reason": "..."} (also inside a code fence or surrounding prose)."""
    m = re.search(r"\{.*\}", content, re.S)
    if m:
        try:
            d = json.loads(m.group(0))
            score = float(d["score"])
            if 0 <= score <= 10:
                return score, str(d.get("reason", "")).strip()
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
    raise ValueError(f"no score 0-10 in the reply: {content[:200]!r}")


RETRIED_STATUS = {408, 429}  # and every 5xx: the server may answer later
MAX_RETRY_AFTER_S = 30.0  # a server asking for longer gets this, then the next attempt


class JudgeFailure(Exception):
    """One failed attempt. Transient ones are retried; retry_after is the wait the server asked for."""

    def __init__(self, message: str, transient: bool = True, retry_after: float | None = None):
        super().__init__(message)
        self.transient, self.retry_after = transient, retry_after


def retry_after_s(value: str | None) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) as seconds from now; None if absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def server_message(r: httpx2.Response) -> str:
    """The message of an OpenAI-style error body ({"error": {"message": ...}}), else ""."""
    try:
        err = r.json().get("error")
    except (ValueError, AttributeError):
        return ""
    msg = err.get("message") if isinstance(err, dict) else err
    return " ".join(str(msg).split())[:200] if msg else ""


class ExternalJudge:
    """Scores answers with a chat-completions endpoint; one instance keeps one connection pool."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60,
                 retries: int = 3, backoff_s: float = 1.0, rubric: str = RUBRIC):
        self.url = base_url.rstrip("/") + "/chat/completions"
        try:
            scheme = httpx2.URL(self.url).scheme
        except httpx2.InvalidURL:
            scheme = ""
        if scheme not in ("http", "https"):
            raise ValueError(f"external judge: base URL {base_url!r} is not an http:// or https:// URL")
        if api_key and not (api_key.isascii() and api_key.isprintable()):
            raise ValueError("external judge: the API key has characters an HTTP header cannot carry")
        self.model, self.rubric = model, rubric
        self.timeout_s, self.retries = timeout_s, retries
        self._key = api_key or None  # kept only to redact it from what the server sends back
        self._backoff = tenacity.wait_exponential(multiplier=backoff_s)  # backoff_s, 2x, 4x, ...
        self._http = httpx2.Client(timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})

    @classmethod
    def from_config(cls, jcfg: dict) -> "ExternalJudge | None":
        """The endpoint from config, else from the environment; None when there is none."""
        base = jcfg.get("base_url") or os.environ.get(jcfg["base_url_env"])
        model = jcfg.get("model") or os.environ.get(jcfg["model_env"])
        if not base or not model:
            return None
        try:
            return cls(base, model, os.environ.get(jcfg["api_key_env"]), jcfg["timeout_s"], jcfg["retries"], jcfg["backoff_s"])
        except ValueError as e:
            where = "audit.judge.base_url" if jcfg.get("base_url") else f"${jcfg['base_url_env']}"
            raise ValueError(f"{e} (base URL from {where}, key from ${jcfg['api_key_env']})") from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ExternalJudge":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _redact(self, text: str) -> str:
        return text.replace(self._key, "[redacted]") if self._key else text

    def _ask(self, prompt: str, answer: str) -> tuple[float, str]:
        """One attempt: (score, reason), or JudgeFailure saying what went wrong."""
        body = {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": self.rubric},
                {"role": "user", "content": f"Prompt:\n{prompt}\n\nAnswer:\n{answer}"},
            ],
        }
        try:
            r = self._http.post(self.url, json=body)
        except httpx2.RequestError as e:  # time-outs, refused or dropped connections, bad encodings
            raise JudgeFailure(f"{type(e).__name__}: {e}") from None
        except httpx2.InvalidURL as e:
            raise JudgeFailure(f"InvalidURL: {e}", transient=False) from None
        if not r.is_success:
            detail = server_message(r)
            raise JudgeFailure(f"HTTP {r.status_code}" + (f": {detail}" if detail else ""),
                               transient=r.status_code in RETRIED_STATUS or r.status_code >= 500,
                               retry_after=retry_after_s(r.headers.get("Retry-After")))
        try:
            return parse_verdict(r.json()["choices"][0]["message"]["content"])
        except (ValueError, KeyError, IndexError, TypeError) as e:  # JSONDecodeError is a ValueError
            raise JudgeFailure(f"unparseable reply: {e}") from None

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """Exponential back-off, or longer when the server asked for it (up to MAX_RETRY_AFTER_S)."""
        wait = self._backoff(state)
        asked = getattr(state.outcome.exception(), "retry_after", None)
        return max(wait, min(MAX_RETRY_AFTER_S, asked)) if asked is not None else wait

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        log.warning("judge attempt %d failed (%s); retrying in %.2f s", state.attempt_number,
                    self._redact(str(state.outcome.exception())), state.next_action.sleep)

    def judge(self, prompt: str, answer: str) -> Verdict:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=self._wait,
            retry=tenacity.retry_if_exception(lambda e: isinstance(e, JudgeFailure) and e.transient),
            before_sleep=self._log_retry,
            reraise=True,  # the last JudgeFailure itself, not tenacity's RetryError
        )
        try:
            score, reason = retrying(self._ask, prompt, answer)
        except JudgeFailure as e:
            return Verdict(None, "", retrying.statistics["attempt_number"], self._redact(str(e)))
        return Verdict(score, self._redact(reason), retrying.statistics["attempt_number"])
