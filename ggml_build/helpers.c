/* ggml_py's own C helpers, compiled into the API-mode cffi module beside the generated
 * bindings (ggml_build/bindings.py appends their declarations, HELPERS_CDEF, to the cdef at
 * compile time; cdef.h, the generated part, stays as generated). Python keeps an equivalent
 * path for ABI-mode bindings and builds made before the helpers existed.
 *
 * ggml_py_prepare: Graph.prepare's pass over a graph's nodes and leafs in one call (issue 14:
 * about 45 cffi calls per node in Python). Nothing here aborts: a failed check returns its
 * code and the tensor, and Python writes the message. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum {
    GGML_PY_OK = 0,
    GGML_PY_UNSUPPORTED_OP = 1,    /* tensor: the node                                   */
    GGML_PY_NO_MEMORY = 2,         /* tensor: a leaf without data                         */
    GGML_PY_UNUSABLE_BUFFER = 3,   /* tensor: held in a buffer the backend cannot use     */
    GGML_PY_VIEW_INIT = 4,         /* tensor: a view ggml_backend_view_init refused       */
    GGML_PY_NO_ROOM = 5,           /* out of host memory for the walk                     */
};

struct ggml_py_prep {
    int32_t status;
    int32_t need_alloc;              /* some node or view has no address yet               */
    struct ggml_tensor * tensor;     /* the tensor a failed check is about                 */
    int32_t n_index;                 /* get_rows/set_rows nodes whose indices are no node  */
};

/* an open-addressing set of pointers, each with a small tag; it grows when half full (sized
 * for every possible source up front, it spread a 10,000-node graph's few leafs over 2 MiB:
 * a cache miss per insert, most of Graph.prepare's time) */
struct ggml_py_set {
    uintptr_t * keys;
    uint8_t * tags;
    size_t mask;
    size_t count;
};

static int ggml_py_set_init(struct ggml_py_set * s, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) {
        cap <<= 1;
    }
    s->keys = (uintptr_t *) calloc(cap, sizeof(uintptr_t));
    s->tags = (uint8_t *) calloc(cap, 1);
    s->mask = cap - 1;
    s->count = 0;
    return s->keys != NULL && s->tags != NULL;
}

static void ggml_py_set_free(struct ggml_py_set * s) {
    free(s->keys);
    free(s->tags);
}

/* the slot of `p` (found, or where it would go) */
static size_t ggml_py_set_slot(const struct ggml_py_set * s, const void * p) {
    uintptr_t k = (uintptr_t) p;
    size_t i = (size_t) ((k >> 4) * 0x9E3779B97F4A7C15ull) & s->mask;
    while (s->keys[i] != 0 && s->keys[i] != k) {
        i = (i + 1) & s->mask;
    }
    return i;
}

/* put `p` with `tag` in its empty slot `slot` (from ggml_py_set_slot); 0 when out of memory */
static int ggml_py_set_put(struct ggml_py_set * s, size_t slot, const void * p, uint8_t tag) {
    s->keys[slot] = (uintptr_t) p;
    s->tags[slot] = tag;
    if (2 * ++s->count <= s->mask + 1) {
        return 1;
    }
    struct ggml_py_set bigger;
    if (!ggml_py_set_init(&bigger, s->mask + 1)) {
        ggml_py_set_free(&bigger);
        return 0;
    }
    for (size_t i = 0; i <= s->mask; i++) {
        if (s->keys[i] != 0) {
            size_t j = ggml_py_set_slot(&bigger, (const void *) s->keys[i]);
            bigger.keys[j] = s->keys[i];
            bigger.tags[j] = s->tags[i];
        }
    }
    bigger.count = s->count;
    ggml_py_set_free(s);
    *s = bigger;
    return 1;
}

static int ggml_py_usable(ggml_backend_t be, ggml_backend_buffer_t buf,
                          ggml_backend_buffer_t * seen, int * n_seen) {
    for (int i = 0; i < *n_seen; i++) {
        if (seen[i] == buf) {
            return 1;
        }
    }
    if (!ggml_backend_supports_buft(be, ggml_backend_buffer_get_type(buf))) {
        return 0;
    }
    if (*n_seen < 64) {
        seen[(*n_seen)++] = buf;
    }
    return 1;
}

/* Graph.prepare for `be` on `dev` (`cpu`: a second device that must support every op as well,
 * or NULL). Index nodes (ops op_get_rows/op_set_rows, -1 when the release has none) whose
 * index source is no node of the graph go to index_out (up to index_cap of them). */
