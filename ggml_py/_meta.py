"""Tensor parallelism: ggml's meta device (ggml 0.26+), ``gg.meta_device(devices, split)``.

A meta device wraps several devices into one: its buffers hold each tensor split across
them, its backend runs the graph on every part and all-reduces partial sums. How each
*weight* (a tensor of a static buffer) is split is the caller's :class:`Split`; ggml derives
the split of every computed node from its sources, and aborts the process on combinations it
does not implement. This module

- resolves every split in Python when a context is allocated on the meta device
  (``Context.alloc``), before ggml sees the tensors: the caller's ``split`` runs there, its
  exceptions reach the caller, and the C callback ggml calls later only looks the answer up
  (it never runs caller code, never raises through C, and its state lives as long as the
  process, since ggml never frees a meta device);
- replays ggml's split-state propagation (``ggml-backend-meta.cpp``) over a graph before the
  meta backend computes it, refusing what ggml would abort on with the op and the split
  states named (:func:`plan`);
- refuses reads and writes ggml would abort on (a PARTIAL tensor's values, a non-contiguous
  split tensor, axis 3...).

Axes are numpy's (``Split(axis=-1)`` splits the last numpy axis, ggml's axis 0).
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import weakref
from typing import Any, Iterator, Mapping, Sequence

from . import _features, _handle
from ._backend import Backend
from ._device import BufferType, Device
from ._rpc_liveness import compose, ensure_alive
from ._loader import cstr, ffi, lib
from ._meta_plan import (BY_DEV, register, Refused, _addr, meta_of_buffer, meta_of_tensor,  # noqa: F401
                         meta_reduce, plan, plan_tensor, split_states, _Planner)
from ._split import (MAX_DEVICES, MAX_DIMS, MIRRORED, PARTIAL, UNKNOWN, Split,  # noqa: F401
                     SplitSpec, State)
from .errors import GGMLError, InvalidArgument, InvalidType, UnsupportedError, require

# ggml_backend_meta_device appears in the pinned releases from 0.10.1 on (0.9.4 has none:
# the releases' generated bindings, as `compare` lists them); its split state gained per-segment
# repeats (`nr`) by 0.25.3, and ggml_py replays the split rules of 0.26.0 (_Planner), so it
# offers the meta device from 0.26.0 on
ADDED_IN = "0.10.1"
CHECKED_FROM = "0.26.0"


def available() -> bool:
    return _features.META_DEVICE


def _release(v: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in v.split(".")[:3])
    except ValueError:
        return None


def require_meta() -> None:
    from . import ggml_version
    v = ggml_version()
    if not available():
        raise UnsupportedError(f"meta devices (tensor parallelism) need ggml {CHECKED_FROM} or "
                               f"later; this build is ggml {v}, which has none (ggml added "
                               f"them in {ADDED_IN})")
    rel = _release(v)
    if rel is not None and rel < _release(CHECKED_FROM):  # type: ignore[operator]
        raise UnsupportedError(f"meta devices (tensor parallelism) need ggml {CHECKED_FROM} or "
                               f"later; this build is ggml {v}, whose meta device ggml_py does "
                               f"not check (it replays the split rules of {CHECKED_FROM})")
    if rel is None:      # a source tree: the split state must have 0.26.0's layout
        try:
            ffi.offsetof("struct ggml_backend_meta_split_state", "nr")
        except (KeyError, ffi.error):
            raise UnsupportedError(f"this ggml tree's meta split state has no per-segment "
                                   f"repeats (nr): ggml_py supports the layout of "
                                   f"{CHECKED_FROM}") from None


# -- the C callback ---------------------------------------------------------------------------

_KEEP: list[Any] = []            # (splitter, handle) of every meta device: ggml never frees one
_CALLBACK: Any = None
_SAFE: Any = None                # a MIRRORED state, made before any call needs it


def _callback() -> Any:
    global _CALLBACK, _SAFE
    if _CALLBACK is None:
        _SAFE = State(MIRRORED).cdata(1)

        def _get_split_state(t: Any, ud: Any) -> Any:
            # called from C: never raises (a Python exception must not unwind through C)
            try:
                return ffi.from_handle(ud).c_state(t)[0]
            except BaseException as e:  # noqa: BLE001 (recorded, raised later to the caller)
                try:
                    ffi.from_handle(ud).errors.append(e)
                except BaseException:   # noqa: BLE001
                    pass
                return _SAFE[0]

        _CALLBACK = ffi.callback("ggml_backend_meta_get_split_state_t", _get_split_state)
    return _CALLBACK


class _Splitter:
    """A meta device's answers to ggml's split-state callback, keyed by tensor address."""

    def __init__(self, spec: SplitSpec, n: int) -> None:
        self.spec, self.n = spec, n
        self.states: dict[int, tuple[State, Any, tuple[Any, ...]]] = {}
        self.errors: list[BaseException] = []

    def ask(self, t: Any) -> Split:
        spec = self.spec
        if callable(spec):
            got = spec(t)
        else:
            got = spec.get(t.name, None)
        if got is None:
            return Split.MIRRORED
        if not isinstance(got, Split):
            raise InvalidType(f"split({t.name!r}) returned {type(got).__name__}; expected a "
                              "gg.Split or None (mirrored)")
        return got

    def admit(self, tensors: list[Any]) -> None:
        """Resolve every tensor's split (in Python: the caller's exceptions reach the
        caller) before ggml places them."""
        found = {}
        for t in tensors:
            require(t.size > 0, f"meta device: tensor {t.name!r} is empty (ggml aborts on "
                                "empty tensors in a meta buffer)")
            sp = self.ask(t)
            st = sp.resolve(t.name, t.shape, t.ne, t.type.block_size,
                            t.type.name == "f32", self.n)
            found[_addr(t.ptr)] = (st, st.cdata(self.n), _fingerprint(t.ptr))
        self.states.update(found)

    def c_state(self, raw: Any) -> Any:
        got = self.states.get(_addr(raw))
        if got is not None and got[2] == _fingerprint(raw):
            return got[1]
        # a tensor placed without Context.alloc (raw calls): mirrored, and said so later
        self.errors.append(InvalidArgument(
            f"meta device: tensor {cstr(raw.name)!r} was placed without Context.alloc, so no "
            "split was resolved for it; it is mirrored"))
        st = State(MIRRORED)
        c = st.cdata(self.n)
        self.states[_addr(raw)] = (st, c, _fingerprint(raw))
        return c

    def static_state(self, raw: Any) -> State | None:
        got = self.states.get(_addr(raw))
        return got[0] if got is not None and got[2] == _fingerprint(raw) else None

    def raise_pending(self) -> None:
        if self.errors:
            err, self.errors = self.errors[0], []
            raise err


def _fingerprint(p: Any) -> tuple[Any, ...]:
    return (int(p.type), tuple(p.ne), cstr(p.name))


# -- devices and backends -------------------------------------------------------------------


class MetaDevice(Device):
    """A device made of several (``gg.meta_device``): tensors in its buffers are split over
    its `parts` as its `split` says; its backend computes on all of them."""

    __slots__ = ("parts", "splitter", "_allreduce")
    parts: tuple[Device, ...]
    splitter: _Splitter          # how each tensor is split (the planning reads it)
    _allreduce: str

    @classmethod
    def _made(cls, raw: Any, parts: Sequence[Device], splitter: _Splitter,
              allreduce: str) -> "MetaDevice":
        dev = cls._of(raw)           # (the one object of its handle from now on)
        assert isinstance(dev, cls)
        dev.parts, dev.splitter, dev._allreduce = tuple(parts), splitter, allreduce
        return dev

    @property
    def type(self) -> str:
        return "meta"

    @property
    def name(self) -> str:
        # ggml 0.26.0 names every meta device "Meta()": its constructor builds the name from
        # the device list after moving it away (docs/upstream-issues.md)
        return "Meta(" + ",".join(d.name for d in self.parts) + ")"

    @property
    def description(self) -> str:
        return "Meta(" + ",".join(d.description for d in self.parts) + ")"

    @property
    def part_ptrs(self) -> list[Any]:
        return [d.ptr for d in self.parts]

    @property
    def n_parts(self) -> int:
        return len(self.parts)

    @property
    def allreduce(self) -> str:
        return allreduce_of(self.parts, self._allreduce)

    def backend(self, n_threads: int | None = None, params: str | None = None) -> Backend:
        require(n_threads is None, "a meta device's backend takes no n_threads (its parts "
                                   "are started with their defaults)", UnsupportedError)
        ensure_alive(self.ptr)
        with _comm_choice(self.parts, self._allreduce):
            be = MetaBackend._create(self, params=params)
        assert isinstance(be, MetaBackend)
        return be

    def check_access(self, raw: Any, what: str) -> None:
        """What ggml's meta buffer aborts on when `raw` is read or written (`what`)."""
        self.splitter.raise_pending()
        st = plan_tensor(raw)
        name = cstr(raw.name) or "(unnamed)"
        desc = f"{what} of {name!r} on {self.name}"
        if st.axis == PARTIAL and what.startswith("get"):
            raise InvalidArgument(
                f"{desc}: its split state is PARTIAL (each device holds a partial sum) and "
                "ggml cannot read it; reduce it first: gg.meta_reduce(t) in the graph "
                "(an op after it makes ggml all-reduce it)")
        if st.axis == PARTIAL and int(raw.type) != int(lib.GGML_TYPE_F32):
            raise InvalidArgument(f"{desc}: ggml writes PARTIAL tensors of f32 only")
        if st.axis != MIRRORED and not lib.ggml_is_contiguous(raw):
            raise InvalidArgument(f"{desc}: a split tensor ({st.name()}) that is not "
                                  "contiguous cannot be read or written by ggml")
        if st.split and (st.n_seg != 1 or st.nr[0] != 1):
            if not (st.axis in (0, 1) and raw.ne[3] == 1 and (st.axis == 1 or raw.ne[2] == 1)):
                raise InvalidArgument(f"{desc}: ggml reads and writes segmented tensors only "
                                      "split on ggml axis 0 (2-d) or 1 (3-d)")
        elif st.axis == 3:
            raise InvalidArgument(f"{desc}: ggml reads and writes tensors split on ggml axis "
                                  "3 (numpy axis 0 of a 4-d tensor) with no code (it aborts)")

    def where(self, tensor: Any) -> list[tuple[str, tuple[slice, ...] | str]]:
        """Which slice of `tensor` (numpy indices) lives on which part."""
        st = plan_tensor(tensor.ptr)
        shape = tensor.shape
        n = self.n_parts
        out: list[tuple[str, tuple[slice, ...] | str]] = []
        if not st.split:
            label = "all (mirrored)" if st.axis == MIRRORED else "a partial sum of all"
            return [(d.name, label) for d in self.parts]
        k = len(shape) - 1 - st.axis
        for j, d in enumerate(self.parts):
            idx: list[slice] = []
            start = 0
            for s in range(st.n_seg):
                for r in range(st.seg_nr(s)):
                    for jj in range(n):
                        size = st.seg_ne(s * n + jj)
                        if jj == j and size:
                            idx.append(slice(start, start + size))
                        start += size
            cut = tuple(slice(None) if i != k else idx[0] for i in range(len(shape))) \
                if len(idx) == 1 else tuple(idx)
            out.append((d.name, cut))
        return out

    def __repr__(self) -> str:
        return (f"<Device {self.name} (meta) over {[d.name for d in self.parts]} "
                f"allreduce={self.allreduce}>")

    def _repr_html_(self) -> str:
        import html
        rows = "".join(f"<tr><td>{j}</td><td>{html.escape(d.name)}</td>"
                       f"<td>{html.escape(d.description)}</td></tr>"
                       for j, d in enumerate(self.parts))
        return (f"<b>{html.escape(self.name)}</b> (meta device, allreduce: "
                f"{html.escape(self.allreduce)})<table><tr><th>part</th><th>device</th>"
                f"<th>description</th></tr>{rows}</table>")


