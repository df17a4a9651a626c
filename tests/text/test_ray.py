"""Scale-out on Ray (llmkernels.on_ray), on a local Ray cluster this module starts on 127.0.0.1
(2 CPUs, no dashboard, a small object store):

* Ray Data: ``map_batches(Generator, ...)`` over a dataset of prompts gives, per row, the text
  ``lk.generate`` gives for the same batch in this process;
* Ray Serve: ``serve_app`` replicas answer the official ``openai`` client with the text
  ``lk.generate`` gives alone, and list the model.

The test extra installs Ray: these run wherever the suite runs, except under AddressSanitizer
(Ray's own processes cannot take the preloaded sanitizer runtime).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import llmkernels as lk
import openai
import pytest
from conftest import UNDER_ASAN

pytestmark = [
    pytest.mark.skipif(
        UNDER_ASAN,
        reason="Ray starts its own processes (raylet, workers), which cannot take the preloaded "
        "sanitizer runtime; these run in make test",
    ),
    # Ray's own modules warn about their own deprecated settings: not ours to fix
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\b"),
    pytest.mark.filterwarnings(r"ignore::FutureWarning:ray\b"),
]

MODEL_DIR = lk.example_model()
PROMPTS = ["What is a list?", "Hello", "Tell me about loops in Python.", "Hi", "Why?"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=128 << 20,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        configure_logging=False,
    )
    yield ray
    ray.shutdown()


def test_ray_data_generates_each_batch_as_generate(ray_cluster: Any) -> None:
    from llmkernels.on_ray import Generator

    ds = ray_cluster.data.from_items(
        [{"prompt": p, "n": i} for i, p in enumerate(PROMPTS)], override_num_blocks=1
    )
    out = ds.map_batches(
        Generator,
        fn_constructor_kwargs={
            "model_dir": MODEL_DIR,
            "max_tokens": MAX_TOKENS,
            "threads": 1,
            "temperature": 0,
        },
        batch_size=len(PROMPTS),
        concurrency=1,
        num_cpus=1,
    ).take_all()
    model, tok = lk.load(MODEL_DIR)
    expected = lk.generate(model, tok, PROMPTS, MAX_TOKENS, temperature=0)  # the same batch
    assert sorted(r["n"] for r in out) == list(range(len(PROMPTS)))
    for row in out:
        assert row["prompt"] == PROMPTS[row["n"]]
        assert row["generated_text"] == expected[row["n"]]


def test_generator_names_a_missing_column() -> None:
    from llmkernels.on_ray import Generator

    gen = Generator(MODEL_DIR, max_tokens=2)
    with pytest.raises(KeyError, match=r"\[Generator\] the batch has no column 'prompt'"):
        gen({"text": ["Hi"]})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_ray_serve_replicas_answer_openai_clients(ray_cluster: Any) -> None:
    from llmkernels.on_ray import serve_app
    from ray import serve

    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(serve_app(MODEL_DIR, model_id="example", ctx=256), route_prefix="/")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=120)
        assert [m.id for m in client.models.list().data] == ["example"]
        model, tok = lk.load(MODEL_DIR)
        for prompt in PROMPTS[:2]:
            reply = client.completions.create(
                model="example", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
            )
            assert reply.choices[0].text == lk.generate(
                model, tok, prompt, MAX_TOKENS, temperature=0
            )
        messages = [{"role": "user", "content": PROMPTS[0]}]
        chat = client.chat.completions.create(
            model="example", messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        greedy = lk.generate(model, tok, messages, MAX_TOKENS, temperature=0)
        assert chat.choices[0].message.content == greedy
    finally:
        serve.shutdown()


def test_the_example_script_runs() -> None:
    """examples/ray_scale_out.py (the documentation's runnable example), on its own cluster."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "ray_scale_out.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--max-tokens", "6"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("[ray data]") == 4 and "[ray serve]" in proc.stdout, proc.stdout