static int ggml_py_prepare(struct ggml_cgraph * g, ggml_backend_t be, ggml_backend_dev_t dev,
                           ggml_backend_dev_t cpu, int op_get_rows, int op_set_rows,
                           struct ggml_tensor ** index_out, int index_cap,
                           struct ggml_py_prep * out) {
    const int n = ggml_graph_n_nodes(g);
    ggml_backend_buffer_t seen[64];
    int n_seen = 0;
    struct ggml_py_set set;
    memset(out, 0, sizeof(*out));
    if (!ggml_py_set_init(&set, (size_t) n + 16)) {
        ggml_py_set_free(&set);
        out->status = GGML_PY_NO_ROOM;
        return out->status;
    }
    for (int i = 0; i < n && out->status == GGML_PY_OK; i++) {   /* the nodes: tag 1 */
        struct ggml_tensor * t = ggml_graph_node(g, i);
        size_t slot = ggml_py_set_slot(&set, t);
        if (set.keys[slot] == 0 && !ggml_py_set_put(&set, slot, t, 1)) {
            out->status = GGML_PY_NO_ROOM;
        }
    }
    for (int i = 0; i < n && out->status == GGML_PY_OK; i++) {
        struct ggml_tensor * t = ggml_graph_node(g, i);
        if (t->buffer == NULL && t->view_src != NULL && t->view_src->buffer != NULL &&
            t->view_src->data != NULL) {
            if (ggml_backend_view_init(t) != GGML_STATUS_SUCCESS) {
                out->status = GGML_PY_VIEW_INIT;
                out->tensor = t;
                break;
            }
        }
        if (t->buffer != NULL && !ggml_py_usable(be, t->buffer, seen, &n_seen)) {
            out->status = GGML_PY_UNUSABLE_BUFFER;
            out->tensor = t;
            break;
        }
        if (t->data == NULL) {
            out->need_alloc = 1;
        }
        if (t->op != GGML_OP_NONE &&
            (!ggml_backend_dev_supports_op(dev, t) ||
             (cpu != NULL && !ggml_backend_dev_supports_op(cpu, t)))) {
            out->status = GGML_PY_UNSUPPORTED_OP;
            out->tensor = t;
            break;
        }
        if ((int) t->op == op_get_rows || (int) t->op == op_set_rows) {
            struct ggml_tensor * idx = t->src[1];
            if (idx != NULL && set.tags[ggml_py_set_slot(&set, idx)] != 1 &&
                out->n_index < index_cap) {
                index_out[out->n_index++] = t;
            }
        }
    }
    /* then the leafs, as Python reports them: sources that are no node, in the order they
     * are first met, each checked once (tag 2) */
    for (int i = 0; i < n && out->status == GGML_PY_OK; i++) {
        struct ggml_tensor * t = ggml_graph_node(g, i);
        for (int j = 0; j < GGML_MAX_SRC && out->status == GGML_PY_OK; j++) {
            struct ggml_tensor * s = t->src[j];
            if (s == NULL) {
                continue;
            }
            size_t slot = ggml_py_set_slot(&set, s);
            if (set.keys[slot] != 0) {
                continue;                  /* a node, or a leaf met before */
            }
            if (!ggml_py_set_put(&set, slot, s, 2)) {
                out->status = GGML_PY_NO_ROOM;
            } else if (s->data == NULL) {
                out->status = GGML_PY_NO_MEMORY;
                out->tensor = s;
            } else if (s->buffer != NULL && !ggml_py_usable(be, s->buffer, seen, &n_seen)) {
                out->status = GGML_PY_UNUSABLE_BUFFER;
                out->tensor = s;
            }
        }
    }
    ggml_py_set_free(&set);
    return out->status;
}

/* ggml_py_copy: a whole host copy into (to_tensor) or out of a tensor, in one call, when its
 * memory is there and on no RPC or meta device: 0, copied. Otherwise nothing is done: 1, it has no
 * memory; 2, its memory is on an RPC device (Python asks whether the server still answers
 * first: ggml aborts on a dead one). Python then takes its own path, which says why. */
