"""Tests written against census survivors in ggml_py/ops (conv, elementwise, index, linalg, nn,
reduce): each pins one operand rule of an op builder, so that it fails when the rule's check
is removed (tools/mutants.py) and passes without. Ops only build graph nodes here: every
refusal happens before ggml sees the operands."""
import numpy as np
import pytest

import ggml_py as gg
from ggml_py.ops.nn import _KQ_MASK_PAD
from ggml_py.ops import elementwise


STRIDED = r"the rows of {} \S.* are strided \(a transposed or permuted view\)"
NOT_CONTIGUOUS = r"{} \S.* must be contiguous \(it is a view\)"


def packed_but_not_contiguous(t, rows, cols):
    """A (rows, cols) window of 2-D f32/i32 `t`: each row packed, but rows `t.shape[1]`
    elements apart, so the view is not contiguous."""
    ts = t.type.type_size
    return gg.view(t, (rows, cols), strides=(t.shape[1] * ts, ts))


# -- conv -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bf16", "i32", "f64"])
def test_im2col_writes_f32_or_f16_columns_only(dtype):
    """im2col's dtype is the type of the columns it writes: f32 or f16, nothing else."""
    with gg.Context() as ctx:
        k = ctx.tensor(gg.f16, (2, 1, 3, 3))
        x = ctx.tensor(gg.f32, (1, 1, 8, 8))
        assert gg.im2col(k, x, dtype="f16").type.name == "f16"       # (the rule's own types)
        assert gg.im2col(k, x, dtype="f32").type.name == "f32"
        with pytest.raises(gg.InvalidType, match="im2col: dtype must be f32 or f16"):
            gg.im2col(k, x, dtype=dtype)


def test_pool_2d_refuses_strided_rows():
    """pool_2d's kernel reads each row as packed floats: a transposed or permuted view is
    refused, naming gg.cont."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (1, 2, 6, 8))
        for bad in (gg.transpose(a), gg.permute(a, (0, 1, 3, 2)), gg.permute(a, (3, 2, 1, 0))):
            with pytest.raises(gg.InvalidArgument, match=STRIDED.format("a") + r"; make them "
                               r"contiguous with gg\.cont\(a\)"):
                gg.pool_2d(bad, 2)
        assert gg.pool_2d(gg.cont(gg.transpose(a)), 2).shape == (1, 2, 4, 3)


@pytest.mark.parametrize("kernel, stride, padding", [
    (0, 1, 0), ((2, 0), 1, 0), (2, (1, -1), 0), (2, 1, -1), (2, 1, 2), (3, 1, (0, 3)),
    ((1, 2), 1, (1, 0))])
def test_pool_2d_kernel_stride_and_padding_rule(kernel, stride, padding):
    """Kernel and stride positive, padding in 0..kernel-1 on each axis (ggml's pool kernel
    reads outside the input otherwise)."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (1, 1, 8, 8))
        with pytest.raises(gg.InvalidArgument, match=r"pool_2d: kernel and stride must be "
                                                     r"positive, padding in 0\.\.kernel-1"):
            gg.pool_2d(a, kernel, stride, padding)
        assert gg.pool_2d(a, 3, 1, 2 if kernel == 3 else 1).ndim == 4   # the bound itself


# -- elementwise ------------------------------------------------------------------------------

UNARY_NAMES = ["relu", "exp", "neg", "sqr", "tanh", "gelu"]


def unary_ops(name):
    """gg.<name>, and the same op made afresh by the factory every unary op comes from
    (ggml_py.ops.elementwise._unary): the rule is the factory's, for each op it makes."""
    return [getattr(gg, name), elementwise._unary(f"ggml_{name}", name)]