class MetaBackend(Backend):
    """The backend of a meta device: each compute is planned first (:func:`plan`)."""

    @property
    def allreduce(self) -> str:
        """Which all-reduce sums partial results: the parts' registry's own
        (``ggml_backend_comm_allreduce_tensor``: RPC protocol 8, CUDA) or ggml's generic
        fallback (copies and adds between the parts' backends)."""
        dev = self.device
        assert isinstance(dev, MetaDevice)
        return dev.allreduce

    def _plan(self, graph: Any) -> None:
        # once per graph until something closes (a graph's nodes and its weights' splits are
        # fixed; replaying ggml's rules costs about 0.1 ms per node in Python)
        planned = self.__dict__.setdefault("_planned", weakref.WeakKeyDictionary())
        if planned.get(graph) != _handle.MEMORY_CHANGES:
            plan(graph, self)
            planned[graph] = _handle.MEMORY_CHANGES

    def split_states(self, graph: Any) -> list[tuple[str, str, str]]:
        """(node name, op, split state) for every node of `graph`, as this backend's meta
        device derives them (Refused, an InvalidArgument, for what ggml would abort on)."""
        return split_states(graph, self)

    def compute(self, graph: Any) -> None:
        self._plan(graph)
        super().compute(graph)

    def compute_async(self, graph: Any) -> None:
        self._plan(graph)
        super().compute_async(graph)

    def __repr__(self) -> str:
        return f"<Backend {self.name} allreduce={self.allreduce}>"