static int ggml_py_copy(struct ggml_tensor * t, void * data, size_t size, int to_tensor) {
    if (t->buffer == NULL || t->data == NULL) {
        return 1;
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
    if (dev != NULL) {
        ggml_backend_reg_t r = ggml_backend_dev_backend_reg(dev);
        if (r == NULL) {
            return 2;                      /* a meta device (no registry): Python checks it */
        }
        const char * reg = ggml_backend_reg_name(r);
        if (reg != NULL && strncmp(reg, "RPC", 3) == 0) {
            return 2;
        }
    }
    if (to_tensor) {
        ggml_backend_tensor_set(t, data, 0, size);
    } else {
        ggml_backend_tensor_get(t, data, 0, size);
    }
    return 0;
}

/* ---- checked ops: the accept-at-once half of ops/'s rules (issue 14) --------------------
 *
 * Each helper builds one ggml op when the operands pass the rule that ops/ applies in
 * Python, reading the operands' facts straight from their ggml records; anything else
 * returns NULL before ggml is called, and Python then takes its own path (the rule in full,
 * its message, numpy's broadcasting, views of allocated memory). So a helper only ever
 * accepts a subset of what Python accepts, and builds what Python would; tests/test_checked.py
 * generates operands to hold them to that. Type rules come from Python as bitmasks of
 * enum ggml_type values (bit t set: type t allowed), so the tables stay in ops/.
 *
 * Each entry point (ggml_py_binary...) takes the Context's state: it holds the mutex, refuses
 * when the Context closed or its chunk has no room for the one record it builds (the Python
 * path then says so, or opens a new chunk), and calls its rule (ggml_py_binary_in...). */

/* how many more tensor records fit in ctx (ggml_new_object aborts when one does not): the one
 * count of room, read by Context._room before the Python path builds and by every checked op */
static int64_t ggml_py_room(struct ggml_context * ctx) {
    int64_t left = (int64_t) ggml_get_mem_size(ctx) - (int64_t) ggml_used_mem(ctx);
    return left / (int64_t) ggml_tensor_overhead() - 1;      /* (- 1: alignment slack) */
}

/* A Context's side of the checked ops: the chunk new tensors go to (NULL once the Context
 * closed) and a mutex. A checked op holds the mutex while it reads the operands and builds;
 * Python holds it (ggml_py_ctx_lock) wherever it builds in, walks or closes the Context's
 * chunks, so ggml never sees two threads in one ggml_context. Nothing else is locked while
 * it is held, so it orders after the Context's Python lock and cannot deadlock with it. */
#if defined(_WIN32)
#include <windows.h>
typedef SRWLOCK ggml_py_mutex;
#define GGML_PY_MUTEX_INIT(m) InitializeSRWLock(m)
#define GGML_PY_MUTEX_LOCK(m) AcquireSRWLockExclusive(m)
#define GGML_PY_MUTEX_UNLOCK(m) ReleaseSRWLockExclusive(m)
#define GGML_PY_MUTEX_DESTROY(m) ((void) (m))
#else
#include <pthread.h>
typedef pthread_mutex_t ggml_py_mutex;
#define GGML_PY_MUTEX_INIT(m) pthread_mutex_init(m, NULL)
#define GGML_PY_MUTEX_LOCK(m) pthread_mutex_lock(m)
#define GGML_PY_MUTEX_UNLOCK(m) pthread_mutex_unlock(m)
#define GGML_PY_MUTEX_DESTROY(m) pthread_mutex_destroy(m)
#endif

struct ggml_py_ctx {
    ggml_py_mutex mutex;
    struct ggml_context * head;
};

static struct ggml_py_ctx * ggml_py_ctx_new(struct ggml_context * head) {
    struct ggml_py_ctx * st = (struct ggml_py_ctx *) calloc(1, sizeof(struct ggml_py_ctx));
    if (st != NULL) {
        GGML_PY_MUTEX_INIT(&st->mutex);
        st->head = head;
    }
    return st;
}

static void ggml_py_ctx_free(struct ggml_py_ctx * st) {
    GGML_PY_MUTEX_DESTROY(&st->mutex);
    free(st);
}

static void ggml_py_ctx_lock(struct ggml_py_ctx * st) {
    GGML_PY_MUTEX_LOCK(&st->mutex);
}

static void ggml_py_ctx_unlock(struct ggml_py_ctx * st) {
    GGML_PY_MUTEX_UNLOCK(&st->mutex);
}

/* a new chunk, or NULL when the Context closes (the caller holds the mutex) */
static void ggml_py_ctx_set_head(struct ggml_py_ctx * st, struct ggml_context * head) {
    st->head = head;
}

typedef struct ggml_tensor * (*ggml_py_fn1)(struct ggml_context *, struct ggml_tensor *);
typedef struct ggml_tensor * (*ggml_py_fn2)(struct ggml_context *, struct ggml_tensor *,
                                            struct ggml_tensor *);

static int ggml_py_type_in(const struct ggml_tensor * t, uint64_t mask) {
    return (unsigned) t->type < 64 && ((mask >> (unsigned) t->type) & 1u);
}

/* ops/_common.rows: packed rows (nb[0] is the element size), quantized rows always are */
static int ggml_py_rows(const struct ggml_tensor * t) {
    return ggml_blck_size(t->type) > 1 || t->nb[0] == ggml_type_size(t->type);
}

/* no memory under t (nor under what it views): a view of it needs no ggml_backend_view_init */
static int ggml_py_unplaced(const struct ggml_tensor * t) {
    const struct ggml_tensor * s = t->view_src != NULL ? t->view_src : t;
    return t->buffer == NULL && t->data == NULL && s->buffer == NULL && s->data == NULL;
}

/* ops/elementwise.binary: float operands, b of a's type or f32, a's rows packed, b repeating
 * into a (numpy: equal shapes; broadcasting is Python's) */
static struct ggml_tensor * ggml_py_binary_in(struct ggml_context * ctx, ggml_py_fn2 fn,
                                           struct ggml_tensor * a, struct ggml_tensor * b,
                                           uint64_t types, int numpy) {
    if (!ggml_py_type_in(a, types) || !ggml_py_type_in(b, types) ||
        (a->type != b->type && b->type != GGML_TYPE_F32) || ggml_blck_size(a->type) != 1 ||
        a->nb[0] != (size_t) ggml_type_size(a->type)) {
        return NULL;
    }
    for (int i = 0; i < 4; i++) {
        if (a->ne[i] != b->ne[i] && (numpy || b->ne[i] <= 0 || a->ne[i] % b->ne[i] != 0)) {
            return NULL;
        }
    }
    return fn(ctx, a, b);
}

/* ops/elementwise._unary: a type the kernels compute, packed rows, contiguous */
static struct ggml_tensor * ggml_py_unary_in(struct ggml_context * ctx, ggml_py_fn1 fn,
                                          struct ggml_tensor * a, uint64_t types) {
    if (!ggml_py_type_in(a, types) || !ggml_py_rows(a) || !ggml_is_contiguous(a)) {
        return NULL;
    }
    return fn(ctx, a);
}

/* ops/linalg.mul_mat: equal inner dims, b's batch dims multiples of a's, a not transposed,
 * a float or quantized and b float, both with packed rows and rows no shorter apart than a
 * row (blas_rows) */
static struct ggml_tensor * ggml_py_mul_mat_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                            struct ggml_tensor * b, uint64_t a_types,
                                            uint64_t b_types) {
    if (!ggml_py_type_in(a, a_types) || !ggml_py_type_in(b, b_types) || a->ne[0] != b->ne[0] ||
        a->ne[2] <= 0 || a->ne[3] <= 0 || b->ne[2] % a->ne[2] != 0 ||
        b->ne[3] % a->ne[3] != 0 || ggml_is_transposed(a) || !ggml_py_rows(a) ||
        !ggml_py_rows(b)) {
        return NULL;
    }
    const struct ggml_tensor * m[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        if (ggml_blck_size(m[i]->type) == 1 &&
            m[i]->nb[1] < (size_t) m[i]->ne[0] * ggml_type_size(m[i]->type)) {
            return NULL;
        }
    }
    return ggml_mul_mat(ctx, a, b);
}

