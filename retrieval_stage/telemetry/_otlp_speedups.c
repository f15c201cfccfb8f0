/* The hot loops of retrieval_stage.telemetry.otlp_encoder, in C.
 *
 * Two functions write OTLP/protobuf KeyValue fields (common.proto) straight into one bytes
 * object: `attributes` for any attribute mapping, `documents` for a RERANKER span's documents
 * read straight from the stage's candidates and outputs (a deferred record, see
 * retrieval_stage.spans.deferred). Their output is byte-identical to the pure-Python encoder's
 * (and so to the SDK's): the tests run both over the same spans. Anything other than an exact
 * str, bool, int in int64 or float is handed to the Python encoder's own `_any_value`, so the
 * rarer types follow one set of rules; errors (a lone surrogate, a key that is not a str) raise,
 * and the Python caller then encodes the batch the way it would without this module.
 *
 * Written by hand because no maintained library writes OTLP from Python objects without a
 * protobuf message per attribute (docs/benchmarks.md, issue 38). The module holds the GIL
 * throughout; a callback into Python may release it, so nothing borrowed is held across one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030B0000
#define FLOAT_PACK8 PyFloat_Pack8
#else
#define FLOAT_PACK8 _PyFloat_Pack8
#endif

/* -- varints ------------------------------------------------------------------------------ */

static inline int varint_len(uint64_t n) {
    int size = 1;
    while (n > 0x7F) {
        n >>= 7;
        size++;
    }
    return size;
}

static inline char *put_varint(char *p, uint64_t n) {
    while (n > 0x7F) {
        *p++ = (char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *p++ = (char)n;
    return p;
}

/* -- module state, set once by `setup` --------------------------------------------------- */

static PyObject *any_value_fn = NULL;  /* otlp_encoder._any_value: body bytes of an AnyValue */
static PyObject *unsupported = NULL;   /* otlp_encoder.UnsupportedValue */

#define KEY_CACHE_LIMIT 8192

/* A slotted class's field read at its slot's offset, or NULL for "use getattr". */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offset;
    PyObject *name;
} Field;

static Field cand_id, cand_text, cand_score;

static int field_init(Field *f, PyObject *type, const char *name) {
    f->name = PyUnicode_InternFromString(name);
    if (f->name == NULL) return -1;
    f->type = NULL;
    f->offset = 0;
    if (!PyType_Check(type)) return 0;
    PyObject *descr = PyObject_GetAttr(type, f->name);  /* the class attribute: the slot */
    if (descr == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type)) {
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type == T_OBJECT_EX && !(member->flags & READ_RESTRICTED)) {
            f->type = (PyTypeObject *)type;
            f->offset = member->offset;
        }
    }
    Py_DECREF(descr);
    return 0;
}

