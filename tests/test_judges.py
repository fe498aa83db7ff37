"""The external judge against a real HTTP server on 127.0.0.1 speaking chat-completions."""

import json
import logging
import socket
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
                auth = self.headers.get("Authorization")
                outer.requests.append({"path": self.path, "body": body, "auth": auth})
                kind = outer.script.pop(0) if outer.script else "ok"
                if kind == "slow":
                    time.sleep(1.5)
                    kind = "ok"
                if kind in ("429", "500", "400", "408", "429wait"):
                    self.send_response(int(kind[:3]))
                    if kind.startswith("429"):
                        self.send_header("Retry-After", "0.3" if kind == "429wait" else "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                # "echo", "echo_prose" and "401" quote the Authorization header back, as some servers do
                data = {
                    "ok": reply('{"score": 7, "reason": "coherent and on topic"}'),
                    "fenced": reply('Here you go:\n```json\n{"score": 4, "reason": "loose"}\n```'),
                    "malformed": b"{this is not json",
                    "noscore": reply("I think it is pretty good."),
                    "echo": reply(json.dumps({"score": 5, "reason": f"graded for {auth}"})),
                    "echo_prose": reply(f"I will not grade this for {auth}."),
                    "401": json.dumps({"error": {"message": f"Incorrect API key provided: {auth}"}}).encode(),
                }[kind]
                self.send_response(401 if kind == "401" else 200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a "slow" reply whose client timed out and left

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

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
    return ExternalJudge(url, "judge-model", api_key=kw.get("key", "sekrit"), timeout_s=kw.get("timeout", 5),
                         retries=kw.get("retries", 2), backoff_s=kw.get("backoff", 0.01))


def test_a_good_reply_is_scored_with_the_rubric_sent(endpoint):
    e = endpoint("ok")
    v = judge(e.url).judge("Why is the sky blue?", "Rayleigh scattering.")
    assert (v.score, v.reason, v.attempts, v.error) == (7.0, "coherent and on topic", 1, None)
    r = e.requests[0]
    assert r["path"] == "/v1/chat/completions" and r["auth"] == "Bearer sekrit"
    assert r["body"]["model"] == "judge-model" and "0 to 10" in r["body"]["messages"][0]["content"]
    assert "Rayleigh scattering." in r["body"]["messages"][1]["content"]


def test_an_endpoint_without_a_key_gets_no_authorization_header(endpoint):
    e = endpoint("ok")
    assert judge(e.url, key=None).judge("p", "a").score == 7.0
    assert e.requests[0]["auth"] is None


@pytest.mark.parametrize("first", ["429", "408", "500", "malformed", "noscore"])
def test_transient_failures_are_retried(endpoint, first):
    e = endpoint(first, "fenced")
    v = judge(e.url).judge("p", "a")
    assert v.score == 4.0 and v.attempts == 2 and len(e.requests) == 2


def test_retries_back_off_exponentially_and_honour_retry_after(endpoint):
    e = endpoint("500", "500", "ok")
    t = time.perf_counter()
    v = judge(e.url, backoff=0.1).judge("p", "a")
    assert v.score == 7.0 and v.attempts == 3 and time.perf_counter() - t >= 0.1 + 0.2
    e2 = endpoint("429wait", "ok")  # Retry-After: 0.3, longer than the 0.01 s back-off
    t = time.perf_counter()
    assert judge(e2.url).judge("p", "a").attempts == 2 and time.perf_counter() - t >= 0.3


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
    assert v2.score is None and "unparseable" in v2.error and v2.attempts == 3
    e3 = endpoint("slow", "slow")
    v3 = judge(e3.url, retries=1, timeout=0.2).judge("p", "a")
    assert v3.score is None and v3.error.startswith("ReadTimeout") and v3.attempts == 2


def test_client_errors_are_not_retried(endpoint):
    e = endpoint("400", "ok")
    v = judge(e.url).judge("p", "a")
    assert v.score is None and v.error == "HTTP 400" and len(e.requests) == 1


def test_unreachable_endpoint_is_unscored(endpoint):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    v = judge(f"http://127.0.0.1:{port}", retries=1).judge("p", "a")
    assert v.score is None and v.error.startswith("ConnectError") and v.attempts == 2


def test_a_base_url_that_is_not_http_is_refused_at_start():
    with pytest.raises(ValueError, match="not an http"):
        ExternalJudge("localhost:8000/v1", "m")
    with pytest.raises(ValueError, match=r"audit.judge.base_url.*ANDREA_JUDGE_API_KEY"):
        ExternalJudge.from_config({"base_url": "ftp://x/v1", "model": "m", "base_url_env": "ANDREA_JUDGE_BASE_URL",
                                   "model_env": "ANDREA_JUDGE_MODEL", "api_key_env": "ANDREA_JUDGE_API_KEY",
                                   "timeout_s": 1, "retries": 0, "backoff_s": 0})


KEY = "sk-andrea-TEST-7f3c9e1d5b"  # recognisable: it must reach the server and nowhere else


def debug_logging_everywhere(caplog):
    """Every logger at DEBUG, the HTTP libraries' included, so a leak would be captured."""
    for name in (None, "andrea", "httpx2", "httpcore2", "tenacity"):
        caplog.set_level(logging.DEBUG, logger=name)


def leaks(caplog, *texts) -> list[str]:
    """The captured log records (message, arguments, traceback) and texts that hold the key."""
    logged = [f"{r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records]
    return [t for t in [*logged, *map(str, texts)] if KEY in t]


def test_the_api_key_reaches_the_server_and_nothing_else(endpoint, caplog, capfd):
    debug_logging_everywhere(caplog)
    e = endpoint("401", "500", "slow", "echo_prose", "echo", "malformed", "malformed")
    j = judge(e.url, key=KEY, timeout=0.3, retries=3)
    refused = j.judge("p", "a")  # the server's error message quotes the key
    assert refused.score is None and refused.attempts == 1
    assert refused.error == "HTTP 401: Incorrect API key provided: Bearer [redacted]"
    v = j.judge("p", "a")  # 500, time-out, a reply quoting the key without a score, then a score whose reason quotes it
    assert v.score == 5.0 and v.attempts == 4 and v.reason == "graded for Bearer [redacted]"
    unscored = judge(e.url, key=KEY, retries=1).judge("p", "a")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    unreachable = judge(f"http://127.0.0.1:{port}", key=KEY, retries=1).judge("p", "a")
    assert unscored.error.startswith("unparseable") and unreachable.error.startswith("ConnectError")
    assert [r["auth"] for r in e.requests] == [f"Bearer {KEY}"] * 7
    # the HTTP libraries did log at DEBUG (so their records were there to leak into)
    assert any(r.name.startswith("httpcore2") and r.levelno == logging.DEBUG for r in caplog.records)
    assert any("[redacted]" in r.getMessage() for r in caplog.records)  # the retry warnings quote the server
    out, err = capfd.readouterr()
    assert leaks(caplog, refused, v, unscored, unreachable, repr(j), out, err) == []


def test_verdict_parsing():
    assert parse_verdict('{"score": 10, "reason": "x"}') == (10.0, "x")
    for bad in ('{"score": 11}', "no json", '{"reason": "x"}', '{"score": "high"}'):
        with pytest.raises(ValueError):
            parse_verdict(bad)


def test_builtin_scores():
    s = builtin_scores("the cat sat on the mat and the dog sat on the log")
    assert s["distinct_1"] == pytest.approx(8 / 13, abs=1e-4) and s["n_words"] == 13
    # 12 bigrams; "sat on" and "on the" come twice: 10 distinct. Its 10 4-grams are all different.
    assert s["distinct_2"] == pytest.approx(10 / 12, abs=1e-4) and s["repetition"] == 0.0
    # 4-grams: abcd bcda cdab dabc abcd: the fifth repeats the first
    assert repetition_rate("a b c d a b c d".split()) == pytest.approx(1 / 5)
    assert repetition_rate("a a a a a a".split()) == pytest.approx(2 / 3)  # 3 4-grams, 2 repeats
    assert repetition_rate("a a a".split()) == 0.0  # no 4-gram at all
    assert builtin_scores("")["coherence"] == 0 and builtin_scores("")["english_rate"] == 0


def test_english_rate_is_the_share_of_letters_in_real_words():
    assert builtin_scores("the cat sat on the mat")["english_rate"] == 1.0
    # "rivers carry salt" are 15 real letters; "qzxwv pkjqx" 10 invented ones.
    s = builtin_scores("rivers carry salt qzxwv pkjqx")
    assert s["english_rate"] == 0.6 and s["n_words"] == 5
    assert builtin_scores("qzx vbnm plokij wertyu asdfgh")["english_rate"] == 0.0
