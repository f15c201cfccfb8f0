/* The hot loops of a traced rerank, in C (issue 38): retrieval_stage._native loads them.
 *
 * Two functions write OTLP/protobuf KeyValue fields (common.proto) for
 * retrieval_stage.telemetry.otlp_encoder: `attributes` for any attribute mapping, `documents`
 * for a RERANKER span's documents read straight from the call's candidates (a deferred record,
 * retrieval_stage.spans.deferred). A third, `output_value`, writes the span's output.value for
 * retrieval_stage.spans.content in its common case. Each is byte-identical to the Python it
 * stands in for, which stays and runs where this module is not built: the tests run both over
 * the same input. A str, bool, int in int64 or float, or a subclass of str, int or float (a
 * str Enum or IntEnum member), is written here from its own value, as the SDK's protobuf
 * messages read it (a str's characters, never its `__str__`); anything else is handed to the
 * Python encoder's own `_any_value`, so the rarer types follow one set of rules; errors (a
 * lone surrogate, a key that is not a str) raise, and the Python caller then does the work the
 * way it would without this module.
 *
 * Written by hand because no maintained library writes OTLP from Python objects without a
 * protobuf message per attribute (docs/benchmarks.md, issue 38). The module holds the GIL
 * throughout; a callback into Python may release it, so nothing borrowed is held across one.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* No fused multiply-add: the quality walk's floats must be the Python's, operation for
 * operation (the build also passes -ffp-contract=off where the compiler takes it). */
#if defined(_MSC_VER)
#pragma fp_contract(off)
#elif defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

#if PY_VERSION_HEX >= 0x030B0000
#define FLOAT_PACK8 PyFloat_Pack8
#else
#define FLOAT_PACK8(x, p, le) _PyFloat_Pack8((x), (unsigned char *)(p), (le))
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

static Field cand_id, cand_text, cand_score, cand_metadata;
static Field out_candidate, out_score;

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

/* A str's characters as UTF-8 (strict: a lone surrogate raises), read from the object itself,
 * a subclass's too: no method it overrides (`__str__`, `encode`) is called. */
static inline int string_of(PyObject *value, Value *v) {
    v->data = PyUnicode_AsUTF8AndSize(value, &v->size);
    if (v->data == NULL) return -1;
    v->kind = V_STR;
    return 0;
}

/* An int's own value (a subclass's too: PyLong_AsLongLongAndOverflow calls no `__index__`):
 * 1 written, 0 beyond int64 (for the Python encoder, which raises), -1 an error. */
static inline int integer_of(PyObject *value, Value *v) {
    int overflow = 0;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (n == -1 && PyErr_Occurred()) return -1;
    if (overflow) return 0;
    v->kind = V_INT;
    v->number = (uint64_t)n;  /* a negative int64 is its two's complement, 10 bytes */
    return 1;
}

/* Describe `value` (which the caller keeps alive until the value is written). The exact types
 * first, the common case; then a subclass of str, int or float (a str Enum or IntEnum member,
 * numpy's float64), read from the object as the SDK's protobuf messages read it: its
 * characters, its integer, its double. bool cannot be subclassed: True and False are the only
 * two, and come before int. */
