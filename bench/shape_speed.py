"""Throughput of has_system_prompt_shape() (design §7): texts per second on a mix of chat turns.

The pool is every user/assistant turn of the embedded demo corpora, the paragraphs of the
embedded books and docs, and longer texts made by joining three and eight of those paragraphs
(Hermes-3 answers are often that long). It does not depend on the labelled set, so versions of the
scorer can be compared. One process, one core.

    python bench/shape_speed.py            # prints one JSON line
"""

from __future__ import annotations

import json
import sys
import time
from importlib import resources
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from andrea.shape import has_system_prompt_shape  # noqa: E402


def pool() -> list[str]:
    corpus = Path(str(resources.files("andrea") / "corpus"))
    texts: list[str] = []
    for f in sorted(corpus.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            def walk(o):
                if isinstance(o, dict):
                    for k, v in o.items():
                        if k in ("value", "content", "text") and isinstance(v, str):
                            texts.append(v)
                        else:
                            walk(v)
                elif isinstance(o, list):
                    for v in o:
                        walk(v)
            walk(json.loads(line))
    paras = [p.strip() for f in sorted(corpus.glob("*/*")) for p in f.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    texts += paras
    texts += ["\n\n".join(paras[i : i + 3]) for i in range(0, len(paras) - 2, 3)]
    texts += ["\n\n".join(paras[i : i + 8]) for i in range(0, len(paras) - 7, 8)]
    return texts


def main() -> None:
    texts = pool()
    for t in texts:  # warm the regex caches
        has_system_prompt_shape(t)
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 3.0:
        for t in texts:
            has_system_prompt_shape(t)
        n += 1
    dt = time.perf_counter() - t0
    chars = sum(map(len, texts))
    print(json.dumps({
        "texts": len(texts), "mean_chars": round(chars / len(texts)),
        "texts_per_s": round(n * len(texts) / dt), "mb_per_s": round(n * chars / dt / 1e6, 2),
    }))


if __name__ == "__main__":
    main()
