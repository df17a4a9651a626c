"""RoPE inverse frequencies and their scaling variants (pure NumPy, float64).

This module is the public implementation of :func:`rope_inv_freq` and
:func:`rope_attention_factor`. It does not depend on the compiled extension.

``scaling`` is a dict in Hugging Face ``rope_scaling`` / ``rope_parameters`` form, e.g.::

    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

The formulas and key names are those of ``transformers.modeling_rope_utils``
(``_compute_linear_scaling_rope_parameters``, ``_compute_dynamic_ntk_parameters``,
``_compute_yarn_parameters``, ``_compute_llama3_parameters``,
``_compute_longrope_parameters``, ``_compute_proportional_rope_parameters``), evaluated in
float64 instead of float32. Values HF reads from the *model config* are read from the dict:

* ``max_position_embeddings``: ``config.max_position_embeddings``;
* ``original_max_position_embeddings``: as in HF (for ``yarn``/``llama3``/``longrope`` it
  falls back to ``max_position_embeddings`` when absent, as HF's config standardization does);
* ``rope_theta``: ``config.rope_parameters["rope_theta"]`` (overrides ``theta``);
* ``partial_rotary_factor``: the rotated dimension is ``int(dim * partial_rotary_factor)``, as
  HF computes it from ``head_dim`` (so ``dim`` plays the role of HF's ``head_dim``).

Supported ``rope_type`` values (the legacy key ``"type"`` is accepted; ``"rope_type"`` wins
when both are present; a missing type means ``"default"``):

``default``, ``linear``, ``dynamic``, ``yarn``, ``llama3``, ``longrope``, ``proportional``
(HF's name for truncated RoPE) and ``p-rope`` (Barbero et al. 2024, "Round and round we go!
What makes Rotary Positional Encodings useful?": keep the highest ``floor(p * dim/2)``
frequencies and set the others to 0, i.e. no rotation).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import _libm

__all__ = ["ROPE_TYPES", "rope_attention_factor", "rope_inv_freq"]

#: The accepted ``rope_type`` values.
ROPE_TYPES: tuple[str, ...] = (
    "default",
    "linear",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
    "proportional",
    "p-rope",
)

_DEFAULT_THETA = 10000.0


# --------------------------------------------------------------------------------------
# argument checking helpers
# --------------------------------------------------------------------------------------


def _is_real(value: object) -> bool:
    """True for int/float and NumPy real scalars, False for bool and everything else."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _type_name(value: object) -> str:
    return type(value).__name__


