"""Judges of generated samples (SPEC §10).

Built in, no network: the coherence score (andrea/coherence.py), distinct-1/2/3, repetition
rate, real-word rate (`english_rate`: the coherence score's real-word share, by letters). The
model's loss on held-out documents is andrea/evaluation.py's.

External: any OpenAI-compatible chat-completions endpoint, given a written rubric, returns a
0–10 score and a reason per sample. Time-outs, HTTP errors, rate limits and unparseable replies
are retried with exponential back-off and then recorded as unscored, with the error: never a
crash, never a made-up score.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


from andrea.coherence import WORD, coherence_score, distinct_n, real_word_share

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
    """Share of word n-grams that already occurred earlier in the text."""
    seen, repeats, total = set(), 0, 0
    for g in zip(*(words[i:] for i in range(n))):
        total += 1
        repeats += g in seen
        seen.add(g)
    return repeats / total if total else 0.0


def builtin_scores(text: str) -> dict:
    found = WORD.findall(text)
    words = [w.lower() for w in found]
    c = coherence_score(text)
    return {
        "coherence": round(c.score, 2),
        # the coherence score's parts (andrea/coherence.py): gate(real-word share) x novelty x (…)
        "coh_share": round(c.share, 4),
        "coh_gate": round(c.gate, 4),
        "coh_bigram": round(c.bigram, 2),
        "coh_trigram": round(c.trigram, 2),
        "coh_chars": round(c.chars, 2),
        "distinct_1": round(distinct_n(words, 1), 4),
        "distinct_2": round(distinct_n(words, 2), 4),
        "distinct_3": round(distinct_n(words, 3), 4),
        "repetition": round(repetition_rate(words), 4),
        "english_rate": round(real_word_share(found), 4),
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


class ExternalJudge:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout_s: float = 60,
                 retries: int = 3, backoff_s: float = 1.0, rubric: str = RUBRIC):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.timeout_s, self.retries, self.backoff_s, self.rubric = timeout_s, retries, backoff_s, rubric

    @classmethod
    def from_config(cls, jcfg: dict) -> "ExternalJudge | None":
        """The endpoint from config, else from the environment; None when there is none."""
        base = jcfg.get("base_url") or os.environ.get(jcfg["base_url_env"])
        model = jcfg.get("model") or os.environ.get(jcfg["model_env"])
        if not base or not model:
            return None
        return cls(base, model, os.environ.get(jcfg["api_key_env"]), jcfg["timeout_s"], jcfg["retries"], jcfg["backoff_s"])

    def _request(self, prompt: str, answer: str) -> str:
        body = json.dumps({
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": self.rubric},
                {"role": "user", "content": f"Prompt:\n{prompt}\n\nAnswer:\n{answer}"},
            ],
        }).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
            data = json.loads(r.read().decode("utf-8"))
        return data["choices"][0]["message"]["content"]

    def judge(self, prompt: str, answer: str) -> Verdict:
        error = None
        for attempt in range(1, self.retries + 2):
            wait = self.backoff_s * 2 ** (attempt - 1)
            try:
                score, reason = parse_verdict(self._request(prompt, answer))
                return Verdict(score, reason, attempt)
            except urllib.error.HTTPError as e:
                error = f"HTTP {e.code}"
                if e.code == 429:
                    try:
                        wait = max(wait, min(30.0, float(e.headers.get("Retry-After", 0))))
                    except (TypeError, ValueError):
                        pass
                elif e.code < 500:
                    break  # a client error will not mend itself
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
                error = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            except (ValueError, KeyError, IndexError, TypeError, json.JSONDecodeError) as e:
                error = f"unparseable reply: {e}"
            if attempt <= self.retries:
                log.warning("judge attempt %d failed (%s); retrying in %.1f s", attempt, error, wait)
                time.sleep(wait)
        return Verdict(None, "", attempt, error)
