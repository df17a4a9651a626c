"""``llmkernels generate`` and ``llmkernels chat`` end to end, in a subprocess.

The model directory is :func:`llmkernels.text.write_tiny_model`'s (random weights, byte-level
tokenizer, chat template); the reference is the in-process text API on the same directory.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import llmkernels as lk
import pytest
from conftest import run_interpreter
from llmkernels.text import write_tiny_model

TIMEOUT = 120


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(write_tiny_model(tmp_path_factory.mktemp("cli_model"), seed=3))


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_interpreter(
        "-m", "llmkernels", *args, stdin=stdin, timeout=TIMEOUT, env={"PYTHONIOENCODING": "utf-8"}
    )


def test_generate_streams_the_text_and_reports_speed(model_dir: Path) -> None:
    model, tok = lk.load(model_dir)
    expected = lk.generate(model, tok, [{"role": "user", "content": "Hello"}], max_tokens=24)
    p = run("generate", "--model", str(model_dir), "--prompt", "Hello", "--max-tokens", "24")
    assert p.returncode == 0, p.stderr
    assert p.stdout == expected + "\n"
    assert re.search(r"Prompt: \d+ tokens, [\d.]+ tokens-per-sec", p.stderr)
    assert re.search(r"Generation: 24 tokens, [\d.]+ tokens-per-sec", p.stderr)
    assert re.search(r"Peak memory: [\d.]+ GB", p.stderr)

    raw = lk.generate(model, tok, "Hello", max_tokens=10, temperature=0.8, top_p=0.9, seed=5)
    p = run(
        "generate", "--model", str(model_dir), "--prompt", "Hello", "-n", "10",
        "--temp", "0.8", "--top-p", "0.9", "--seed", "5", "--ignore-chat-template",
        "--dtype", "float32",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout == raw + "\n"


def test_generate_errors(model_dir: Path) -> None:
    p = run("generate", "--model", "meta-llama/Llama-3.2-1B", "--prompt", "x")
    assert p.returncode == 2 and "huggingface-cli download" in p.stderr
    p = run("generate", "--model", str(model_dir), "--prompt", "x", "--temp", "nan")
    assert p.returncode == 2 and "[stream_generate] temperature" in p.stderr
    p = run("generate", "--model", str(model_dir))
    assert p.returncode == 2 and "--prompt" in p.stderr


def test_max_prompt_tokens(model_dir: Path) -> None:
    """--max-prompt-tokens refuses a longer prompt (generate; chat: the conversation) by name;
    a prompt over max_position_embeddings (512) runs with transformers' warning."""
    p = run("generate", "--model", str(model_dir), "--prompt", "Hello there", "-n", "2",
            "--ignore-chat-template", "--max-prompt-tokens", "5")  # fmt: skip
    assert p.returncode == 2 and p.stdout == ""
    assert "error: [stream_generate] the prompt has" in p.stderr
    assert "over max_prompt_tokens = 5" in p.stderr
    p = run("chat", "--model", str(model_dir), "--max-prompt-tokens", "5", stdin="Hello\n")
    assert p.returncode == 2 and "error: [chat] the prompt has" in p.stderr
    p = run("generate", "--model", str(model_dir), "--prompt", "ab" * 300, "-n", "1",
            "--ignore-chat-template")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "UserWarning: [stream_generate] the prompt's sequence length" in p.stderr


def test_chat_from_stdin_keeps_the_cache(model_dir: Path) -> None:
    model, tok = lk.load(model_dir)
    session = lk.ChatSession(model, tok)
    replies, prefilled = [], []
    for turn in ("Hi there", "And then?", "Bye"):
        replies.append("".join(r.text for r in session.send(turn, max_tokens=12)))
        prefilled.append(session.prefilled)
    p = run("chat", "--model", str(model_dir), "-n", "12", stdin="Hi there\nAnd then?\nBye\n")
    assert p.returncode == 0, p.stderr
    for reply in replies:
        assert reply in p.stdout
    got = [int(n) for n in re.findall(r"Prompt: (\d+) tokens", p.stderr)]
    assert got == prefilled
    # turns after the first prefill only their new tokens, not the whole conversation
    full = len(tok.apply_chat_template(session.messages[:-1]))
    assert got[0] == prefilled[0] and max(got[1:]) < full / 2
    p = run("chat", "--model", str(model_dir), "-n", "4", stdin="hello\n/reset\nhello\nq\n")
    assert p.returncode == 0, p.stderr
    first, second = re.findall(r"Prompt: (\d+) tokens", p.stderr)
    assert first == second  # /reset starts a new conversation