/* New reference to obj.<field>: straight from the slot for the exact class, else getattr. */
static inline PyObject *field_get(Field *f, PyObject *obj) {
    if (f->type != NULL && Py_IS_TYPE(obj, f->type)) {
        PyObject *value = *(PyObject **)((char *)obj + f->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(obj, f->name);
}

/* -- one KeyValue ------------------------------------------------------------------------ */

/* New reference to the bytes every attribute under `key` starts with: KeyValue.key (field 1,
 * left out for "") then the tag of KeyValue.value (field 2), from `cache` or made and kept. */
static PyObject *key_head(PyObject *cache, PyObject *key) {
    PyObject *head = PyDict_GetItemWithError(cache, key);
    if (head != NULL) {
        Py_INCREF(head);
        return head;
    }
    if (PyErr_Occurred()) return NULL;
    if (!PyUnicode_CheckExact(key)) {
        PyErr_Format(unsupported, "attribute key of type %.100s", Py_TYPE(key)->tp_name);
        return NULL;
    }
    Py_ssize_t n;
    const char *raw = PyUnicode_AsUTF8AndSize(key, &n);
    if (raw == NULL) return NULL;
    Py_ssize_t size = n ? 1 + varint_len((uint64_t)n) + n + 1 : 1;
    head = PyBytes_FromStringAndSize(NULL, size);
    if (head == NULL) return NULL;
    char *p = PyBytes_AS_STRING(head);
    if (n) {
        *p++ = 0x0a;
        p = put_varint(p, (uint64_t)n);
        memcpy(p, raw, (size_t)n);
        p += n;
    }
    *p = 0x12;
    if (PyDict_GET_SIZE(cache) >= KEY_CACHE_LIMIT) PyDict_Clear(cache);
    if (PyDict_SetItem(cache, key, head) < 0) {
        Py_DECREF(head);
        return NULL;
    }
    return head;
}

enum { V_STR, V_TRUE, V_FALSE, V_INT, V_DOUBLE, V_BODY };

/* An AnyValue body, described without copying: a str's UTF-8 (owned by the str), an int, a
 * double, or bytes from the Python encoder (`body`, owned here). */
typedef struct {
    int kind;
    const char *data;
    Py_ssize_t size;
    uint64_t number;
    double real;
    PyObject *body;
} Value;

/* Describe `value` (which the caller keeps alive until the value is written). */
static int value_of(PyObject *value, Value *v) {
    v->body = NULL;
    if (PyUnicode_CheckExact(value)) {
        v->data = PyUnicode_AsUTF8AndSize(value, &v->size);  /* strict: a surrogate raises */
        if (v->data == NULL) return -1;
        v->kind = V_STR;
        return 0;
    }
    if (value == Py_True) {
        v->kind = V_TRUE;
        return 0;
    }
    if (value == Py_False) {
        v->kind = V_FALSE;
        return 0;
    }
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (n == -1 && PyErr_Occurred()) return -1;
        if (!overflow) {
            v->kind = V_INT;
            v->number = (uint64_t)n;  /* a negative int64 is its two's complement, 10 bytes */
            return 0;
        }
    } else if (PyFloat_CheckExact(value)) {
        v->kind = V_DOUBLE;
        v->real = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    /* Everything else, the Python encoder's way (subclasses, sequences, bytes, big ints). */
    PyObject *body = PyObject_CallOneArg(any_value_fn, value);
    if (body == NULL) return -1;
    if (!PyBytes_Check(body)) {
        Py_DECREF(body);
        PyErr_SetString(PyExc_TypeError, "_any_value must return bytes");
        return -1;
    }
    v->kind = V_BODY;
    v->body = body;
    v->data = PyBytes_AS_STRING(body);
    v->size = PyBytes_GET_SIZE(body);
    return 0;
}

static inline Py_ssize_t body_size(const Value *v) {
    switch (v->kind) {
    case V_STR:
        return 1 + varint_len((uint64_t)v->size) + v->size;
    case V_TRUE:
    case V_FALSE:
        return 2;
    case V_INT:
        return 1 + varint_len(v->number);
    case V_DOUBLE:
        return 9;
    default:
        return v->size;
    }
}

/* -- a batch of KeyValue fields, written in two passes ------------------------------------ */

/* One attribute, resolved: its head, its described value and what that value's bytes live
 * in (`owner`, a str, or the body bytes), and its lengths. */
typedef struct {
    PyObject *head;
    PyObject *owner;
    Value v;
    Py_ssize_t body;
    Py_ssize_t kv;
} Item;

#define INLINE_ITEMS 512

/* The fields of one call: resolved first (every callback into Python happens then), then
 * written into one bytes object of exactly their size, so no buffer is grown, shrunk or
 * copied: a span's ~48 KB are written once. */
typedef struct {
    const char *tag;
    Py_ssize_t tag_len;
    PyObject *cache;
    Item *items;
    Py_ssize_t len;
    Py_ssize_t cap;
    Py_ssize_t size;
    Item inline_items[INLINE_ITEMS];
} Batch;

static void batch_init(Batch *b, PyObject *tag, PyObject *cache) {
    b->tag = PyBytes_AS_STRING(tag);
    b->tag_len = PyBytes_GET_SIZE(tag);
    b->cache = cache;
    b->items = b->inline_items;
    b->len = 0;
    b->cap = INLINE_ITEMS;
    b->size = 0;
}

static void batch_clear(Batch *b) {
    for (Py_ssize_t i = 0; i < b->len; i++) {
        Py_XDECREF(b->items[i].head);
        Py_XDECREF(b->items[i].owner);
    }
    if (b->items != b->inline_items) PyMem_Free(b->items);
    b->items = b->inline_items;
    b->len = 0;
}

/* Resolve `value` (a new reference, consumed) under `key`: the value is described first (it
 * may call into Python), the head looked up after. */
static int batch_add(Batch *b, PyObject *key, PyObject *value) {
    if (value == NULL) return -1;
    if (b->len == b->cap) {
        Py_ssize_t cap = b->cap * 2;
        Item *items = PyMem_Malloc((size_t)cap * sizeof(Item));
        if (items == NULL) {
            Py_DECREF(value);
            PyErr_NoMemory();
            return -1;
        }
        memcpy(items, b->items, (size_t)b->len * sizeof(Item));
        if (b->items != b->inline_items) PyMem_Free(b->items);
        b->items = items;
        b->cap = cap;
    }
    Item *item = &b->items[b->len];
    if (value_of(value, &item->v) < 0) {
        Py_DECREF(value);
        return -1;
    }
    if (item->v.kind == V_BODY) {  /* its bytes live in the body: the value can go */
        item->owner = item->v.body;
        Py_DECREF(value);
    } else {
        item->owner = value;
    }
    item->head = key_head(b->cache, key);
    if (item->head == NULL) {
        Py_DECREF(item->owner);
        return -1;
    }
    item->body = body_size(&item->v);
    item->kv = PyBytes_GET_SIZE(item->head) + varint_len((uint64_t)item->body) + item->body;
    b->size += b->tag_len + varint_len((uint64_t)item->kv) + item->kv;
    b->len++;
    return 0;
}

static char *put_item(char *p, const char *tag, Py_ssize_t tag_len, const Item *item) {
    memcpy(p, tag, (size_t)tag_len);
    p = put_varint(p + tag_len, (uint64_t)item->kv);
    Py_ssize_t head_len = PyBytes_GET_SIZE(item->head);
    memcpy(p, PyBytes_AS_STRING(item->head), (size_t)head_len);
    p = put_varint(p + head_len, (uint64_t)item->body);
    const Value *v = &item->v;
    switch (v->kind) {
    case V_STR:
        *p++ = 0x0a;
        p = put_varint(p, (uint64_t)v->size);
        memcpy(p, v->data, (size_t)v->size);
        return p + v->size;
    case V_TRUE:
        *p++ = 0x10;
        *p++ = 0x01;
        return p;
    case V_FALSE:
        *p++ = 0x10;
        *p++ = 0x00;
        return p;
    case V_INT:
        *p++ = 0x18;
        return put_varint(p, v->number);
    case V_DOUBLE:
        *p++ = 0x21;
        FLOAT_PACK8(v->real, p, 1);  /* cannot fail for an IEEE double */
        return p + 8;
    default:
        memcpy(p, v->data, (size_t)v->size);
        return p + v->size;
    }
}

/* The batch's bytes, exactly sized; the batch is cleared either way. */
static PyObject *batch_write(Batch *b) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, b->size);
    if (out != NULL) {
        char *p = PyBytes_AS_STRING(out);
        for (Py_ssize_t i = 0; i < b->len; i++) p = put_item(p, b->tag, b->tag_len, &b->items[i]);
        assert(p == PyBytes_AS_STRING(out) + b->size);
    }
    batch_clear(b);
    return out;
}