/* ops/nn.norm and rms_norm (`rms` picks): a type the kernel computes, eps >= 0, packed rows */
static struct ggml_tensor * ggml_py_norm_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                         double eps, uint64_t types, int rms) {
    if (!ggml_py_type_in(a, types) || !(eps >= 0.0) || !ggml_py_rows(a)) {
        return NULL;
    }
    return rms ? ggml_rms_norm(ctx, a, (float) eps) : ggml_norm(ctx, a, (float) eps);
}

/* ops/nn.soft_max: a of a type the kernel computes and contiguous; the mask (may be NULL)
 * f32 or f16, contiguous, covering a's rows, its batch dims dividing a's; max_bias only with
 * a mask */
static struct ggml_tensor * ggml_py_soft_max_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                             struct ggml_tensor * mask, double scale,
                                             double max_bias, uint64_t types) {
    if (!ggml_py_type_in(a, types) || !ggml_is_contiguous(a)) {
        return NULL;
    }
    if (mask == NULL) {
        if (!(max_bias <= 0.0)) {
            return NULL;
        }
    } else if ((mask->type != GGML_TYPE_F32 && mask->type != GGML_TYPE_F16) ||
               mask->ne[0] != a->ne[0] || mask->ne[1] < a->ne[1] || mask->ne[2] <= 0 ||
               mask->ne[3] <= 0 || a->ne[2] % mask->ne[2] != 0 || a->ne[3] % mask->ne[3] != 0 ||
               !ggml_is_contiguous(mask)) {
        return NULL;
    }
    return ggml_soft_max_ext(ctx, a, mask, (float) scale, (float) max_bias);
}

