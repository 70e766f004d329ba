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
