/* A page's words as numbers, and Gopher's n-gram repetition counts over them.
 *
 * `Words` takes a page's words (Python str, in order, a list at a time: a long page comes in
 * pieces and no list of all its words is ever held), numbers the distinct ones, and answers
 * datatrove's two n-gram questions exactly (gristmill/filters/gopher_repetition.py says what
 * they are and why the quirks are kept):
 *
 *   top_chars(n):  the most common n-gram, the words joined by spaces (ties: the first seen),
 *                  its characters times its count; None when the page has fewer than n words;
 *   repeated_chars(n, n_chars, max_frac): datatrove's left-to-right scan over the n-grams joined
 *                  WITHOUT spaces: an n-gram seen before adds its characters and the scan jumps
 *                  past it; stops early once count / n_chars > max_frac (the count only grows).
 *
 * Equality is exact: hashes find candidates, then the words (for " "-joined n-grams: words hold
 * no spaces, so equal strings are equal word sequences) or the characters (for ""-joined ones,
 * where ("ab", "c") equals ("a", "bc")) are compared. Memory: 4 bytes per word occurrence, the
 * distinct words (a reference to the first str of each, and 24 bytes), and while a rule runs a
 * table of 16 bytes per n-gram slot (at most half full).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BASE 0x9E3779B97F4A7C15ull /* odd: a polynomial hash of code points modulo 2**64 */
#define MIX 0xD6E8FEB86659FD93ull

typedef struct {
    PyObject_HEAD
    /* distinct words */
    PyObject **word;  /* the first str seen of each (a new reference) */
    int64_t *len;     /* characters */
    uint64_t *hash;   /* sum of (c_k + 1) * BASE**(len-1-k) */
    uint64_t *power;  /* BASE**len */
    uint64_t distinct, distinct_cap;
    int32_t *table;   /* open addressing over the distinct words, -1 = empty */
    uint64_t table_cap;
    /* the page: one id per word, and the characters before each word */
    int32_t *ids;
    uint64_t count, ids_cap;
    int64_t chars;
} Words;

static int grow(void **buf, uint64_t *cap, uint64_t need, size_t item) {
    if (need <= *cap) return 0;
    uint64_t cap2 = *cap ? *cap : 256;
    while (cap2 < need) cap2 *= 2;
    void *p = realloc(*buf, cap2 * item);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    *buf = p;
    *cap = cap2;
    return 0;
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= MIX;
    h ^= h >> 29;
    return h;
}

static int same_str(PyObject *a, PyObject *b) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(a);
    if (n != PyUnicode_GET_LENGTH(b)) return 0;
    int ka = PyUnicode_KIND(a), kb = PyUnicode_KIND(b);
    const void *da = PyUnicode_DATA(a), *db = PyUnicode_DATA(b);
    if (ka == kb) return memcmp(da, db, (size_t)n * ka) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(ka, da, i) != PyUnicode_READ(kb, db, i)) return 0;
    return 1;
}

static int rehash(Words *self, uint64_t cap) {
    int32_t *t = malloc(cap * sizeof(int32_t));
    if (!t) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < cap; i++) t[i] = -1;
    for (uint64_t id = 0; id < self->distinct; id++) {
        uint64_t i = mix(self->hash[id] ^ (uint64_t)self->len[id]) & (cap - 1);
        while (t[i] != -1) i = (i + 1) & (cap - 1);
        t[i] = (int32_t)id;
    }
    free(self->table);
    self->table = t;
    self->table_cap = cap;
    return 0;
}

/* The id of `w`, a new one if it is new. */
static int64_t word_id(Words *self, PyObject *w) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(w);
    int kind = PyUnicode_KIND(w);
    const void *data = PyUnicode_DATA(w);
    uint64_t h = 0, p = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = h * BASE + (uint64_t)PyUnicode_READ(kind, data, i) + 1;
        p *= BASE;
    }
    if (2 * (self->distinct + 1) > self->table_cap && rehash(self, self->table_cap ? 2 * self->table_cap : 1024) < 0)
        return -1;
    uint64_t mask = self->table_cap - 1, i = mix(h ^ (uint64_t)n) & mask;
    while (self->table[i] != -1) {
        int32_t id = self->table[i];
        if (self->hash[id] == h && self->len[id] == n && same_str(self->word[id], w)) return id;
        i = (i + 1) & mask;
    }
    if (self->distinct >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 distinct words on one page");
        return -1;
    }
    uint64_t id = self->distinct, cap = self->distinct_cap;
    if (grow((void **)&self->word, &cap, id + 1, sizeof(PyObject *)) < 0) return -1;
    cap = self->distinct_cap;
    if (grow((void **)&self->len, &cap, id + 1, sizeof(int64_t)) < 0) return -1;
    cap = self->distinct_cap;
    if (grow((void **)&self->hash, &cap, id + 1, sizeof(uint64_t)) < 0) return -1;
    cap = self->distinct_cap;
    if (grow((void **)&self->power, &cap, id + 1, sizeof(uint64_t)) < 0) return -1;
    self->distinct_cap = cap;
    Py_INCREF(w);
    self->word[id] = w;
    self->len[id] = n;
    self->hash[id] = h;
    self->power[id] = p;
    self->distinct++;
    self->table[i] = (int32_t)id;
    return (int64_t)id;
}

