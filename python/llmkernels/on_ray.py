"""Scale-out on Ray, when one machine is not enough (``pip install "llmkernels[ray]"``).

* Offline batch generation over a dataset with **Ray Data**: :class:`Generator` is a
  ``map_batches`` class, so each Ray worker loads the model once and generates for every batch
  it is given (one left-padded batch per call, as :func:`llmkernels.generate` does)::

      import ray
      from llmkernels.on_ray import Generator

      ds = ray.data.from_items([{"prompt": p} for p in prompts])
      out = ds.map_batches(
          Generator,
          fn_constructor_kwargs={"model_dir": "path/to/model", "max_tokens": 64},
          batch_size=16,
          concurrency=2,  # workers, each with its own copy of the model
      )
      for row in out.iter_rows():
          print(row["prompt"], "->", row["generated_text"])

* Serving replicas with **Ray Serve**: :func:`serve_app` wraps the same OpenAI-compatible app
  as ``llmkernels serve`` (:func:`llmkernels.serve.create_app`, continuous batching inside each
  replica); Ray's proxy spreads the requests over the replicas::

      from ray import serve
      from llmkernels.on_ray import serve_app

      serve.run(serve_app("path/to/model", num_replicas=2), route_prefix="/")
      # any OpenAI client: base_url="http://127.0.0.1:8000/v1"

Each worker or replica runs the model on ``threads`` threads and asks Ray for as many CPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from . import set_num_threads
from .text import generate, load

__all__ = ["Generator", "serve_app"]


class Generator:
    """A Ray Data ``map_batches`` class: the model of ``model_dir`` loaded once per worker
    (``dtype`` as in :func:`llmkernels.load`), then, per batch, ``batch[prompt_column]`` (texts,
    or chat conversations) generated as one batch into ``batch[output_column]``. ``max_tokens``
    and ``sampling`` (``temperature``, ``top_k``, ``top_p``, ``min_p``, ``repetition_penalty``,
    ``seed``, ``stop``) are :func:`llmkernels.generate`'s, with its defaults (the checkpoint's
    ``generation_config.json``; ``temperature=0`` is greedy). The other columns pass through."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        *,
        dtype: Any = None,
        max_tokens: int = 256,
        prompt_column: str = "prompt",
        output_column: str = "generated_text",
        threads: int | None = None,
        **sampling: Any,
    ) -> None:
        if threads is not None:
            set_num_threads(threads)
        self.model, self.tokenizer = load(model_dir, dtype=dtype, progress=False)
        self.max_tokens = max_tokens
        self.prompt_column, self.output_column = prompt_column, output_column
        self.sampling = sampling

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.prompt_column not in batch:
            raise KeyError(
                f"[Generator] the batch has no column {self.prompt_column!r} (columns: "
                f"{', '.join(batch)}): set prompt_column"
            )
        prompts = [p if isinstance(p, str) else list(p) for p in batch[self.prompt_column]]
        texts = (
            generate(self.model, self.tokenizer, prompts, self.max_tokens, **self.sampling)
            if prompts
            else []
        )
        out = dict(batch)
        out[self.output_column] = np.array(texts, dtype=object)
        return out


def serve_app(
    model_dir: str | os.PathLike[str],
    *,
    dtype: Any = None,
    model_id: str | None = None,
    num_replicas: int = 1,
    threads: int = 1,
    **app_options: Any,
) -> Any:
    """A Ray Serve application of ``num_replicas`` replicas, each loading the model of
    ``model_dir`` (``dtype`` as in :func:`llmkernels.load`) and serving it with
    :func:`llmkernels.serve.create_app` (``app_options``: its ``max_sequences``,
    ``queue_size``, ``ctx``, ``kv_dtype``, ``api_key``, ...) on ``threads`` threads (the CPUs
    each replica asks Ray for). Run it with ``serve.run(serve_app(...), route_prefix="/")``."""
    from ray import serve

    model_dir = os.fspath(model_dir)
    name = model_id or Path(model_dir).name

    def build() -> Any:  # runs in each replica
        from .serve import create_app

        set_num_threads(threads)
        model, tokenizer = load(model_dir, dtype=dtype, progress=False)
        return create_app(model, tokenizer, model_id=name, **app_options)

    deployment = serve.deployment(
        serve.ingress(build)(),
        name="llmkernels",
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": threads},
    )
    return deployment.bind()