static int check_tag(PyObject *tag, PyObject *cache) {
    if (!PyBytes_Check(tag) || PyBytes_GET_SIZE(tag) == 0 || PyBytes_GET_SIZE(tag) > 5) {
        PyErr_SetString(PyExc_TypeError, "tag must be 1 to 5 bytes");
        return -1;
    }
    if (!PyDict_CheckExact(cache)) {
        PyErr_SetString(PyExc_TypeError, "cache must be a dict");
        return -1;
    }
    if (any_value_fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_otlp_speedups.setup() was not called");
        return -1;
    }
    return 0;
}

/* attributes(tag, mapping, cache) -> bytes: every item of the dict `mapping`, in order, as a
 * KeyValue field `tag`. */
static PyObject *attributes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "attributes(tag, mapping, cache)");
        return NULL;
    }
    PyObject *tag = args[0], *mapping = args[1], *cache = args[2];
    if (check_tag(tag, cache) < 0) return NULL;
    if (!PyDict_CheckExact(mapping)) {
        PyErr_SetString(PyExc_TypeError, "mapping must be a dict");
        return NULL;
    }
    /* A snapshot of the items: a callback cannot change what is walked. */
    PyObject *items = PyDict_Items(mapping);
    if (items == NULL) return NULL;
    Batch b;
    batch_init(&b, tag, cache);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        PyObject *value = PyTuple_GET_ITEM(item, 1);
        Py_INCREF(value);
        if (batch_add(&b, PyTuple_GET_ITEM(item, 0), value) < 0) {
            Py_DECREF(items);
            batch_clear(&b);
            return NULL;
        }
    }
    Py_DECREF(items);
    return batch_write(&b);
}