/* add(words): appends a list of str, the page's next words. */
static PyObject *Words_add(Words *self, PyObject *words) {
    PyObject *seq = PySequence_Fast(words, "Words.add: expected a list of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (grow((void **)&self->ids, &self->ids_cap, self->count + (uint64_t)n, sizeof(int32_t)) < 0) goto fail;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *w = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyUnicode_Check(w)) {
            PyErr_Format(PyExc_TypeError, "Words.add: expected str, got %.100s", Py_TYPE(w)->tp_name);
            goto fail;
        }
        int64_t id = word_id(self, w);
        if (id < 0) goto fail;
        self->ids[self->count++] = (int32_t)id;
        self->chars += self->len[id];
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* A table of n-grams for one rule: (hash, first position + 1, count); position 0 = empty. */
typedef struct {
    uint64_t hash;
    uint32_t pos1;
    uint32_t count;
} Gram;

static Gram *gram_table(uint64_t grams, uint64_t *mask) {
    uint64_t cap = 16;
    while (cap < 2 * grams) cap *= 2;
    Gram *t = calloc(cap, sizeof(Gram));
    if (!t) PyErr_NoMemory();
    *mask = cap - 1;
    return t;
}

static int same_words(const int32_t *ids, uint64_t a, uint64_t b, int n) {
    for (int k = 0; k < n; k++)
        if (ids[a + k] != ids[b + k]) return 0;
    return 1;
}

/* The n words at a and at b, each joined without spaces, are the same string. */
static int same_joined(const Words *self, uint64_t a, uint64_t b, int n) {
    if (same_words(self->ids, a, b, n)) return 1;
    int64_t la = 0, lb = 0;
    for (int k = 0; k < n; k++) {
        la += self->len[self->ids[a + k]];
        lb += self->len[self->ids[b + k]];
    }
    if (la != lb) return 0;
    /* walk both sequences a character at a time */
    uint64_t wa = a, wb = b;
    Py_ssize_t ia = 0, ib = 0;
    for (int64_t c = 0; c < la; c++) {
        while (ia >= self->len[self->ids[wa]]) {
            wa++;
            ia = 0;
        }
        while (ib >= self->len[self->ids[wb]]) {
            wb++;
            ib = 0;
        }
        PyObject *sa = self->word[self->ids[wa]], *sb = self->word[self->ids[wb]];
        if (PyUnicode_READ_CHAR(sa, ia) != PyUnicode_READ_CHAR(sb, ib)) return 0;
        ia++;
        ib++;
    }
    return 1;
}

static PyObject *Words_top_chars(Words *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "top_chars: n must be >= 1");
        return NULL;
    }
    if (self->count < (uint64_t)n) Py_RETURN_NONE;
    uint64_t grams = self->count - (uint64_t)n + 1, mask;
    if (grams > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "top_chars: more than 2**32 n-grams");
        return NULL;
    }
    Gram *t = gram_table(grams, &mask);
    if (!t) return NULL;
    const int32_t *ids = self->ids;
    uint32_t best_count = 0, best_pos = 0;
    for (uint64_t i = 0; i < grams; i++) {
        uint64_t h = 0;
        for (long k = 0; k < n; k++) h = h * BASE + (uint64_t)ids[i + k] + 1;
        uint64_t s = mix(h) & mask;
        while (t[s].pos1 && !(t[s].hash == h && same_words(ids, t[s].pos1 - 1, i, (int)n))) s = (s + 1) & mask;
        if (!t[s].pos1) {
            t[s].hash = h;
            t[s].pos1 = (uint32_t)i + 1;
        }
        uint32_t c = ++t[s].count;
        /* Counter.most_common(1): the highest count, the first inserted among equal ones */
        if (c > best_count || (c == best_count && t[s].pos1 - 1 < best_pos)) {
            best_count = c;
            best_pos = t[s].pos1 - 1;
        }
    }
    free(t);
    int64_t chars = n - 1; /* the spaces */
    for (long k = 0; k < n; k++) chars += self->len[ids[best_pos + k]];
    return PyLong_FromLongLong(chars * (int64_t)best_count);
}

