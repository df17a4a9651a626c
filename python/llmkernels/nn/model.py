"""The model, :class:`Transformer`: embedding, blocks, final norm and LM head; its caches,
quantization, dtype conversion, Hugging Face checkpoints and ``generate``."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from .. import _core
from .._config import ModelConfig
from ..families import FAMILIES
from .block import TransformerBlock
from .cache import ModelCache, check_cache, check_layers_in_step, holding
from .checkpoint import QuantizingSink, checkpoint_dir, hf_token_ids
from .generation import (
    check_cache_size,
    check_max_tokens,
    generate_step,
    left_align,
    model_inputs,
    progress_bar,
)
from .layers import make_norm
from .module import (
    INIT_STD,
    QUANT_DTYPES,
    SKIP_INIT,
    Module,
    check_kv_dtype,
    check_weight_dtype,
    convert_parts,
    entry,
    entry_name,
    fill_matrix,
    group_arg,
    no_random_init,
    quant_sources,
    seeded_rng,
    to_numpy,
)
from .positions import RopeSchedule, positions_and_mask
from .sampling import Sampling

# The forward that returns attention weights / residual statistics (``return_attention=``,
# ``return_stats=``): llmkernels.inspect sets it when imported (it wraps the model from its own
# side, so this package never imports it).
_tracer: Callable[..., tuple[Any, ...]] | None = None


def set_tracer(fn: Callable[..., tuple[Any, ...]]) -> None:
    """Install ``fn(model, ids, pos, key_mask, cache, last_only, return_attention,
    return_stats)`` as the forward of ``Transformer.__call__`` when it is asked for attention
    weights or residual statistics."""
    global _tracer
    _tracer = fn


class Transformer(Module):
    """A LLaMA-style decoder: token embedding, ``n_layers`` blocks, final norm, LM head (tied to
    the embedding when ``tie_embeddings``). State-dict keys are HF ``LlamaForCausalLM``'s.

    Examples:
        >>> import llmkernels as lk, numpy as np
        >>> model = lk.Transformer({"dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32,
        ...                         "vocab_size": 50}, seed=0)
        >>> model(np.array([[1, 2, 3]])).shape, model.generate([1, 2, 3], 4, progress=False).shape
        ((1, 3, 50), (1, 7))
    """

    _name = "Transformer"
    # bos / eos / pad ids of the checkpoint loaded (from_pretrained), written by save_pretrained
    _token_ids: dict[str, Any] = {}  # noqa: RUF012 - replaced, never mutated

    def __init__(
        self,
        config: Mapping[str, Any] | ModelConfig,
        *,
        seed: int | None = None,
        dtype: Any = None,
        group_size: int = 32,
        embed_dtype: Any = None,
    ) -> None:
        """``dtype``: storage of the projection and embedding matrices (float32, bfloat16,
        float16), or ``"int8"`` / ``"int4"``: projections and LM head quantized in groups of
        ``group_size`` (32, 64, 128) along the input dimension, the embedding stored as
        ``embed_dtype`` (default float32; a float ``dtype`` is used for both)."""
        wdtype = check_weight_dtype(self._name, dtype)
        c = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config)
        quantized = wdtype in QUANT_DTYPES
        group = group_arg(self._name, str(wdtype), group_size)
        edtype = check_weight_dtype(self._name, embed_dtype) if quantized else wdtype
        if edtype in QUANT_DTYPES:
            raise ValueError(f"[{self._name}] embed_dtype must be a float dtype, got {edtype!r}")
        self.config = c
        rng = seeded_rng(seed)
        with entry(self._name):  # (the argument errors of its layers name it)
            self.blocks = [
                TransformerBlock.from_config(
                    c, seed=int(s), layer=i, dtype=wdtype, group_size=group
                )
                for i, s in enumerate(rng.integers(0, 2**63 - 1, size=c.n_layers))
            ]
            self.norm = make_norm(c.norm, c.dim, c.norm_eps, c.norm_unit_offset)
            self._impl = _core.TransformerImpl(
                c.vocab_size,
                c.dim,
                [b._impl for b in self.blocks],
                self.norm._impl,
                c.tie_embeddings,
                float(np.float32(np.sqrt(c.dim))) if c.embed_scale else 0.0,
                c.final_softcap or 0.0,
                edtype,
                wdtype,
                group,
                fn=entry_name(self._name),
            )
        if not SKIP_INIT.get():
            own = self._own_params()
            emb = rng.standard_normal((c.vocab_size, c.dim), dtype=np.float32) * INIT_STD
            np.copyto(own["model.embed_tokens.weight"], emb, casting="unsafe")
            if c.tie_embeddings:
                if quantized:  # the quantized LM head is a quantized copy of the embedding
                    self._impl.assign(self._impl.converted(wdtype, group, self._name))
            else:
                w = rng.standard_normal((c.vocab_size, c.dim), dtype=np.float32) * INIT_STD
                fill_matrix(own, "lm_head", w, group)
        # one rotary schedule for the whole model, as HF's LlamaModel.rotary_emb
        self._rope = RopeSchedule(c.head_dim, c.rope_theta, c.rope_scaling_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """As :meth:`Module.load_state_dict`; with tied embeddings ``lm_head.weight`` (which HF
        lists too) is optional and, when given, must equal ``model.embed_tokens.weight``.

        A quantized model takes its own layout (``X.qweight`` / ``X.scales``, copied bit for
        bit) or float ``X.weight`` matrices, which are quantized as they are loaded (with tied
        embeddings the quantized LM head is then made from the embedding)."""
        sd = dict(state_dict)
        if self.config.tie_embeddings and self.dtype in QUANT_DTYPES:
            fn = "Transformer.load_state_dict"
            head = sd.pop("lm_head.weight", None)
            emb = sd.get("model.embed_tokens.weight")
            if head is not None and emb is not None:
                if not np.array_equal(to_numpy(head), to_numpy(emb)):
                    raise ValueError(
                        f"[{fn}] lm_head.weight: embeddings are tied, so it must equal "
                        "model.embed_tokens.weight"
                    )
            # the quantized head follows a new embedding unless its own codes are given
            remake = emb is not None and "lm_head.qweight" not in sd and "lm_head.scales" not in sd
            own = self.state_dict()
            sd, _ = quant_sources(fn, own, sd, self._group_size())
            derived = {"lm_head.qweight", "lm_head.scales"} if remake else set()
            missing = [k for k in own if k not in sd and k not in derived]
            unexpected = [k for k in sd if k not in own]
            if strict and (missing or unexpected):
                raise KeyError(f"[{fn}] missing keys {missing}; unexpected keys {unexpected}")
            if remake:  # the head is made from the new embedding: check that it can be, first
                stored = own["model.embed_tokens.weight"].dtype  # as the model will hold it
                with np.errstate(over="ignore"):
                    e = np.asarray(to_numpy(emb)).astype(stored).astype(np.float32)
                try:
                    _core.quantize(e, QUANT_DTYPES[self.dtype], self._group_size())
                except ValueError as exc:
                    raise ValueError(
                        f"[{fn}] lm_head (the tied embedding) cannot be quantized: "
                        f"{str(exc).removeprefix('[quantize] ')}"
                    ) from None
            super().load_state_dict(sd, strict=False)
            if remake:
                self._impl.assign(self._impl.converted(self.dtype, self._group_size(), fn))
            return
        if self.config.tie_embeddings:
            head = sd.pop("lm_head.weight", None)
            emb = sd.get("model.embed_tokens.weight")
            if head is not None:
                head_arr = to_numpy(head)
                emb_arr = (
                    to_numpy(emb)
                    if emb is not None
                    else self.state_dict()["model.embed_tokens.weight"]
                )
                if head_arr.shape != emb_arr.shape or not np.array_equal(head_arr, emb_arr):
                    raise ValueError(
                        "[Transformer.load_state_dict] lm_head.weight: embeddings are tied, so it "
                        "must equal model.embed_tokens.weight"
                    )
            own = self.state_dict()
            own.pop("lm_head.weight")
            missing = [k for k in own if k not in sd]
            unexpected = [k for k in sd if k not in own]
            if strict and (missing or unexpected):
                raise KeyError(
                    f"[Transformer.load_state_dict] missing keys {missing}; unexpected keys "
                    f"{unexpected}"
                )
            super().load_state_dict(
                sd | {"lm_head.weight": sd["model.embed_tokens.weight"]}
                if "model.embed_tokens.weight" in sd
                else sd,
                strict=False,
            )
            return
        super().load_state_dict(sd, strict=strict)

    def _children(self) -> Iterator[tuple[str, Module]]:
        for i, block in enumerate(self.blocks):
            yield f"model.layers.{i}", block
        yield "model.norm", self.norm

    def _quant_parts(self) -> list[Any]:
        return [p for block in self.blocks for p in block._quant_parts()] + [self._impl]

    def _group_size(self) -> int:
        return int(self._impl.group_size)

    @property
    def quantization(self) -> dict[str, int] | None:
        """``{"bits": 8 | 4, "group_size": 32 | 64 | 128}`` for a quantized model, else None."""
        if self.dtype not in QUANT_DTYPES:
            return None
        return {"bits": QUANT_DTYPES[self.dtype], "group_size": self._group_size()}

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str],
        *,
        dtype: Any = None,
        group_size: int | None = None,
        progress: bool | None = None,
    ) -> Transformer:
        """Load an HF LLaMA checkpoint directory: ``config.json`` and ``model.safetensors`` (or
        shards with ``model.safetensors.index.json``). Never unpickles; the config and every
        tensor (key, dtype, shape, offsets) are checked from the headers before the model is
        built, so a bad file raises a clear error and nothing is allocated for a config the
        files do not back. The model is then built without random initialisation and each
        tensor is read straight into its storage (bf16/f16 widened chunk by chunk): peak memory
        is the model plus a few MiB.

        ``dtype``: storage of the projection and embedding matrices. ``None`` (default) keeps
        the checkpoint's: bf16 stays bf16 and f16 stays f16 (when every such matrix has that
        dtype; otherwise float32) -- no widened copy. ``"float32"``, ``"bfloat16"`` or
        ``"float16"`` converts while loading, tensor by tensor (round to nearest even).
        ``"int8"`` / ``"int4"`` quantizes the projections and the LM head while loading, a few
        rows at a time (never a float32 copy of a matrix, let alone of the model), in groups of
        ``group_size`` (default 32); the embedding keeps the checkpoint's float dtype. The
        result is bit-identical to loading in float32 and calling :meth:`quantize`. A
        checkpoint written by :meth:`save_pretrained` from a quantized model (its config has
        a ``quantization_config``) loads as it was saved (``dtype`` None or its own).
        Norms and biases are float32 in every case. ``progress``: a tqdm bar over the bytes read
        (default: on for checkpoints over 256 MiB when stderr is a terminal).
        """
        from .._checkpoint import (
            DTYPE_NAMES,
            check_finite_scales,
            checkpoint_weight_dtype,
            is_quantized_key,
            read_pretrained,
        )
        from .._safetensors import load_into

        fn = "from_pretrained"
        wdtype = check_weight_dtype(fn, dtype, allow_none=True)
        if group_size is not None:
            group_arg(fn, "int8", group_size)
        path = checkpoint_dir(path)
        # config and every tensor's key/shape are checked against the headers before any data
        # is read or any weights are allocated
        config, located, quant = read_pretrained(path, with_quantization=True)
        group = 0
        edtype = None
        if quant is not None:  # a quantized checkpoint (save_pretrained of an int8/int4 model)
            saved = f"int{quant.bits}"
            if wdtype not in (None, saved) or group_size not in (None, quant.group_size):
                raise ValueError(
                    f"[{fn}] {path} holds an {saved} model (group_size {quant.group_size}): load "
                    f"it with dtype=None or {saved!r} and no other group_size (a quantized "
                    "checkpoint is not converted)"
                )
            wdtype, group = saved, quant.group_size
        elif wdtype is None:
            wdtype = checkpoint_weight_dtype(located)
        if group_size is not None and wdtype not in QUANT_DTYPES:
            raise ValueError(
                f"[{fn}] group_size is the quantization group of dtype='int8' / 'int4', got "
                f"dtype={wdtype!r}"
            )
        if wdtype in QUANT_DTYPES:
            group = group or (group_size or 32)  # (checked as the model is built)
            emb = located["model.embed_tokens.weight"][1].dtype
            edtype = DTYPE_NAMES.get(emb, "float32")
        with no_random_init(), entry(fn):
            model = cls(config, dtype=wdtype, group_size=group or 32, embed_dtype=edtype)
        own = model.state_dict()
        dests: dict[str, Any] = {}
        for key in located:
            if key in own:
                dests[key] = own[key]
            elif is_quantized_key(key):  # a float matrix into int8 / int4 storage
                base = key[: -len(".weight")]
                dests[key] = QuantizingSink(
                    key, own[base + ".qweight"], own[base + ".scales"], group
                )
        covered = set(dests)
        for key in list(dests):
            if isinstance(dests[key], QuantizingSink):
                base = key[: -len(".weight")]
                covered |= {base + ".qweight", base + ".scales"}
        # the weights were allocated uninitialised: every one must come from the files
        tied = config.tie_embeddings
        derived = {"lm_head.weight"} if tied else set()
        remake_head = tied and wdtype in QUANT_DTYPES and "lm_head.qweight" not in located
        if remake_head:
            derived |= {"lm_head.qweight", "lm_head.scales"}
        unread = [k for k in own if k not in covered and k not in derived]
        if unread:
            raise ValueError(f"[{fn}] {path}: no tensor for {unread[:5]}")
        total = sum(info.offsets[1] - info.offsets[0] for _, info in located.values())
        show = (sys.stderr.isatty() and total > 256 << 20) if progress is None else progress
        bar = progress_bar(total, show, desc="load", unit="B")
        try:
            load_into(located, dests, bar.update)
        finally:
            bar.close()
        for key, (file, _) in located.items():
            if key.endswith(".scales"):  # (a NaN / Inf scale: NaN logits)
                check_finite_scales(file, key, own[key])
        if remake_head:  # tied: the quantized head is made from the embedding just read
            model._impl.assign(model._impl.converted(wdtype, group, fn))
        model._token_ids = hf_token_ids(os.path.join(path, "config.json"))
        return model

    @property
    def dtype(self) -> str:
        """Storage dtype of the projection matrices and LM head: ``"float32"``,
        ``"bfloat16"``, ``"float16"``, ``"int8"`` or ``"int4"`` (quantized: the embedding
        keeps a float dtype, :attr:`embed_dtype`)."""
        return str(self._impl.dtype)

    @property
    def embed_dtype(self) -> str:
        """Storage dtype of the embedding (a float dtype; :attr:`dtype` unless quantized)."""
        return str(self._impl.embed_dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the weights (a tied LM head counted once; a quantized model: codes and
        scales, plus the float embedding, and with tied embeddings the quantized head too)."""
        return sum(
            v.nbytes
            for k, v in self.state_dict().items()
            if not (k == "lm_head.weight" and self.config.tie_embeddings)
        )

    def to(self, dtype: Any) -> Transformer:
        """Convert the weight storage to ``dtype`` (``"float32"``, ``"bfloat16"``,
        ``"float16"``) in place, and return the model. The new storage is filled tensor by
        tensor from the old one, then replaces it (peak memory: both copies). ``"int8"`` /
        ``"int4"`` is :meth:`quantize` with ``bits`` 8 / 4 and group size 32; from int8 / int4
        to a float dtype the matrices are dequantized (exactly: ``code * scale``)."""
        fn = "Transformer.to"
        wdtype = check_weight_dtype(fn, dtype)
        parts = self._quant_parts()
        # (a block or module quantized or converted on its own makes a mixed model: each part
        # is looked at, not only the model's dtype, which reads the LM head's)
        if wdtype == self.dtype and all(str(impl.dtype) == wdtype for impl in parts):
            return self
        if wdtype in QUANT_DTYPES:
            convert_parts(fn, parts, wdtype, 32)
            return self
        quantized = [impl for impl in parts if str(impl.dtype) in QUANT_DTYPES]
        if quantized:  # dequantized in C++, tensor by tensor
            convert_parts(fn, quantized, "float32", 0)
            floats = all(str(impl.dtype) == "float32" for impl in parts)
            if wdtype == "float32" and self.embed_dtype == "float32" and floats:
                return self
        with no_random_init():
            new = Transformer(self.config, dtype=wdtype)
        own = new.state_dict()
        for key, arr in self.state_dict().items():
            if key == "lm_head.weight" and self.config.tie_embeddings:
                continue
            np.copyto(own[key], arr, casting="unsafe")
        self.__dict__.update(new.__dict__)
        return self

    def save_pretrained(self, path: str | os.PathLike[str], *, dtype: Any = None) -> None:
        """Write an HF checkpoint directory that transformers (and :meth:`from_pretrained`)
        load: ``config.json`` (``torch_dtype`` set) and ``model.safetensors``. ``dtype``: the
        dtype the matrices are written in (default: the model's own; norms and biases are
        written in it too, as HF does). A tied LM head is not written (as transformers).

        A quantized model (int8 / int4) is written as it is stored, in llmkernels' documented
        layout (docs/quantization.md): ``X.qweight`` codes (int8, or uint8 nibble pairs) and
        ``X.scales`` (float16) per projection and for the LM head (also with tied
        embeddings), the embedding in its float dtype, norms and biases float32, and a
        ``quantization_config`` in config.json. :meth:`from_pretrained` loads it back
        bit-identically; transformers does not read it (its quant_method is unknown there).
        ``dtype`` must then be None or the model's."""
        from .._safetensors import save_file

        fn = "save_pretrained"
        quant = self.quantization
        wdtype = check_weight_dtype(fn, dtype, allow_none=True) or self.dtype
        if quant is not None and wdtype != self.dtype:
            raise ValueError(
                f"[{fn}] dtype: a quantized ({self.dtype}) model is written as it is stored; "
                f"convert it first (model.to({wdtype!r})) to write {wdtype}"
            )
        keys = self.state_dict().keys()
        if (quant is None and any(k.endswith(".qweight") for k in keys)) or (
            quant is not None and any(k.endswith("_proj.weight") for k in keys)
        ):
            raise ValueError(
                f"[{fn}] the model mixes quantized and float projections (a block or module "
                "was quantized or converted on its own): quantize or convert the whole model "
                "(model.quantize(...), model.to(...)) before saving it"
            )
        out = os.fspath(path)
        os.makedirs(out, exist_ok=True)
        cfg = self.config.to_hf_dict()
        import json

        tensors = {
            k: v
            for k, v in self.state_dict().items()
            if not (k == "lm_head.weight" and self.config.tie_embeddings)
        }
        if quant is not None:
            from .._checkpoint import QuantConfig

            cfg["torch_dtype"] = self.embed_dtype
            cfg["quantization_config"] = QuantConfig(**quant).to_dict()
            write_dtype = None  # every tensor as stored: bit-identical on load
        else:
            cfg["torch_dtype"] = wdtype
            write_dtype = wdtype
        # the special token ids of the checkpoint it was loaded from (transformers builds the
        # embedding's padding row from pad_token_id: a config class's default, Phi3Config's
        # 32000, may be past a small vocabulary)
        cfg.update(self._token_ids)
        pad = FAMILIES[self.config.model_type].default_pad_token_id
        if "pad_token_id" not in self._token_ids and pad is not None:
            if self.config.vocab_size <= pad:
                cfg["pad_token_id"] = None
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
        save_file(os.path.join(out, "model.safetensors"), tensors, dtype=write_dtype)

    def new_cache(
        self, batch: int, max_seq_len: int | None = None, dtype: Any = None
    ) -> ModelCache:
        """Per-layer KV caches for ``batch`` sequences of up to ``max_seq_len`` tokens, keys and
        values stored in ``dtype``: ``"float32"`` (default), ``"bfloat16"`` or ``"float16"``
        (half the memory and the bytes decode reads; see :class:`KVCache`)."""
        kv_dtype = check_kv_dtype("new_cache", "dtype", dtype)
        length = self.config.max_seq_len if max_seq_len is None else max_seq_len
        return ModelCache([b.new_cache(batch, length, kv_dtype) for b in self.blocks])

    def __call__(
        self,
        ids: Any,
        *,
        positions: Any = None,
        mask: Any = None,
        cache: ModelCache | None = None,
        last_only: bool = False,
        return_attention: bool = False,
        return_stats: bool = False,
    ) -> Any:
        """Logits ``(B, T, vocab)`` float32 for token ids ``(B, T)`` (or ``(T,)``), or
        ``(B, 1, vocab)`` with ``last_only``. ``mask``: ``(B, T)`` padding mask (True = real
        token, e.g. left padding for batched prompts).

        ``last_only`` also saves work, as llama.cpp does: the last layer computes the keys and
        values of every token (the cache keeps them) but the query, attention, output
        projection and MLP of the last position only -- a quarter of a 4-layer model's prefill.
        Its logits equal the full forward's last row within rounding (with int8 / int4 weights
        those rows take the decode kernels: activations rounded to int8 per token).

        ``return_attention`` / ``return_stats`` (no cache): run the forward with an observer
        (:func:`llmkernels.inspect.trace`) and return ``(logits, weights)``, ``(logits, stats)``
        or ``(logits, weights, stats)``: ``weights`` a list of ``(B, Hq, T, T)`` arrays, one per
        layer; ``stats`` a :class:`llmkernels.inspect.ResidualStats`.

        ``ids`` may be a tokenizer's output as it is: a ``BatchEncoding`` or a dict with
        ``input_ids`` (and ``attention_mask``, used as ``mask``), NumPy, lists or torch."""
        ids, mask = model_inputs(self._name, ids, mask)
        ids_arr = np.asarray(ids)
        if ids_arr.dtype.kind not in "iu":
            raise TypeError(f"[{self._name}] ids must be integers, got dtype {ids_arr.dtype}")
        if ids_arr.ndim == 1:
            ids_arr = ids_arr[None]
        if ids_arr.ndim != 2:
            raise ValueError(
                f"[{self._name}] ids must have shape (B, T) or (T,), got {ids_arr.shape}"
            )
        b, t = ids_arr.shape  # (their range, and the cache's room: checked by the C++ entry)
        if b == 0 or t == 0:
            raise ValueError(
                f"[{self._name}] ids holds no tokens (shape {ids_arr.shape}): give at least one "
                "token per sequence"
            )
        if cache is not None:
            if not isinstance(cache, ModelCache) or len(cache.layers) != len(self.blocks):
                raise TypeError(f"[{self._name}] cache must come from this model's new_cache()")
        with holding(cache, self._name):  # positions continue from the previous call
            if cache is not None:  # under the lock: another thread may be appending
                for c in cache.layers:
                    check_cache(self._name, c, b)
                check_layers_in_step(self._name, cache)
            pos, key_mask, nxt = positions_and_mask(self._name, b, t, positions, mask, cache)
            if return_attention is not False or return_stats is not False:
                if _tracer is None:  # pragma: no cover - the package's __init__ imports it
                    raise RuntimeError("[Transformer] import llmkernels.inspect first")
                return _tracer(
                    self, ids_arr, pos, key_mask, cache, last_only, return_attention, return_stats
                )
            freqs = self._rope.frequencies(pos)
            for c in cache.layers if cache is not None else []:
                c._begin(nxt)
            logits = self._impl.forward(
                np.ascontiguousarray(ids_arr, dtype=np.int64),
                pos,
                key_mask,
                [c._impl for c in cache.layers] if cache is not None else [],
                bool(last_only),
                freqs,
            )
            for c in cache.layers if cache is not None else []:
                c._commit(nxt)
            self._rope.advance(pos)
        return logits

    def decode(self, ids: Any, caches: Sequence[ModelCache]) -> np.ndarray:
        """One decode step of several independent sequences in one forward: ``ids (B,)``, the
        next token of each, and ``caches``, each sequence's own :class:`ModelCache` (from
        ``new_cache(1, ...)``) holding its tokens so far, at its own length and positions.
        Returns the logits ``(B, vocab)``: row ``b`` is what
        ``model(ids[b:b+1, None], cache=caches[b], last_only=True)[0, -1]`` gives, and each
        cache advances by one token as it would. The projections run once over the B tokens,
        so each weight is read once for all the sequences (a server's continuous batching);
        attention reads each sequence's own cache.

        With int8 / int4 weights every row is bitwise the single-sequence step (activations
        are quantized per token, sums are exact). With float weights the projection kernels
        group tokens, so a row can differ from the single-sequence step in the last bits of
        float32 (and with bf16 weights on AVX512-BF16 / AMX CPUs, above 8 tokens, by bf16
        activation rounding): greedy tokens then agree except at near-ties. A model whose RoPE
        frequencies depend on the sequence length (dynamic NTK, longrope) runs the rows one by
        one, each with its own frequencies.

        Examples:
            >>> import llmkernels as lk, numpy as np
            >>> model = lk.Transformer({"dim": 32, "n_layers": 2, "n_heads": 4,
            ...                         "n_kv_heads": 2, "hidden_dim": 64, "vocab_size": 50},
            ...                        seed=0)
            >>> a, b = model.new_cache(1, 16), model.new_cache(1, 16)
            >>> _ = model([[1, 2, 3]], cache=a); _ = model([[4]], cache=b)
            >>> model.decode([7, 8], [a, b]).shape, a.length, b.length
            ((2, 50), 4, 2)
        """
        fn = "Transformer.decode"
        arr = np.asarray(ids)
        if arr.size == 0:  # [] (no sequence): not floats
            arr = arr.astype(np.int64)
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            raise TypeError(f"[{fn}] ids must be a 1-D array of integer token ids")
        if isinstance(caches, ModelCache) or not isinstance(caches, Sequence):
            raise TypeError(f"[{fn}] caches must be a list of ModelCache, one per sequence")
        if len(caches) != len(arr):
            raise ValueError(f"[{fn}] {len(arr)} ids but {len(caches)} caches")
        for c in caches:
            if not isinstance(c, ModelCache) or len(c.layers) != len(self.blocks):
                raise TypeError(f"[{fn}] each cache must come from this model's new_cache()")
        if len({id(c) for c in caches}) != len(caches):
            raise ValueError(f"[{fn}] a cache appears twice: each sequence needs its own")
        if not len(arr):
            return np.zeros((0, self.config.vocab_size), np.float32)
        ids64 = np.ascontiguousarray(arr, dtype=np.int64)
        with contextlib.ExitStack() as locks:  # (taken in one order: no deadlock)
            for c in sorted(caches, key=id):
                locks.enter_context(holding(c, fn))
            for c in caches:
                check_layers_in_step(fn, c)
                if c.layers[0].batch != 1:
                    raise ValueError(f"[{fn}] each cache holds one sequence (new_cache(1, ...))")
            if self._rope.kind != "static":  # frequencies of each row's own length
                rows = [self._decode_rows(ids64[i : i + 1], [c]) for i, c in enumerate(caches)]
                return np.concatenate(rows)
            return self._decode_rows(ids64, caches)

    def _decode_rows(self, ids: np.ndarray, caches: Sequence[ModelCache]) -> np.ndarray:
        """:meth:`decode` on checked ids and caches, their locks held."""
        pos = np.array([c.next_positions[0] for c in caches], np.int64)
        freqs = self._rope.frequencies(pos[:, None])
        nxt = [p[None] + 1 for p in pos]
        for c, n in zip(caches, nxt, strict=True):
            for layer in c.layers:
                layer._begin(n)
        logits = self._impl.forward_rows(
            ids, pos, [[layer._impl for layer in c.layers] for c in caches], freqs
        )
        for c, n in zip(caches, nxt, strict=True):
            for layer in c.layers:
                layer._commit(n)
        self._rope.advance(pos)
        return logits

    def generate(
        self,
        ids: Any,
        max_new_tokens: int,
        *,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        mask: Any = None,
        progress: bool | None = None,
        kv_dtype: Any = None,
    ) -> np.ndarray:
        """Autoregressive decoding with a KV cache: one prefill, then one C++ call per token.

        ``temperature=0`` is greedy (argmax); otherwise samples from
        ``softmax(logits / temperature)`` restricted to the ``top_k`` tokens, the ``top_p``
        nucleus and the tokens with at least ``min_p`` times the top probability, with a NumPy
        generator seeded by ``seed``. ``repetition_penalty`` divides the positive (multiplies
        the negative) logits of tokens already in the sequence, as in transformers. ``ids``
        ``(B, T)`` (left-padded with ``mask`` for prompts of different lengths; a right-padded
        batch is moved to the left) or a tokenizer's output (``BatchEncoding`` / dict with
        ``input_ids`` and ``attention_mask``). Returns ``(B, T + max_new_tokens)``.
        ``progress``: a tqdm bar (default: on when stderr is a terminal). ``kv_dtype``: the KV
        cache's dtype, ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (see
        :class:`KVCache`). No stopping at EOS here: :func:`llmkernels.generate` works on text
        and stops at EOS and stop strings.
        """
        kv = check_kv_dtype("generate", "kv_dtype", kv_dtype)
        ids, mask = model_inputs("generate", ids, mask)
        ids_arr = np.asarray(ids)
        if ids_arr.ndim == 1:
            ids_arr = ids_arr[None]
        steps = check_max_tokens("generate", "max_new_tokens", max_new_tokens)
        sampling = Sampling.checked(
            "generate", temperature, top_k, top_p, min_p, repetition_penalty, seed
        )
        if ids_arr.ndim != 2 or ids_arr.shape[0] == 0 or ids_arr.shape[1] == 0:
            raise ValueError(
                f"[generate] ids must hold a prompt of at least one token per sequence, "
                f"got shape {ids_arr.shape}"
            )
        if ids_arr.dtype.kind not in "iu":
            raise TypeError(f"[{self._name}] ids must be integers, got dtype {ids_arr.dtype}")
        if ids_arr.min() < 0 or ids_arr.max() >= self.config.vocab_size:  # also for 0 steps
            raise ValueError(f"[generate] ids must be in [0, vocab_size={self.config.vocab_size})")
        ids_arr, mask = left_align("generate", ids_arr, mask)
        b, t = ids_arr.shape
        if steps == 0:
            return ids_arr.astype(np.int64)
        check_cache_size("generate", "max_new_tokens", self.config, b, t, steps)
        cache = self.new_cache(b, t + steps, kv)
        sampler = sampling.sampler(b, self.config.vocab_size)
        sampler.see(ids_arr, mask)
        out = [ids_arr.astype(np.int64)]
        show = sys.stderr.isatty() if progress is None else progress
        bar = progress_bar(steps, show)
        step = generate_step(self, ids_arr, cache, sampler, mask)
        for _ in range(steps):
            out.append(next(step)[:, None])
            bar.update(1)
        step.close()
        bar.close()
        return np.concatenate(out, axis=1)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Transformer(vocab={c.vocab_size}, dim={c.dim}, n_layers={c.n_layers}, "
            f"n_heads={c.n_heads}, n_kv_heads={c.n_kv_heads})"
        )