@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_ops_refuse_strided_rows(name):
    """The CPU unary kernels read rows as packed floats: a transposed/permuted view is refused
    by the rows rule (before the contiguity rule), naming gg.cont."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (3, 4, 5))
        for op in unary_ops(name):
            for bad in (gg.transpose(a), gg.permute(a, (2, 1, 0)), gg.permute(a, (0, 2, 1))):
                with pytest.raises(gg.InvalidArgument,
                                   match=f"{name}: " + STRIDED.format("a") + r"; make them "
                                         r"contiguous with gg\.cont\(a\)"):
                    op(bad)
            assert op(gg.cont(gg.transpose(a))).shape == (3, 5, 4)


@pytest.mark.parametrize("name", UNARY_NAMES)
def test_unary_ops_refuse_a_view_that_is_not_contiguous(name):
    """CUDA's unary kernels need a contiguous tensor: a window of packed rows that are further
    apart than a row is refused too."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 6))
        bad = packed_but_not_contiguous(a, 3, 4)
        assert bad.nb[0] == 4 and not bad.is_contiguous
        for op in unary_ops(name):
            with pytest.raises(gg.InvalidArgument, match=f"{name}: " + NOT_CONTIGUOUS.format("a")
                               + r"; use gg\.cont\(a\)"):
                op(bad)
            assert op(gg.cont(bad)).shape == (3, 4)


# -- index ------------------------------------------------------------------------------------

def test_get_rows_refuses_strided_table_or_indices():
    """get_rows reads packed rows of the table and packed index values: a transposed table or
    transposed indices are refused, naming which."""
    with gg.Context() as ctx:
        table = ctx.tensor(gg.f32, (2, 6, 4))          # ne [4, 6, 2]
        idx = ctx.tensor(gg.i32, (3, 2))               # ne [2, 3]: transposed -> ne [3, 2]
        with pytest.raises(gg.InvalidArgument, match="get_rows: " + STRIDED.format("indices")):
            gg.get_rows(table, gg.transpose(idx))
        sq = ctx.tensor(gg.f32, (2, 4, 4))
        with pytest.raises(gg.InvalidArgument, match="get_rows: " + STRIDED.format("a")):
            gg.get_rows(gg.transpose(sq), gg.cont(gg.transpose(idx)))
        assert gg.get_rows(table, gg.cont(gg.transpose(idx))).shape == (2, 3, 4)


def test_set_rows_refuses_strided_indices():
    """set_rows reads its index values packed: transposed indices are refused."""
    with gg.Context() as ctx:
        dst = ctx.tensor(gg.f32, (2, 6, 4))            # ne [4, 6, 2]
        src = ctx.tensor(gg.f32, (2, 3, 4))            # ne [4, 3, 2]
        for itype in (gg.i32, gg.i64):
            idx = ctx.tensor(itype, (3, 2))            # transposed -> ne [3, 2]
            with pytest.raises(gg.InvalidArgument,
                               match="set_rows: " + STRIDED.format("indices")):
                gg.set_rows(dst, src, gg.transpose(idx))
            assert gg.set_rows(dst, src, ctx.tensor(itype, (2, 3))).shape == dst.shape


# -- linalg -----------------------------------------------------------------------------------

@pytest.mark.parametrize("atype", ["i32", "i16", "f64"])
def test_out_prod_refuses_a_that_is_not_float_or_quantized(atype):
    with gg.Context() as ctx:
        a = ctx.tensor(getattr(gg, atype), (3, 4))
        b = ctx.tensor(gg.f32, (3, 5))
        with pytest.raises(gg.InvalidType, match=f"out_prod: a must be f32/f16/bf16 or "
                                                 f"quantized, got {atype}"):
            gg.out_prod(a, b)


@pytest.mark.parametrize("btype", ["f16", "bf16", "i32"])
def test_out_prod_takes_an_f32_b_only(btype):
    """ggml's CPU out_prod kernel reads b as f32 whatever its type."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (3, 4))
        b = ctx.tensor(getattr(gg, btype), (3, 5))
        with pytest.raises(gg.InvalidType, match=f"out_prod: b must be f32, got {btype}"):
            gg.out_prod(a, b)
        assert gg.out_prod(a, ctx.tensor(gg.f32, (3, 5))).shape == (5, 4)


@pytest.mark.parametrize("ashape, bshape", [((3, 4), (2, 5)), ((1, 4), (3, 5)),
                                            ((2, 3, 4), (2, 4, 5))])
def test_out_prod_needs_matching_second_dims(ashape, bshape):
    """ggml_out_prod sums over ne1, which a and b must share (ggml asserts otherwise)."""
    with gg.Context() as ctx:
        a, b = ctx.tensor(gg.f32, ashape), ctx.tensor(gg.f32, bshape)
        with pytest.raises(gg.InvalidArgument, match=r"out_prod: a\.ne1=\d+ != b\.ne1=\d+"):
            gg.out_prod(a, b)


def test_out_prod_refuses_a_with_strided_rows():
    """out_prod's kernel reads a's rows packed: a transposed a is refused by the rows rule."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 3))                 # transposed: ne [4, 3], nb [12, 4]
        b = ctx.tensor(gg.f32, (3, 5))
        with pytest.raises(gg.InvalidArgument, match="out_prod: " + STRIDED.format("a")):
            gg.out_prod(gg.transpose(a), b)
        assert gg.out_prod(gg.cont(gg.transpose(a)), b).shape == (5, 4)