static PyObject *Words_repeated_chars(Words *self, PyObject *args) {
    long n;
    long long n_chars;
    double max_frac;
    if (!PyArg_ParseTuple(args, "lLd", &n, &n_chars, &max_frac)) return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "repeated_chars: n must be >= 1");
        return NULL;
    }
    if (self->count < (uint64_t)n) return PyLong_FromLong(0);
    uint64_t grams = self->count - (uint64_t)n + 1, mask;
    if (grams > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "repeated_chars: more than 2**32 n-grams");
        return NULL;
    }
    Gram *t = gram_table(grams, &mask);
    if (!t) return NULL;
    const int32_t *ids = self->ids;
    int64_t total = 0;
    uint64_t i = 0;
    while (i < grams) {
        uint64_t h = 0;
        int64_t chars = 0;
        for (long k = 0; k < n; k++) {
            int32_t id = ids[i + k];
            h = h * self->power[id] + self->hash[id];
            chars += self->len[id];
        }
        uint64_t s = mix(h) & mask;
        int seen = 0;
        while (t[s].pos1) {
            if (t[s].hash == h && same_joined(self, t[s].pos1 - 1, i, (int)n)) {
                seen = 1;
                break;
            }
            s = (s + 1) & mask;
        }
        if (seen) {
            total += chars;
            i += (uint64_t)n;
            if (n_chars > 0 && (double)total / (double)n_chars > max_frac) break;
        } else {
            t[s].hash = h;
            t[s].pos1 = (uint32_t)i + 1;
            i++;
        }
    }
    free(t);
    return PyLong_FromLongLong(total);
}

static PyObject *Words_len(Words *self, void *Py_UNUSED(closure)) { return PyLong_FromUnsignedLongLong(self->count); }

static PyObject *Words_distinct(Words *self, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(self->distinct);
}

static PyObject *Words_chars(Words *self, void *Py_UNUSED(closure)) { return PyLong_FromLongLong(self->chars); }

static void Words_dealloc(Words *self) {
    for (uint64_t i = 0; i < self->distinct; i++) Py_DECREF(self->word[i]);
    free(self->word);
    free(self->len);
    free(self->hash);
    free(self->power);
    free(self->table);
    free(self->ids);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Words_init(Words *self, PyObject *args, PyObject *kwds) {
    PyObject *words = NULL;
    static char *kwlist[] = {"words", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O", kwlist, &words)) return -1;
    if (words && words != Py_None) {
        PyObject *r = Words_add(self, words);
        if (!r) return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyMethodDef Words_methods[] = {
    {"add", (PyCFunction)Words_add, METH_O, "add(words): the page's next words (a list of str)"},
    {"top_chars", (PyCFunction)Words_top_chars, METH_O,
     "top_chars(n): characters of the most common ' '-joined n-gram times its count; None below n words"},
    {"repeated_chars", (PyCFunction)Words_repeated_chars, METH_VARARGS,
     "repeated_chars(n, n_chars, max_frac): datatrove's find_all_duplicate, stopping once count / n_chars > "
     "max_frac"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Words_getset[] = {
    {"count", (getter)Words_len, NULL, "words added", NULL},
    {"distinct", (getter)Words_distinct, NULL, "distinct words", NULL},
    {"chars", (getter)Words_chars, NULL, "characters of the words added", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gristmill.native._ngrams.Words",
    .tp_basicsize = sizeof(Words),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A page's words as numbers, and Gopher's n-gram repetition counts over them",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Words_init,
    .tp_dealloc = (destructor)Words_dealloc,
    .tp_methods = Words_methods,
    .tp_getset = Words_getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_ngrams", .m_doc = "Gopher's n-gram repetition counts", .m_size = -1,
};

PyMODINIT_FUNC PyInit__ngrams(void) {
    if (PyType_Ready(&WordsType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&WordsType);
    if (PyModule_AddObject(m, "Words", (PyObject *)&WordsType) < 0) {
        Py_DECREF(&WordsType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