ALLREDUCE_CHOICES = ("auto", "backend", "generic")
_ENV_LOCK = threading.Lock()


def _has_comm(parts: Sequence[Device]) -> bool:
    reg = parts[0].registry
    return reg.proc_address("ggml_backend_comm_init") is not None and \
        reg.proc_address("ggml_backend_comm_allreduce_tensor") is not None


def _one_cuda_gpu(parts: Sequence[Device]) -> bool:
    """CUDA parts that are virtual devices of one GPU (GGML_CUDA_DEVICES): one PCI bus id."""
    if not all(d.registry.name == "CUDA" for d in parts):
        return False
    # ggml 0.26.0 gives a virtual device its GPU's PCI bus id with "-v<k>" appended
    ids = {re.sub(r"-v\d+$", "", d.device_id or "") for d in parts}
    return len(ids) == 1 and "" not in ids


def _comm_used(parts: Sequence[Device], choice: str) -> str:
    """'backend' or 'generic': which all-reduce the meta backend is made to use."""
    if len(parts) < 2 or not _has_comm(parts) or choice == "generic":
        return "generic"
    if choice == "auto" and _one_cuda_gpu(parts):
        # CUDA's own all-reduce is NCCL (real GPUs only) or, for two devices, a copy staged
        # through pinned host memory; between virtual devices of one GPU the generic one
        # (device-to-device copies and adds) moves nothing over PCIe
        return "generic"
    return "backend"


