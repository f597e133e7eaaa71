/* The most attributes an element of an HTML page can have, found before any parser sees it.
 *
 * Parsers compare each new attribute of an element with those it already has (duplicates are
 * dropped, as the HTML standard says): lexbor (resiliparse) and libxml2 (trafilatura's lxml) take
 * time quadratic in one element's distinct attributes, so one `<div a0 a1 ... a299999>` never
 * finishes. `most_attributes` counts them as the HTML standard's tokenizer does (the states
 * from "tag name" to "self-closing start tag"), in linear time, and without knowing where tags
 * really start: which `<` starts a tag depends on the tree builder (a `<style>` is raw text in
 * HTML and markup inside `<svg>`, a comment or a script hides what looks like a tag), so a scan
 * starts at every `<` followed by an ASCII letter and every `</` followed by one. Every real
 * tag is then among the scans, counted exactly; the others can only add to the maximum. Scans
 * that reach the same state at the same character continue identically, so they merge (the
 * higher count kept): at most one scan per state is alive, whatever the markup.
 *
 * gristmill.input.warc uses it (`most_attributes`); tests/pipeline/test_warc_reader.py
 * checks it equal to a Python transcription of the same states on the sample and on hostile
 * pages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string.h>

enum { TAG_NAME, BEFORE_NAME, NAME, AFTER_NAME, BEFORE_VALUE, VALUE_DQ, VALUE_SQ, VALUE_UNQ, AFTER_VALUE_Q,
       SELF_CLOSING, STATES, END = -1 };

static inline int is_space(Py_UCS4 c) { return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\r'; }
static inline int is_alpha(Py_UCS4 c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }

/* The state after character `c` in `state` (END: the tag is over); *added: a new attribute began. */
static int step(int state, Py_UCS4 c, int *added) {
    for (;;) { /* "reconsume in ..." loops */
        switch (state) {
        case TAG_NAME:
            if (is_space(c)) return BEFORE_NAME;
            if (c == '/') return SELF_CLOSING;
            if (c == '>') return END;
            return TAG_NAME;
        case BEFORE_NAME:
            if (is_space(c)) return BEFORE_NAME;
            if (c == '/' || c == '>') { state = AFTER_NAME; continue; }
            *added = 1; /* `=` too begins a name here */
            return NAME;
        case NAME:
            if (is_space(c) || c == '/' || c == '>') { state = AFTER_NAME; continue; }
            if (c == '=') return BEFORE_VALUE;
            return NAME;
        case AFTER_NAME:
            if (is_space(c)) return AFTER_NAME;
            if (c == '/') return SELF_CLOSING;
            if (c == '=') return BEFORE_VALUE;
            if (c == '>') return END;
            *added = 1;
            return NAME;
        case BEFORE_VALUE:
            if (is_space(c)) return BEFORE_VALUE;
            if (c == '"') return VALUE_DQ;
            if (c == '\'') return VALUE_SQ;
            if (c == '>') return END;
            return VALUE_UNQ;
        case VALUE_DQ:
            return c == '"' ? AFTER_VALUE_Q : VALUE_DQ;
        case VALUE_SQ:
            return c == '\'' ? AFTER_VALUE_Q : VALUE_SQ;
        case VALUE_UNQ:
            if (is_space(c)) return BEFORE_NAME;
            if (c == '>') return END;
            return VALUE_UNQ;
        case AFTER_VALUE_Q:
            if (is_space(c)) return BEFORE_NAME;
            if (c == '/') return SELF_CLOSING;
            if (c == '>') return END;
            state = BEFORE_NAME;
            continue;
        default: /* SELF_CLOSING */
            if (c == '>') return END;
            state = BEFORE_NAME;
            continue;
        }
    }
}

typedef struct {
    int state;
    Py_ssize_t count, start;
} Scan;

typedef struct {
    Py_ssize_t best, best_at;
} Most;

/* One pass over characters of one kind (1, 2 or 4 bytes): the scans alive (at most one per
 * state) follow each character; returns 1 once some element has more than `stop` attributes. */
