"""Split states of ggml's meta device: :class:`Split` (how a caller splits a weight, numpy axes)
and :class:`State` (ggml's ``struct ggml_backend_meta_split_state``: axis, elements per segment
and device, repeats). Used by :mod:`ggml_py._meta`."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ._loader import ffi, lib
from .errors import InvalidType, require

MAX_DEVICES = int(getattr(lib, "GGML_BACKEND_META_MAX_DEVICES", 16))
MAX_DIMS = 4
MIRRORED, PARTIAL, NONE, UNKNOWN = 10, 11, 98, 99
_NAMES = {MIRRORED: "MIRRORED", PARTIAL: "PARTIAL", NONE: "NONE", UNKNOWN: "UNKNOWN"}


class State:
    """A split state as ggml keeps it: ggml axis (0-3), MIRRORED or PARTIAL; for axes, the
    elements per segment and device (``ne[s*n + j]``) and each segment's repeat count."""

    __slots__ = ("axis", "ne", "nr", "n_seg")

    def __init__(self, axis: int, ne: Sequence[int] = (), nr: Sequence[int] = (1,),
                 n_seg: int = 1) -> None:
        self.axis, self.ne, self.nr, self.n_seg = axis, list(ne), list(nr), n_seg

    @property
    def split(self) -> bool:
        return 0 <= self.axis < MAX_DIMS

    def per_device(self, n: int) -> list[int]:
        """Elements along the split axis on each device (segments and repeats summed)."""
        out = []
        for j in range(n):
            out.append(sum(self.seg_ne(s * n + j) * self.seg_nr(s) for s in range(self.n_seg)))
        return out

    def seg_ne(self, i: int) -> int:
        """Elements of segment i // n on part i % n along the split axis (0 past the end)."""
        return self.ne[i] if i < len(self.ne) else 0

    def seg_nr(self, s: int) -> int:
        """How many times segment `s` repeats along the split axis (0 past the end)."""
        return self.nr[s] if s < len(self.nr) else 0

    def name(self, ndim: int | None = None) -> str:
        if not self.split:
            return _NAMES.get(self.axis, str(self.axis))
        if ndim:
            return f"axis {ndim - 1 - self.axis} (ggml {self.axis})"
        return f"ggml axis {self.axis}"

    def copy(self) -> "State":
        return State(self.axis, self.ne, self.nr, self.n_seg)

    def cdata(self, n: int) -> Any:
        s = ffi.new("struct ggml_backend_meta_split_state *")
        s.axis = self.axis
        s.n_segments = self.n_seg
        for i, r in enumerate(self.nr[:16]):
            s.nr[i] = r
        for i in range(min(len(self.ne), 16 * MAX_DEVICES)):
            s.ne[i] = self.ne[i]
        return s

    def __repr__(self) -> str:
        return f"<State {self.name()} ne={self.ne} nr={self.nr[:self.n_seg]}>"