def allreduce_of(parts: Sequence[Device], choice: str = "auto") -> str:
    """Which all-reduce a meta backend over `parts` sums partial results with: '<registry>
    comm' (the first part's registry's ggml_backend_comm_allreduce_tensor; ggml's generic one
    still runs for a tensor it declines, e.g. CUDA's internal one for more than two devices),
    'generic' (the meta backend's butterfly of copies and adds between the parts' backends),
    or 'none' (one part)."""
    if len(parts) < 2:
        return "none"
    if _comm_used(parts, choice) == "generic":
        return "generic"
    return f"{parts[0].registry.name} comm"


@contextlib.contextmanager
def _comm_choice(parts: Sequence[Device], choice: str) -> Iterator[None]:
    """Make the meta backend created inside use the generic all-reduce where `choice` says
    so. ggml's meta backend asks the parts' registry for a communicator when it is created;
    CUDA's reads GGML_CUDA_ALLREDUCE then ("none": decline every tensor). The variable is set
    for the creation only, under a lock, and put back."""
    if len(parts) < 2 or not _has_comm(parts) or _comm_used(parts, choice) == "backend":
        yield
        return
    with _ENV_LOCK:
        old = os.environ.get("GGML_CUDA_ALLREDUCE")
        os.environ["GGML_CUDA_ALLREDUCE"] = "none"
        try:
            yield
        finally:
            if old is None:
                del os.environ["GGML_CUDA_ALLREDUCE"]
            else:
                os.environ["GGML_CUDA_ALLREDUCE"] = old