#define SCAN_KIND(NAME, T)                                                                          \
    static int NAME(const T *text, Py_ssize_t n, Py_ssize_t stop, Most *most) {                     \
        Scan live[STATES], next[STATES];                                                            \
        int slot[STATES]; /* where a state is in `next` this character, or -1 */                   \
        int alive = 0;                                                                              \
        Py_ssize_t pending = -1; /* a `</`: its scan begins after the `/` */                        \
        for (Py_ssize_t i = 0; i < n; i++) {                                                        \
            if (!alive && pending < 0) { /* in text, nothing to follow: on to the next `<` */        \
                if (sizeof(T) == 1) {                                                               \
                    const void *lt = memchr(text + i, '<', (size_t)(n - i));                        \
                    if (lt == NULL) break;                                                          \
                    i = (const T *)lt - text;                                                       \
                } else {                                                                            \
                    while (i < n && text[i] != '<') i++;                                            \
                    if (i == n) break;                                                              \
                }                                                                                   \
            }                                                                                       \
            if (alive == 1 && pending < 0 && (live[0].state == VALUE_DQ || live[0].state == VALUE_SQ)) { \
                /* one scan inside a quoted value (most bytes of tags): on to its quote or a `<` */   \
                const T q = live[0].state == VALUE_DQ ? '"' : '\'';                                  \
                while (i < n && text[i] != q && text[i] != '<') i++;                                \
                if (i == n) break;                                                                  \
            }                                                                                       \
            Py_UCS4 c = text[i];                                                                    \
            if (alive == 1) { /* the usual case: one tag followed */                                \
                int added = 0;                                                                      \
                int t = step(live[0].state, c, &added);                                             \
                if (t == END) {                                                                     \
                    alive = 0;                                                                      \
                } else {                                                                            \
                    live[0].state = t;                                                              \
                    if (added) {                                                                    \
                        Py_ssize_t k = ++live[0].count, at = live[0].start;                         \
                        if (k > most->best || (k == most->best && at < most->best_at)) {            \
                            most->best = k;                                                         \
                            most->best_at = at;                                                     \
                            if (k > stop) return 1;                                                 \
                        }                                                                           \
                    }                                                                               \
                }                                                                                   \
            } else if (alive) {                                                                     \
                int m = 0;                                                                          \
                for (int s = 0; s < STATES; s++) slot[s] = -1;                                      \
                for (int j = 0; j < alive; j++) {                                                   \
                    int added = 0;                                                                  \
                    int t = step(live[j].state, c, &added);                                         \
                    if (t == END) continue;                                                         \
                    Py_ssize_t k = live[j].count + added, at = live[j].start;                       \
                    if (slot[t] < 0) {                                                              \
                        slot[t] = m;                                                                \
                        next[m++] = (Scan){t, k, at};                                               \
                    } else {                                                                        \
                        Scan *o = &next[slot[t]];                                                   \
                        if (k > o->count || (k == o->count && at < o->start)) *o = (Scan){t, k, at}; \
                    }                                                                               \
                    if (added && (k > most->best || (k == most->best && at < most->best_at))) {     \
                        most->best = k;                                                             \
                        most->best_at = at;                                                         \
                        if (k > stop) return 1;                                                     \
                    }                                                                               \
                }                                                                                   \
                memcpy(live, next, sizeof(Scan) * (size_t)m);                                       \
                alive = m;                                                                          \
            }                                                                                       \
            /* a scan begins at the letter after `<` or `</`; its start is the `<` */               \
            Py_ssize_t at = -1;                                                                     \
            if (pending == i) {                                                                     \
                at = i - 1;                                                                         \
                pending = -1;                                                                       \
            } else if (c == '<' && i + 1 < n) {                                                     \
                if (is_alpha(text[i + 1]))                                                          \
                    at = i;                                                                         \
                else if (text[i + 1] == '/' && i + 2 < n && is_alpha(text[i + 2]))                  \
                    pending = i + 1;                                                                \
            }                                                                                       \
            if (at >= 0) {                                                                          \
                int found = 0; /* a scan in TAG_NAME already counts at least 0, from earlier */     \
                for (int j = 0; j < alive; j++) found |= live[j].state == TAG_NAME;                 \
                if (!found) live[alive++] = (Scan){TAG_NAME, 0, at};                                \
            }                                                                                       \
        }                                                                                           \
        return 0;                                                                                   \
    }

SCAN_KIND(scan1, Py_UCS1)
SCAN_KIND(scan2, Py_UCS2)
SCAN_KIND(scan4, Py_UCS4)

/* most_attributes(html, stop) -> (attributes, offset): the most attributes of any element and
 * the first `<` whose tag has that many (-1 without attributes); once some element has more
 * than `stop` it returns at once, with that element's count and `<`. */
static PyObject *most_attributes(PyObject *self, PyObject *args) {
    PyObject *text;
    Py_ssize_t stop;
    if (!PyArg_ParseTuple(args, "Un", &text, &stop)) return NULL;
    const void *data = PyUnicode_DATA(text);
    const Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    Most most = {0, -1};
    switch (PyUnicode_KIND(text)) {
    case PyUnicode_1BYTE_KIND: scan1(data, n, stop, &most); break;
    case PyUnicode_2BYTE_KIND: scan2(data, n, stop, &most); break;
    default: scan4(data, n, stop, &most); break;
    }
    return Py_BuildValue("nn", most.best, most.best_at);
}

static PyMethodDef module_methods[] = {
    {"most_attributes", most_attributes, METH_VARARGS,
     "most_attributes(html, stop) -> (attributes, offset): the most attributes of an element, and where its tag "
     "starts; it stops once over `stop`"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_html", .m_doc = "attributes of HTML elements, counted before parsing",
    .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__html(void) { return PyModule_Create(&module); }
