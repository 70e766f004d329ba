"""The meta backend's planning (:mod:`ggml_py._meta`): ggml's split-state propagation
(``ggml-backend-meta.cpp``) replayed over a graph before the meta backend computes it, so
that what ggml would abort on is refused with the op and the split states named; and which
meta device a tensor lives on (the registry of meta devices by their ggml handle)."""
from __future__ import annotations

from typing import Any

from ._loader import cstr, ffi, lib
from ._split import MAX_DIMS, MIRRORED, PARTIAL, UNKNOWN, State
from .errors import InvalidArgument

BY_DEV: dict[int, Any] = {}        # ggml's meta device handle -> its MetaDevice


def register(raw: Any, meta: Any) -> None:
    """Record `meta` (a MetaDevice of ggml_py._meta) as the device of ggml's meta device handle
    `raw`: its buffers' tensors are planned with its ``splitter`` from now on."""
    BY_DEV[_addr(raw)] = meta
    from . import _context
    _context.meta_view_check = check_view


def check_view(raw: Any) -> None:
    """Refused for a view of a meta device's memory whose split state ggml cannot derive:
    ggml's meta buffer derives it when the view is initialised, and aborts the process on a
    view it cannot map (a permuted view of a split tensor, strides it cannot follow, a
    reshape across the split axis). Called before ``ggml_backend_view_init``."""
    meta = meta_of_buffer(raw.view_src.buffer)
    if meta is not None:
        # (the refused record stays in its context, which ggml cannot drop: no graph reaches
        # it, and Context.alloc refuses a meta context that already holds placed tensors)
        _Planner(meta.n_parts).state(raw, False)


def _addr(p: Any) -> int:
    return int(ffi.cast("uintptr_t", p))


def meta_of_buffer(buf: Any) -> Any:
    if buf == ffi.NULL:
        return None
    dev = lib.ggml_backend_buft_get_device(lib.ggml_backend_buffer_get_type(buf))
    return None if dev == ffi.NULL else BY_DEV.get(_addr(dev))


# -- planning: ggml's split-state propagation, replayed ---------------------------------------

def _op(name: str) -> int:
    return int(getattr(lib, f"GGML_OP_{name}", -1))


_BIN = {_op(n) for n in ("ADD", "ADD_ID", "SUB", "MUL", "DIV")}
_ELEMENTWISE = {_op(n) for n in ("SQR", "SQRT", "LOG", "SIN", "COS", "SCALE", "CLAMP",
                                 "LEAKY_RELU", "UNARY", "FILL", "SILU_BACK")}
_PER_ROW = {_op(n) for n in ("SUM_ROWS", "MEAN", "ARGMAX", "NORM", "RMS_NORM", "L2_NORM",
                             "GROUP_NORM", "CUMSUM", "ARGSORT", "TOP_K")}
# ggml treats these as elementwise (its split passes through), but each output element reads
# a whole row: split along rows (ggml axis 0) they compute something else (soft_max measured:
# NMSE 0.94, docs/tensor-parallel.md); ggml_py refuses that split and passes the others
_ROW_READING = {_op(n) for n in ("SOFT_MAX", "GLU")}
# a repeat of a split tensor: not measured, refused
_SCALAR_ONLY_HERE = {_op("REPEAT")}
_SCALAR_ONLY = {_op(n) for n in ("DUP", "ADD1", "ACC", "SUM", "DIAG", "DIAG_MASK_INF",
                                 "DIAG_MASK_ZERO", "SET", "OUT_PROD", "GET_ROWS_BACK")}
_OPS_MODELLED = _BIN | _ELEMENTWISE | _PER_ROW | _SCALAR_ONLY | _ROW_READING | \
    _SCALAR_ONLY_HERE | {
    _op(n) for n in ("NONE", "MUL_MAT", "CONT", "RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE",
                     "CPY", "GET_ROWS", "CONCAT")}


class Refused(InvalidArgument):
    """A graph or tensor that ggml's meta backend would abort on."""


def _opname(t: Any) -> str:
    return cstr(lib.ggml_op_desc(t)) or str(int(t.op))


def _label(t: Any) -> str:
    return f"{cstr(t.name) or '(unnamed)'} ({_opname(t)})"