/* -- a RERANKER span's documents --------------------------------------------------------- */

/* New reference: `text` as the span keeps it: as it is when it is a str of ASCII no longer
 * than `max_bytes` (spans.content.capped's test), else `cap(text, max_bytes)`. */
static PyObject *capped(PyObject *text, Py_ssize_t max_bytes, PyObject *cap, PyObject *limit) {
    if (PyUnicode_Check(text) && PyUnicode_IS_ASCII(text) &&
        PyUnicode_GET_LENGTH(text) <= max_bytes) {
        Py_INCREF(text);
        return text;
    }
    PyObject *call_args[2] = {text, limit};
    return PyObject_Vectorcall(cap, call_args, 2, NULL);
}

/* Add key_row[slot] = value (a new reference, consumed). */
static inline int add_row(Batch *b, PyObject *key_row, Py_ssize_t slot, PyObject *value) {
    return batch_add(b, PyTuple_GET_ITEM(key_row, slot), value);
}

static PyObject *key_row(PyObject *keys, Py_ssize_t i) {
    PyObject *row = PyTuple_GET_ITEM(keys, i);
    if (!PyTuple_Check(row) || PyTuple_GET_SIZE(row) != 4) {
        PyErr_SetString(PyExc_TypeError, "each key row must be a 4-tuple");
        return NULL;
    }
    return row;
}

/* The metadata JSON list `metas` holds for position i (a new reference), or NULL with no
 * error when it holds None there or is None itself. */
static int meta_at(PyObject *metas, Py_ssize_t i, PyObject **out) {
    *out = NULL;
    if (metas == Py_None) return 0;
    if (i >= PyList_GET_SIZE(metas)) {
        PyErr_SetString(PyExc_ValueError, "metadata list shorter than the documents");
        return -1;
    }
    PyObject *meta = PyList_GET_ITEM(metas, i);
    if (meta != Py_None) {
        Py_INCREF(meta);
        *out = meta;
    }
    return 0;
}

/* documents(tag, cache, in_keys, out_keys, candidates, outputs, max_bytes, output_content, cap,
 *           in_metas, out_metas) -> bytes
 *
 * The KeyValue fields spans.fit.DocumentsRecord.attributes() would hold, in its order,
 * without building them: per input candidate its capped id and text, its recall score unless
 * None, its metadata JSON (`in_metas[i]`, made when the call ended: a caller's mapping may
 * change later) unless None; per output (`outputs`: the n output candidates, then their n
 * scores) its candidate's capped id, its text (with `output_content`), its score unless None,
 * its metadata JSON (`out_metas[j]`) unless None. `cap(text, max_bytes)` caps a long or
 * non-ASCII text. */