static int value_of(PyObject *value, Value *v) {
    v->body = NULL;
    int written;
    if (PyUnicode_CheckExact(value)) return string_of(value, v);
    if (value == Py_True) {
        v->kind = V_TRUE;
        return 0;
    }
    if (value == Py_False) {
        v->kind = V_FALSE;
        return 0;
    }
    if (PyLong_CheckExact(value)) {
        if ((written = integer_of(value, v)) != 0) return written < 0 ? -1 : 0;
    } else if (PyFloat_CheckExact(value)) {
        v->kind = V_DOUBLE;
        v->real = PyFloat_AS_DOUBLE(value);
        return 0;
    } else if (PyUnicode_Check(value)) {
        return string_of(value, v);
    } else if (PyLong_Check(value)) {
        if ((written = integer_of(value, v)) != 0) return written < 0 ? -1 : 0;
    } else if (PyFloat_Check(value)) {
        v->kind = V_DOUBLE;
        v->real = PyFloat_AS_DOUBLE(value);
        return 0;
    }
    /* Everything else, the Python encoder's way (sequences, bytes, ints beyond int64). */
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

#define INLINE_ITEMS 64

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

/* Room for `n` items in all, made once (a RERANKER span's ~300 document attributes). */
static int batch_reserve(Batch *b, Py_ssize_t n) {
    if (n <= b->cap) return 0;
    Item *items = PyMem_Malloc((size_t)n * sizeof(Item));
    if (items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(items, b->items, (size_t)b->len * sizeof(Item));
    if (b->items != b->inline_items) PyMem_Free(b->items);
    b->items = items;
    b->cap = n;
    return 0;
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
        PyErr_SetString(PyExc_RuntimeError, "_speedups.setup_encoder() was not called");
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
    if (batch_reserve(&b, PyList_GET_SIZE(items)) < 0) {
        Py_DECREF(items);
        return NULL;
    }
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

/* New reference: `text` as the span keeps it: as it is when it is an exact str of ASCII no
 * longer than `max_bytes` (spans.content.capped's test), else `cap(text, max_bytes)`, which
 * takes anything else (a str Enum member, say) by its characters. */
static PyObject *capped(PyObject *text, Py_ssize_t max_bytes, PyObject *cap, PyObject *limit) {
    if (PyUnicode_CheckExact(text) && PyUnicode_IS_ASCII(text) &&
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

/* documents(tag, cache, in_keys, out_keys, documents, n_in, in_metas, out_metas) -> bytes
 *
 * The KeyValue fields spans.fit.DocumentsRecord.attributes() would hold, in its order,
 * without building them. `documents` is the record's list: three per document, `n_in` inputs
 * then the outputs, each its id, its text (None: left out) and its score (None: left out),
 * all capped when the call ended; `in_metas[i]` and `out_metas[j]` their metadata JSON (None:
 * left out), or None for no metadata at all. No callback into Python but `_any_value`, for a
 * value that is not an exact str, bool, int or float. */
static PyObject *documents(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "documents() takes 8 arguments");
        return NULL;
    }
    PyObject *tag = args[0], *cache = args[1], *in_keys = args[2], *out_keys = args[3];
    PyObject *docs = args[4], *in_metas = args[6], *out_metas = args[7];
    Py_ssize_t n_in = PyLong_AsSsize_t(args[5]);
    if (n_in == -1 && PyErr_Occurred()) return NULL;
    if (check_tag(tag, cache) < 0) return NULL;
    if (!PyTuple_Check(in_keys) || !PyTuple_Check(out_keys) || !PyList_CheckExact(docs) ||
        (in_metas != Py_None && !PyList_CheckExact(in_metas)) ||
        (out_metas != Py_None && !PyList_CheckExact(out_metas))) {
        PyErr_SetString(PyExc_TypeError, "key tables must be tuples, the rest lists or None");
        return NULL;
    }
    Py_ssize_t size = PyList_GET_SIZE(docs), n_out = size / 3 - n_in;
    if (size % 3 || n_in < 0 || n_out < 0 || n_in > PyTuple_GET_SIZE(in_keys) ||
        n_out > PyTuple_GET_SIZE(out_keys)) {
        PyErr_SetString(PyExc_ValueError, "key tables shorter than the documents, or bad counts");
        return NULL;
    }
    Batch b;
    batch_init(&b, tag, cache);
    if (batch_reserve(&b, 4 * (n_in + n_out)) < 0) return NULL;
    PyObject *meta = NULL;
    for (Py_ssize_t d = 0; d < n_in + n_out; d++) {
        int input = d < n_in;
        Py_ssize_t at = 3 * d, i = input ? d : d - n_in;
        if (at + 2 >= PyList_GET_SIZE(docs)) goto changed; /* a callback emptied it */
        PyObject *row = key_row(input ? in_keys : out_keys, i);
        if (row == NULL) goto fail;
        for (int slot = 0; slot < 3; slot++) {
            PyObject *value = PyList_GET_ITEM(docs, at + slot);
            if (value == Py_None) {
                if (slot == 0) { /* an id is always there */
                    PyErr_SetString(PyExc_ValueError, "a document without an id");
                    goto fail;
                }
                continue;
            }
            Py_INCREF(value);
            if (add_row(&b, row, slot, value) < 0) goto fail;
            if (at + 2 >= PyList_GET_SIZE(docs)) goto changed;
        }
        if (meta_at(input ? in_metas : out_metas, i, &meta) < 0) goto fail;
        if (meta != NULL) {
            PyObject *value = meta;
            meta = NULL;
            if (add_row(&b, row, 3, value) < 0) goto fail;
        }
    }
    return batch_write(&b);

changed:
    PyErr_SetString(PyExc_RuntimeError, "the documents changed while being encoded");
fail:
    batch_clear(&b);
    return NULL;
}

/* -- a span's frame ---------------------------------------------------------------------- */

/* The frame's attribute names as interned str, made once: `PyObject_GetAttrString` would
 * make and hash a new str for each of the ~20 lookups of every span. Keyed by the literal's
 * address (each name is one literal in this file). */
#define NAME_SLOTS 32
static const char *name_keys[NAME_SLOTS];
static PyObject *name_values[NAME_SLOTS];

/* New reference to getattr(obj, name), or NULL with the error. */
static PyObject *attr(PyObject *obj, const char *name) {
    for (int i = 0; i < NAME_SLOTS; i++) {
        if (name_keys[i] == name) return PyObject_GetAttr(obj, name_values[i]);
        if (name_keys[i] == NULL) {
            PyObject *interned = PyUnicode_InternFromString(name);
            if (interned == NULL) return NULL;
            name_keys[i] = name;
            name_values[i] = interned; /* kept for the life of the process */
            return PyObject_GetAttr(obj, interned);
        }
    }
    return PyObject_GetAttrString(obj, name);
}

/* An enum member's value: its ``_value_`` (what ``.value`` returns, without the property's
 * call), else ``.value`` itself for anything that is not an Enum member. */
static PyObject *enum_value(PyObject *member) {
    PyObject *value = attr(member, "_value_");
    if (value != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError)) return value;
    PyErr_Clear();
    return attr(member, "value");
}

/* `value` (an int) as `n` big-endian bytes written at p; -1 when it does not fit (an error is
 * set: the Python writer then raises the same). */
static int big_endian(PyObject *value, int n, char *p) {
    if (PyLong_CheckExact(value) && (n == 8 || n == 16)) { /* the ids: no method call */
        unsigned long long high = 0, low;
        if (n == 16) {
            PyObject *shift = PyLong_FromLong(64), *top = NULL;
            if (shift != NULL) top = PyNumber_Rshift(value, shift);
            Py_XDECREF(shift);
            if (top == NULL) return -1;
            high = PyLong_AsUnsignedLongLong(top); /* negative or too big: OverflowError */
            Py_DECREF(top);
            if (high == (unsigned long long)-1 && PyErr_Occurred()) goto method;
            low = PyLong_AsUnsignedLongLongMask(value);
        } else {
            low = PyLong_AsUnsignedLongLong(value);
        }
        if (low == (unsigned long long)-1 && PyErr_Occurred()) goto method;
        for (int i = 0; i < 8; i++) {
            if (n == 16) p[i] = (char)((high >> (56 - 8 * i)) & 0xFF);
            p[n - 8 + i] = (char)((low >> (56 - 8 * i)) & 0xFF);
        }
        return 0;
    }
method: /* anything else, and every error, as the Python writer meets it */
    PyErr_Clear();
    PyObject *raw = PyObject_CallMethod(value, "to_bytes", "is", n, "big");
    if (raw == NULL) return -1;
    if (!PyBytes_Check(raw) || PyBytes_GET_SIZE(raw) != n) {
        Py_DECREF(raw);
        PyErr_SetString(PyExc_TypeError, "to_bytes");
        return -1;
    }
    memcpy(p, PyBytes_AS_STRING(raw), (size_t)n);
    Py_DECREF(raw);
    return 0;
}

/* An unsigned int attribute of `obj` into *out; 0 when it is absent/None/0 or not one. */
static int uint_attr(PyObject *obj, const char *name, unsigned long long *out) {
    PyObject *value = attr(obj, name);
    if (value == NULL) return -1;
    *out = 0;
    int status = 0;
    if (value != Py_None) {
        if (!PyLong_Check(value)) {
            status = -1;
            PyErr_SetString(PyExc_TypeError, name);
        } else {
            *out = PyLong_AsUnsignedLongLong(value);
            if (*out == (unsigned long long)-1 && PyErr_Occurred()) status = -1;
        }
    }
    Py_DECREF(value);
    return status;
}

/* Whether `obj.name` is an empty sequence (or None): 1 yes, 0 no, -1 error. */
static int empty_attr(PyObject *obj, const char *name) {
    PyObject *value = attr(obj, name);
    if (value == NULL) return -1;
    int empty = value == Py_None ? 1 : !PyObject_IsTrue(value);
    Py_DECREF(value);
    return empty;
}

/* span_frame(span) -> (head: bytes, tail: bytes) | None
 *
 * What otlp_encoder._span_parts writes around a span's attributes, for the common span: no
 * trace state, no events, no links (None for any other, and for anything the Python writer
 * would raise on, which it then does). `head` holds Span fields 1-8 (trace and span id,
 * parent span id, name, kind, start and end time), `tail` fields 10-16 (the dropped
 * attribute count, the status, the flags). */
static PyObject *span_frame(PyObject *self, PyObject *span) {
    char head[64], tail[32];
    char *h = head, *t = tail;
    PyObject *context = NULL, *parent = NULL, *name = NULL, *kind = NULL, *status = NULL,
             *value = NULL, *description = NULL, *result = NULL;
    context = PyObject_CallMethod(span, "get_span_context", NULL);
    if (context == NULL || context == Py_None) goto python;
    value = attr(context, "trace_state");
    if (value == NULL) goto python;
    if (value != Py_None) {
        Py_ssize_t n = PyObject_Length(value);
        if (n != 0) goto python; /* -1: an error; > 0: the Python joins it */
    }
    Py_CLEAR(value);
    *h++ = 0x0a;
    *h++ = 0x10;
    if ((value = attr(context, "trace_id")) == NULL || big_endian(value, 16, h) < 0) goto python;
    h += 16;
    Py_CLEAR(value);
    *h++ = 0x12;
    *h++ = 0x08;
    if ((value = attr(context, "span_id")) == NULL || big_endian(value, 8, h) < 0) goto python;
    h += 8;
    Py_CLEAR(value);
    if ((parent = attr(span, "parent")) == NULL) goto python;
    int has_parent = parent != Py_None && PyObject_IsTrue(parent);
    if (has_parent < 0) goto python;
    int remote = 0;
    if (has_parent) {
        *h++ = 0x22;
        *h++ = 0x08;
        if ((value = attr(parent, "span_id")) == NULL || big_endian(value, 8, h) < 0)
            goto python;
        h += 8;
        Py_CLEAR(value);
        if ((value = attr(parent, "is_remote")) == NULL) goto python;
        remote = PyObject_IsTrue(value);
        if (remote < 0) goto python;
        Py_CLEAR(value);
    }
    if ((name = attr(span, "name")) == NULL || !PyUnicode_Check(name)) goto python;
    Py_ssize_t name_len;
    const char *name_raw = PyUnicode_AsUTF8AndSize(name, &name_len);
    if (name_raw == NULL) goto python;
    if ((kind = attr(span, "kind")) == NULL || (value = enum_value(kind)) == NULL ||
        !PyLong_CheckExact(value))
        goto python;
    long kind_value = PyLong_AsLong(value);
    if (kind_value < 0 || kind_value > 4) goto python;
    Py_CLEAR(value);
    unsigned long long start, end, dropped;
    if (uint_attr(span, "start_time", &start) < 0 || uint_attr(span, "end_time", &end) < 0 ||
        uint_attr(span, "dropped_attributes", &dropped) < 0)
        goto python;
    if (dropped > 0xFFFFFFFFULL) goto python;
    int none;
    if ((none = empty_attr(span, "events")) != 1 || (none = empty_attr(span, "links")) != 1)
        goto python;
    unsigned long long dropped_events, dropped_links;
    if (uint_attr(span, "dropped_events", &dropped_events) < 0 ||
        uint_attr(span, "dropped_links", &dropped_links) < 0 || dropped_events || dropped_links)
        goto python;
    /* head: the name (field 5) needs its own room */
    Py_ssize_t head_len = (h - head) + (name_len ? 1 + varint_len((uint64_t)name_len) + name_len
                                                 : 0) + 2 + (start ? 9 : 0) + (end ? 9 : 0);
    PyObject *head_bytes = PyBytes_FromStringAndSize(NULL, head_len);
    if (head_bytes == NULL) goto done;
    char *out = PyBytes_AS_STRING(head_bytes);
    memcpy(out, head, (size_t)(h - head));
    out += h - head;
    if (name_len) {
        *out++ = 0x2a;
        out = put_varint(out, (uint64_t)name_len);
        memcpy(out, name_raw, (size_t)name_len);
        out += name_len;
    }
    *out++ = 0x30;
    *out++ = (char)(kind_value + 1);
    if (start) {
        *out++ = 0x39;
        for (int i = 0; i < 8; i++) *out++ = (char)((start >> (8 * i)) & 0xFF);
    }
    if (end) {
        *out++ = 0x41;
        for (int i = 0; i < 8; i++) *out++ = (char)((end >> (8 * i)) & 0xFF);
    }
    /* tail: the dropped count (10), the status (15), the flags (16) */
    if (dropped) {
        *t++ = 0x50;
        t = put_varint(t, dropped);
    }
    if ((status = attr(span, "status")) == NULL) {
        Py_DECREF(head_bytes);
        goto python;
    }
    const char *desc_raw = NULL;
    Py_ssize_t desc_len = 0;
    long code = 0;
    if (status != Py_None) {
        if ((description = attr(status, "description")) == NULL ||
            (description != Py_None && !PyUnicode_Check(description)) ||
            (value = attr(status, "status_code")) == NULL) {
            Py_DECREF(head_bytes);
            goto python;
        }
        if (description != Py_None && PyObject_IsTrue(description)) {
            desc_raw = PyUnicode_AsUTF8AndSize(description, &desc_len);
            if (desc_raw == NULL) {
                Py_DECREF(head_bytes);
                goto python;
            }
        }
        PyObject *code_value = enum_value(value);
        if (code_value == NULL || !PyLong_CheckExact(code_value)) {
            Py_XDECREF(code_value);
            Py_DECREF(head_bytes);
            goto python;
        }
        code = PyLong_AsLong(code_value);
        Py_DECREF(code_value);
        if (code < 0 || code > 127) {
            Py_DECREF(head_bytes);
            goto python;
        }
        Py_CLEAR(value);
    }
    Py_ssize_t status_len = status == Py_None
                                ? 0
                                : (desc_len ? 1 + varint_len((uint64_t)desc_len) + desc_len : 0) +
                                      (code ? 2 : 0);
    Py_ssize_t tail_len = (t - tail) + (status == Py_None ? 0 : 1 + varint_len(status_len) +
                                                                   status_len) + 6;
    PyObject *tail_bytes = PyBytes_FromStringAndSize(NULL, tail_len);
    if (tail_bytes == NULL) {
        Py_DECREF(head_bytes);
        goto done;
    }
    out = PyBytes_AS_STRING(tail_bytes);
    memcpy(out, tail, (size_t)(t - tail));
    out += t - tail;
    if (status != Py_None) {
        *out++ = 0x7a;
        out = put_varint(out, (uint64_t)status_len);
        if (desc_len) {
            *out++ = 0x12;
            out = put_varint(out, (uint64_t)desc_len);
            memcpy(out, desc_raw, (size_t)desc_len);
            out += desc_len;
        }
        if (code) {
            *out++ = 0x18;
            *out++ = (char)code;
        }
    }
    /* SpanFlags: whether the parent is remote is always said (0x100), and if so 0x200. */
    unsigned int flags = 0x100 | (has_parent && remote ? 0x200 : 0);
    *out++ = (char)0x85;
    *out++ = 0x01;
    for (int i = 0; i < 4; i++) *out++ = (char)((flags >> (8 * i)) & 0xFF);
    result = PyTuple_Pack(2, head_bytes, tail_bytes);
    Py_DECREF(head_bytes);
    Py_DECREF(tail_bytes);
    goto done;

python:
    PyErr_Clear();
    result = Py_None;
    Py_INCREF(result);
done:
    Py_XDECREF(context);
    Py_XDECREF(parent);
    Py_XDECREF(name);
    Py_XDECREF(kind);
    Py_XDECREF(status);
    Py_XDECREF(value);
    Py_XDECREF(description);
    return result;
}

/* -- the documents' record ------------------------------------------------------------- */

/* pack_documents(candidates, kept_in, outputs, kept_out, max_bytes, output_content, cap)
 *     -> (list, bool)
 *
 * spans.fit._pack in one pass: three per document, the first `kept_in` candidates (capped id,
 * capped text, recall score) then the first `kept_out` outputs (their candidate's capped id,
 * its capped text or None without `output_content`, the output's score), and whether any of
 * those candidates has metadata (a truthy `metadata`). Capped as spans.content.capped caps:
 * as it is when an exact str of ASCII no longer than `max_bytes`, else `cap(text, max_bytes)`
 * (spans.content.cap_content, which takes a str subclass by its characters). Both
 * sequences must be lists; each is copied first, so nothing a callback does can change what is
 * walked. */
static PyObject *pack_documents(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "pack_documents() takes 7 arguments");
        return NULL;
    }
    PyObject *limit = args[4], *cap = args[6];
    Py_ssize_t kept_in = PyLong_AsSsize_t(args[1]), kept_out = PyLong_AsSsize_t(args[3]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(limit);
    if ((kept_in == -1 || kept_out == -1 || max_bytes == -1) && PyErr_Occurred()) return NULL;
    int output_content = PyObject_IsTrue(args[5]);
    if (output_content < 0) return NULL;
    if (!PyList_CheckExact(args[0]) || !PyList_CheckExact(args[2])) {
        PyErr_SetString(PyExc_TypeError, "candidates and outputs must be lists");
        return NULL;
    }
    if (kept_in < 0 || kept_out < 0 || kept_in > PyList_GET_SIZE(args[0]) ||
        kept_out > PyList_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_ValueError, "kept counts out of range");
        return NULL;
    }
    PyObject *candidates = PyList_GetSlice(args[0], 0, kept_in);
    PyObject *outputs = PyList_GetSlice(args[2], 0, kept_out);
    PyObject *packed = PyList_New(3 * (kept_in + kept_out));
    PyObject *c = NULL, *field = NULL;
    int metadata = 0;
    if (candidates == NULL || outputs == NULL || packed == NULL) goto fail;
    for (Py_ssize_t d = 0; d < kept_in + kept_out; d++) {
        int input = d < kept_in;
        PyObject *r = input ? NULL : PyList_GET_ITEM(outputs, d - kept_in);
        if (input) {
            c = PyList_GET_ITEM(candidates, d);
            Py_INCREF(c);
        } else if ((c = field_get(&out_candidate, r)) == NULL) {
            goto fail;
        }
        if ((field = field_get(&cand_id, c)) == NULL) goto fail;
        PyObject *value = capped(field, max_bytes, cap, limit);
        if (value == NULL) goto fail;
        PyList_SET_ITEM(packed, 3 * d, value);
        Py_CLEAR(field);
        if (input || output_content) {
            if ((field = field_get(&cand_text, c)) == NULL) goto fail;
            value = capped(field, max_bytes, cap, limit);
            if (value == NULL) goto fail;
            Py_CLEAR(field);
        } else {
            value = Py_None;
            Py_INCREF(value);
        }
        PyList_SET_ITEM(packed, 3 * d + 1, value);
        value = input ? field_get(&cand_score, c) : field_get(&out_score, r);
        if (value == NULL) goto fail;
        PyList_SET_ITEM(packed, 3 * d + 2, value);
        if (!metadata) {
            if ((field = field_get(&cand_metadata, c)) == NULL) goto fail;
            metadata = PyObject_IsTrue(field);
            Py_CLEAR(field);
            if (metadata < 0) goto fail;
        }
        Py_CLEAR(c);
    }
    Py_DECREF(candidates);
    Py_DECREF(outputs);
    PyObject *result = PyTuple_Pack(2, packed, metadata ? Py_True : Py_False);
    Py_DECREF(packed);
    return result;

fail:
    Py_XDECREF(c);
    Py_XDECREF(field);
    Py_XDECREF(candidates);
    Py_XDECREF(outputs);
    Py_XDECREF(packed); /* its unset items are NULL, which list_dealloc passes over */
    return NULL;
}