def meta_device(devices: Sequence[Device | str], split: SplitSpec, *,
                allreduce: str = "auto") -> MetaDevice:
    """A meta device over `devices` (names or Devices, 1 to 16, each a plain device), whose
    weights are split as `split` says: a callable ``tensor -> gg.Split | None`` or a mapping
    ``name -> gg.Split``; tensors it leaves out are mirrored.

    `allreduce`: how its backends sum partial results. "backend": the parts' registry's own
    where it offers one (RPC protocol 8, CUDA), else ggml's generic one; "generic": ggml's
    generic one (copies and adds between the parts' backends; on RPC parts not available:
    ggml offers no way to decline the servers' own); "auto" (default): "backend", except for
    CUDA virtual devices of one GPU, where the generic one is used (CUDA's own stages each
    sum through host memory). ``md.allreduce`` says which is used."""
    require_meta()
    require(allreduce in ALLREDUCE_CHOICES, f"meta_device: allreduce must be one of "
            f"{', '.join(ALLREDUCE_CHOICES)}, not {allreduce!r}")
    from ._device import device as _lookup
    require(isinstance(devices, (list, tuple)), "meta_device: devices must be a list of "
            f"devices or names, not {type(devices).__name__}", InvalidType)
    parts = [d if isinstance(d, Device) else _lookup(d) for d in devices]
    require(1 <= len(parts) <= MAX_DEVICES,
            f"meta_device: takes 1 to {MAX_DEVICES} devices (GGML_BACKEND_META_MAX_DEVICES), "
            f"got {len(parts)}")
    for d in parts:
        require(not isinstance(d, MetaDevice) and d.type != "meta",
                f"meta_device: {d.name} is a meta device itself; meta devices do not nest")
        ensure_alive(d.ptr)
    require(callable(split) or isinstance(split, Mapping),
            "meta_device: split must be a callable (tensor -> gg.Split) or a mapping "
            f"name -> gg.Split, not {type(split).__name__}", InvalidType)
    if isinstance(split, Mapping):
        for k, v in split.items():
            require(isinstance(k, str) and isinstance(v, Split),
                    f"meta_device: split maps names to gg.Split, got {k!r}: {v!r}", InvalidType)
    if allreduce == "generic" and len(parts) > 1 and _has_comm(parts):
        require(all(d.registry.name == "CUDA" for d in parts),
                f"meta_device: allreduce='generic' over {parts[0].registry.name} devices: "
                "ggml's meta backend takes that registry's own all-reduce and offers no way to "
                "decline it (CUDA's does, GGML_CUDA_ALLREDUCE=none)", UnsupportedError)
    sp = _Splitter(split, len(parts))
    handle = ffi.new_handle(sp)
    _KEEP.append((sp, handle))       # ggml keeps the device (and calls back) until exit
    arr = ffi.new("ggml_backend_dev_t[]", [d.ptr for d in parts])
    raw = lib.ggml_backend_meta_device(arr, len(parts), _callback(), handle)
    if raw == ffi.NULL:
        raise GGMLError("ggml_backend_meta_device failed")
    dev = MetaDevice._made(raw, parts, sp, allreduce)
    register(raw, dev)
    compose(raw, dev)
    BufferType(lib.ggml_backend_dev_buffer_type(raw)).admit_with(sp.admit)
    return dev