class _Planner:
    def __init__(self, n: int) -> None:
        self.n = n
        self.memo: dict[tuple[int, bool], State] = {}

    def state(self, t: Any, sync: bool) -> State:
        key = (_addr(t), sync)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._compute(t, sync)
        return got

    def fail(self, t: Any, srcs: list[tuple[Any, State]], why: str) -> Refused:
        described = ", ".join(f"{_label(s)}: {st.name()}" for s, st in srcs)
        return Refused(f"meta device: {_opname(t)} {cstr(t.name) or '(unnamed)'!r} "
                       f"{why} (sources: {described or 'none'})")

    def _compute(self, t: Any, sync: bool) -> State:
        n = self.n
        if int(lib.ggml_nelements(t)) == 0:
            raise Refused(f"meta device: {_label(t)} is empty; ggml aborts on empty tensors")
        buf = t.buffer
        static = buf != ffi.NULL and t.view_src == ffi.NULL and \
            int(lib.ggml_backend_buffer_get_usage(buf)) != int(lib.GGML_BACKEND_BUFFER_USAGE_COMPUTE)
        if static:
            meta = meta_of_buffer(buf)
            if meta is None:
                raise Refused(f"meta device: {_label(t)} lives in a buffer of "
                              f"{cstr(lib.ggml_backend_buffer_name(buf))}, not of a meta "
                              "device; allocate it on the meta device (ctx.alloc(meta_backend))")
            st: State | None = meta.splitter.static_state(t)
            if st is None:
                meta.splitter.raise_pending()
                raise Refused(f"meta device: {_label(t)} has no resolved split (placed "
                              "without Context.alloc?)")
            return st
        srcs = [t.src[i] for i in range(int(lib.GGML_MAX_SRC))]
        ss: list[State] = []
        present: list[tuple[Any, State]] = []
        for s in srcs:
            if s == ffi.NULL or s == t:
                ss.append(State(UNKNOWN))
                continue
            st = self.state(s, True)
            ss.append(st)
            present.append((s, st))
        op = int(t.op)
        if op not in _OPS_MODELLED:
            raise self.fail(t, present, "is not an op ggml_py has checked on meta devices")
        if op == _op("NONE"):
            if t.view_src != ffi.NULL:
                return self.state(t.view_src, sync)
            return State(MIRRORED)
        for s, st in present:
            if st.axis == PARTIAL:
                raise self.fail(t, present, f"consumes {_label(s)}, a PARTIAL tensor that ggml "
                                            "never all-reduces (only a matmul's partial sums "
                                            "are reduced before their consumers)")
        ret = self._rule(t, op, ss, present, sync)
        if ret.split:
            self._take_ratio(t, ret, ss, present, srcs)
        return ret

    def _generic(self, t: Any, ss: list[State], present: list[tuple[Any, State]],
                 scalar_only: bool) -> State:
        ret: State | None = None
        for _, st in present:
            if ret is None:
                ret = st.copy()
            elif not self._equal(st, ret):
                raise self.fail(t, present, "has sources split in different ways, which ggml "
                                            "does not implement for this op")
        if ret is None:
            raise self.fail(t, present, "has no sources")
        if scalar_only and ret.split:
            raise self.fail(t, present, "cannot take a source split along an axis (ggml "
                                        "implements this op for mirrored sources only)")
        return ret

    def _equal(self, a: State, b: State) -> bool:
        return a.axis == b.axis and a.per_device(self.n) == b.per_device(self.n)

    def _rule(self, t: Any, op: int, ss: list[State], present: list[tuple[Any, State]],
              sync: bool) -> State:
        if op in _BIN:
            s0, s1, s2 = ss[0], ss[1], ss[2]
            if s0.split and int(t.src[1].ne[s0.axis]) == 1 and s1.axis == MIRRORED:
                return s0.copy()
            if s2.axis == MIRRORED and (s0.axis == s1.axis or (s0.axis == MIRRORED and
                                                                s1.axis == PARTIAL)):
                return s0.copy()
            if t.src[2] != ffi.NULL and s2.axis != MIRRORED:
                raise self.fail(t, present, "needs a mirrored third source")
            return self._generic(t, ss, present, False)
        if op in _ELEMENTWISE:
            return self._generic(t, ss, present, False)
        if op in _SCALAR_ONLY or op in _SCALAR_ONLY_HERE:
            return self._generic(t, ss, present, True)
        if op in _ROW_READING:
            if ss[0].axis == 0:
                raise self.fail(t, present, "reads whole rows, and its source is split along "
                                            "rows (numpy axis -1): ggml would compute it on each "
                                            "device's part of every row (a wrong result)")
            return self._generic(t, ss, present, False)
        if op in _PER_ROW:
            if ss[0].axis == 0:
                raise self.fail(t, present, "works on whole rows; its source is split along "
                                            "rows (numpy axis -1), which ggml does not implement")
            return ss[0].copy()
        if op == _op("MUL_MAT"):
            return self._rule_mul_mat(t, ss, present, sync)
        if op in (_op("CONT"), _op("RESHAPE")):
            return self._reshape(t, ss, present)
        if op == _op("CPY"):
            if ss[0].split:
                return self._reshape(t, ss, present)
            return self._generic(t, ss, present, False)
        if op == _op("VIEW"):
            return self._view(t, ss, present)
        if op in (_op("PERMUTE"), _op("TRANSPOSE")):
            moved = self._rule_axes_moved(t, op, ss, present)
            if moved is not None:
                return moved
        if op == _op("GET_ROWS"):
            if ss[0].axis == 0 and ss[1].axis == MIRRORED:
                return ss[0].copy()
            return self._generic(t, ss, present, True)
        if op == _op("CONCAT"):
            return self._rule_concat(t, ss, present)
        raise self.fail(t, present, "has split states ggml aborts on")

    def _rule_mul_mat(self, t: Any, ss: list[State], present: list[tuple[Any, State]],
                      sync: bool) -> State:
        """ggml's rule for mul_mat: a weight split on columns, the inner axis or batches."""
        a, b = ss[0], ss[1]
        if a.axis == MIRRORED and b.axis == MIRRORED:
            return State(MIRRORED)
        if a.axis == 1 and b.axis == MIRRORED:
            if a.n_seg > 1 or a.nr[0] != 1:
                raise self.fail(t, present, "multiplies a segmented (fused) weight: ggml "
                                            "keeps one segment in the result, whose columns "
                                            "then come out in device order (q0 k0 v0 q1 k1 "
                                            "v1 instead of q0 q1 k0 k1 v0 v1), a wrong result "
                                            "(docs/tensor-parallel.md)")
            r = a.copy()
            r.axis, r.nr, r.n_seg = 0, [1] + r.nr[1:], 1
            return r
        if b.axis == 1 and a.axis == MIRRORED:
            return b.copy()
        if a.axis == 0 and b.axis == 0:
            if not self._equal(a, b):
                raise self.fail(t, present, "has its inner axis split differently in its "
                                            "two sources")
            return State(MIRRORED if sync else PARTIAL)
        if a.axis == b.axis and a.axis in (2, 3):
            if not self._equal(a, b):
                raise self.fail(t, present, "has batches split differently")
            return a.copy()
        if a.axis in (2, 3) and b.axis == MIRRORED:
            return a.copy()
        raise self.fail(t, present, "combines split states ggml's meta backend does not "
                                    "implement ('unsupported mul_mat split states'); it "
                                    "implements weight split on numpy axis -2 (columns: "
                                    "output split) with a mirrored input, or both split "
                                    "on the inner axis -1 (rows: partial sums)")

    def _rule_axes_moved(self, t: Any, op: int, ss: list[State],
                         present: list[tuple[Any, State]]) -> State | None:
        """ggml's rule for permute and transpose (the split axis moves); None where it has none."""
        s0 = ss[0]
        if op == _op("PERMUTE"):
            if s0.split:
                if not (s0.n_seg == 1 or s0.nr[0] == 1):
                    raise self.fail(t, present, "permutes a segmented split")
                axis = int(ffi.cast("int32_t *", t.op_params)[s0.axis])
                return State(axis, [], [s0.nr[0]], 1)
            if s0.axis in (MIRRORED, PARTIAL):
                return s0.copy()
            return None
        if s0.axis in (0, 1):
            if not (s0.n_seg == 1 or s0.nr[0] == 1):
                raise self.fail(t, present, "transposes a segmented split")
            return State(s0.axis ^ 1, [], [s0.nr[0]], 1)
        if s0.axis in (2, 3, MIRRORED, PARTIAL):
            return s0.copy()
        return None

    def _rule_concat(self, t: Any, ss: list[State], present: list[tuple[Any, State]]) -> State:
        """ggml's rule for concat: a split source passes unless the concat runs along its axis."""
        cax = int(ffi.cast("int32_t *", t.op_params)[0])
        s0, s1 = ss[0], ss[1]
        if s0.axis == MIRRORED and s1.split:
            if cax == s1.axis:
                raise self.fail(t, present, "concatenates along the split axis")
            return s1.copy()
        if s1.axis == MIRRORED and s0.split:
            if cax == s0.axis:
                raise self.fail(t, present, "concatenates along the split axis")
            return s0.copy()
        if s0.axis == s1.axis and s0.axis != cax:
            return s0.copy()
        return self._generic(t, ss, present, True)

    def _reshape(self, t: Any, ss: list[State], present: list[tuple[Any, State]]) -> State:
        s0 = ss[0]
        src = t.src[0]
        if s0.axis in (MIRRORED, PARTIAL):
            return s0.copy()
        if not s0.split:
            raise self.fail(t, present, "reshapes a source of unknown split")
        base_in = 1
        for d in range(s0.axis + 1):
            base_in *= int(src.ne[d])
        if s0.n_seg == 1:
            base_in //= max(s0.nr[0], 1)
            if s0.axis == int(lib.ggml_n_dims(src)) - 1 and s0.nr[0] == 1:
                return State(int(lib.ggml_n_dims(t)) - 1)
            if s0.axis == 0 and t.ne[0] == src.ne[0] and t.ne[1] == 1 and s0.nr[0] == 1:
                if all(ne == 0 or ne == int(src.ne[0]) for ne in s0.per_device(self.n)):
                    return State(1)
        base_out = 1
        for d in range(MAX_DIMS):
            base_out *= int(t.ne[d])
            if base_out % base_in == 0:
                return State(d, [], [base_out // base_in], 1)
            if base_out > base_in:
                if s0.n_seg != 1 or s0.nr[0] != 1:
                    raise self.fail(t, present, "reshapes a segmented split across its axis")
                return State(d)
        raise self.fail(t, present, "reshapes across the split axis ('shape mismatch')")

    def _view(self, t: Any, ss: list[State], present: list[tuple[Any, State]]) -> State:
        src = t.src[0]
        if lib.ggml_is_contiguous(t) and lib.ggml_is_contiguous(src):
            return self._reshape(t, ss, present)
        s0 = ss[0]
        same = all((t.ne[d] == 1 and src.ne[d] == 1) or t.nb[d] == src.nb[d]
                   for d in range(MAX_DIMS))
        if same:
            return s0.copy()
        if not lib.ggml_is_permuted(t) and not lib.ggml_is_permuted(src) and \
                0 <= s0.axis < MAX_DIMS - 1:
            for d in range(MAX_DIMS - 1):
                if t.nb[d + 1] == src.nb[s0.axis + 1]:
                    return State(d)
            raise self.fail(t, present, "views a split tensor with strides ggml cannot map")
        if s0.axis in (MIRRORED, PARTIAL):
            return s0.copy()
        raise self.fail(t, present, "views a permuted split tensor ('view of permuted tensor "
                                    "not implemented')")

    def _take_ratio(self, t: Any, ret: State, ss: list[State], present: list[tuple[Any, State]],
                    srcs: list[Any]) -> None:
        """ggml's last step for split results: the per-device sizes follow the first split
        source's ratio; the other split sources must agree (GGML_ASSERTs there)."""
        n = self.n
        first = True
        for i, s in enumerate(srcs):
            st = ss[i]
            if s == ffi.NULL or s == t or not st.split:
                continue
            src_len = int(s.ne[st.axis])
            if first:
                ne = [0] * (n * max(st.n_seg, ret.n_seg))
                per = st.per_device(n)
                for j in range(n):
                    v = per[j] * int(t.ne[ret.axis])
                    if v != 0 or src_len != 0:
                        div = src_len * ret.nr[0]
                        if div == 0 or v % div:
                            raise self.fail(t, present, "gets an uneven share on a device "
                                                        "(the split sizes do not divide its "
                                                        "shape)")
                        v //= div
                    ne[j] = v
                ret.ne = ne
            else:
                if ret.n_seg != 1:
                    raise self.fail(t, present, "combines a segmented split with another "
                                                "split source")
                per = st.per_device(n)
                for j in range(n):
                    if ret.ne[j] * ret.nr[0] * src_len != per[j] * int(t.ne[ret.axis]):
                        raise self.fail(t, present, "has split sources whose ratios differ")
            first = False
        if first:
            raise self.fail(t, present, "is split with no split source")


def plan(graph: Any, backend: Any) -> dict[int, State]:
    """Check `graph` for the meta backend before ggml sees it: the split state of every
    node as ggml would derive it; Refused (an InvalidArgument) for what ggml aborts on."""
    dev = backend.device          # a MetaDevice (ggml_py._meta): parts and the splitter
    dev.splitter.raise_pending()
    gp = graph.ptr
    n_nodes = int(lib.ggml_graph_n_nodes(gp))
    pl = _Planner(dev.n_parts)
    states = {}
    nodes = [lib.ggml_graph_node(gp, i) for i in range(n_nodes)]
    for i, t in enumerate(nodes):
        if t.buffer != ffi.NULL and t.view_src == ffi.NULL:
            m = meta_of_buffer(t.buffer)
            if m is None:
                raise Refused(f"meta device: node {_label(t)} lives in a buffer of "
                              f"{cstr(lib.ggml_backend_buffer_name(t.buffer))}")
        st = pl.state(t, False)
        if st.axis == UNKNOWN:
            raise Refused(f"meta device: node {_label(t)} has an unknown split")
        if st.axis == PARTIAL:
            if i == n_nodes - 1:
                raise Refused(
                    f"meta device: the graph's last node {_label(t)} is PARTIAL (each device "
                    "holds a partial sum): ggml does not all-reduce a graph's last node and "
                    "cannot read it; end the graph with gg.meta_reduce(t)")
            if not lib.ggml_is_contiguous(t):
                raise Refused(f"meta device: {_label(t)} is PARTIAL and not contiguous; "
                              "ggml's all-reduce needs contiguous tensors")
        states[_addr(t)] = st
    last = nodes[-1] if nodes else None
    if last is not None and last.view_src != ffi.NULL and int(last.view_src.op) == _op("NONE") \
            and lib.ggml_backend_buffer_is_host(last.view_src.buffer):
        raise Refused(f"meta device: the graph's last node {_label(last)} is a view of "
                      f"{_label(last.view_src)} in host memory; ggml's meta backend skips such "
                      "nodes and then aborts (GGML_ASSERT(i_start == cgraph->n_nodes)); end "
                      "the graph with gg.cont(view)")
    dev.splitter.raise_pending()
    return states


def _meta_under(raw: Any, seen: set[int]) -> Any:
    """The meta device whose buffer holds `raw`, its view source or (not yet allocated) one
    of the tensors it is computed from."""
    if _addr(raw) in seen:
        return None
    seen.add(_addr(raw))
    for b in (raw.buffer, raw.view_src.buffer if raw.view_src != ffi.NULL else ffi.NULL):
        m = meta_of_buffer(b)
        if m is not None:
            return m
    for i in range(int(lib.GGML_MAX_SRC)):
        s = raw.src[i]
        if s != ffi.NULL and s != raw:
            m = _meta_under(s, seen)
            if m is not None:
                return m
    return None


def meta_of_tensor(t: Any) -> Any:
    """The meta device `t` (a Tensor) lives on or is computed on, None for other tensors."""
    return _meta_under(t.ptr, set()) if BY_DEV else None


def plan_tensor(raw: Any) -> State:
    """The split state ggml gives the tensor `raw` (of a meta buffer) when it is read."""
    meta = _meta_under(raw, set())
    if meta is None:
        return State(MIRRORED)
    return _Planner(meta.n_parts).state(raw, False)


def meta_reduce(t: Any) -> Any:
    """`t`, all-reduced: an op after a PARTIAL tensor makes ggml's meta backend sum it over
    the devices first (``ggml_scale(t, 1)``); its result is mirrored and can be read."""
    from . import ops
    return ops.scale(t, 1.0)


def split_states(graph: Any, backend: Any) -> list[tuple[str, str, str]]:
    """(node name, op, split state) for every node of `graph` as the meta backend derives."""
    states = plan(graph, backend)
    gp = graph.ptr
    out = []
    for i in range(int(lib.ggml_graph_n_nodes(gp))):
        t = lib.ggml_graph_node(gp, i)
        out.append((cstr(t.name) or "", _opname(t), states[_addr(t)].name(int(lib.ggml_n_dims(t)))))
    return out
