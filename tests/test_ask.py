"""`ask`: grounded answers from the notes, with the real daemon, the real generator engine and a
real chat model (SmolLM2-135M-Instruct from PyPI, tests/chat_model.py), over the socket and
through ragctl. Answers are short (max_tokens) to keep the CPU time modest; greedy decoding
(temperature 0) makes the model's answers repeatable."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

import chat_model
from conftest import BM25_ONLY, bulk_embedding_stopped, engine_config, ragctl
from ragd import protocol as P
from ragd.search.ask import DONT_KNOW, citations

NOTES = {
    "Sourdough.md": "# Sourdough\n\n## Baking day\n\nFeed the starter the night before. Mix 500 g "
                    "flour, 350 g water and 100 g starter, rest four hours, shape the loaf and "
                    "let it proof overnight in the fridge.\n\nBake the sourdough at 250 °C for "
                    "40 minutes in a Dutch oven, lid on for the first 20 minutes.\n",
    "Tomatoes.md": "# Tomatoes\n\nTomatoes need six hours of direct sun a day. Water them at the "
                   "roots in the morning, never on the leaves, and tie the stems to stakes once "
                   "they reach 30 cm.\n",
    "Bicycle.md": "# Bicycle maintenance\n\nPump the road bike tyres to 6 bar before every long "
                  "ride. Oil the chain every 300 km and after riding in the rain.\n",
    "Passport.md": "# Passport renewal\n\nThe passport expires in March 2027. Renewal takes about "
                   "six weeks: book the appointment at the town hall and bring two photos and the "
                   "old passport.\n",
}
ANSWERED = "How many hours of sun do tomatoes need?"
OUT_OF_SCOPE = "Who won the football world cup in 1998?"
LONG = "Describe every step of baking the sourdough, in detail."


@pytest.fixture(scope="session")
def generator_model() -> Path:
    try:
        return chat_model.ensure()
    except chat_model.ChatModelError as e:
        pytest.fail(f"no chat model for the ask tests:\n{e}", pytrace=False)


def vault(root: Path) -> Path:
    root.mkdir()
    for name, text in NOTES.items():
        (root / name).write_text(text)
    return root


def generator_daemon(make_daemon, tmp_path, extra: str = ""):
    root = vault(tmp_path / "notes")
    chat_model.install(tmp_path / "data")  # found as installed: `model` is a registry name
    return make_daemon(sources=[{"name": "notes", "path": str(root)}], extra=(
        BM25_ONLY + f'[generator]\nmodel = "{chat_model.NAME}"\n' + extra))


def wait_generator(d, restarts: int = 0, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        g = d.call("status")["engines"]["generator"]
        if g["state"] == "ready" and g["restarts"] >= restarts:
            return g
        assert g["state"] != "failed", g["reason"]
        assert time.monotonic() < deadline, f"the generator is not ready: {g}"
        time.sleep(0.1)


def ask_stream(d, **args) -> tuple[list[dict], dict]:
    """(the non-final replies' results, the final result) of one ask over the socket."""
    events, final = [], None
    with d.client(timeout=300) as c:
        req = c.send("ask", **args)
        for reply in c.replies(req):
            if reply.get("final", True):
                final = reply["result"]
            else:
                events.append(reply["result"])
    return events, final


def test_citations_are_read_as_the_model_writes_them():
    assert citations("Bake at 250 °C [2]. Proof overnight [1][2].", 3) == [2, 1]
    assert citations("See [1, 3] and [3; 2].", 3) == [1, 3, 2]
    assert citations("Nothing cited; [4] is not a source, [0] neither, [x] no.", 3) == []
    assert citations("An array a[1] is cited too", 1) == [1]
    assert citations("Yes [1].", 1) == [1]
    assert citations("- Tomatoes need six hours of sun [1]", 1, ("Tomatoes",)) == [1]


def test_answers_written_to_look_cited_are_not_grounded():
    """What a small model writes when it has nothing to cite: a made-up answer followed by
    the prompt's list of notes echoed ("[1] Cats [2] Plants", the worked example's), a list
    of the sources, a Markdown reference link. None of it cites a note."""
    heads = ("Tomatoes", "Passport renewal")
    assert citations("New South Wales [1] Cats [2] Plants", 2, heads) == []
    assert citations("Canberra.\n\n[1] Cats\n[2] Plants", 2, heads) == []
    assert citations("[1] Tomatoes\n[2] Passport renewal", 2, heads) == []
    assert citations("It is Sydney [1] Tomatoes [2] Passport renewal", 2, heads) == []
    assert citations("1. [1]\n2. [2]", 2, heads) == []
    assert citations("See the [Task Filters][1] page for more.", 2, heads) == []
    assert citations("[1]: https://example.org/filters", 2, heads) == []
    assert citations("See [1](https://example.org).", 2, heads) == []
    assert citations("Renew it six weeks ahead [3].", 2, heads) == []  # no source 3
    # while the answer is still coming, a marker that may yet become an echo is not counted
    assert citations("Water them in the morning [1]", 2, heads, final=False) == []
    assert citations("Water them in the morning [1] Toma", 2, heads, final=False) == []
    assert citations("Water them in the morning [1].", 2, heads, final=False) == [1]


def test_ask_answers_from_the_notes_and_cites_the_right_file(make_daemon, tmp_path,
                                                             generator_model):
    d = generator_daemon(make_daemon, tmp_path)
    with d:
        d.wait_idle()
        g = wait_generator(d)
        assert g["model"] == chat_model.NAME and g["context"] == 4096
        assert g["engine"].startswith("bundled") and Path(g["model_path"]).is_file()
        assert os.path.basename(os.path.realpath(f"/proc/{g['pid']}/exe")).startswith("python")

        events, res = ask_stream(d, question=ANSWERED, max_tokens=32)
        notes_event = events[0]
        assert notes_event["used"] == len(notes_event["sources"]) >= 1
        assert Path(notes_event["sources"][0]["path"]).name == "Tomatoes.md"
        assert events[1] == {"writing": True}
        # while the answer is held back (nothing cited yet): progress, then only text
        held = [e for e in events[2:] if "delta" not in e]
        assert all(set(e) == {"writing", "tokens"} and e["tokens"] > 0 for e in held), held
        deltas = [e["delta"] for e in events[2:] if "delta" in e]
        assert deltas and all(set(e) == {"delta"} for e in events[2 + len(held):])
        assert res["grounded"] is True, res
        assert res["answer"] == "".join(deltas).strip()
        cited = [Path(c["path"]).name for c in res["citations"]]
        assert cited == ["Tomatoes.md"], res
        assert "6" in res["answer"] or "six" in res["answer"].lower(), res["answer"]
        c = res["citations"][0]
        assert (c["line_start"], c["line_end"]) == (3, 3)
        assert [s["n"] for s in res["sources"]] == list(range(1, res["used"] + 1))
        assert res["sources"][0]["text"].startswith("Tomatoes need six hours")
        t = res["timings"]
        assert t["prompt_tokens"] > 0 and 0 < t["tokens"] <= 32
        assert t["retrieval_ms"] <= t["first_token_ms"] <= t["first_shown_ms"] <= t["total_ms"]

        # Nothing in the notes: no model call, no stream, the plain answer.
        events, res = ask_stream(d, question=OUT_OF_SCOPE, max_tokens=32)
        assert events == []
        assert res["answer"] == DONT_KNOW and res["grounded"] is False
        assert res["reason"].startswith("nothing relevant") and res["citations"] == []

        # The notes are found, the model answers without citing them (one token cannot cite):
        # not an answer. Nothing of its text was streamed; it is kept apart, labelled.
        events, res = ask_stream(d, question=ANSWERED, max_tokens=1)
        assert events[0]["used"] >= 1 and events[1] == {"writing": True}
        assert not any("delta" in e for e in events)
        assert res["answer"] == DONT_KNOW and res["grounded"] is False
        assert "cites none" in res["reason"] and res["ungrounded_answer"]
        assert "cut off at max_tokens, 1," in res["reason"], res["reason"]
        assert res["timings"]["tokens"] == 1 and res["finish_reason"] == "length"

        # Through ragctl: streamed text, then the numbered sources as path:line-line.
        out = ragctl("--config", d.config, "ask", "--max-tokens", "32", ANSWERED, timeout=300)
        assert out.returncode == 0, out.stderr
        answer, _, sources = out.stdout.partition("\n\nCited (")
        assert "[1]" in answer and DONT_KNOW not in answer
        assert sources.startswith("1 of the ") and "notes given to the model" in sources
        assert f"[1] {tmp_path / 'notes' / 'Tomatoes.md'}:3-3" in sources
        # a line of progress on stderr while the model thinks (here not a terminal: once)
        assert "given to the model; waiting for its answer" in out.stderr, out.stderr
        js = ragctl("--config", d.config, "--json", "ask", "--max-tokens", "32", ANSWERED,
                    timeout=300)
        got = json.loads(js.stdout)
        assert got["grounded"] is True and got["answer"] == answer.strip()
        assert got["citations"][0]["path"].endswith("Tomatoes.md")
        assert got["sources"][0]["text"]  # the chunks used
        out = ragctl("--config", d.config, "ask", OUT_OF_SCOPE, timeout=300)
        assert out.returncode == 0 and out.stdout.startswith(DONT_KNOW + "\n"), out
        out = ragctl("--config", d.config, "ask", "--max-tokens", "1", ANSWERED, timeout=300)
        assert out.stdout.startswith(DONT_KNOW + "\n"), out.stdout  # never the uncited text
        assert "cites none" in out.stdout
        js = json.loads(ragctl("--config", d.config, "--json", "ask", "--max-tokens", "1",
                               ANSWERED, timeout=300).stdout)
        assert js["grounded"] is False and js["ungrounded_answer"]
        st = ragctl("--config", d.config, "status")
        assert f"generator engine: ready  model {chat_model.NAME}" in st.stdout

        # Bad requests get errors; the connection and the daemon go on.
        with d.client() as conn:
            for args, code in (({"question": "  "}, P.BAD_ARGS),
                               ({"question": ANSWERED, "max_tokens": 0}, P.BAD_ARGS),
                               ({"question": ANSWERED, "max_tokens": 4000}, P.BAD_ARGS),
                               ({"question": ANSWERED, "sources": ["nope"]}, P.NOT_FOUND),
                               ({"question": ANSWERED, "stream": True}, P.BAD_ARGS)):
                with pytest.raises(P.DaemonError) as e:
                    conn.call("ask", **args)
                assert e.value.code == code, (args, e.value)
            assert conn.call("ping")["pid"] == d.proc.pid


def test_generator_killed_mid_answer(make_daemon, tmp_path, generator_model):
    d = generator_daemon(make_daemon, tmp_path)
    with d:
        d.wait_idle()
        pid = wait_generator(d)["pid"]
        with d.client(timeout=300) as c:
            req = c.send("ask", question=LONG, max_tokens=400)
            replies = c.replies(req)
            with pytest.raises(P.DaemonError) as e:
                for reply in replies:
                    assert not reply.get("final", True), reply  # no answer may come
                    if reply["result"] == {"writing": True}:  # the model is generating
                        os.kill(pid, signal.SIGKILL)
            assert e.value.code == P.UNAVAILABLE
            assert "generator engine stopped while answering" in e.value.message
            assert c.call("ping")["pid"] == d.proc.pid  # the same connection goes on
        res = d.call("search", query="tomatoes sun")
        assert Path(res["results"][0]["path"]).name == "Tomatoes.md"
        g = wait_generator(d, restarts=1)
        assert g["pid"] != pid and g["restarts"] == 1
        events, res = ask_stream(d, question=ANSWERED, max_tokens=32)
        assert res["grounded"] is True and res["citations"][0]["path"].endswith("Tomatoes.md")


def cpu_ticks(pid: int) -> int:
    """A process's CPU time so far, in clock ticks (user + system)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_a_client_gone_mid_answer_stops_the_generation(make_daemon, tmp_path, generator_model):
    """Ctrl-C on `ragctl ask` while the answer is held back (it has cited nothing yet: with
    a small model, most answers) left the generator writing all its max_tokens — nothing was
    sent, so nothing found the client gone — and the next ask waited behind it. Now the
    stream asks after each held-back token whether the client is there."""
    d = generator_daemon(make_daemon, tmp_path)
    with d:
        d.wait_idle()
        pid = wait_generator(d)["pid"]
        with d.client(timeout=300) as c:
            req = c.send("ask", question=LONG, max_tokens=1000)
            for reply in c.replies(req):
                assert not reply.get("final", True), reply
                if reply["result"] == {"writing": True}:
                    break  # the model has begun: the client goes (the connection closes)
        # the next token finds it gone: the engine goes quiet (a generating one uses 100+
        # ticks a second). Measured in windows until one is quiet, so a loaded machine that
        # delays the next token does not fail it; 1,000 tokens would take over 10 s.
        deadline = time.monotonic() + 10
        while True:
            before = cpu_ticks(pid)
            time.sleep(1.0)
            used = cpu_ticks(pid) - before
            if used < 20:
                break
            assert time.monotonic() < deadline, f"the generator still works: {used} ticks/s"
        assert d.call("ping")["pid"] == d.proc.pid
        events, res = ask_stream(d, question=ANSWERED, max_tokens=32)
        assert res["grounded"] is True, res


def test_ask_without_a_generator_is_unavailable(make_daemon, tmp_path):
    root = vault(tmp_path / "notes")
    d = make_daemon(sources=[{"name": "notes", "path": str(root)}])
    with d:
        d.wait_idle()
        with pytest.raises(P.DaemonError) as e:
            d.call("ask", question=ANSWERED)
        assert e.value.code == P.UNAVAILABLE and "[generator] model" in e.value.message
        out = ragctl("--config", d.config, "ask", ANSWERED)
        assert out.returncode == 1 and "no generator" in out.stderr
        assert "generator" not in d.call("status")["engines"]
        with pytest.raises(P.DaemonError) as e:  # a bad request says so first
            d.call("ask", question=ANSWERED, k=0)
        assert e.value.code == P.BAD_ARGS and "'k' must be between 1 and 50" in e.value.message


def test_notes_are_cut_to_fit_the_context(tmp_path, generator_model, engine_kind):
    """A generator started with a small context: the notes that do not fit are left out, the
    last one that partly fits is cut, and the engine takes the prompt (with room for the
    answer). On both engines, the bundled one and a native llama-server."""
    from ragd.engines.models import resolve
    from ragd.engines.supervisor import Engine
    from ragd.search import ask

    model = resolve(str(generator_model), "generator", tmp_path)
    assert model.context == 8192  # from the GGUF header
    import dataclasses
    model = dataclasses.replace(model, context=512)
    engine = Engine("generator", model, engine_kind.settings(), tmp_path / "run",
                    tmp_path / "logs")
    engine.start()
    try:
        assert engine.wait_ready(60), engine.tail_log()
        engine_kind.check(engine.status())
        long = " ".join(f"Line {i}: the harbour lamp is lit at dusk." for i in range(60))
        results = [{"path": f"/n/{i}.md", "source": "n", "title": str(i), "heading": str(i),
                    "line_start": 1, "line_end": 60, "text": long} for i in range(3)]
        max_tokens = 16
        notes = ask.fit_notes(engine.client, results, "When is the lamp lit?", 512, max_tokens)
        assert len(notes) == 1 and notes[0].cut and notes[0].text.endswith(" …")
        assert len(notes[0].text) < len(long)
        events = list(engine.client.chat_stream({"messages": ask.messages(
            "When is the lamp lit?", notes), "max_tokens": max_tokens, "temperature": 0}))
        timings = next(e["timings"] for e in reversed(events) if e.get("timings"))
        assert timings["prompt_n"] + max_tokens <= 512
        assert timings["prompt_n"] > 512 // 2  # the room was used, not wasted
    finally:
        engine.stop()


def test_ask_while_vectors_are_coming_says_it_does_not_know_yet(make_daemon, tmp_path,
                                                                 generator_model):
    """Below 95% vector coverage the note that answers by meaning may not be embedded yet;
    an answer from what is would look complete (at 43% coverage SmolLM answered "New South
    Wales" to "the capital of Australia", shown as cited). ask says so, before generating."""
    root = vault(tmp_path / "notes")
    chat_model.install(tmp_path / "data")
    for i in range(30):  # enough text that the first vectors leave most still to come
        (root / f"log-{i}.md").write_text(f"# Log {i}\n\n" + "\n\n".join(
            f"Entry {j}: the harbour lamp {i}-{j} was checked and found in order."
            for j in range(12)) + "\n")
    d = make_daemon(sources=[{"name": "notes", "path": str(root)}], extra=(
        engine_config() + f'[generator]\nmodel = "{chat_model.NAME}"\n'))
    with d:
        d.wait_idle()
        wait_generator(d)
        with bulk_embedding_stopped(d):
            events, res = ask_stream(d, question=ANSWERED, max_tokens=32)
            assert events == [], events  # no model call
            assert res["answer"] == DONT_KNOW and res["grounded"] is False
            assert res["reason"].startswith("vectors are still being computed"), res["reason"]
            out = ragctl("--config", d.config, "ask", ANSWERED, timeout=120)
            assert out.returncode == 0 and out.stdout.startswith(DONT_KNOW + "\n"), out
            assert "still being computed" in out.stdout