/* -- output.value --------------------------------------------------------------------- */

static const char OUTPUT_HEAD[] = "{\"documents\":[";
#define OUTPUT_HEAD_LEN ((Py_ssize_t)(sizeof(OUTPUT_HEAD) - 1))
#define ENTRY_FIXED 18 /* {"id":"","score":} */

/* output_value(outputs, scores, score_json, max_bytes) -> str | None
 *
 * spans.content._plain_output in C: output.value of an answered call, written whole and cut
 * to `max_bytes`, or None where the general path must write it. `outputs` are the Reranked
 * outputs, `scores` their scores (each an exact float, checked by the caller) and
 * `score_json` orjson's JSON array of them, whose digits are each score's repr wherever the
 * magnitude is 0 or in [1e-4, 1e16) (spans.content.float_reprs). None unless every id is an
 * exact str of printable ASCII without quote or backslash and no longer than `max_bytes`, and
 * every score is finite and of such a magnitude. */
static PyObject *output_value(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "output_value(outputs, scores, score_json, max_bytes)");
        return NULL;
    }
    PyObject *outputs = args[0], *scores = args[1], *raw = args[2];
    if (!PyLong_CheckExact(args[3])) Py_RETURN_NONE; /* a cap the general path reads */
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[3]);
    if (max_bytes == -1 && PyErr_Occurred()) { /* beyond a Py_ssize_t: the general path */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (!PyList_CheckExact(outputs) && !PyTuple_CheckExact(outputs)) Py_RETURN_NONE;
    if (!PyList_CheckExact(scores) || !PyBytes_Check(raw)) Py_RETURN_NONE;
    /* A copy of its own: reading an id may run Python (a Candidate subclass's attribute),
     * which could change the caller's list under a borrowed reference. */
    PyObject *items = PySequence_List(outputs);
    if (items == NULL) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    if (PyList_GET_SIZE(scores) != n) {
        Py_DECREF(items);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    PyObject **ids = NULL;
    const char **texts = NULL;
    Py_ssize_t *text_lens = NULL;
    if (n == 0) {  /* nothing to gain: the general path writes it */
        Py_DECREF(items);
        Py_RETURN_NONE;
    }
    ids = PyMem_Calloc((size_t)n, sizeof(PyObject *));
    texts = PyMem_Malloc((size_t)n * sizeof(char *));
    text_lens = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
    if (ids == NULL || texts == NULL || text_lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* The scores' texts: orjson's array, split at its commas (a float's text has none). */
    const char *p = PyBytes_AS_STRING(raw), *end = p + PyBytes_GET_SIZE(raw);
    if (end - p < 2 || *p != '[' || end[-1] != ']' || memchr(p, 'n', (size_t)(end - p))) {
        result = Py_None;  /* null: a NaN or an infinity */
        Py_INCREF(result);
        goto done;
    }
    p++;
    end--;
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma != NULL ? comma : end;
        if ((comma == NULL) != (i == n - 1) || stop == p) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        texts[i] = p;
        text_lens[i] = stop - p;
        p = stop + 1;
        PyObject *score = PyList_GET_ITEM(scores, i);
        if (!PyFloat_CheckExact(score)) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        double size = fabs(PyFloat_AS_DOUBLE(score));
        if (!isfinite(size) || (size != 0.0 && (size < 1e-4 || size >= 1e16))) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    /* The ids: exact str, printable ASCII, nothing to escape, none to cap. */
    Py_ssize_t total = OUTPUT_HEAD_LEN + 2;  /* head, then "]}" */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *c = field_get(&out_candidate, PyList_GET_ITEM(items, i));
        if (c == NULL) goto done;
        ids[i] = field_get(&cand_id, c);
        Py_DECREF(c);
        if (ids[i] == NULL) goto done;
        PyObject *id = ids[i];
        if (!PyUnicode_CheckExact(id) || !PyUnicode_IS_ASCII(id) ||
            PyUnicode_GET_LENGTH(id) > max_bytes) {
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
        const Py_UCS1 *chars = PyUnicode_1BYTE_DATA(id);
        Py_ssize_t len = PyUnicode_GET_LENGTH(id);
        for (Py_ssize_t j = 0; j < len; j++) {
            Py_UCS1 ch = chars[j];
            if (ch < 0x20 || ch > 0x7E || ch == '"' || ch == '\\') {
                result = Py_None;
                Py_INCREF(result);
                goto done;
            }
        }
        total += ENTRY_FIXED + len + text_lens[i] + (i ? 1 : 0);
    }
    /* How many entries: all when the whole text fits, else as many as fit before the tail. */
    Py_ssize_t kept = n;
    char tail[64];
    Py_ssize_t tail_len = 0;
    if (total > max_bytes) {
        int longest = snprintf(tail, sizeof(tail), "],\"omitted\":%zd}", n);
        Py_ssize_t budget = max_bytes - OUTPUT_HEAD_LEN - longest;
        Py_ssize_t used = -1;  /* the first entry has no comma before it */
        kept = 0;
        while (kept < n) {
            Py_ssize_t size = ENTRY_FIXED + PyUnicode_GET_LENGTH(ids[kept]) + text_lens[kept] + 1;
            if (used + size > budget) break;
            used += size;
            kept++;
        }
        tail_len = snprintf(tail, sizeof(tail), "],\"omitted\":%zd}", n - kept);
        total = OUTPUT_HEAD_LEN + (kept ? used : 0) + tail_len;
    } else {
        memcpy(tail, "]}", 2);
        tail_len = 2;
    }
    result = PyUnicode_New(total, 127);
    if (result == NULL) goto done;
    char *out = (char *)PyUnicode_1BYTE_DATA(result);
    memcpy(out, OUTPUT_HEAD, OUTPUT_HEAD_LEN);
    out += OUTPUT_HEAD_LEN;
    for (Py_ssize_t i = 0; i < kept; i++) {
        if (i) *out++ = ',';
        memcpy(out, "{\"id\":\"", 7);
        out += 7;
        Py_ssize_t len = PyUnicode_GET_LENGTH(ids[i]);
        memcpy(out, PyUnicode_1BYTE_DATA(ids[i]), (size_t)len);
        out += len;
        memcpy(out, "\",\"score\":", 10);
        out += 10;
        memcpy(out, texts[i], (size_t)text_lens[i]);
        out += text_lens[i];
        *out++ = '}';
    }
    memcpy(out, tail, (size_t)tail_len);
    out += tail_len;
    assert(out == (char *)PyUnicode_1BYTE_DATA(result) + total);

done:
    if (ids != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(ids[i]);
        PyMem_Free(ids);
    }
    PyMem_Free(texts);
    PyMem_Free(text_lens);
    Py_DECREF(items);
    return result;
}

/* -- the quality walk -------------------------------------------------------------------- */

static inline int popcount64(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_popcountll(x);
#else
    int n = 0;
    while (x) {
        x &= x - 1;
        n++;
    }
    return n;
#endif
}

/* Bits of `words` below bit r: the popcount of (words & ((1 << r) - 1)). */
static inline Py_ssize_t count_below(const uint64_t *words, Py_ssize_t r) {
    Py_ssize_t full = r >> 6, count = 0;
    for (Py_ssize_t w = 0; w < full; w++) count += popcount64(words[w]);
    if (r & 63) count += popcount64(words[full] & ((UINT64_C(1) << (r & 63)) - 1));
    return count;
}

#define WALK_MAX 8192 /* n0 = n(n-1)/2 < 2^25.5, so n0 * n0 < 2^51: exact in a double */

/* quality_walk(scored, recall, k, full, weights, tails) -> tuple | None
 *
 * quality._walk for scores best first, as (top, tau, rbo, spread), with the same arithmetic
 * in the same order, so every float is the one the Python computes. None, for the Python to
 * do it (and raise where it raises), unless every pair is a 2-tuple of an int position within
 * `recall` and a finite exact float, no position comes twice, the scores never rise, and
 * `recall` is a permutation of range(len(recall)) in ints. `weights` and `tails` are
 * quality._rbo_weights(k). */
static PyObject *quality_walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "quality_walk(scored, recall, k, full, weights, tails)");
        return NULL;
    }
    PyObject *scored = args[0], *recall = args[1], *weights = args[4], *tails = args[5];
    Py_ssize_t k = PyLong_AsSsize_t(args[2]);
    if (k == -1 && PyErr_Occurred()) return NULL;
    int full = PyObject_IsTrue(args[3]);
    if (full < 0) return NULL;
    if (!PyList_CheckExact(scored) || !PyList_CheckExact(recall) || !PyList_CheckExact(weights) ||
        !PyList_CheckExact(tails))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(scored), n_ranks = PyList_GET_SIZE(recall);
    /* Beyond WALK_MAX pairs tau's n0 * (n0 - tied) no longer fits a double exactly (nor, far
     * beyond, a long long): the Python computes it in integers. */
    if (n == 0 || n > WALK_MAX || k < 0 || k > n || k >= PyList_GET_SIZE(weights) ||
        k >= PyList_GET_SIZE(tails))
        Py_RETURN_NONE;
    Py_ssize_t n_words = n_ranks / 64 + 1;
    /* rank_of, then three bit sets of n_ranks bits: one allocation. */
    Py_ssize_t *rank_of = PyMem_Malloc((size_t)n_ranks * sizeof(Py_ssize_t) +
                                       3 * (size_t)n_words * sizeof(uint64_t) + 1);
    if (rank_of == NULL) return PyErr_NoMemory();
    uint64_t *seen = (uint64_t *)(rank_of + n_ranks), *before = seen + n_words,
             *placed = before + n_words;
    memset(seen, 0, 3 * (size_t)n_words * sizeof(uint64_t));
    PyObject *result = NULL;
    for (Py_ssize_t rank = 0; rank < n_ranks; rank++) {
        PyObject *item = PyList_GET_ITEM(recall, rank);
        if (!PyLong_CheckExact(item)) goto python;
        Py_ssize_t position = PyLong_AsSsize_t(item);
        if (position == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto python;
        }
        if (position < 0 || position >= n_ranks || (placed[position >> 6] >> (position & 63)) & 1)
            goto python;
        placed[position >> 6] |= UINT64_C(1) << (position & 63);
        rank_of[position] = rank;
    }
    long long concordant = 0, tied = 0, run = -1;
    double agreement = 0.0, prev = 0.0, first = 0.0, kth = 0.0;
    Py_ssize_t depth = full ? n : k;
    for (Py_ssize_t i = 0; i < depth; i++) {
        PyObject *pair = PyList_GET_ITEM(scored, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) goto python;
        PyObject *pos = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyLong_CheckExact(pos) || !PyFloat_CheckExact(value)) goto python;
        Py_ssize_t position = PyLong_AsSsize_t(pos);
        if (position == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto python;
        }
        double score = PyFloat_AS_DOUBLE(value);
        if (position < 0 || position >= n_ranks || !isfinite(score)) goto python;
        Py_ssize_t rank = rank_of[position];
        if ((seen[rank >> 6] >> (rank & 63)) & 1) goto python; /* scored twice */
        if (i == 0) {
            prev = first = score;
        }
        if (score < prev) { /* a new run of scores */
            memcpy(before, seen, (size_t)n_words * sizeof(uint64_t));
            run = 0;
            prev = score;
        } else if (score == prev) {
            run += 1;
            tied += run;
        } else {
            goto python; /* not best first */
        }
        concordant += count_below(before, rank);
        seen[rank >> 6] |= UINT64_C(1) << (rank & 63);
        if (i < k) {
            Py_ssize_t d = i + 1;
            PyObject *weight = PyList_GET_ITEM(weights, d);
            if (!PyFloat_CheckExact(weight)) goto python;
            agreement += (double)count_below(seen, d) * PyFloat_AS_DOUBLE(weight);
            if (d == k) {
                kth = score;
                memcpy(placed, seen, (size_t)n_words * sizeof(uint64_t)); /* `top` */
            }
        }
    }
    /* The rest of `scored` (not walked when not `full`) must still be valid for the Python's
     * result to be this one: it would have raised on a duplicate or a bad pair there too. */
    for (Py_ssize_t i = depth; i < n; i++) {
        PyObject *pair = PyList_GET_ITEM(scored, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) goto python;
        PyObject *pos = PyTuple_GET_ITEM(pair, 0), *value = PyTuple_GET_ITEM(pair, 1);
        if (!PyLong_CheckExact(pos) || !PyFloat_CheckExact(value) ||
            !isfinite(PyFloat_AS_DOUBLE(value)))
            goto python;
        Py_ssize_t position = PyLong_AsSsize_t(pos);
        if (position == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto python;
        }
        if (position < 0 || position >= n_ranks) goto python;
        Py_ssize_t rank = rank_of[position];
        if ((seen[rank >> 6] >> (rank & 63)) & 1) goto python;
        seen[rank >> 6] |= UINT64_C(1) << (rank & 63);
    }
    if (k == 0) memset(placed, 0, (size_t)n_words * sizeof(uint64_t));
    /* top: the recall ranks of the first k, as a Python int. */
    PyObject *top = PyLong_FromUnsignedLongLong(0);
    if (top == NULL) goto done;
    for (Py_ssize_t w = n_words - 1; w >= 0; w--) {
        PyObject *shift = PyLong_FromLong(64), *word = PyLong_FromUnsignedLongLong(placed[w]);
        PyObject *shifted = (shift && word) ? PyNumber_Lshift(top, shift) : NULL;
        PyObject *joined = shifted ? PyNumber_Or(shifted, word) : NULL;
        Py_XDECREF(shift);
        Py_XDECREF(word);
        Py_XDECREF(shifted);
        Py_DECREF(top);
        top = joined;
        if (top == NULL) goto done;
    }
    PyObject *rbo = Py_None, *spread = Py_None, *tau = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (k) {
        PyObject *tail = PyList_GET_ITEM(tails, k);
        if (!PyFloat_CheckExact(tail)) {
            Py_DECREF(top);
            Py_DECREF(rbo);
            Py_DECREF(spread);
            Py_DECREF(tau);
            goto python;
        }
        double value = agreement + (double)count_below(placed, k) * PyFloat_AS_DOUBLE(tail);
        Py_SETREF(rbo, PyFloat_FromDouble(value < 1.0 ? value : 1.0));
        if (k >= 2) Py_SETREF(spread, PyFloat_FromDouble(first - kth));
    }
    long long n0 = (long long)depth * (depth - 1) / 2;
    if (!(depth < 2 || tied == n0)) {
        long long balance = 2 * concordant - (n0 - tied);
        double value = tied ? (double)balance / sqrt((double)(n0 * (n0 - tied)))
                            : (double)balance / (double)n0;
        Py_SETREF(tau, PyFloat_FromDouble(value));
    }
    if (rbo == NULL || spread == NULL || tau == NULL) {
        Py_DECREF(top);
        Py_XDECREF(rbo);
        Py_XDECREF(spread);
        Py_XDECREF(tau);
        goto done;
    }
    result = PyTuple_Pack(4, top, tau, rbo, spread);
    Py_DECREF(top);
    Py_DECREF(tau);
    Py_DECREF(rbo);
    Py_DECREF(spread);
    goto done;

