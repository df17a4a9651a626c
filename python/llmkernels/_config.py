"""Model configuration for LLaMA-style decoders: :class:`ModelConfig` and the HF key layout.

A :class:`ModelConfig` is built either from llmkernels' own (canonical) field names::

    ModelConfig(dim=4096, n_layers=32, n_heads=32, hidden_dim=11008, vocab_size=32000)

or from a Hugging Face ``LlamaConfig``-style dict (``config.json``, ``config.to_dict()``)
with :meth:`ModelConfig.from_dict`, which accepts both spellings (never mixed).

HF dicts carry many keys that do not matter here (``initializer_range``, ``use_cache``,
token ids, ...); they are ignored. A canonical dict must not contain unknown keys.

RoPE parameters in HF dicts: transformers 5.x writes ``rope_parameters`` (a dict holding
``rope_type`` and ``rope_theta`` plus the scaling keys); transformers 4.x wrote a top-level
``rope_theta`` and an optional ``rope_scaling`` dict. Both are read with transformers 5's
precedence: a non-empty legacy ``rope_scaling`` wins over ``rope_parameters``; ``rope_theta``
inside the dict wins over the top-level key; for ``llama3``/``yarn``/``longrope``,
``original_max_position_embeddings`` is the top-level key if there is one (Phi-3's configs keep
it there), else the dict's, else ``max_position_embeddings``. A key the file leaves out takes
the default of the family's transformers config class (Gemma: tied head, tanh GELU; Gemma 2:
``query_pre_attn_scalar`` 256, caps 50 / 30, windows of 4096; Mistral: windows of 4096; ...).
:attr:`ModelConfig.rope_scaling` is the scaling dict without ``rope_theta`` (``None`` for plain
RoPE); :attr:`ModelConfig.rope_theta` holds the base.

Every error is a :class:`ConfigError` (a ``ValueError``) reading ``"[config] <key>: <problem>"``,
where ``<key>`` is the key as spelled in the input (HF or canonical name), or the file name
for problems with ``config.json`` itself. Sizes are checked before anything else, so absurd
configs (``hidden_size = 2**40``) are refused at once, before any allocation.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from .families import FAMILIES
from .families.base import ConfigError, check_real, config_error, is_int, is_real

__all__ = [
    "MAX_DIMENSION",
    "MAX_PARAMETERS",
    "ConfigError",
    "ModelConfig",
    "block_key_shapes",
    "hf_key_shapes",
    "read_config_json",
]

#: Largest accepted value of any single size (``dim``, ``vocab_size``, ``max_seq_len``, ...).
MAX_DIMENSION = 2**24
#: Largest accepted total parameter count implied by a config (about 68.7 billion).
MAX_PARAMETERS = 2**36
#: Largest accepted ``config.json`` (bytes).
MAX_CONFIG_BYTES = 1 << 20

_NORMS = ("rms", "layer")
# the HF model types that load, with the architecture name transformers saves
MODEL_TYPES = {t: f.architecture for t, f in FAMILIES.items()}
_LAYER_TYPES = ("full_attention", "sliding_attention")
_ACTIVATIONS = ("silu", "gelu_tanh")
_NORM_POSITIONS = ("pre", "post", "sandwich")
_DEFAULT_EPS = {"rms": 1e-6, "layer": 1e-5}  # HF LlamaConfig.rms_norm_eps / nn.LayerNorm
_DEFAULT_THETA = 10000.0
_DEFAULT_MAX_SEQ_LEN = 2048  # HF LlamaConfig.max_position_embeddings

# canonical name -> HF LlamaConfig name (only the fields that have an HF counterpart)
_HF_NAMES: dict[str, str] = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "hidden_dim": "intermediate_size",
    "vocab_size": "vocab_size",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "tie_embeddings": "tie_word_embeddings",
    "max_seq_len": "max_position_embeddings",
}
# keys whose presence marks a dict as HF-style
_HF_MARKERS = frozenset(
    {
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
        "rope_parameters",
        "hidden_act",
    }
)
_HF_REQUIRED = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)
_SIZE_FIELDS = (
    "dim",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "hidden_dim",
    "vocab_size",
    "max_seq_len",
)
# what the number of weights depends on (the sizes but max_seq_len, the norm and bias flags)
_PARAMETER_FIELDS = (
    *(f for f in _SIZE_FIELDS if f != "max_seq_len"),
    "norm",
    "norm_position",
    "attention_bias",
    "o_bias",
    "mlp_bias",
    "tie_embeddings",
    "qk_norm",
)


def _check_size(key: str, value: object) -> int:
    if not is_int(value):
        raise config_error(key, f"must be a positive int, got {type(value).__name__} {value!r:.60}")
    value = int(value)  # type: ignore[call-overload]
    if value <= 0:
        raise config_error(key, f"must be a positive int, got {value}")
    if value > MAX_DIMENSION:
        raise config_error(key, f"{value} exceeds the supported maximum {MAX_DIMENSION} (2**24)")
    return value


def _check_bool(key: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise config_error(key, f"must be true or false, got {type(value).__name__} {value!r:.60}")
    return bool(value)


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise config_error(
            key, f"must be one of {', '.join(map(repr, choices))}, got {value!r:.60}"
        )
    return value


def _check_scaling_values(key: str, scaling: Mapping[str, Any]) -> dict[str, Any]:
    """A plain copy of a RoPE scaling dict: str keys, scalar or list-of-number values."""
    out: dict[str, Any] = {}
    for k, v in scaling.items():
        if not isinstance(k, str):
            raise config_error(key, f"keys must be strings, got {k!r:.60}")
        if isinstance(v, (list, tuple)):
            if not all(is_real(x) for x in v):
                raise config_error(f"{key}[{k!r}]", "must be a list of numbers")
            v = [float(x) for x in v]
        elif isinstance(v, np.ndarray):
            raise config_error(f"{key}[{k!r}]", "must be a list of numbers, not an ndarray")
        elif v is not None and not isinstance(v, (str, bool, numbers.Real)):
            raise config_error(f"{key}[{k!r}]", f"unsupported value of type {type(v).__name__}")
        out[k] = v
    return out


def _parameter_count(
    *,
    dim: int,
    n_layers: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    hidden_dim: int,
    vocab_size: int,
    norm: str,
    norm_position: str,
    attention_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    tie_embeddings: bool,
    qk_norm: bool,
) -> int:
    """Exact parameter count (Python ints: no overflow)."""
    q, kv = n_heads * head_dim, n_kv_heads * head_dim
    norm_size = dim * (2 if norm == "layer" else 1)
    attn = dim * q + 2 * dim * kv + q * dim + ((q + 2 * kv) if attention_bias else 0)
    attn += (dim if o_bias else 0) + (2 * head_dim if qk_norm else 0)
    mlp = 3 * dim * hidden_dim + ((2 * hidden_dim + dim) if mlp_bias else 0)
    layer = attn + mlp + (4 if norm_position == "sandwich" else 2) * norm_size
    head = 0 if tie_embeddings else vocab_size * dim
    return vocab_size * dim + n_layers * layer + norm_size + head


def _normalize(values: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """Validate the canonical ``values`` and return them resolved (no ``None`` sizes).

    ``names`` maps canonical names to the names used in error messages.
    """

    def n(field: str) -> str:
        return names.get(field, field)

    out: dict[str, Any] = dict(values)
    # 1. sizes first: refuse absurd values before anything else looks at them
    for field in _SIZE_FIELDS:
        if field in ("n_kv_heads", "head_dim") and out[field] is None:
            continue
        out[field] = _check_size(n(field), out[field])
    dim, n_heads = out["dim"], out["n_heads"]
    if out["n_kv_heads"] is None:
        out["n_kv_heads"] = n_heads
    if out["head_dim"] is None:
        if dim % n_heads:
            raise config_error(
                n("dim"),
                f"{dim} is not divisible by {n('n_heads')}={n_heads} "
                f"(give {n('head_dim')} explicitly for such a model)",
            )
        out["head_dim"] = dim // n_heads
    if n_heads % out["n_kv_heads"]:
        raise config_error(
            n("n_heads"),
            f"{n_heads} is not a multiple of {n('n_kv_heads')}={out['n_kv_heads']} "
            "(grouped-query attention needs n_heads % n_kv_heads == 0)",
        )
    if out["head_dim"] % 2:
        raise config_error(n("head_dim"), f"must be even for RoPE, got {out['head_dim']}")

    # 2. choices and flags (needed by the parameter count)
    out["norm"] = _check_choice(n("norm"), out["norm"], _NORMS)
    out["norm_position"] = _check_choice(n("norm_position"), out["norm_position"], _NORM_POSITIONS)
    out["model_type"] = _check_choice(n("model_type"), out["model_type"], tuple(MODEL_TYPES))
    if out["o_bias"] is None:
        out["o_bias"] = out["attention_bias"]
    out["activation"] = _check_choice(n("activation"), out["activation"], _ACTIVATIONS)
    for field in (
        "attention_bias",
        "o_bias",
        "mlp_bias",
        "tie_embeddings",
        "qk_norm",
        "norm_unit_offset",
        "embed_scale",
    ):
        out[field] = _check_bool(n(field), out[field])
    if out["sliding_window"] is not None:
        out["sliding_window"] = _check_size(n("sliding_window"), out["sliding_window"])
    if out["layer_types"] is not None:
        types = out["layer_types"]
        if isinstance(types, (str, bytes)) or not isinstance(types, (list, tuple)):
            raise config_error(n("layer_types"), f"must be a list, got {type(types).__name__}")
        if len(types) != out["n_layers"]:
            raise config_error(
                n("layer_types"), f"needs {out['n_layers']} entries, got {len(types)}"
            )
        for t in types:
            _check_choice(n("layer_types"), t, _LAYER_TYPES)
        out["layer_types"] = tuple(types)
    for field in ("attn_softcap", "final_softcap", "attn_scale"):
        if out[field] is not None:
            out[field] = check_real(n(field), out[field], positive=True)

    count = _parameter_count(**{k: out[k] for k in _PARAMETER_FIELDS})
    if count > MAX_PARAMETERS:
        raise config_error(
            n("dim"),
            f"the configuration implies {count:,} parameters, more than the supported "
            f"maximum {MAX_PARAMETERS:,} (2**36)",
        )

    # 3. reals
    if out["norm_eps"] is None:
        out["norm_eps"] = _DEFAULT_EPS[out["norm"]]
    out["norm_eps"] = check_real(n("norm_eps"), out["norm_eps"], positive=False)
    if out["norm_eps"] >= 1.0:  # as the norm modules require
        raise config_error(n("norm_eps"), f"must be < 1, got {out['norm_eps']!r}")
    out["rope_theta"] = check_real(n("rope_theta"), out["rope_theta"], positive=True)

    # 4. RoPE scaling: validated by the same code that computes the frequencies
    scaling = out["rope_scaling"]
    key = n("rope_scaling")
    if scaling is not None:
        if not isinstance(scaling, Mapping):
            raise config_error(key, f"must be a dict or null, got {type(scaling).__name__}")
        scaling = _check_scaling_values(key, scaling)
        if scaling.get("rope_theta") is not None:
            dict_theta = check_real(f"{key}['rope_theta']", scaling["rope_theta"], positive=True)
            theta = out["rope_theta"]
            if theta not in (_DEFAULT_THETA, dict_theta):
                raise config_error(
                    key,
                    f"rope_theta={dict_theta!r} conflicts with {n('rope_theta')}={theta!r}",
                )
            out["rope_theta"] = dict_theta
        scaling.pop("rope_theta", None)
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type in (None, "default") and not (set(scaling) - {"rope_type", "type"}):
            scaling = None  # plain RoPE
        out["rope_scaling"] = scaling
        if scaling is not None:
            from ._rope_scaling import rope_inv_freq

            probe = dict(scaling)
            probe.setdefault("max_position_embeddings", out["max_seq_len"])
            try:
                rope_inv_freq(out["head_dim"], out["rope_theta"], probe)
            except (TypeError, ValueError) as exc:
                msg = str(exc)
                if msg.startswith("[rope_inv_freq] "):
                    msg = msg[len("[rope_inv_freq] ") :]
                raise config_error(key, msg) from None
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The architecture of a LLaMA-style decoder (frozen, keyword-only, validated).

    ``dim``, ``n_layers``, ``n_heads``, ``hidden_dim`` and ``vocab_size`` are required; the
    ``None`` defaults below are resolved on construction, so instances never hold ``None``
    sizes. Equal configs compare and hash equal.

    Attributes:
        dim: model width (HF ``hidden_size``).
        n_layers: number of blocks (HF ``num_hidden_layers``).
        n_heads: query heads (HF ``num_attention_heads``).
        hidden_dim: SwiGLU inner width (HF ``intermediate_size``).
        vocab_size: vocabulary size.
        n_kv_heads: key/value heads (HF ``num_key_value_heads``); ``None`` means ``n_heads``.
        head_dim: per-head width; ``None`` means ``dim // n_heads`` (which must divide).
        norm_eps: normalization epsilon (HF ``rms_norm_eps``); ``None`` means 1e-6 for
            ``norm="rms"`` (HF's LLaMA default) and 1e-5 for ``norm="layer"``.
        rope_theta: RoPE base.
        rope_scaling: ``None`` or a RoPE scaling dict in HF form (``{"rope_type": "llama3",
            "factor": 8.0, ...}``); stored without ``rope_theta``.
        norm: ``"rms"`` (RMSNorm, LLaMA) or ``"layer"`` (LayerNorm with bias).
        norm_position: ``"pre"`` (LLaMA) or ``"post"``.
        attention_bias: q/k/v (and, unless ``o_bias`` says otherwise, o) projections carry
            biases (HF ``attention_bias``; Qwen2: q/k/v only).
        mlp_bias: gate/up/down projections carry biases (HF ``mlp_bias``).
        tie_embeddings: the LM head reuses the embedding (HF ``tie_word_embeddings``).
        max_seq_len: context length (HF ``max_position_embeddings``).
        model_type: the HF family it loads as and saves to, one of
            :data:`llmkernels.families.FAMILIES` (one block for all; the differences are the
            fields below, and the tensor names of a family's checkpoints).
        sliding_window: ``None`` or ``w``: every layer attends only to the last ``w`` keys
            (Mistral; transformers' semantics, see :func:`llmkernels.attention`'s ``window``).
        o_bias: the output projection carries a bias; ``None`` means ``attention_bias``.
        qk_norm: RMSNorm (eps ``norm_eps``) of each head of q and of k before RoPE (Qwen3).
        activation: the gated MLP's activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU
            with the tanh-approximated GELU, Gemma).
        norm_unit_offset: RMSNorms scale by ``1 + weight`` (Gemma).
        embed_scale: the embeddings are multiplied by ``sqrt(dim)`` rounded to float32 (Gemma).
        layer_types: ``None`` (every layer windowed when ``sliding_window`` is set) or one
            ``"full_attention"`` / ``"sliding_attention"`` per layer (Gemma 2 alternates).
        attn_softcap: attention-logit soft-capping ``c * tanh(s / c)`` (Gemma 2), or ``None``.
        final_softcap: final-logit soft-capping (Gemma 2), or ``None``.
        attn_scale: the attention score scale, ``None`` for ``1 / sqrt(head_dim)`` (Gemma 2:
            ``query_pre_attn_scalar ** -0.5``).

    Raises:
        ConfigError: ``"[config] <field>: <problem>"`` for any invalid value.
    """

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int = None  # type: ignore[assignment]  # resolved to n_heads
    head_dim: int = None  # type: ignore[assignment]  # resolved to dim // n_heads
    hidden_dim: int
    vocab_size: int
    norm_eps: float = None  # type: ignore[assignment]  # resolved per norm
    rope_theta: float = _DEFAULT_THETA
    rope_scaling: dict[str, Any] | None = None
    norm: str = "rms"
    norm_position: str = "pre"
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False
    max_seq_len: int = _DEFAULT_MAX_SEQ_LEN
    model_type: str = "llama"
    sliding_window: int | None = None
    o_bias: bool = None  # type: ignore[assignment]  # resolved to attention_bias
    qk_norm: bool = False
    activation: str = "silu"
    norm_unit_offset: bool = False
    embed_scale: bool = False
    layer_types: tuple[str, ...] | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    attn_scale: float | None = None

    def __post_init__(self) -> None:
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key, value in _normalize(values, {}).items():
            object.__setattr__(self, key, value)

    def __hash__(self) -> int:
        return hash(tuple(json.dumps(v, sort_keys=True) for v in self.to_dict().values()))

    # ---------------------------------------------------------------------------------
    # construction from / conversion to dicts
    # ---------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelConfig:
        """Build from canonical field names or from an HF ``LlamaConfig``-style dict.

        The form is detected from the keys: any HF-only key (``hidden_size``,
        ``num_hidden_layers``, ``rope_parameters``, ...) selects the HF form, in which unknown
        keys are ignored, ``model_type`` must be one of :data:`MODEL_TYPES` (absent: llama) and
        ``hidden_act`` must be ``"silu"``. In the canonical form unknown keys are errors.
        """
        if not isinstance(d, Mapping):
            raise config_error("config", f"must be a dict (JSON object), got {type(d).__name__}")
        for key in d:
            if not isinstance(key, str):
                raise config_error(repr(key), "config keys must be strings")
        if _HF_MARKERS.intersection(d):
            return cls(**_from_hf(d))
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in d if k not in fields]
        if unknown:
            raise config_error(
                unknown[0],
                "unknown key (canonical fields are: " + ", ".join(sorted(fields)) + ")",
            )
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.name not in d
        ]
        if missing:
            raise config_error(missing[0], "missing required key")
        return cls(**dict(d))

    def to_dict(self) -> dict[str, Any]:
        """The canonical fields as a plain dict (``ModelConfig.from_dict`` reads it back)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if out["rope_scaling"] is not None:
            out["rope_scaling"] = dict(out["rope_scaling"])
        return out

    def to_hf_dict(self) -> dict[str, Any]:
        """An HF ``LlamaConfig``-style dict (``LlamaConfig(**d)`` builds the same model).

        RoPE is written in both spellings: transformers 5's ``rope_parameters`` (with
        ``rope_theta`` and ``rope_type`` inside) and 4.x's ``rope_theta`` / ``rope_scaling``.

        Raises:
            ConfigError: for ``norm="layer"`` or ``norm_position="post"``, which HF LLaMA
                cannot express (use :meth:`to_dict` for those).
        """
        if self.norm != "rms" or self.norm_position == "post":
            raise config_error(
                "norm" if self.norm != "rms" else "norm_position",
                "an HF LLaMA config can only describe pre-norm RMSNorm models; "
                "use to_dict() for this configuration",
            )
        family = FAMILIES[self.model_type]
        expressible = family.can_write(self)
        if not expressible:
            raise config_error(
                "model_type",
                f"an HF {self.model_type} config cannot describe attention_bias="
                f"{self.attention_bias}, o_bias={self.o_bias}, mlp_bias={self.mlp_bias}, "
                f"sliding_window={self.sliding_window}; use to_dict() for this configuration",
            )
        scaling = dict(self.rope_scaling) if self.rope_scaling is not None else None
        rope_parameters: dict[str, Any] = {"rope_type": "default"}
        if scaling is not None:
            rope_parameters = dict(scaling)
            rope_parameters.setdefault("rope_type", scaling.get("type", "default"))
        rope_parameters["rope_theta"] = self.rope_theta
        extra = family.hf_extra(self, scaling)
        return extra | {
            "model_type": self.model_type,
            "architectures": [MODEL_TYPES[self.model_type]],
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.hidden_dim,
            "vocab_size": self.vocab_size,
            "hidden_act": "gelu_pytorch_tanh" if self.activation == "gelu_tanh" else "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "rope_parameters": rope_parameters,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_seq_len,
        }

    # ---------------------------------------------------------------------------------
    # derived values
    # ---------------------------------------------------------------------------------

    @property
    def n_params(self) -> int:
        """Total parameter count (embedding, blocks, final norm, LM head unless tied)."""
        return _parameter_count(
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            head_dim=self.head_dim,
            hidden_dim=self.hidden_dim,
            vocab_size=self.vocab_size,
            norm=self.norm,
            norm_position=self.norm_position,
            attention_bias=self.attention_bias,
            o_bias=self.o_bias,
            mlp_bias=self.mlp_bias,
            qk_norm=self.qk_norm,
            tie_embeddings=self.tie_embeddings,
        )

    def layer_window(self, layer: int) -> int | None:
        """The sliding window of layer ``layer`` (``None``: full attention)."""
        if self.layer_types is not None and self.layer_types[layer] != "sliding_attention":
            return None
        return self.sliding_window

    @property
    def fused_projections(self) -> bool:
        """The checkpoint stores q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj``
        (Phi-3): how the block stores them too, so they load as they are."""
        return FAMILIES[self.model_type].fused_projections

    def rope_scaling_dict(self) -> dict[str, Any] | None:
        """``rope_scaling`` completed with ``max_position_embeddings = max_seq_len``.

        This is the ``scaling`` argument for :func:`llmkernels.rope_inv_freq` and
        :func:`llmkernels.rope_attention_factor` (HF reads that length from the model
        config; the kernels read it from the dict). ``None`` for plain RoPE.
        """
        if self.rope_scaling is None:
            return None
        out = dict(self.rope_scaling)
        out.setdefault("max_position_embeddings", self.max_seq_len)
        return out

    def inv_freq(self, seq_len: int | None = None) -> np.ndarray:
        """The model's RoPE inverse frequencies (float64, ``(head_dim // 2,)``)."""
        from ._rope_scaling import rope_inv_freq

        return rope_inv_freq(
            self.head_dim, self.rope_theta, self.rope_scaling_dict(), seq_len=seq_len
        )

    def attention_factor(self) -> float:
        """The cos/sin multiplier of the RoPE scaling (YaRN/longrope), else 1.0."""
        from ._rope_scaling import rope_attention_factor

        return float(rope_attention_factor(self.rope_scaling_dict()))


