"""Scale-out on Ray, end to end on one machine: ``python examples/ray_scale_out.py``.

Starts a local Ray cluster on 127.0.0.1, then

1. generates a small dataset of prompts with Ray Data (``llmkernels.on_ray.Generator``: each
   worker loads the model once and generates its batches);
2. serves the model with Ray Serve (``llmkernels.on_ray.serve_app``: the OpenAI-compatible app
   of ``llmkernels serve`` in each replica) and asks it with OpenAI's client.

``--model DIR`` for your model directory (default: the example model that ships with the
package). Needs ``pip install "llmkernels[ray]" openai``.
"""

from __future__ import annotations

import argparse
import socket

import llmkernels as lk
import openai
import ray
from llmkernels.on_ray import Generator, serve_app
from ray import serve

PROMPTS = ["What is a list?", "Hello", "Tell me about loops in Python.", "Why?"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the example)")
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    model_dir = args.model or lk.example_model()

    ray.init(
        address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
        object_store_memory=128 << 20, log_to_driver=False,
    )  # fmt: skip
    try:
        # 1. Ray Data: one model per worker, a batch of prompts per call
        ds = ray.data.from_items([{"prompt": p} for p in PROMPTS])
        out = ds.map_batches(
            Generator,
            fn_constructor_kwargs={
                "model_dir": model_dir, "max_tokens": args.max_tokens, "temperature": 0,
            },
            batch_size=2,
            concurrency=1,
            num_cpus=1,
        )  # fmt: skip
        for row in out.iter_rows():
            print(f"[ray data] {row['prompt']!r} -> {row['generated_text']!r}")

        # 2. Ray Serve: the OpenAI-compatible app in a replica, behind Ray's HTTP proxy
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(serve_app(model_dir, model_id="model", ctx=512), route_prefix="/")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reply = client.chat.completions.create(
            model="model",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=args.max_tokens,
            temperature=0,
        )
        print(f"[ray serve] {PROMPTS[0]!r} -> {reply.choices[0].message.content!r}")
        serve.shutdown()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
