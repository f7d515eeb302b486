"""The options of one attention call as one immutable record, ``AttentionOptions``: built and
checked once at the public entry points, passed whole through ops.py, turned into the C API's
``struct flamia_options`` by ``to_c()`` and into the custom ops' flat arguments (which torch.library
schemas need: bools, floats and strings) by ``op_arguments()`` / ``from_op_arguments()``. Needs
neither torch nor a GPU (``to_c()`` needs libflamia_capi.so)."""

import dataclasses
import math
import typing

from . import _capi

# struct flamia_options' default for p_boost_log2 and its largest value (the C header's).
P_BOOST_LOG2_DEFAULT = _capi.P_BOOST_LOG2_DEFAULT
P_BOOST_LOG2_MAX = _capi.P_BOOST_LOG2_MAX


def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"flamia.attention: {name} must be one of {sorted(choices)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """The numerics options of an attention call (docs/DESIGN.md §1), checked on construction.

    causal: causal mask inside each document (any truthy value; stored as bool).
    softmax_scale: None for 1/sqrt(D), else a finite number > 0 that stays > 0 in float32, stored
        as the float32 value the C API receives. resolved(head_dim) replaces None by 1/sqrt(D),
        which to_c() rounds to float32 as the C API's field does.
    isolation, scale_geometry, scale_rule: the Python spellings of the C enums (_capi.ISOLATION,
        _capi.SCALE_GEOMETRY, _capi.SCALE_RULE).
    deterministic: the backward's dQ reduction (stored as bool; True: bitwise repeatable).
    p_boost_log2: P's boost exponent (docs/DESIGN.md §2), an int in [0, 8], the C default 8. The
        custom ops' schemas do not carry it, so only the default passes through them.
    """

    causal: bool = True
    softmax_scale: typing.Optional[float] = None
    isolation: str = "document"
    scale_geometry: str = "block32"
    scale_rule: str = "ceil"
    deterministic: bool = False
    p_boost_log2: int = P_BOOST_LOG2_DEFAULT

    def __post_init__(self):
        # The frozen record's fields are normalized here, once (dataclasses' idiom for frozen classes).
        object.__setattr__(self, "causal", bool(self.causal))
        object.__setattr__(self, "deterministic", bool(self.deterministic))
        if self.softmax_scale is not None:
            object.__setattr__(self, "softmax_scale", _capi.explicit_softmax_scale(self.softmax_scale))
        _check_choice(self.isolation, "isolation", _capi.ISOLATION)
        _check_choice(self.scale_geometry, "scale_geometry", _capi.SCALE_GEOMETRY)
        _check_choice(self.scale_rule, "scale_rule", _capi.SCALE_RULE)
        boost = self.p_boost_log2
        if isinstance(boost, bool) or not isinstance(boost, int):
            raise TypeError(f"flamia.attention: p_boost_log2 must be an int, got {type(boost).__name__}")
        # A C int field would wrap an out-of-range Python int silently, so the range is checked here.
        if not 0 <= boost <= P_BOOST_LOG2_MAX:
            raise ValueError(f"flamia.attention: p_boost_log2 must lie in [0, {P_BOOST_LOG2_MAX}] so that boosted P "
                             f"(<= 2^boost) never exceeds 448, got {boost}")

    def replace(self, **changes):
        """A copy with the given fields changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def resolved(self, head_dim):
        """This record with an explicit softmax_scale: 1/sqrt(head_dim) where it is None (a valid
        scale for every head_dim, so set without the float32 check: that check calls ctypes, which
        torch.compile cannot trace, and flamia.attention resolves the default while it traces)."""
        if self.softmax_scale is not None:
            return self
        resolved = self.replace()
        object.__setattr__(resolved, "softmax_scale", 1.0 / math.sqrt(head_dim))
        return resolved

    def to_c(self):
        """The C API's struct flamia_options (a _capi.Options): flamia_default_options, then every
        field of this record. softmax_scale None is the C default +0.0 (1/sqrt(D) in C)."""
        options = _capi.default_options()
        options.causal = 1 if self.causal else 0
        if self.softmax_scale is not None:
            options.softmax_scale = self.softmax_scale  # explicit, so never +0 (the C default)
        options.isolation = _capi.ISOLATION[self.isolation]
        options.scale_geometry = _capi.SCALE_GEOMETRY[self.scale_geometry]
        options.scale_rule = _capi.SCALE_RULE[self.scale_rule]
        options.p_boost_log2 = self.p_boost_log2
        options.deterministic = 1 if self.deterministic else 0
        return options

    def op_arguments(self, with_deterministic=False):
        """The custom ops' flat option arguments: (causal, softmax_scale, isolation, scale_geometry,
        scale_rule), and deterministic after them for the ops whose schema has it
        (attention_forward_train, attention_backward_saved). softmax_scale must be explicit
        (resolved()), p_boost_log2 the default: the schemas carry neither None nor a boost."""
        if self.softmax_scale is None:
            raise ValueError("flamia: the custom ops take an explicit softmax_scale; call resolved(head_dim) first")
        if self.p_boost_log2 != P_BOOST_LOG2_DEFAULT:
            raise ValueError(f"flamia: the custom ops run with the default p_boost_log2 "
                             f"({P_BOOST_LOG2_DEFAULT}) only, got {self.p_boost_log2}")
        flat = (self.causal, self.softmax_scale, self.isolation, self.scale_geometry, self.scale_rule)
        return flat + (self.deterministic,) if with_deterministic else flat

    @classmethod
    def from_op_arguments(cls, causal, softmax_scale, isolation, scale_geometry, scale_rule, deterministic=False):
        """The record of the custom ops' flat option arguments (op_arguments' inverse)."""
        return cls(causal=causal, softmax_scale=softmax_scale, isolation=isolation, scale_geometry=scale_geometry,
                   scale_rule=scale_rule, deterministic=deterministic)