def _from_hf(d: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical keyword arguments from an HF LlamaConfig-style dict (HF names in errors)."""
    canonical_only = sorted(set(_HF_NAMES) - set(_HF_NAMES.values()) | {"norm", "norm_position"})
    mixed = [k for k in canonical_only if k in d]
    if mixed:
        raise config_error(
            mixed[0], "canonical key in an HF-style config (do not mix the two forms)"
        )
    model_type = d.get("model_type", "llama")
    if not isinstance(model_type, str) or model_type not in MODEL_TYPES:
        raise config_error(
            "model_type",
            f"{model_type!r:.60} is not supported (supported: {', '.join(MODEL_TYPES)})",
        )
    # a key the file leaves out takes the family's transformers default (GemmaConfig ties the
    # head, MistralConfig slides over 4096 keys, ...), not LLaMA's
    family = FAMILIES[model_type]
    d = {**family.hf_defaults, **d}
    # the activation: each family's key (Gemma 2: hidden_activation), SiLU (SwiGLU) or, for the
    # GeGLU families, the tanh GELU
    act_key = family.act_key
    act = d.get(act_key, "silu")
    if isinstance(act, str) and act in family.gelu_names:
        act = "gelu_tanh"
    elif act in ("silu", "swish"):
        act = "silu"
    else:
        supported = "'silu' (SwiGLU)" + (
            " or 'gelu_pytorch_tanh' (GeGLU)" if family.gelu_names else ""
        )
        raise config_error(act_key, f"only {supported} is supported, got {act!r:.60}")
    for key in _HF_REQUIRED:
        if key not in d:
            raise config_error(key, "missing required key")
    names = dict(_HF_NAMES)

    def get(key: str, default: Any) -> Any:
        value = d.get(key, default)
        return default if value is None else value

    max_seq_len = get("max_position_embeddings", _DEFAULT_MAX_SEQ_LEN)
    # RoPE, with transformers 5's precedence (modeling_rope_utils.convert_rope_params_to_dict)
    legacy, params = d.get("rope_scaling"), d.get("rope_parameters")
    rope_key = "rope_scaling" if legacy else "rope_parameters"
    rope = legacy or params or {}
    if not isinstance(rope, Mapping):
        raise config_error(rope_key, f"must be a dict or null, got {type(rope).__name__}")
    rope = dict(rope)
    theta = rope.pop("rope_theta", None)
    theta_key = f"{rope_key}['rope_theta']"
    if theta is None:
        theta, theta_key = get("rope_theta", _DEFAULT_THETA), "rope_theta"
    if d.get("partial_rotary_factor") is not None:
        rope.setdefault("partial_rotary_factor", d["partial_rotary_factor"])
    if rope:
        rope.setdefault("rope_type", rope.get("type", "default"))
        if rope["rope_type"] in ("llama3", "yarn", "longrope"):
            if "original_max_position_embeddings" in d:
                # a top-level value wins over the dict's (transformers'
                # standardize_rope_params; Phi-3's configs keep it there, default 4096)
                rope["original_max_position_embeddings"] = d["original_max_position_embeddings"]
            elif is_int(max_seq_len):
                rope.setdefault("original_max_position_embeddings", max_seq_len)
        if rope["rope_type"] == "default" and not family.partial_rotary_in_plain_rope:
            # transformers' plain RoPE of these families rotates every feature whatever
            # partial_rotary_factor says (its scaled RoPE types and Phi-3 do read it)
            rope.pop("partial_rotary_factor", None)
    names.update(rope_theta=theta_key, rope_scaling=rope_key)
    values = {
        "dim": d["hidden_size"],
        "n_layers": d["num_hidden_layers"],
        "n_heads": d["num_attention_heads"],
        "n_kv_heads": d.get("num_key_value_heads"),
        "head_dim": d.get("head_dim"),
        "hidden_dim": d["intermediate_size"],
        "vocab_size": d["vocab_size"],
        "norm_eps": get("rms_norm_eps", _DEFAULT_EPS["rms"]),
        "rope_theta": theta,
        "rope_scaling": rope or None,
        "norm": "rms",
        "norm_position": "pre",
        "attention_bias": get("attention_bias", False),
        "mlp_bias": get("mlp_bias", False),
        "tie_embeddings": get("tie_word_embeddings", False),
        "max_seq_len": max_seq_len,
        "model_type": model_type,
        "sliding_window": None,
        "o_bias": None,
        "qk_norm": False,
        "activation": act,
        "norm_unit_offset": False,
        "embed_scale": False,
        "layer_types": None,
        "attn_softcap": None,
        "final_softcap": None,
        "attn_scale": None,
    }
    family.read_hf(d, values)
    return _normalize(values, names)


# -------------------------------------------------------------------------------------
# config.json
# -------------------------------------------------------------------------------------


def read_config_json(path: str | os.PathLike[str]) -> ModelConfig:
    """Read an HF (or canonical) ``config.json`` into a :class:`ModelConfig`.

    The file must be a regular file of at most 1 MiB, UTF-8, holding one JSON object without
    duplicate keys.

    Raises:
        ConfigError: ``"[config] <file>: <problem>"`` for an unreadable or malformed file,
            ``"[config] <key>: <problem>"`` for an invalid configuration.
    """
    from ._files import DuplicateKey, no_duplicate_keys, read_small

    name = os.fspath(path)
    # opened first, then checked (a FIFO swapped in cannot block the open): see _files
    raw = read_small(
        name,
        MAX_CONFIG_BYTES,
        lambda problem: config_error(name, problem),
        lambda: config_error(name, "cannot read: no such file"),
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise config_error(name, f"not valid UTF-8 (byte offset {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as exc:
        raise config_error(name, f"duplicate key {exc.key!r:.80} in JSON") from None
    except RecursionError:
        raise config_error(name, "JSON nested too deeply") from None
    except ValueError as exc:
        raise config_error(name, f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise config_error(name, f"must hold a JSON object, got {type(data).__name__}")
    return ModelConfig.from_dict(data)


# -------------------------------------------------------------------------------------
# HF LLaMA state-dict layout
# -------------------------------------------------------------------------------------


def block_key_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF key names and shapes of one decoder layer (no ``model.layers.{i}.`` prefix).

    Linear weights are ``(out, in)`` as in ``torch.nn.Linear``. Biases appear when
    ``attention_bias`` (q, k, v and o) / ``mlp_bias`` (gate, up, down) are set; norm biases
    when ``norm == "layer"``.
    """
    d, q, kv, h = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.hidden_dim
    out: dict[str, tuple[int, ...]] = {}
    attn = (("q", (q, d)), ("k", (kv, d)), ("v", (kv, d)), ("o", (d, q)))
    mlp = (("gate", (h, d)), ("up", (h, d)), ("down", (d, h)))
    if cfg.fused_projections:  # Phi-3
        attn = (("qkv", (q + 2 * kv, d)), ("o", (d, q)))
        mlp = (("gate_up", (2 * h, d)), ("down", (d, h)))
    for name, (n_out, n_in) in attn:
        out[f"self_attn.{name}_proj.weight"] = (n_out, n_in)
        if cfg.o_bias if name == "o" else cfg.attention_bias:
            out[f"self_attn.{name}_proj.bias"] = (n_out,)
    for name, (n_out, n_in) in mlp:
        out[f"mlp.{name}_proj.weight"] = (n_out, n_in)
        if cfg.mlp_bias:
            out[f"mlp.{name}_proj.bias"] = (n_out,)
    if cfg.qk_norm:
        out["self_attn.q_norm.weight"] = (cfg.head_dim,)
        out["self_attn.k_norm.weight"] = (cfg.head_dim,)
    norms = ["input_layernorm", "post_attention_layernorm"]
    if cfg.norm_position == "sandwich":
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for norm in norms:
        out[f"{norm}.weight"] = (d,)
        if cfg.norm == "layer":
            out[f"{norm}.bias"] = (d,)
    return out


def hf_key_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """HF ``LlamaForCausalLM`` state-dict keys and shapes of the whole model.

    ``model.embed_tokens.weight``, every layer's :func:`block_key_shapes` under
    ``model.layers.{i}.``, ``model.norm.weight`` (+ ``.bias`` for LayerNorm) and
    ``lm_head.weight`` unless ``tie_embeddings``.
    """
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.dim)}
    block = block_key_shapes(cfg)
    for i in range(cfg.n_layers):
        for key, shape in block.items():
            out[f"model.layers.{i}.{key}"] = shape
    out["model.norm.weight"] = (cfg.dim,)
    if cfg.norm == "layer":
        out["model.norm.bias"] = (cfg.dim,)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, cfg.dim)
    return out