python:
    result = Py_None;
    Py_INCREF(result);
done:
    PyMem_Free(rank_of);
    return result;
}

/* setup_fields(candidate_type, reranked_type): the classes whose slots `documents` and
 * `output_value` read directly. Called once, by retrieval_stage._native, on import. */
static PyObject *setup_fields(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "setup_fields(candidate_type, reranked_type)");
        return NULL;
    }
    if (field_init(&cand_id, args[0], "id") < 0 || field_init(&cand_text, args[0], "text") < 0 ||
        field_init(&cand_score, args[0], "score") < 0 ||
        field_init(&cand_metadata, args[0], "metadata") < 0 ||
        field_init(&out_candidate, args[1], "candidate") < 0 ||
        field_init(&out_score, args[1], "score") < 0)
        return NULL;
    Py_INCREF(args[0]);  /* the classes stay alive as long as their offsets are used */
    Py_INCREF(args[1]);
    Py_RETURN_NONE;
}

/* setup_encoder(any_value, unsupported): the Python encoder's `_any_value` and
 * `UnsupportedValue`. Called once, by otlp_encoder, when it imports this module. */
static PyObject *setup_encoder(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyCallable_Check(args[0]) || !PyExceptionClass_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "setup_encoder(any_value, unsupported)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(any_value_fn, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(unsupported, args[1]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"attributes", (PyCFunction)(void (*)(void))attributes, METH_FASTCALL,
     "attributes(tag, mapping, cache) -> bytes: each item as a KeyValue field `tag`."},
    {"documents", (PyCFunction)(void (*)(void))documents, METH_FASTCALL,
     "documents(...) -> bytes: a RERANKER span's documents as KeyValue fields."},
    {"output_value", (PyCFunction)(void (*)(void))output_value, METH_FASTCALL,
     "output_value(outputs, scores, score_json, max_bytes) -> str | None: output.value."},
    {"span_frame", (PyCFunction)span_frame, METH_O,
     "span_frame(span) -> (head, tail) | None: the Span fields around its attributes."},
    {"pack_documents", (PyCFunction)(void (*)(void))pack_documents, METH_FASTCALL,
     "pack_documents(candidates, kept_in, outputs, kept_out) -> (list, bool): fit._plan's."},
    {"quality_walk", (PyCFunction)(void (*)(void))quality_walk, METH_FASTCALL,
     "quality_walk(scored, recall, k, full, weights, tails) -> tuple | None: quality._walk."},
    {"setup_fields", (PyCFunction)(void (*)(void))setup_fields, METH_FASTCALL,
     "setup_fields(candidate_type, reranked_type): called once by retrieval_stage._native."},
    {"setup_encoder", (PyCFunction)(void (*)(void))setup_encoder, METH_FASTCALL,
     "setup_encoder(any_value, unsupported): called once by otlp_encoder."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups",
    "C loops of a traced rerank (each identical to the Python it stands in for).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__speedups(void) { return PyModule_Create(&module); }