def test_generate_with_quantized_weights_and_a_bf16_cache(model_dir: Path) -> None:
    """``--dtype int8 --kv-dtype bfloat16`` gives what the text API gives with the same
    options."""
    model, tok = lk.load(model_dir, dtype="int8")
    expected = lk.generate(model, tok, "Hello", max_tokens=12, kv_dtype="bfloat16", temperature=0.0)
    p = run(
        "generate", "--model", str(model_dir), "--prompt", "Hello", "-n", "12", "--temp", "0",
        "--ignore-chat-template", "--dtype", "int8", "--kv-dtype", "bfloat16",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stdout == expected + "\n"


def test_user_errors_print_no_traceback(model_dir: Path, tmp_path: Path) -> None:
    """A closed stdout (`| head -c 10`), non-UTF-8 stdin and a chat template that raises:
    a one-line error (or a quiet end), never a Python traceback."""
    import os
    import shutil
    import sys

    from conftest import ROOT

    # stdout closed early: generate ends quietly (status 0), no BrokenPipeError traceback
    cmd = [sys.executable, "-m", "llmkernels", "generate", "--model", str(model_dir)]
    cmd += ["-p", "Hello", "-n", "200", "--ignore-chat-template"]
    producer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    assert producer.stdout is not None
    producer.stdout.read(3)
    producer.stdout.close()  # the reader goes away
    _, err = producer.communicate(timeout=TIMEOUT)
    assert producer.returncode == 0 and b"Traceback" not in err, err.decode()
    # non-UTF-8 bytes on stdin
    p = subprocess.run(
        [*cmd[:-5], "-p", "-"],
        input=b"caf\xe9 au lait",
        capture_output=True,
        cwd=ROOT,
        timeout=TIMEOUT,
        env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        check=False,
    )
    assert p.returncode == 2 and b"not UTF-8" in p.stderr and b"Traceback" not in p.stderr
    # a template's raise_exception (no system role) in chat --system
    d = tmp_path / "strict"
    shutil.copytree(model_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    (d / "chat_template.jinja").unlink(missing_ok=True)
    p = run("chat", "--model", str(d), "--system", "be brief", "-n", "4", stdin="hi\n")
    assert p.returncode == 2 and "error: System role not supported" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_version_and_the_name_in_the_usage(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from llmkernels.__main__ import main

    p = run("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"llmkernels {lk.__version__}"
    for argv0, prog in (
        ("/venv/bin/llmkernels", "llmkernels"),
        ("x/__main__.py", "python -m llmkernels"),
    ):
        monkeypatch.setattr("sys.argv", [argv0])
        with pytest.raises(SystemExit):
            main(["--help"])
        assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def test_missing_text_extra_is_one_line(model_dir: Path) -> None:
    """Without the tokenizers package (the [text] extra) the command says what to install."""
    code = (
        "import sys; sys.modules['tokenizers'] = None\n"
        "from llmkernels.__main__ import main\n"
        f"sys.exit(main(['generate', '--model', {str(model_dir)!r}, '--prompt', 'x']))\n"
    )
    p = run_interpreter("-c", code, timeout=TIMEOUT)
    assert p.returncode == 2, p.stderr
    assert "pip install 'llmkernels[text]'" in p.stderr and "Traceback" not in p.stderr


def test_ctrl_c_stops_the_reply_not_the_chat(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Ctrl-C during a reply ends that reply; the partial reply stays in the conversation and
    the next turn goes on from it."""
    from llmkernels.__main__ import main

    send = lk.ChatSession.send
    seen: list[list[dict]] = []

    def interrupted_send(self, content, *args, **kw):
        seen.append([dict(m) for m in self.messages])
        for i, r in enumerate(send(self, content, *args, **kw)):
            if i == 2 and len(seen) == 1:
                raise KeyboardInterrupt
            yield r

    monkeypatch.setattr(lk.ChatSession, "send", interrupted_send)
    lines = iter(["Hi there", "And then?", "q"])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(lines))
    assert main(["chat", "--model", str(model_dir), "-n", "8"]) == 0
    err = capsys.readouterr().err
    assert err.count("[interrupted]") == 1
    assert len(seen) == 2 and seen[1][-1]["role"] == "assistant"  # the partial reply joined
    assert seen[1][-1]["content"]
