"""The external judge against a real HTTP server on 127.0.0.1 speaking chat-completions."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from andrea.judges import ExternalJudge, builtin_scores, parse_verdict, repetition_rate


def reply(content: str) -> bytes:
    return json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()


class FakeEndpoint:
    """Serves a scripted sequence of behaviours, one per request, and records the requests."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                kind = outer.script.pop(0) if outer.script else "ok"
                if kind == "slow":
                    time.sleep(1.5)
                    kind = "ok"
                if kind in ("429", "500", "400"):
                    self.send_response(int(kind))
                    if kind == "429":
                        self.send_header("Retry-After", "0")
                    self.end_headers()
                    return
                data = {"ok": reply('{"score": 7, "reason": "coherent and on topic"}'),
                        "fenced": reply('Here you go:\n```json\n{"score": 4, "reason": "loose"}\n```'),
                        "malformed": b"{this is not json",
                        "noscore": reply("I think it is pretty good.")}[kind]
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def endpoint():
    made = []

    def make(*script):
        e = FakeEndpoint(script)
        made.append(e)
        return e

    yield make
    for e in made:
        e.close()


def judge(url, **kw):
    return ExternalJudge(url, "judge-model", api_key="sekrit", timeout_s=kw.get("timeout", 5), retries=kw.get("retries", 2), backoff_s=0.01)


def test_a_good_reply_is_scored_with_the_rubric_sent(endpoint):
    e = endpoint("ok")
    v = judge(e.url).judge("Why is the sky blue?", "Rayleigh scattering.")
    assert (v.score, v.reason, v.attempts, v.error) == (7.0, "coherent and on topic", 1, None)
    r = e.requests[0]
    assert r["path"] == "/v1/chat/completions" and r["auth"] == "Bearer sekrit"
    assert r["body"]["model"] == "judge-model" and "0 to 10" in r["body"]["messages"][0]["content"]
    assert "Rayleigh scattering." in r["body"]["messages"][1]["content"]


@pytest.mark.parametrize("first", ["429", "500", "malformed", "noscore"])
def test_transient_failures_are_retried(endpoint, first):
    e = endpoint(first, "fenced")
    v = judge(e.url).judge("p", "a")
    assert v.score == 4.0 and v.attempts == 2 and len(e.requests) == 2


def test_a_slow_reply_times_out_and_is_retried(endpoint):
    e = endpoint("slow", "ok")
    v = judge(e.url, timeout=0.5).judge("p", "a")
    assert v.score == 7.0 and v.attempts == 2


def test_persistent_failure_is_unscored_never_invented(endpoint):
    e = endpoint("500", "500", "500", "500")
    v = judge(e.url, retries=2).judge("p", "a")
    assert v.score is None and v.error == "HTTP 500" and v.attempts == 3 and len(e.requests) == 3
    e2 = endpoint("malformed", "malformed", "malformed")
    v2 = judge(e2.url, retries=2).judge("p", "a")
    assert v2.score is None and "unparseable" in v2.error


def test_client_errors_are_not_retried(endpoint):
    e = endpoint("400", "ok")
    v = judge(e.url).judge("p", "a")
    assert v.score is None and v.error == "HTTP 400" and len(e.requests) == 1


def test_unreachable_endpoint_is_unscored(endpoint):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    v = judge(f"http://127.0.0.1:{port}", retries=1).judge("p", "a")
    assert v.score is None and "URLError" in v.error


def test_verdict_parsing():
    assert parse_verdict('{"score": 10, "reason": "x"}') == (10.0, "x")
    for bad in ('{"score": 11}', "no json", '{"reason": "x"}', '{"score": "high"}'):
        with pytest.raises(ValueError):
            parse_verdict(bad)


def test_builtin_scores():
    s = builtin_scores("the cat sat on the mat and the dog sat on the log")
    assert s["distinct_1"] == pytest.approx(8 / 13, abs=1e-4) and s["n_words"] == 13
    assert repetition_rate("a b c d a b c d".split()) == pytest.approx(1 / 5)
    assert builtin_scores("")["coherence"] == 0 and builtin_scores("")["english_rate"] == 0


def test_english_rate_is_the_share_of_letters_in_real_words():
    assert builtin_scores("the cat sat on the mat")["english_rate"] == 1.0
    # "rivers carry salt" are 15 real letters; "qzxwv pkjqx" 10 invented ones.
    s = builtin_scores("rivers carry salt qzxwv pkjqx")
    assert s["english_rate"] == 0.6 and s["n_words"] == 5
    assert builtin_scores("qzx vbnm plokij wertyu asdfgh")["english_rate"] == 0.0