/* ops/nn.rope_ext without freq_factors: a of a type the kernel computes with packed rows,
 * mode normal (0) or neox, 0 < n_dims <= head_dim and even (n_dims < 0: head_dim), one i32
 * position per token */
static struct ggml_tensor * ggml_py_rope_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                         struct ggml_tensor * pos, int64_t n_dims, int mode,
                                         int n_ctx_orig, double freq_base, double freq_scale,
                                         double ext_factor, double attn_factor, double beta_fast,
                                         double beta_slow, uint64_t types) {
    if (n_dims < 0) {
        n_dims = a->ne[0];
    }
    if (!ggml_py_type_in(a, types) || !ggml_py_rows(a) ||
        (mode != 0 && mode != GGML_ROPE_TYPE_NEOX) || n_dims <= 0 || n_dims > a->ne[0] ||
        n_dims > INT32_MAX ||                       /* (ggml takes an int) */
        n_dims % 2 != 0 || n_ctx_orig < 0 || pos->type != GGML_TYPE_I32 || pos->ne[1] != 1 ||
        pos->ne[2] != 1 || pos->ne[3] != 1 || pos->ne[0] != a->ne[2]) {
        return NULL;
    }
    return ggml_rope_ext(ctx, a, pos, NULL, (int) n_dims, mode, n_ctx_orig, (float) freq_base,
                         (float) freq_scale, (float) ext_factor, (float) attn_factor,
                         (float) beta_fast, (float) beta_slow);
}

/* ops/shape.reshape of memory not yet placed: a contiguous, the same element count, every
 * dim >= 1, quantized blocks not split */
static struct ggml_tensor * ggml_py_reshape_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                            int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    if (ne0 < 1 || ne1 < 1 || ne2 < 1 || ne3 < 1 || !ggml_py_unplaced(a) ||
        !ggml_is_contiguous(a) || ne0 % ggml_blck_size(a->type) != 0 ||
        ne0 > INT64_MAX / ne1 || ne0 * ne1 > INT64_MAX / ne2 || ne0 * ne1 * ne2 > INT64_MAX / ne3 ||
        ne0 * ne1 * ne2 * ne3 != ggml_nelements(a)) {
        return NULL;
    }
    return ggml_reshape_4d(ctx, a, ne0, ne1, ne2, ne3);
}

/* ops/shape.permute of memory not yet placed: ggml's axes a permutation of 0..3, a quantized
 * tensor's first axis kept */
static struct ggml_tensor * ggml_py_permute_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                            int p0, int p1, int p2, int p3) {
    int seen = 0;
    int p[4] = {p0, p1, p2, p3};
    for (int i = 0; i < 4; i++) {
        if (p[i] < 0 || p[i] > 3 || (seen >> p[i]) & 1) {
            return NULL;
        }
        seen |= 1 << p[i];
    }
    if (!ggml_py_unplaced(a) || (ggml_blck_size(a->type) != 1 && p0 != 0)) {
        return NULL;
    }
    return ggml_permute(ctx, a, p0, p1, p2, p3);
}

/* ops/shape.cont: a contiguous copy; gathering a view only of the types the copy kernels
 * gather */
static struct ggml_tensor * ggml_py_cont_in(struct ggml_context * ctx, struct ggml_tensor * a,
                                         uint64_t strided_types) {
    if (!ggml_is_contiguous(a) && !ggml_py_type_in(a, strided_types)) {
        return NULL;
    }
    return ggml_cont(ctx, a);
}

/* the entry points: the rule and the build under the Context's mutex */
#define GGML_PY_CHECKED(call)                                                          \
    struct ggml_tensor * r = NULL;                                                     \
    GGML_PY_MUTEX_LOCK(&st->mutex);                                                    \
    if (st->head != NULL && ggml_py_room(st->head) >= 1) {                            \
        struct ggml_context * ctx = st->head;                                          \
        r = call;                                                                      \
    }                                                                                  \
    GGML_PY_MUTEX_UNLOCK(&st->mutex);                                                  \
    return r