def _float(fn: str, label: str, value: Any) -> float:
    """float(value), an int past float's range refused with the function and the name."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(
            f"[{fn}] {label} must be finite (got an integer beyond float range)"
        ) from None


_MAX_DIM = 2**24  # as the model config's largest size
_MAX_SEQ_LEN = 2**63  # past every int64 position + 1


def _check_dim(fn: str, dim: object) -> int:
    if not _is_int(dim):
        raise TypeError(f"[{fn}] dim must be an int, got {_type_name(dim)}")
    dim = int(dim)  # type: ignore[arg-type]
    if dim <= 0 or dim % 2:
        raise ValueError(f"[{fn}] dim must be a positive even integer, got {dim}")
    if dim > _MAX_DIM:
        raise ValueError(f"[{fn}] dim must be at most 2**24, got {dim}")
    return dim


def _check_theta(fn: str, theta: object, name: str = "theta") -> float:
    if not _is_real(theta):
        raise TypeError(f"[{fn}] {name} must be a real number, got {_type_name(theta)}")
    value = _float(fn, name, theta)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"[{fn}] {name} must be a positive finite number, got {theta!r}")
    return value


def _check_seq_len(fn: str, seq_len: object) -> int | None:
    if seq_len is None:
        return None
    if not _is_int(seq_len):
        raise TypeError(f"[{fn}] seq_len must be an int or None, got {_type_name(seq_len)}")
    value = int(seq_len)  # type: ignore[arg-type]
    if value < 0:
        raise ValueError(f"[{fn}] seq_len must be >= 0, got {value}")
    if value > _MAX_SEQ_LEN:
        shown = str(value) if value < 10**30 else f"an int of {len(str(value))} digits"
        raise ValueError(f"[{fn}] seq_len must be at most 2**63 (int64 positions), got {shown}")
    return value


class _Scaling:
    """A validated view of a ``scaling`` dict; every error names the function and the key."""

    def __init__(self, fn: str, scaling: Mapping[str, Any] | None) -> None:
        self.fn = fn
        if scaling is None:
            scaling = {}
        if not isinstance(scaling, Mapping):
            raise TypeError(f"[{fn}] scaling must be a dict or None, got {_type_name(scaling)}")
        self.params: Mapping[str, Any] = scaling
        rope_type = scaling.get("rope_type", scaling.get("type", "default"))
        if rope_type is None:
            rope_type = "default"
        if not isinstance(rope_type, str):
            raise TypeError(
                f"[{fn}] scaling['rope_type'] must be a str, got {_type_name(rope_type)}"
            )
        if rope_type not in ROPE_TYPES:
            raise ValueError(
                f"[{fn}] unknown scaling['rope_type'] {rope_type!r}; "
                f"expected one of {', '.join(ROPE_TYPES)}"
            )
        self.rope_type: str = rope_type
        self._validate()

    # -- generic key readers ----------------------------------------------------------

    def has(self, key: str) -> bool:
        return self.params.get(key) is not None

    def _missing(self, key: str) -> ValueError:
        return ValueError(
            f"[{self.fn}] scaling is missing required key {key!r} for rope_type {self.rope_type!r}"
        )

    def real(self, key: str, *, positive: bool = True, allow_zero: bool = False) -> float:
        """The finite real value of a required key (> 0, or >= 0 with allow_zero)."""
        if not self.has(key):
            raise self._missing(key)
        value = self.params[key]
        if not _is_real(value):
            raise TypeError(
                f"[{self.fn}] scaling[{key!r}] must be a real number, got {_type_name(value)}"
            )
        value = _float(self.fn, f"scaling[{key!r}]", value)
        if not math.isfinite(value):
            raise ValueError(f"[{self.fn}] scaling[{key!r}] must be finite, got {value!r}")
        if positive and (value < 0.0 or (value == 0.0 and not allow_zero)):
            bound = ">= 0" if allow_zero else "> 0"
            raise ValueError(f"[{self.fn}] scaling[{key!r}] must be {bound}, got {value!r}")
        return value

    def opt_real(self, key: str) -> float | None:
        """An optional positive finite real key (None when absent or None)."""
        return self.real(key) if self.has(key) else None

    def positions(self, key: str) -> float:
        """A context length key: a positive number (int in every real config)."""
        return self.real(key)

    def original_max(self) -> float:
        """``original_max_position_embeddings``, falling back to ``max_position_embeddings``.

        This mirrors HF's ``standardize_rope_params``, which copies ``config.max_position_
        embeddings`` into the rope dict when the original length is not given.
        """
        if self.has("original_max_position_embeddings"):
            return self.positions("original_max_position_embeddings")
        if self.has("max_position_embeddings"):
            return self.positions("max_position_embeddings")
        raise ValueError(
            f"[{self.fn}] scaling is missing required key 'original_max_position_embeddings' "
            f"(or 'max_position_embeddings') for rope_type {self.rope_type!r}"
        )

    def factor_list(self, key: str) -> np.ndarray:
        if not self.has(key):
            raise self._missing(key)
        value = self.params[key]
        if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
            raise TypeError(
                f"[{self.fn}] scaling[{key!r}] must be a list of numbers, got {_type_name(value)}"
            )
        if not all(_is_real(v) for v in value):
            raise TypeError(f"[{self.fn}] scaling[{key!r}] must be a list of numbers")
        arr = np.asarray(value, dtype=np.float64).reshape(-1)
        if not (np.all(np.isfinite(arr)) and np.all(arr > 0.0)):
            raise ValueError(
                f"[{self.fn}] scaling[{key!r}] must contain positive finite numbers only"
            )
        return arr

    # -- per-type values --------------------------------------------------------------

    def yarn_factor(self) -> float:
        """HF: ``factor``, or ``max_position_embeddings / original`` when factor is None."""
        if self.has("factor"):
            return self.real("factor")
        if self.has("max_position_embeddings"):
            return self.positions("max_position_embeddings") / self.original_max()
        raise self._missing("factor")

    def _validate(self) -> None:
        """Check every key the chosen rope_type reads (dim-independent checks only)."""
        t = self.rope_type
        if self.has("rope_theta"):
            _check_theta(self.fn, self.params["rope_theta"], "scaling['rope_theta']")
        if self.has("partial_rotary_factor"):
            prf = self.real("partial_rotary_factor")
            if prf > 1.0:
                raise ValueError(
                    f"[{self.fn}] scaling['partial_rotary_factor'] must be in (0, 1], got {prf!r}"
                )
        if self.has("max_position_embeddings"):
            self.positions("max_position_embeddings")
        if t in ("linear", "dynamic"):
            self.real("factor")
        if t == "dynamic":
            self.dynamic_max_positions()
        elif t == "yarn":
            self.original_max()
            self.yarn_factor()
            # 0 means "use the default" for the betas and "unset" for mscale (HF truthiness)
            for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
                if self.has(key):
                    self.real(key, allow_zero=True)
            truncate = self.params.get("truncate", True)
            if truncate is not None and not isinstance(truncate, (bool, np.bool_)):
                raise TypeError(
                    f"[{self.fn}] scaling['truncate'] must be a bool, got {_type_name(truncate)}"
                )
            self.opt_real("attention_factor")
        elif t == "llama3":
            self.real("factor")
            low = self.real("low_freq_factor")
            high = self.real("high_freq_factor")
            if high <= low:
                raise ValueError(
                    f"[{self.fn}] scaling['high_freq_factor'] must be greater than "
                    f"scaling['low_freq_factor'], got {high!r} <= {low!r}"
                )
            self.original_max()
        elif t == "longrope":
            self.original_max()
            self.factor_list("short_factor")
            self.factor_list("long_factor")
            if self.has("factor"):
                self.real("factor")
            self.opt_real("attention_factor")
        elif t == "proportional":
            if self.has("factor"):
                self.real("factor")
        elif t == "p-rope":
            if not self.has("p"):
                raise self._missing("p")
            p = self.real("p", positive=False)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"[{self.fn}] scaling['p'] must be in [0, 1], got {p!r}")

    def dynamic_max_positions(self) -> float:
        """The pre-training length for dynamic NTK (HF: ``config.max_position_embeddings``).

        Read from ``original_max_position_embeddings``, else ``max_position_embeddings``.
        """
        return self.original_max()

    def theta(self, theta: float) -> float:
        """``rope_theta`` from the dict, else the ``theta`` argument."""
        if not self.has("rope_theta"):
            return theta
        dict_theta = _float(self.fn, "scaling['rope_theta']", self.params["rope_theta"])
        if theta != _DEFAULT_THETA and dict_theta != theta:
            raise ValueError(
                f"[{self.fn}] theta={theta!r} conflicts with scaling['rope_theta']="
                f"{dict_theta!r}; give only one"
            )
        return dict_theta


# --------------------------------------------------------------------------------------
# public functions
# --------------------------------------------------------------------------------------


def _default_inv_freq(dim: int, base: float) -> np.ndarray:
    """``1 / base**(arange(0, dim, 2) / dim)`` in float64."""
    return 1.0 / _libm.pow(base, np.arange(0, dim, 2, dtype=np.float64) / dim)


def rope_inv_freq(
    dim: int,
    theta: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    *,
    seq_len: int | None = None,
) -> np.ndarray:
    """RoPE inverse frequencies ``1 / theta**(arange(0, dim, 2) / dim)``, optionally scaled.

    Args:
        dim: the rotated dimension (``rotary_dim``; HF's ``head_dim``), a positive even int.
        theta: the RoPE base (HF ``rope_theta``), a positive finite number. A ``"rope_theta"``
            key in ``scaling`` takes precedence (it conflicts only with a non-default
            ``theta``, which raises ``ValueError``).
        scaling: ``None`` or a dict in HF ``rope_scaling`` form; ``scaling["rope_type"]``
            (or legacy ``scaling["type"]``) selects the variant:

            * ``"default"``: no rescaling.
            * ``"linear"`` (``factor``): ``inv_freq / factor``.
            * ``"dynamic"`` (``factor``, ``original_max_position_embeddings`` or
              ``max_position_embeddings``): dynamic NTK. With ``L`` the pre-training length
              and ``s = max(seq_len, L)`` (``s = L`` when ``seq_len`` is None), the base
              becomes ``theta * (factor * s / L - (factor - 1)) ** (dim / (dim - 2))``.
              HF reads ``L`` from ``config.max_position_embeddings``.
            * ``"yarn"`` (``factor``, ``original_max_position_embeddings``; optional
              ``beta_fast`` = 32, ``beta_slow`` = 1, ``truncate`` = True,
              ``attention_factor``, ``mscale``, ``mscale_all_dim``): YaRN's ramp between
              interpolated (``/ factor``) and extrapolated frequencies. When ``factor`` is
              None it is ``max_position_embeddings / original_max_position_embeddings``.
            * ``"llama3"`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
              ``original_max_position_embeddings``): Llama 3.1 wavelength-band scaling.
            * ``"longrope"`` (``short_factor``, ``long_factor`` of length ``dim // 2``,
              ``original_max_position_embeddings``): ``1 / (ext * theta**(arange/dim))`` with
              ``ext = long_factor`` if ``seq_len > original_max_position_embeddings`` else
              ``short_factor``.
            * ``"proportional"`` (``partial_rotary_factor``, optional ``factor``): HF's
              truncated RoPE: keep ``int(partial_rotary_factor * dim // 2)`` frequencies, zero
              the rest, divide by ``factor``; returns ``dim // 2`` values.
            * ``"p-rope"`` (``p`` in [0, 1]): keep the first (highest) ``floor(p * dim / 2)``
              frequencies and set the rest to 0 (no rotation). A ``1e-9`` guard absorbs
              rounding, so ``p=0.29, dim=200`` keeps 29.

            For every type except ``"proportional"``, a ``partial_rotary_factor`` key makes
            the rotated dimension ``int(dim * partial_rotary_factor)`` (HF's rule), which must
            then be even; the result has that many halves.
        seq_len: the current sequence length, i.e. ``max(position) + 1`` as HF's
            ``dynamic_rope_update`` computes it. Used by ``"dynamic"`` and ``"longrope"``
            only; ``None`` gives the frequencies HF computes at model init.

    Returns:
        float64 array of shape ``(dim // 2,)`` (``(int(dim * partial_rotary_factor) // 2,)``
        with a ``partial_rotary_factor``), highest frequency first.

    Raises:
        TypeError: wrong argument or key types.
        ValueError: odd/non-positive ``dim``, ``theta <= 0``, unknown ``rope_type``, missing
            required key, ``factor <= 0``, ``p`` outside [0, 1], wrong ``*_factor`` length.

    Examples:
        >>> import llmkernels as lk
        >>> lk.rope_inv_freq(8, 10000.0)
        array([1.   , 0.1  , 0.01 , 0.001])
    """
    fn = "rope_inv_freq"
    dim = _check_dim(fn, dim)
    theta = _check_theta(fn, theta)
    seq_len = _check_seq_len(fn, seq_len)
    sc = _Scaling(fn, scaling)
    base = sc.theta(theta)
    rope_type = sc.rope_type

    if rope_type == "proportional":
        # HF `_compute_proportional_rope_parameters`: `dim` is head_dim, the output keeps
        # dim // 2 entries and partial_rotary_factor is the kept fraction.
        prf = sc.real("partial_rotary_factor") if sc.has("partial_rotary_factor") else 1.0
        factor = sc.real("factor") if sc.has("factor") else 1.0
        keep = int(prf * dim // 2)
        inv_freq = np.zeros(dim // 2, dtype=np.float64)
        # the kept frequencies use the full head_dim in the exponent
        exponents = np.arange(0, 2 * keep, 2, dtype=np.float64) / dim
        inv_freq[:keep] = 1.0 / _libm.pow(base, exponents)
        return inv_freq / factor

    # the rotated dimension (HF: int(head_dim * partial_rotary_factor))
    if sc.has("partial_rotary_factor"):
        prf = sc.real("partial_rotary_factor")
        rdim = int(dim * prf)
        if rdim <= 0 or rdim % 2:
            raise ValueError(
                f"[{fn}] int(dim * scaling['partial_rotary_factor']) must be a positive even "
                f"integer, got int({dim} * {prf!r}) = {rdim}"
            )
    else:
        rdim = dim
    half = rdim // 2

    if rope_type == "default":
        return _default_inv_freq(rdim, base)

    if rope_type == "linear":
        return _default_inv_freq(rdim, base) / sc.real("factor")

    if rope_type == "dynamic":
        factor = sc.real("factor")
        max_pos = sc.dynamic_max_positions()
        s = max_pos if seq_len is None else max(float(seq_len), max_pos)
        if rdim > 2:  # with dim == 2 the only frequency is base**0 == 1 whatever the base
            try:
                base = base * ((factor * s / max_pos) - (factor - 1.0)) ** (rdim / (rdim - 2))
            except OverflowError:
                base = math.inf
            if not math.isfinite(base):
                raise ValueError(
                    f"[{fn}] dynamic RoPE's base overflows at seq_len {seq_len} "
                    f"(factor {factor}, max_position_embeddings {max_pos})"
                )
        return _default_inv_freq(rdim, base)

    if rope_type == "yarn":
        return _yarn_inv_freq(sc, rdim, base)

    if rope_type == "llama3":
        return _llama3_inv_freq(sc, rdim, base)

    if rope_type == "longrope":
        original = sc.original_max()
        key = "long_factor" if seq_len and seq_len > original else "short_factor"
        ext = sc.factor_list(key)
        if ext.shape[0] != half:
            raise ValueError(
                f"[{fn}] scaling[{key!r}] must have length dim // 2 = {half}, got {ext.shape[0]}"
            )
        return 1.0 / (ext * _libm.pow(base, np.arange(0, rdim, 2, dtype=np.float64) / rdim))

    # p-rope
    p = sc.real("p", positive=False)
    keep = min(half, math.floor(p * half + 1e-9))
    inv_freq = _default_inv_freq(rdim, base)
    inv_freq[keep:] = 0.0
    return inv_freq


def _yarn_inv_freq(sc: _Scaling, dim: int, base: float) -> np.ndarray:
    """HF ``_compute_yarn_parameters`` (inverse frequencies only), in float64."""
    if base == 1.0:
        raise ValueError(f"[{sc.fn}] theta must be != 1 for rope_type 'yarn' (log(theta) = 0)")
    factor = sc.yarn_factor()
    original = sc.original_max()
    # HF: `rope_parameters.get("beta_fast") or 32`
    beta_fast = sc.params.get("beta_fast") or 32
    beta_slow = sc.params.get("beta_slow") or 1
    truncate = sc.params.get("truncate", True)

    def find_correction_dim(num_rotations: float) -> float:
        # the dimension whose wavelength fits `num_rotations` times in the original context
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low = find_correction_dim(float(beta_fast))
    high = find_correction_dim(float(beta_slow))
    if truncate:
        low = math.floor(low)
        high = math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # prevent a singular ramp (HF)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    extrapolation_weight = 1.0 - ramp

    pos_freqs = _libm.pow(base, np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv_freq_extrapolation = 1.0 / pos_freqs
    inv_freq_interpolation = 1.0 / (factor * pos_freqs)
    return (
        inv_freq_interpolation * (1.0 - extrapolation_weight)
        + inv_freq_extrapolation * extrapolation_weight
    )


def _llama3_inv_freq(sc: _Scaling, dim: int, base: float) -> np.ndarray:
    """HF ``_compute_llama3_parameters``, in float64."""
    inv_freq = _default_inv_freq(dim, base)
    factor = sc.real("factor")  # 8 for Llama 3.1
    low_freq_factor = sc.real("low_freq_factor")  # 1
    high_freq_factor = sc.real("high_freq_factor")  # 4
    old_context_len = sc.original_max()  # 8192

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # wavelen < high_freq_wavelen: keep; wavelen > low_freq_wavelen: divide by factor
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    # in between: interpolate smoothly
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor
    )
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def rope_attention_factor(
    scaling: Mapping[str, Any] | None,
    *,
    seq_len: int | None = None,
) -> float:
    """The multiplier a RoPE scaling type applies to cos and sin (HF ``attention_factor``).

    Pass it to ``rope(..., attention_factor=...)``.

    * ``"yarn"``: ``scaling["attention_factor"]`` if given; else, when ``mscale`` and
      ``mscale_all_dim`` are both given and non-zero,
      ``get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)``; else
      ``get_mscale(factor)``, with ``get_mscale(s, m=1) = 1 if s <= 1 else 0.1*m*ln(s) + 1``.
    * ``"longrope"``: ``scaling["attention_factor"]`` if given; else with ``factor`` (or
      ``max_position_embeddings / original_max_position_embeddings`` when ``factor`` is
      absent) ``1`` if ``factor <= 1`` else
      ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))``.
    * every other type: ``1.0``.

    ``seq_len`` is accepted for symmetry with :func:`rope_inv_freq`; in HF no type's
    attention factor depends on it (longrope uses the same factor for short and long).

    Raises:
        TypeError / ValueError: as :func:`rope_inv_freq` for the ``scaling`` dict.

    Examples:
        >>> import llmkernels as lk
        >>> round(lk.rope_attention_factor({"rope_type": "yarn", "factor": 4.0,
        ...                                 "original_max_position_embeddings": 4096}), 4)
        1.1386
    """
    fn = "rope_attention_factor"
    _check_seq_len(fn, seq_len)
    sc = _Scaling(fn, scaling)

    if sc.rope_type == "yarn":
        explicit = sc.opt_real("attention_factor")
        if explicit is not None:
            return explicit
        factor = sc.yarn_factor()
        mscale = sc.params.get("mscale")
        mscale_all_dim = sc.params.get("mscale_all_dim")

        def get_mscale(scale: float, m: float = 1.0) -> float:
            if scale <= 1:
                return 1.0
            return 0.1 * m * math.log(scale) + 1.0

        if mscale and mscale_all_dim:
            return get_mscale(factor, float(mscale)) / get_mscale(factor, float(mscale_all_dim))
        return get_mscale(factor)

    if sc.rope_type == "longrope":
        explicit = sc.opt_real("attention_factor")
        if explicit is not None:
            return explicit
        original = sc.original_max()
        if sc.has("factor"):
            factor = sc.real("factor")
        elif sc.has("max_position_embeddings"):
            factor = sc.positions("max_position_embeddings") / original
        else:
            raise ValueError(
                f"[{fn}] scaling for rope_type 'longrope' needs 'factor' (or "
                "'max_position_embeddings', or an explicit 'attention_factor')"
            )
        if factor <= 1.0:
            return 1.0
        if original <= 1.0:
            raise ValueError(
                f"[{fn}] scaling['original_max_position_embeddings'] must be > 1 for "
                f"rope_type 'longrope', got {original!r}"
            )
        return math.sqrt(1 + math.log(factor) / math.log(original))

    return 1.0