class Split:
    """How a weight is split over a meta device's parts.

    ``Split(axis=k)``: numpy axis `k` cut into near-equal slices, one per device (``sizes=``
    gives them: one length per device). ``segments=[q, k, v]``: the axis holds fused tensors
    (a QKV weight), each segment split on its own, so each device gets a slice of each.
    ``Split.MIRRORED``: a whole copy on every device. ``Split.PARTIAL``: every device holds a
    share of a sum (values written are divided among the devices; f32 only).
    """

    __slots__ = ("axis", "sizes", "segments", "kind")
    MIRRORED: "Split"
    PARTIAL: "Split"

    def __init__(self, axis: int | None = None, *, sizes: Sequence[int] | None = None,
                 segments: Sequence[int] | None = None, _kind: int | None = None) -> None:
        if _kind is None:
            require(isinstance(axis, int) and not isinstance(axis, bool),
                    f"Split: axis must be an int (numpy order), not {axis!r}", InvalidType)
        for what, v in (("sizes", sizes), ("segments", segments)):
            if v is not None:
                require(isinstance(v, (list, tuple)) and len(v) > 0 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v),
                    f"Split: {what} must be a non-empty list of ints >= 0, got {v!r}",
                    InvalidType)
        require(sizes is None or segments is None,
                "Split: give sizes (per device) or segments (fused tensors), not both")
        require(segments is None or len(segments) <= 16,
                f"Split: at most 16 segments, got {len(segments or ())}")
        self.axis, self.kind = axis, _kind
        self.sizes = None if sizes is None else tuple(sizes)
        self.segments = None if segments is None else tuple(segments)

    def __repr__(self) -> str:
        if self.kind is not None:
            return f"Split.{_NAMES[self.kind]}"
        extra = f", sizes={list(self.sizes)}" if self.sizes else \
            f", segments={list(self.segments)}" if self.segments else ""
        return f"Split(axis={self.axis}{extra})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Split) and (self.axis, self.kind, self.sizes, self.segments) \
            == (other.axis, other.kind, other.sizes, other.segments)

    def __hash__(self) -> int:
        return hash((self.axis, self.kind, self.sizes, self.segments))

    def resolve(self, name: str, shape: Sequence[int], ne: Sequence[int], block: int,
                is_f32: bool, n: int) -> State:
        """The ggml split state of a tensor of numpy `shape` (ggml `ne`) over `n` devices;
        InvalidArgument for what ggml would abort on."""
        if self.kind == MIRRORED:
            return State(MIRRORED)
        if self.kind == PARTIAL:
            require(is_f32, f"Split.PARTIAL of {name!r}: ggml writes partial sums of f32 "
                            "tensors only")
            return State(PARTIAL)
        ndim = len(shape)
        assert self.axis is not None
        require(-ndim <= self.axis < ndim,
                f"Split(axis={self.axis}) of {name!r}: the tensor has {ndim} axes {tuple(shape)}")
        k = self.axis % ndim
        gax = ndim - 1 - k
        length = int(ne[gax])
        gran = block if gax == 0 else 1
        what = f"Split(axis={self.axis}) of {name!r} {tuple(shape)}"
        if self.segments is not None:
            require(sum(self.segments) == length,
                    f"{what}: segments {list(self.segments)} add up to {sum(self.segments)}, "
                    f"not the axis length {length}")
            require(gax in (0, 1) and int(ne[3]) == 1 and (gax == 1 or int(ne[2]) == 1),
                    f"{what}: ggml reads and writes segmented tensors split on their last two "
                    "numpy axes only, with at most 2 (axis -1) or 3 (axis -2) dimensions")
            ne_out: list[int] = []
            for seg in self.segments:
                ne_out += _even(seg, n, gran, what)
            return State(gax, ne_out, [1] * len(self.segments), len(self.segments))
        if self.sizes is not None:
            require(len(self.sizes) == n, f"{what}: sizes has {len(self.sizes)} entries for "
                                          f"{n} devices")
            require(sum(self.sizes) == length, f"{what}: sizes {list(self.sizes)} add up to "
                                               f"{sum(self.sizes)}, not the axis length {length}")
            require(all(s % gran == 0 for s in self.sizes),
                    f"{what}: each size must be a multiple of the type's block size {gran}")
            return State(gax, list(self.sizes))
        return State(gax, _even(length, n, gran, what))


Split.MIRRORED = Split(_kind=MIRRORED)
Split.PARTIAL = Split(_kind=PARTIAL)


def _even(length: int, n: int, gran: int, what: str) -> list[int]:
    require(length % gran == 0, f"{what}: the axis length {length} is not a multiple of the "
                                f"type's block size {gran}")
    blocks = length // gran
    return [(blocks // n + (1 if j < blocks % n else 0)) * gran for j in range(n)]


SplitSpec = Callable[[Any], "Split | None"] | Mapping[str, Split]