static PyObject *documents(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "documents() takes 11 arguments");
        return NULL;
    }
    PyObject *tag = args[0], *cache = args[1], *in_keys = args[2], *out_keys = args[3];
    PyObject *candidates = args[4], *outputs = args[5];
    PyObject *limit = args[6];
    Py_ssize_t max_bytes = PyLong_AsSsize_t(limit);
    if (max_bytes == -1 && PyErr_Occurred()) return NULL;
    int output_content = PyObject_IsTrue(args[7]);
    if (output_content < 0) return NULL;
    PyObject *cap = args[8], *in_metas = args[9], *out_metas = args[10];
    if (check_tag(tag, cache) < 0) return NULL;
    if (!PyTuple_Check(in_keys) || !PyTuple_Check(out_keys) || !PyList_CheckExact(candidates) ||
        !PyList_CheckExact(outputs) || (in_metas != Py_None && !PyList_CheckExact(in_metas)) ||
        (out_metas != Py_None && !PyList_CheckExact(out_metas))) {
        PyErr_SetString(PyExc_TypeError, "key tables must be tuples, the rest lists or None");
        return NULL;
    }
    Py_ssize_t n_in = PyList_GET_SIZE(candidates), n_out = PyList_GET_SIZE(outputs) / 2;
    if (PyList_GET_SIZE(outputs) % 2 || n_in > PyTuple_GET_SIZE(in_keys) ||
        n_out > PyTuple_GET_SIZE(out_keys)) {
        PyErr_SetString(PyExc_ValueError, "key tables shorter than the documents, or odd outputs");
        return NULL;
    }
    Batch b;
    batch_init(&b, tag, cache);
    PyObject *c = NULL, *field = NULL, *meta = NULL;

    for (Py_ssize_t i = 0; i < n_in; i++) {
        if (i >= PyList_GET_SIZE(candidates)) goto changed;
        PyObject *row = key_row(in_keys, i);
        if (row == NULL) goto fail;
        c = PyList_GET_ITEM(candidates, i);
        Py_INCREF(c);
        if ((field = field_get(&cand_id, c)) == NULL) goto fail;
        if (add_row(&b, row, 0, capped(field, max_bytes, cap, limit)) < 0) goto fail;
        Py_CLEAR(field);
        if ((field = field_get(&cand_text, c)) == NULL) goto fail;
        if (add_row(&b, row, 1, capped(field, max_bytes, cap, limit)) < 0) goto fail;
        Py_CLEAR(field);
        if ((field = field_get(&cand_score, c)) == NULL) goto fail;
        if (field != Py_None) {
            Py_INCREF(field);
            if (add_row(&b, row, 2, field) < 0) goto fail;
        }
        Py_CLEAR(field);
        if (meta_at(in_metas, i, &meta) < 0) goto fail;
        if (meta != NULL) {
            PyObject *value = meta;
            meta = NULL;
            if (add_row(&b, row, 3, value) < 0) goto fail;
        }
        Py_CLEAR(c);
    }

    for (Py_ssize_t j = 0; j < n_out; j++) {
        if (n_out + j >= PyList_GET_SIZE(outputs)) goto changed;
        PyObject *row = key_row(out_keys, j);
        if (row == NULL) goto fail;
        c = PyList_GET_ITEM(outputs, j);
        Py_INCREF(c);
        if ((field = field_get(&cand_id, c)) == NULL) goto fail;
        if (add_row(&b, row, 0, capped(field, max_bytes, cap, limit)) < 0) goto fail;
        Py_CLEAR(field);
        if (output_content) {
            if ((field = field_get(&cand_text, c)) == NULL) goto fail;
            if (add_row(&b, row, 1, capped(field, max_bytes, cap, limit)) < 0)
                goto fail;
            Py_CLEAR(field);
        }
        field = PyList_GET_ITEM(outputs, n_out + j);
        Py_INCREF(field);
        if (field != Py_None) {
            Py_INCREF(field);
            if (add_row(&b, row, 2, field) < 0) goto fail;
        }
        Py_CLEAR(field);
        if (meta_at(out_metas, j, &meta) < 0) goto fail;
        if (meta != NULL) {
            PyObject *value = meta;
            meta = NULL;
            if (add_row(&b, row, 3, value) < 0) goto fail;
        }
        Py_CLEAR(c);
    }
    return batch_write(&b);

changed:
    PyErr_SetString(PyExc_RuntimeError, "the documents changed while being encoded");
fail:
    Py_XDECREF(field);
    Py_XDECREF(c);
    batch_clear(&b);
    return NULL;
}

/* setup(any_value, unsupported, candidate_type): the Python encoder's `_any_value` and
 * `UnsupportedValue`, and the class whose slots `documents` reads directly. Called once, by
 * otlp_encoder, when it imports this module. */
static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyCallable_Check(args[0]) || !PyExceptionClass_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup(any_value, unsupported, candidate_type)");
        return NULL;
    }
    if (field_init(&cand_id, args[2], "id") < 0 || field_init(&cand_text, args[2], "text") < 0 ||
        field_init(&cand_score, args[2], "score") < 0)
        return NULL;
    Py_INCREF(args[0]);
    Py_XSETREF(any_value_fn, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(unsupported, args[1]);
    Py_INCREF(args[2]);  /* the class stays alive as long as its offsets are used */
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL,
     "attributes(tag, mapping, cache) -> bytes: each item as a KeyValue field `tag`."},
    {"documents", (PyCFunction)(void (*)(void))documents, METH_FASTCALL,
     "documents(...) -> bytes: a RERANKER span's documents as KeyValue fields."},
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL,
     "setup(any_value, candidate_type, reranked_type): called once by otlp_encoder."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_otlp_speedups",
    "C loops for retrieval_stage.telemetry.otlp_encoder (byte-identical to its Python).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__otlp_speedups(void) { return PyModule_Create(&module); }