def test_mul_mat_refuses_b_with_strided_rows():
    """mul_mat reads b's rows packed: a permuted b whose rows are strided (and whose row
    stride is still a full row, so no other rule sees it) is refused, naming b."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (5, 2))                 # ne [2, 5]
        b = ctx.tensor(gg.f32, (2, 3, 4))              # ne [4, 3, 2]
        bp = gg.permute(b, (2, 1, 0))                  # ne [2, 3, 4], nb [48, 16, 4]
        assert bp.nb[0] == 48 and bp.nb[1] >= bp.ne[0] * 4
        with pytest.raises(gg.InvalidArgument, match="mul_mat: " + STRIDED.format("b")):
            gg.mul_mat(a, bp)
        assert gg.mul_mat(a, gg.cont(bp)).shape == (4, 3, 5)


# -- nn ---------------------------------------------------------------------------------------

def test_group_norm_refuses_a_view_that_is_not_contiguous():
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (1, 4, 6, 6))
        for bad in (gg.transpose(a), gg.permute(a, (0, 2, 1, 3)),
                    gg.view(a, (1, 4, 3, 6), strides=(4 * 36 * 4, 36 * 4, 6 * 4, 4))):
            assert not bad.is_contiguous
            with pytest.raises(gg.InvalidArgument,
                               match="group_norm: " + NOT_CONTIGUOUS.format("a")):
                gg.group_norm(bad, 2)
        assert gg.group_norm(a, 2).shape == a.shape


def _qkv(ctx, q, k, v):
    return (ctx.tensor(gg.f32, q), ctx.tensor(gg.f32, k), ctx.tensor(gg.f32, v))


def test_flash_attn_ext_accepts_the_shapes_the_rules_allow():
    with gg.Context() as ctx:
        q, k, v = _qkv(ctx, (2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6))
        mask = ctx.tensor(gg.f16, (_KQ_MASK_PAD if _KQ_MASK_PAD > 1 else 3, 5))   # (0.9.x pad)
        assert gg.flash_attn_ext(q, k, v).shape == (2, 3, 4, 6)
        assert gg.flash_attn_ext(q, k, v, mask).shape == (2, 3, 4, 6)


@pytest.mark.parametrize("q, k", [((1, 3, 2, 8), (1, 2, 5, 8)), ((1, 4, 2, 8), (1, 3, 5, 8)),
                                  ((1, 1, 2, 8), (1, 2, 5, 8))])
def test_flash_attn_ext_query_heads_are_a_multiple_of_kv_heads(q, k):
    """Grouped-query attention: every k/v head serves the same number of q heads."""
    with gg.Context() as ctx:
        qt, kt, vt = _qkv(ctx, q, k, k)
        with pytest.raises(gg.InvalidArgument, match=r"flash_attn_ext: q's heads/batch \(.*\) "
                                                     r"are not multiples of k's"):
            gg.flash_attn_ext(qt, kt, vt)


@pytest.mark.parametrize("q, k, v", [((2, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)),
                                     ((2, 2, 3, 8), (2, 2, 5, 8), (1, 2, 5, 8)),
                                     ((4, 2, 3, 8), (2, 2, 5, 8), (2, 2, 5, 8))])
def test_flash_attn_ext_q_k_v_share_the_batch(q, k, v):
    with gg.Context() as ctx:
        qt, kt, vt = _qkv(ctx, q, k, v)
        with pytest.raises(gg.InvalidArgument,
                           match="flash_attn_ext: q, k and v batch sizes differ"):
            gg.flash_attn_ext(qt, kt, vt)


@pytest.mark.parametrize("v", [(1, 2, 4, 8), (1, 1, 5, 8), (1, 2, 6, 6)])
def test_flash_attn_ext_v_matches_k_in_keys_and_heads(v):
    with gg.Context() as ctx:
        qt, kt, vt = _qkv(ctx, (1, 2, 3, 8), (1, 2, 5, 8), v)
        with pytest.raises(gg.InvalidArgument, match=r"flash_attn_ext: v \(.*\) does not match "
                                                     r"k \(1, 2, 5, 8\) in keys and heads"):
            gg.flash_attn_ext(qt, kt, vt)


def test_flash_attn_ext_mask_must_be_contiguous():
    with gg.Context() as ctx:
        q, k, v = _qkv(ctx, (1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8))
        wide = ctx.tensor(gg.f16, (4, 7))
        for bad in (gg.transpose(ctx.tensor(gg.f16, (5, 3))),
                    gg.view(wide, (3, 5), strides=(14, 2))):
            assert not bad.is_contiguous and bad.shape == (3, 5)
            with pytest.raises(gg.InvalidArgument,
                               match="flash_attn_ext: mask must be contiguous"):
                gg.flash_attn_ext(q, k, v, bad)


@pytest.mark.parametrize("mask", [(3, 4), (3, 6), (2, 5), (1, 5)])
def test_flash_attn_ext_mask_covers_queries_and_keys(mask):
    """The mask has a column per key (exactly) and at least a row per query."""
    with gg.Context() as ctx:
        q, k, v = _qkv(ctx, (1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8))
        m = ctx.tensor(gg.f16, mask)
        with pytest.raises(gg.InvalidArgument, match=r"flash_attn_ext: mask \(.*\) does not "
                                                     r"cover \(3, 5\)"):
            gg.flash_attn_ext(q, k, v, m)


@pytest.mark.parametrize("mshape", [(3, 4, 5), (2, 2, 4, 5), (4, 1, 4, 5)])
def test_soft_max_mask_batch_dims_divide_a(mshape):
    """The mask's batch dims broadcast over a's: each must divide a's."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (3, 2, 4, 5))           # ne [5, 4, 2, 3]
        mask = ctx.tensor(gg.f32, mshape)
        with pytest.raises(gg.InvalidArgument,
                           match="soft_max: mask batch dims must divide a's"):
            gg.soft_max(a, mask, 0.5)
        assert gg.soft_max(a, ctx.tensor(gg.f32, (1, 2, 4, 5)), 0.5).shape == a.shape


