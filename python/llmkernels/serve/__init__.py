"""An OpenAI-compatible HTTP server for a model directory: ``llmkernels serve --model DIR``.

Any OpenAI client (the ``openai`` Python package, an editor plugin, an evaluation harness) can
then talk to the model over HTTP::

    llmkernels serve --model path/to/model --port 8000

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
    reply = client.chat.completions.create(
        model="model", messages=[{"role": "user", "content": "Hi"}], max_tokens=20
    )

:func:`create_app` builds the ASGI app (Starlette) for a loaded model; :class:`Engine` runs
the generations with continuous batching (``llmkernels.serve.engine``). Needs the ``serve`` extra:
``pip install "llmkernels[serve]"``.
"""

from __future__ import annotations

from .app import create_app
from .engine import Engine, GenerationRequest, Overloaded

__all__ = ["Engine", "GenerationRequest", "Overloaded", "create_app"]