/* The type sets of the ops' rules (ops/_common.type_mask, bit t for enum value t), each
 * registered once by ops/_common.rule when its module is imported, and taken by the entry
 * points below as the small id registered: cffi's conversion of a 64-bit mask cost 15-30 ns a
 * call, a twentieth of a whole op. An id never registered reads as the empty set (every type
 * refused: the Python path decides). The binary ops take none: theirs is fixed
 * (ggml_py_binary_types), and they are the ops graphs are built of node by node. */
/* the version ggml_py/_loader.py's HELPERS_VERSION expects (its checked ops stay unused
 * with any other): bump both when an entry point's arguments change */
static int ggml_py_helpers(void) {
    return 2;
}

#define GGML_PY_MAX_RULES 64
static uint64_t ggml_py_masks[GGML_PY_MAX_RULES];
static int ggml_py_n_masks = 0;

/* the id of `mask` (the same id for the same mask); -1 when the table is full. Called with
 * Python's lock held (ops/_common.rule), never from two threads at once */
static int ggml_py_rule(uint64_t mask) {
    for (int i = 0; i < ggml_py_n_masks; i++) {
        if (ggml_py_masks[i] == mask) {
            return i;
        }
    }
    if (ggml_py_n_masks == GGML_PY_MAX_RULES) {
        return -1;
    }
    ggml_py_masks[ggml_py_n_masks] = mask;
    return ggml_py_n_masks++;
}

static uint64_t ggml_py_mask(int id) {
    return (unsigned) id < (unsigned) ggml_py_n_masks ? ggml_py_masks[id] : 0;
}

static uint64_t ggml_py_binary_mask = 0;

static void ggml_py_binary_types(uint64_t types) {
    ggml_py_binary_mask = types;
}

static struct ggml_tensor * ggml_py_binary(struct ggml_py_ctx * st, ggml_py_fn2 fn,
                                           struct ggml_tensor * a, struct ggml_tensor * b,
                                           int numpy) {
    GGML_PY_CHECKED(ggml_py_binary_in(ctx, fn, a, b, ggml_py_binary_mask, numpy));
}

static struct ggml_tensor * ggml_py_unary(struct ggml_py_ctx * st, ggml_py_fn1 fn,
                                          struct ggml_tensor * a, int types) {
    GGML_PY_CHECKED(ggml_py_unary_in(ctx, fn, a, ggml_py_mask(types)));
}

static struct ggml_tensor * ggml_py_mul_mat(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                            struct ggml_tensor * b, int a_types, int b_types) {
    GGML_PY_CHECKED(ggml_py_mul_mat_in(ctx, a, b, ggml_py_mask(a_types), ggml_py_mask(b_types)));
}

static struct ggml_tensor * ggml_py_norm(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                         double eps, int types, int rms) {
    GGML_PY_CHECKED(ggml_py_norm_in(ctx, a, eps, ggml_py_mask(types), rms));
}

static struct ggml_tensor * ggml_py_soft_max(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                             struct ggml_tensor * mask, double scale,
                                             double max_bias, int types) {
    GGML_PY_CHECKED(ggml_py_soft_max_in(ctx, a, mask, scale, max_bias, ggml_py_mask(types)));
}

static struct ggml_tensor * ggml_py_rope(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                         struct ggml_tensor * pos, int64_t n_dims, int mode,
                                         int n_ctx_orig, double freq_base, double freq_scale,
                                         double ext_factor, double attn_factor, double beta_fast,
                                         double beta_slow, int types) {
    GGML_PY_CHECKED(ggml_py_rope_in(ctx, a, pos, n_dims, mode, n_ctx_orig, freq_base,
                                    freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
                                    ggml_py_mask(types)));
}

static struct ggml_tensor * ggml_py_reshape(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                            int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
    GGML_PY_CHECKED(ggml_py_reshape_in(ctx, a, ne0, ne1, ne2, ne3));
}

static struct ggml_tensor * ggml_py_permute(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                            int p0, int p1, int p2, int p3) {
    GGML_PY_CHECKED(ggml_py_permute_in(ctx, a, p0, p1, p2, p3));
}

static struct ggml_tensor * ggml_py_cont(struct ggml_py_ctx * st, struct ggml_tensor * a,
                                         int strided_types) {
    GGML_PY_CHECKED(ggml_py_cont_in(ctx, a, ggml_py_mask(strided_types)));
}