def test_soft_max_mask_must_be_contiguous():
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 5))
        wide = ctx.tensor(gg.f32, (4, 8))
        for bad in (gg.transpose(ctx.tensor(gg.f32, (5, 4))),
                    packed_but_not_contiguous(wide, 4, 5)):
            assert not bad.is_contiguous and bad.shape == (4, 5)
            for scale in (1.0, 0.5, 2):
                with pytest.raises(gg.InvalidArgument,
                                   match="soft_max: " + NOT_CONTIGUOUS.format("mask")):
                    gg.soft_max(a, bad, scale)


# -- reduce -----------------------------------------------------------------------------------

def test_argmax_refuses_strided_rows():
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 6))
        with pytest.raises(gg.InvalidArgument, match="argmax: " + STRIDED.format("a")):
            gg.argmax(gg.transpose(a))
        assert gg.argmax(gg.cont(gg.transpose(a))).shape == (6,)


@pytest.mark.parametrize("descending", [1, 0, "yes", None, np.bool_(True)])
def test_argsort_descending_is_a_bool(descending):
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 6))
        with pytest.raises(gg.InvalidType, match="argsort: descending must be a bool"):
            gg.argsort(a, descending)
        assert gg.argsort(a, True).shape == (4, 6)


def test_argsort_refuses_strided_rows():
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 6))
        for bad in (gg.transpose(a), gg.permute(ctx.tensor(gg.f32, (2, 3, 4)), (2, 0, 1))):
            with pytest.raises(gg.InvalidArgument, match="argsort: " + STRIDED.format("a")):
                gg.argsort(bad)


def test_argsort_refuses_a_view_that_is_not_contiguous():
    """argsort's rows packed but further apart than a row: CUDA's kernel needs a contiguous
    tensor, so the view is refused."""
    with gg.Context() as ctx:
        a = ctx.tensor(gg.f32, (4, 8))
        bad = packed_but_not_contiguous(a, 3, 5)
        with pytest.raises(gg.InvalidArgument, match="argsort: " + NOT_CONTIGUOUS.format("a")):
            gg.argsort(bad)
        assert gg.argsort(gg.cont(bad)).shape == (3, 5)
