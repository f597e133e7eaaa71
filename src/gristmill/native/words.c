/* Words of a page: gristmill's word tokenizer, and what the Gopher filters count over the words.
 *
 * The tokenizer is `gristmill.text.words.WORD_TOKEN` (a Python regex: its docstring says what a
 * word is) run as a hand-written scanner: at each position the regex's five alternatives are
 * tried in order, as `re.findall` tries them, and each takes the longest match its greedy
 * quantifiers give:
 *
 *   1. \d+(?:[.,]\d+)+                       numbers with "." or "," inside
 *   2. [ALNUM]+(?:['’\-][ALNUM]+)*           words, joined across ' ’ -
 *   3. [^\s ALNUM IDEOGRAPHIC SYLLABIC ASTRAL]+  runs of punctuation and symbols
 *   4. [IDEOGRAPHIC ASTRAL]                  one Han/kana character, or one beyond U+FFFF
 *   5. [SYLLABIC][MARK]*                     one Thai/Lao/Khmer/Myanmar letter with its marks
 *
 * \d and \s are Python's (str.isdecimal, str.isspace, for every code point, as `re` uses them);
 * ALNUM, IDEOGRAPHIC, SYLLABIC and MARK hold BMP characters only and come from the same class
 * strings the regex is compiled from (`set_tables`, called by words.py at import). The scanner
 * is tested equal to the regex on the sample and on every code point (tests/text/test_words.py).
 *
 * `Words` holds a page's words as numbers (4 bytes per occurrence; the distinct words as str,
 * with their counts), filled from text (the scanner) or from lists of str (ICU's words for the
 * scripts written without spaces), a piece at a time for long pages. It answers:
 *
 *   top_chars(n), repeated_chars(n, n_chars, max_frac): datatrove's n-gram repetition counts
 *     (gristmill/filters/gopher_repetition.py says what they are and why the quirks are kept);
 *     equality is exact: hashes find candidates, then words (" "-joined n-grams: words hold no
 *     spaces) or characters (""-joined ones, where ("ab", "c") equals ("a", "bc")) are compared;
 *   quality_counts(): the Gopher quality filter's word counts (gopher_quality.py);
 *   present(words): how many of these distinct words the page holds (stop words).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BASE 0x9E3779B97F4A7C15ull /* odd: a polynomial hash of code points modulo 2**64 */
#define MIX 0xD6E8FEB86659FD93ull

/* ---- character classes ----------------------------------------------------------------------- */

#define C_ALNUM 1
#define C_IDEO 2
#define C_SYLL 4
#define C_MARK 8
#define C_PUNCT 16 /* datatrove's PUNCTUATION_SET: a word of these only is a "symbol word" */
#define C_DIGIT 32 /* str.isdecimal, \d: kept here for the BMP (a table read, not a call) */
#define C_SPACE 64 /* str.isspace, \s */
#define C_ALPHA 128 /* str.isalpha */

static uint8_t CLASS[65536];
static Py_UCS4 *ASTRAL_PUNCT; /* the set's characters beyond U+FFFF, sorted */
static Py_ssize_t N_ASTRAL_PUNCT;
static int TABLES_SET;

static inline int c_alnum(Py_UCS4 c) { return c < 0x10000 && (CLASS[c] & C_ALNUM); }
static inline int c_ideo(Py_UCS4 c) { return c < 0x10000 && (CLASS[c] & C_IDEO); }
static inline int c_syll(Py_UCS4 c) { return c < 0x10000 && (CLASS[c] & C_SYLL); }
static inline int c_mark(Py_UCS4 c) { return c < 0x10000 && (CLASS[c] & C_MARK); }
static inline int c_space(Py_UCS4 c) { return c < 0x10000 ? CLASS[c] & C_SPACE : Py_UNICODE_ISSPACE(c); }
static inline int c_digit(Py_UCS4 c) { return c < 0x10000 ? CLASS[c] & C_DIGIT : Py_UNICODE_ISDECIMAL(c); }
static inline int c_run(Py_UCS4 c) { /* alternative 3's class */
    return c < 0x10000 && !(CLASS[c] & (C_ALNUM | C_IDEO | C_SYLL | C_SPACE));
}
static inline int c_alpha(Py_UCS4 c) { return c < 0x10000 ? CLASS[c] & C_ALPHA : Py_UNICODE_ISALPHA(c); }
static inline int c_joiner(Py_UCS4 c) { return c == '\'' || c == 0x2019 || c == '-'; }

static int c_punct(Py_UCS4 c) {
    if (c < 0x10000) return CLASS[c] & C_PUNCT;
    Py_ssize_t lo = 0, hi = N_ASTRAL_PUNCT;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (ASTRAL_PUNCT[mid] < c) lo = mid + 1;
        else hi = mid;
    }
    return lo < N_ASTRAL_PUNCT && ASTRAL_PUNCT[lo] == c;
}

static int cmp_ucs4(const void *a, const void *b) {
    Py_UCS4 x = *(const Py_UCS4 *)a, y = *(const Py_UCS4 *)b;
    return x < y ? -1 : x > y;
}

/* set_tables(classes, punctuation): classes, 65536 bytes, one per BMP code point, of bits
 * ALNUM 1, IDEOGRAPHIC 2, SYLLABIC 4, MARK 8; punctuation, a str of PUNCTUATION_SET's characters. */
static PyObject *set_tables(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer classes;
    PyObject *punct;
    if (!PyArg_ParseTuple(args, "y*U", &classes, &punct)) return NULL;
    if (classes.len != 65536) {
        PyBuffer_Release(&classes);
        PyErr_SetString(PyExc_ValueError, "set_tables: expected 65536 class bytes");
        return NULL;
    }
    memcpy(CLASS, classes.buf, 65536);
    PyBuffer_Release(&classes);
    for (int c = 0; c < 65536; c++) {
        CLASS[c] &= (uint8_t)(C_ALNUM | C_IDEO | C_SYLL | C_MARK);
        if (Py_UNICODE_ISDECIMAL((Py_UCS4)c)) CLASS[c] |= C_DIGIT;
        if (Py_UNICODE_ISSPACE((Py_UCS4)c)) CLASS[c] |= C_SPACE;
        if (Py_UNICODE_ISALPHA((Py_UCS4)c)) CLASS[c] |= C_ALPHA;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(punct);
    Py_UCS4 *astral = malloc(sizeof(Py_UCS4) * (n ? n : 1));
    if (!astral) return PyErr_NoMemory();
    Py_ssize_t na = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ_CHAR(punct, i);
        if (c < 0x10000) CLASS[c] |= C_PUNCT;
        else astral[na++] = c;
    }
    qsort(astral, (size_t)na, sizeof(Py_UCS4), cmp_ucs4);
    free(ASTRAL_PUNCT);
    ASTRAL_PUNCT = astral;
    N_ASTRAL_PUNCT = na;
    TABLES_SET = 1;
    Py_RETURN_NONE;
}

/* The end of the token starting at i (WORD_TOKEN at position i), or i when none starts there
 * (whitespace). One copy per str kind (1, 2 or 4 bytes a character), so a character is an
 * array read. */
#define TOKEN_END(NAME, T)                                                                   \
    static Py_ssize_t NAME(const T *d, Py_ssize_t i, Py_ssize_t n) {                         \
        Py_UCS4 c = d[i];                                                                    \
        if (c_digit(c)) { /* 1 */                                                            \
            Py_ssize_t j = i + 1;                                                            \
            while (j < n && c_digit(d[j])) j++;                                              \
            Py_ssize_t k = j;                                                                \
            while (k + 1 < n && (d[k] == '.' || d[k] == ',') && c_digit(d[k + 1])) {         \
                k += 2;                                                                      \
                while (k < n && c_digit(d[k])) k++;                                          \
            }                                                                                \
            if (k > j) return k;                                                             \
        }                                                                                    \
        if (c_alnum(c)) { /* 2 */                                                            \
            Py_ssize_t j = i + 1;                                                            \
            while (j < n && c_alnum(d[j])) j++;                                              \
            while (j + 1 < n && c_joiner(d[j]) && c_alnum(d[j + 1])) {                       \
                j += 2;                                                                      \
                while (j < n && c_alnum(d[j])) j++;                                          \
            }                                                                                \
            return j;                                                                        \
        }                                                                                    \
        if (c_run(c)) { /* 3 */                                                              \
            Py_ssize_t j = i + 1;                                                            \
            while (j < n && c_run(d[j])) j++;                                                \
            return j;                                                                        \
        }                                                                                    \
        if (c >= 0x10000 || c_ideo(c)) return i + 1; /* 4 */                                 \
        if (c_syll(c)) {                             /* 5 */                                 \
            Py_ssize_t j = i + 1;                                                            \
            while (j < n && c_mark(d[j])) j++;                                               \
            return j;                                                                        \
        }                                                                                    \
        return i; /* whitespace: no token */                                                 \
    }
TOKEN_END(token_end_1, Py_UCS1)
TOKEN_END(token_end_2, Py_UCS2)
TOKEN_END(token_end_4, Py_UCS4)

static Py_ssize_t token_end(int kind, const void *d, Py_ssize_t i, Py_ssize_t n) {
    switch (kind) {
    case PyUnicode_1BYTE_KIND:
        return token_end_1(d, i, n);
    case PyUnicode_2BYTE_KIND:
        return token_end_2(d, i, n);
    default:
        return token_end_4(d, i, n);
    }
}

static int need_tables(void) {
    if (!TABLES_SET) {
        PyErr_SetString(PyExc_RuntimeError, "gristmill.native._words: set_tables() was not called");
        return -1;
    }
    return 0;
}

static int bounds(PyObject *text, Py_ssize_t *start, Py_ssize_t *end) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    if (*start < 0) *start = 0;
    if (*end < 0 || *end > n) *end = n;
    if (*start > *end) *start = *end;
    return 0;
}

/* tokenize(text, start=0, end=len(text)) -> list[str]: WORD_TOKEN.findall(text, start, end). */
static PyObject *tokenize(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *text;
    Py_ssize_t start = 0, end = -1;
    if (!PyArg_ParseTuple(args, "U|nn", &text, &start, &end)) return NULL;
    if (need_tables() < 0) return NULL;
    bounds(text, &start, &end);
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    Py_ssize_t i = start;
    while (i < end) {
        Py_ssize_t j = token_end(kind, d, i, end);
        if (j == i) {
            i++;
            continue;
        }
        PyObject *w = PyUnicode_Substring(text, i, j);
        if (!w || PyList_Append(out, w) < 0) {
            Py_XDECREF(w);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(w);
        i = j;
    }
    return out;
}

/* spaced_word_counts(text) -> (words, words holding a letter): of text.split()'s words, counted
 * without making them (Gopher's letter-share rule over whitespace words). */
static PyObject *spaced_word_counts(PyObject *Py_UNUSED(module), PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "spaced_word_counts: expected str, got %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    long long words = 0, lettered = 0;
    int in_word = 0, letter = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, i);
        if (Py_UNICODE_ISSPACE(c)) {
            if (in_word) {
                words++;
                lettered += letter;
            }
            in_word = letter = 0;
        } else {
            in_word = 1;
            if (!letter && Py_UNICODE_ISALPHA(c)) letter = 1;
        }
    }
    if (in_word) {
        words++;
        lettered += letter;
    }
    return Py_BuildValue("(LL)", words, lettered);
}

/* ---- helpers ---------------------------------------------------------------------------------- */

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

/* chars [a, a + n) of (ka, da) equal chars [b, b + n) of (kb, db) */
static int same_chars(int ka, const void *da, Py_ssize_t a, int kb, const void *db, Py_ssize_t b, Py_ssize_t n) {
    if (ka == kb) return memcmp((const char *)da + a * ka, (const char *)db + b * kb, (size_t)n * ka) == 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_READ(ka, da, a + i) != PyUnicode_READ(kb, db, b + i)) return 0;
    return 1;
}

/* sum of (c_k + 1) * BASE**(n-1-k) over text[a:b] (a loop per str kind) */
static uint64_t hash_chars(int kind, const void *d, Py_ssize_t a, Py_ssize_t b) {
    uint64_t h = 0;
    switch (kind) {
    case PyUnicode_1BYTE_KIND:
        for (Py_ssize_t i = a; i < b; i++) h = h * BASE + (uint64_t)((const Py_UCS1 *)d)[i] + 1;
        break;
    case PyUnicode_2BYTE_KIND:
        for (Py_ssize_t i = a; i < b; i++) h = h * BASE + (uint64_t)((const Py_UCS2 *)d)[i] + 1;
        break;
    default:
        for (Py_ssize_t i = a; i < b; i++) h = h * BASE + (uint64_t)((const Py_UCS4 *)d)[i] + 1;
    }
    return h;
}

/* line_counts(text) -> (lines, bullet lines, ellipsis lines): of text.splitlines(), the lines
 * that start with "•" or "-" once stripped of leading whitespace, and those that end with "..."
 * or "…" once stripped of trailing whitespace (the Gopher quality filter's line rules). */
static int is_linebreak(Py_UCS4 c) {
    return c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || c == 0x1c || c == 0x1d || c == 0x1e || c == 0x85 ||
           c == 0x2028 || c == 0x2029;
}

static PyObject *line_counts(PyObject *Py_UNUSED(module), PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "line_counts: expected str, got %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    long long lines = 0, bullets = 0, ellipses = 0;
    Py_ssize_t i = 0;
    while (i < n) { /* str.splitlines: a line ends at a line break ("\r\n" is one); no empty last line */
        Py_ssize_t a = i;
        while (i < n && !is_linebreak(PyUnicode_READ(kind, d, i))) i++;
        Py_ssize_t b = i;
        if (i < n) {
            if (PyUnicode_READ(kind, d, i) == '\r' && i + 1 < n && PyUnicode_READ(kind, d, i + 1) == '\n') i++;
            i++;
        }
        lines++;
        Py_ssize_t s = a, e = b;
        while (s < e && c_space(PyUnicode_READ(kind, d, s))) s++;
        while (e > s && c_space(PyUnicode_READ(kind, d, e - 1))) e--;
        if (s < e) {
            Py_UCS4 first = PyUnicode_READ(kind, d, s), last = PyUnicode_READ(kind, d, e - 1);
            bullets += first == 0x2022 || first == '-';
            ellipses += last == 0x2026 || (last == '.' && e - s >= 3 && PyUnicode_READ(kind, d, e - 2) == '.' &&
                                           PyUnicode_READ(kind, d, e - 3) == '.');
        }
    }
    return Py_BuildValue("(LLL)", lines, bullets, ellipses);
}

/* duplicate_parts(text, paragraphs) -> (parts, repeated parts, their characters): datatrove's
 * find_duplicates over the text's paragraphs (text.strip() split at runs of 2+ newlines; if
 * paragraphs) or lines (re.split("\n+", text)), without making them: parts are compared in
 * place (a hash, then their characters). */
typedef struct {
    uint64_t hash;
    Py_ssize_t start; /* -1: empty slot */
    Py_ssize_t len;
} Part;

typedef struct {
    Part *slots;
    uint64_t mask, used;
    long long parts, dups, dup_chars;
} PartSet;

static int part_add(PartSet *set, int kind, const void *d, Py_ssize_t a, Py_ssize_t b) {
    set->parts++;
    uint64_t h = hash_chars(kind, d, a, b) ^ (uint64_t)(b - a);
    if (2 * (set->used + 1) > set->mask + 1) {
        uint64_t cap = 2 * (set->mask + 1);
        Part *t = malloc(cap * sizeof(Part));
        if (!t) {
            PyErr_NoMemory();
            return -1;
        }
        for (uint64_t i = 0; i < cap; i++) t[i].start = -1;
        for (uint64_t i = 0; i <= set->mask; i++) {
            if (set->slots[i].start < 0) continue;
            uint64_t j = mix(set->slots[i].hash) & (cap - 1);
            while (t[j].start >= 0) j = (j + 1) & (cap - 1);
            t[j] = set->slots[i];
        }
        free(set->slots);
        set->slots = t;
        set->mask = cap - 1;
    }
    uint64_t i = mix(h) & set->mask;
    while (set->slots[i].start >= 0) {
        Part *p = &set->slots[i];
        if (p->hash == h && p->len == b - a && same_chars(kind, d, p->start, kind, d, a, b - a)) {
            set->dups++;
            set->dup_chars += b - a;
            return 0;
        }
        i = (i + 1) & set->mask;
    }
    set->slots[i] = (Part){h, a, b - a};
    set->used++;
    return 0;
}

static PyObject *duplicate_parts(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *text;
    int paragraphs;
    if (!PyArg_ParseTuple(args, "Up", &text, &paragraphs)) return NULL;
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    PartSet set = {malloc(64 * sizeof(Part)), 63, 0, 0, 0, 0};
    if (!set.slots) return PyErr_NoMemory();
    for (int i = 0; i < 64; i++) set.slots[i].start = -1;
    int rc = 0;
    if (paragraphs) { /* text.strip(), then the pieces between runs of two or more "\n" */
        Py_ssize_t a = 0, e = n;
        while (a < e && c_space(PyUnicode_READ(kind, d, a))) a++;
        while (e > a && c_space(PyUnicode_READ(kind, d, e - 1))) e--;
        Py_ssize_t i = a;
        while (rc == 0) {
            Py_ssize_t j = i;
            while (j < e && !(PyUnicode_READ(kind, d, j) == '\n' && j + 1 < e && PyUnicode_READ(kind, d, j + 1) == '\n'))
                j++;
            rc = part_add(&set, kind, d, i, j);
            if (j >= e) break;
            while (j < e && PyUnicode_READ(kind, d, j) == '\n') j++;
            i = j;
        }
    } else { /* text.split("\n"), the empty pieces dropped but the first and the last */
        Py_ssize_t i = 0;
        for (int first = 1; rc == 0; first = 0) {
            Py_ssize_t j = i;
            while (j < n && PyUnicode_READ(kind, d, j) != '\n') j++;
            if (j >= n) { /* the last piece */
                rc = part_add(&set, kind, d, i, n);
                break;
            }
            if (first || j > i) rc = part_add(&set, kind, d, i, j);
            i = j + 1;
        }
    }
    free(set.slots);
    if (rc < 0) return NULL;
    return Py_BuildValue("(LLL)", set.parts, set.dups, set.dup_chars);
}

/* utf8_length(text) -> len(text.encode("utf-8", "surrogatepass")), without encoding it. */
static PyObject *utf8_length(PyObject *Py_UNUSED(module), PyObject *text) {
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "utf8_length: expected str, got %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), bytes = n;
    if (PyUnicode_IS_ASCII(text)) return PyLong_FromSsize_t(n);
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = d;
        for (Py_ssize_t i = 0; i < n; i++) bytes += s[i] >= 0x80;
    } else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *s = d;
        for (Py_ssize_t i = 0; i < n; i++) bytes += (s[i] >= 0x80) + (s[i] >= 0x800);
    } else {
        const Py_UCS4 *s = d;
        for (Py_ssize_t i = 0; i < n; i++) bytes += (s[i] >= 0x80) + (s[i] >= 0x800) + (s[i] >= 0x10000);
    }
    return PyLong_FromSsize_t(bytes);
}

/* ---- a page's words -------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    /* distinct words */
    PyObject **word;  /* each as a str (a new reference) */
    int64_t *len;     /* characters */
    uint64_t *hash;   /* sum of (c_k + 1) * BASE**(len-1-k) */
    uint64_t *fwd;    /* sum of (c_k + 1) * BASE**k: read forwards, for the page's prefix sums */
    uint64_t *power;  /* BASE**len */
    uint64_t *inv;    /* BASE**-len (modulo 2**64: BASE is odd, so it has an inverse) */
    int64_t *freq;    /* occurrences */
    uint8_t *flags;   /* F_ALPHA: holds a letter; F_SYMBOL: all PUNCTUATION_SET */
    uint64_t distinct, distinct_cap;
    int32_t *table;   /* open addressing over the distinct words, -1 = empty */
    uint64_t table_cap;
    /* the page: one id per word */
    int32_t *ids;
    uint64_t count, ids_cap;
    int64_t chars;
    /* for the n-gram rules, made when the first runs (`prefixes`): over the page's characters,
     * F[i] = sum of (c_p + 1) * BASE**p before word i, Rinv[i] = BASE**-p at word i, C[i] = p
     * there; the ""-joined n words at i hash to (F[i+n] - F[i]) * Rinv[i] wherever they are */
    uint64_t *F, *Rinv;
    int64_t *C;
    uint64_t prefixed; /* words the prefixes cover */
    struct Gram *grams; /* a rule's table, kept for the next rule */
    uint64_t grams_cap;
    uint32_t *counts; /* top_chars: occurrences of the n-gram first seen at each position */
    uint64_t counts_cap;
} Words;

#define F_ALPHA 1
#define F_SYMBOL 2

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

static int grow_distinct(Words *self) {
    uint64_t need = self->distinct + 1;
    if (need <= self->distinct_cap) return 0;
    uint64_t cap = self->distinct_cap ? 2 * self->distinct_cap : 256;
#define RE(field, type)                                       \
    do {                                                      \
        void *p = realloc(self->field, cap * sizeof(type));   \
        if (!p) {                                             \
            PyErr_NoMemory();                                 \
            return -1;                                        \
        }                                                     \
        self->field = p;                                      \
    } while (0)
    RE(word, PyObject *);
    RE(len, int64_t);
    RE(hash, uint64_t);
    RE(fwd, uint64_t);
    RE(power, uint64_t);
    RE(inv, uint64_t);
    RE(freq, int64_t);
    RE(flags, uint8_t);
#undef RE
    self->distinct_cap = cap;
    return 0;
}

/* The id of the word text[a:b] (one occurrence more), a new id if it is new. `owner` is a str
 * equal to that word if the caller has one (else it is made from `text` when new). */
static int64_t add_word(Words *self, PyObject *text, int kind, const void *d, Py_ssize_t a, Py_ssize_t b,
                        PyObject *owner) {
    Py_ssize_t n = b - a;
    uint64_t h = hash_chars(kind, d, a, b);
    if (2 * (self->distinct + 1) > self->table_cap && rehash(self, self->table_cap ? 2 * self->table_cap : 1024) < 0)
        return -1;
    uint64_t mask = self->table_cap - 1, i = mix(h ^ (uint64_t)n) & mask;
    while (self->table[i] != -1) {
        int32_t id = self->table[i];
        if (self->hash[id] == h && self->len[id] == n) {
            PyObject *w = self->word[id];
            if (same_chars(PyUnicode_KIND(w), PyUnicode_DATA(w), 0, kind, d, a, n)) {
                self->freq[id]++;
                return id;
            }
        }
        i = (i + 1) & mask;
    }
    if (self->distinct >= INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**31 distinct words on one page");
        return -1;
    }
    if (grow_distinct(self) < 0) return -1;
    PyObject *w = owner;
    if (w) Py_INCREF(w);
    else if (!(w = PyUnicode_Substring(text, a, b))) return -1;
    uint8_t flags = F_SYMBOL;
    uint64_t f = 0, p = 1;
    for (Py_ssize_t k = a; k < b; k++) {
        Py_UCS4 c = PyUnicode_READ(kind, d, k);
        if (c_alpha(c)) flags |= F_ALPHA;
        if (!c_punct(c)) flags &= (uint8_t)~F_SYMBOL;
        f += ((uint64_t)c + 1) * p;
        p *= BASE;
    }
    uint64_t inv = p; /* Newton's iteration: correct to 3 bits, then 6, 12, 24, 48, 96 */
    for (int k = 0; k < 5; k++) inv *= 2 - p * inv;
    uint64_t id = self->distinct++;
    self->word[id] = w;
    self->len[id] = n;
    self->hash[id] = h;
    self->fwd[id] = f;
    self->power[id] = p;
    self->inv[id] = inv;
    self->freq[id] = 1;
    self->flags[id] = flags;
    self->table[i] = (int32_t)id;
    return (int64_t)id;
}

static int append_id(Words *self, int64_t id) {
    if (self->count == self->ids_cap && grow((void **)&self->ids, &self->ids_cap, self->count + 1, 4) < 0) return -1;
    self->ids[self->count++] = (int32_t)id;
    self->chars += self->len[id];
    return 0;
}

/* add(words): appends a list of str, the page's next words. */
static PyObject *Words_add(Words *self, PyObject *words) {
    if (need_tables() < 0) return NULL;
    PyObject *seq = PySequence_Fast(words, "Words.add: expected a list of str");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *w = PySequence_Fast_GET_ITEM(seq, k);
        if (!PyUnicode_Check(w)) {
            PyErr_Format(PyExc_TypeError, "Words.add: expected str, got %.100s", Py_TYPE(w)->tp_name);
            goto fail;
        }
        int64_t id = add_word(self, w, PyUnicode_KIND(w), PyUnicode_DATA(w), 0, PyUnicode_GET_LENGTH(w), w);
        if (id < 0 || append_id(self, id) < 0) goto fail;
    }
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq);
    return NULL;
}

/* add_text(text, start=0, end=len(text)): appends the words the tokenizer finds there. */
static PyObject *Words_add_text(Words *self, PyObject *args) {
    PyObject *text;
    Py_ssize_t start = 0, end = -1;
    if (!PyArg_ParseTuple(args, "U|nn", &text, &start, &end)) return NULL;
    if (need_tables() < 0) return NULL;
    bounds(text, &start, &end);
    int kind = PyUnicode_KIND(text);
    const void *d = PyUnicode_DATA(text);
    /* room for what a page of this length usually holds (web text: a word per ~5 characters, a
     * new one per ~13), so the arrays and the table do not grow word by word */
    uint64_t expect = (uint64_t)(end - start) / 4 + 16;
    if (grow((void **)&self->ids, &self->ids_cap, self->count + expect, sizeof(int32_t)) < 0) return NULL;
    uint64_t table = self->table_cap ? self->table_cap : 1024;
    while (table < 2 * (self->distinct + expect / 3)) table *= 2;
    if (table > self->table_cap && rehash(self, table) < 0) return NULL;
    Py_ssize_t i = start;
    while (i < end) {
        Py_ssize_t j = token_end(kind, d, i, end);
        if (j == i) {
            i++;
            continue;
        }
        int64_t id = add_word(self, text, kind, d, i, j, NULL);
        if (id < 0 || append_id(self, id) < 0) return NULL;
        i = j;
    }
    Py_RETURN_NONE;
}

/* A rule's table of n-grams: (the hash's high 32 bits, the n-gram's first position + 1);
 * position 0 = empty. 8 bytes a slot so that a page's table stays in the CPU's first caches
 * (the probes' misses were most of the rules' time); a match of the 32 bits is checked against
 * the words, so other n-grams that share them are only probed past. */
typedef struct Gram {
    uint32_t frag;
    uint32_t pos1;
} Gram;

/* The page's prefix sums (see Words), extended over words added since the last rule. */
static int prefixes(Words *self) {
    uint64_t n = self->count;
    if (self->prefixed == n && self->F) return 0;
    uint64_t *F = realloc(self->F, (n + 1) * sizeof(uint64_t));
    if (F) self->F = F;
    uint64_t *R = realloc(self->Rinv, (n + 1) * sizeof(uint64_t));
    if (R) self->Rinv = R;
    int64_t *C = realloc(self->C, (n + 1) * sizeof(int64_t));
    if (C) self->C = C;
    if (!F || !R || !C) {
        PyErr_NoMemory();
        return -1;
    }
    uint64_t i = self->prefixed;
    uint64_t pw = 1; /* BASE**C[i] */
    if (i == 0) {
        F[0] = 0;
        R[0] = 1;
        C[0] = 0;
    } else {
        /* BASE**p from BASE**-p: the inverse of an odd number, by Newton's iteration */
        uint64_t r = R[i];
        pw = r;
        for (int k = 0; k < 5; k++) pw *= 2 - r * pw;
    }
    for (; i < n; i++) {
        int32_t id = self->ids[i];
        F[i + 1] = F[i] + pw * self->fwd[id];
        pw *= self->power[id];
        R[i + 1] = R[i] * self->inv[id];
        C[i + 1] = C[i] + self->len[id];
    }
    self->prefixed = n;
    return 0;
}

/* The kept table, emptied and large enough for `grams` n-grams at most half full. */
static Gram *gram_table(Words *self, uint64_t grams, uint64_t *mask) {
    uint64_t cap = 16;
    while (cap < 2 * grams) cap *= 2;
    if (cap > self->grams_cap) {
        free(self->grams);
    free(self->counts);
        self->grams = malloc(cap * sizeof(Gram));
        self->grams_cap = self->grams ? cap : 0;
        if (!self->grams) {
            PyErr_NoMemory();
            return NULL;
        }
    }
    memset(self->grams, 0, cap * sizeof(Gram));
    *mask = cap - 1;
    return self->grams;
}

static int same_words(const int32_t *ids, uint64_t a, uint64_t b, long n) {
    for (long k = 0; k < n; k++)
        if (ids[a + k] != ids[b + k]) return 0;
    return 1;
}

/* The n words at a and at b, each joined without spaces, are the same string. */
static int same_joined(const Words *self, uint64_t a, uint64_t b, long n) {
    if (same_words(self->ids, a, b, n)) return 1;
    int64_t la = 0, lb = 0;
    for (long k = 0; k < n; k++) {
        la += self->len[self->ids[a + k]];
        lb += self->len[self->ids[b + k]];
    }
    if (la != lb) return 0;
    uint64_t wa = a, wb = b; /* walk both sequences a character at a time */
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

static int gram_count(const Words *self, long n, uint64_t *grams) {
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 1");
        return -1;
    }
    *grams = self->count >= (uint64_t)n ? self->count - (uint64_t)n + 1 : 0;
    if (*grams > UINT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "more than 2**32 n-grams on one page");
        return -1;
    }
    return 0;
}

/* top_chars(n): characters of the most common " "-joined n-gram times its count; None below n words. */
static PyObject *Words_top_chars(Words *self, PyObject *arg) {
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    uint64_t grams, mask;
    if (gram_count(self, n, &grams) < 0) return NULL;
    if (!grams) Py_RETURN_NONE;
    if (prefixes(self) < 0) return NULL;
    Gram *t = gram_table(self, grams, &mask);
    if (!t || grow((void **)&self->counts, &self->counts_cap, grams, sizeof(uint32_t)) < 0) return NULL;
    uint32_t *counts = self->counts;
    const int32_t *ids = self->ids;
    const uint64_t *F = self->F, *R = self->Rinv;
    uint32_t best_count = 0, best_pos = 0;
    for (uint64_t i = 0; i < grams; i++) {
        /* the ""-joined words' hash: equal words join equal; words that only join equal (("ab",
         * "c") and ("a", "bc")) are told apart by same_words, as " " would tell them apart */
        uint64_t h = (F[i + n] - F[i]) * R[i];
        uint32_t frag = (uint32_t)(h >> 32);
        uint64_t s = mix(h) & mask;
        while (t[s].pos1 && !(t[s].frag == frag && same_words(ids, t[s].pos1 - 1, i, n))) s = (s + 1) & mask;
        if (!t[s].pos1) {
            t[s].frag = frag;
            t[s].pos1 = (uint32_t)i + 1;
            counts[i] = 0;
        }
        uint32_t first = t[s].pos1 - 1, c = ++counts[first];
        /* Counter.most_common(1): the highest count, the first inserted among equal ones */
        if (c > best_count || (c == best_count && first < best_pos)) {
            best_count = c;
            best_pos = first;
        }
    }
    int64_t chars = n - 1 + self->C[best_pos + n] - self->C[best_pos]; /* with the spaces */
    return PyLong_FromLongLong(chars * (int64_t)best_count);
}

/* repeated_chars(n, n_chars, max_frac): datatrove's find_all_duplicate(words, n), stopping once
 * count / n_chars > max_frac. */
static PyObject *Words_repeated_chars(Words *self, PyObject *args) {
    long n;
    long long n_chars;
    double max_frac;
    if (!PyArg_ParseTuple(args, "lLd", &n, &n_chars, &max_frac)) return NULL;
    uint64_t grams, mask;
    if (gram_count(self, n, &grams) < 0) return NULL;
    if (!grams) return PyLong_FromLong(0);
    if (prefixes(self) < 0) return NULL;
    Gram *t = gram_table(self, grams, &mask);
    if (!t) return NULL;
    const uint64_t *F = self->F, *R = self->Rinv;
    const int64_t *C = self->C;
    int64_t total = 0;
    uint64_t i = 0;
    while (i < grams) {
        uint64_t h = (F[i + n] - F[i]) * R[i];
        uint32_t frag = (uint32_t)(h >> 32);
        uint64_t s = mix(h) & mask;
        int seen = 0;
        while (t[s].pos1) {
            if (t[s].frag == frag && same_joined(self, t[s].pos1 - 1, i, n)) {
                seen = 1;
                break;
            }
            s = (s + 1) & mask;
        }
        if (seen) {
            total += C[i + n] - C[i];
            i += (uint64_t)n;
            if (n_chars > 0 && (double)total / (double)n_chars > max_frac) break;
        } else {
            t[s].frag = frag;
            t[s].pos1 = (uint32_t)i + 1;
            i++;
        }
    }
    return PyLong_FromLongLong(total);
}

/* quality_counts() -> (words, content words, their characters, words holding a letter): the
 * Gopher quality filter's counts. A content word holds a character outside PUNCTUATION_SET. */
static PyObject *Words_quality_counts(Words *self, PyObject *Py_UNUSED(ignored)) {
    int64_t content = 0, content_chars = 0, alpha = 0;
    for (uint64_t id = 0; id < self->distinct; id++) {
        int64_t f = self->freq[id];
        if (!(self->flags[id] & F_SYMBOL)) {
            content += f;
            content_chars += f * self->len[id];
        }
        if (self->flags[id] & F_ALPHA) alpha += f;
    }
    return Py_BuildValue("(KLLL)", (unsigned long long)self->count, (long long)content, (long long)content_chars,
                         (long long)alpha);
}

/* present(words) -> how many of these (distinct) words occur on the page. */
static PyObject *Words_present(Words *self, PyObject *words) {
    PyObject *it = PyObject_GetIter(words);
    if (!it) return NULL;
    long long found = 0;
    PyObject *w;
    while ((w = PyIter_Next(it))) {
        if (!PyUnicode_Check(w)) {
            PyErr_Format(PyExc_TypeError, "Words.present: expected str, got %.100s", Py_TYPE(w)->tp_name);
            Py_DECREF(w);
            Py_DECREF(it);
            return NULL;
        }
        if (self->table_cap) {
            int kind = PyUnicode_KIND(w);
            const void *d = PyUnicode_DATA(w);
            Py_ssize_t n = PyUnicode_GET_LENGTH(w);
            uint64_t h = 0;
            for (Py_ssize_t i = 0; i < n; i++) h = h * BASE + (uint64_t)PyUnicode_READ(kind, d, i) + 1;
            uint64_t mask = self->table_cap - 1, i = mix(h ^ (uint64_t)n) & mask;
            while (self->table[i] != -1) {
                int32_t id = self->table[i];
                PyObject *x = self->word[id];
                if (self->hash[id] == h && self->len[id] == n &&
                    same_chars(PyUnicode_KIND(x), PyUnicode_DATA(x), 0, kind, d, 0, n)) {
                    found++;
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        Py_DECREF(w);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(found);
}

/* words() -> list[str]: the page's words in order (for callers that need the list). */
static PyObject *Words_words(Words *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *out = PyList_New((Py_ssize_t)self->count);
    if (!out) return NULL;
    for (uint64_t i = 0; i < self->count; i++) {
        PyObject *w = self->word[self->ids[i]];
        Py_INCREF(w);
        PyList_SET_ITEM(out, (Py_ssize_t)i, w);
    }
    return out;
}

static PyObject *Words_count(Words *self, void *Py_UNUSED(closure)) { return PyLong_FromUnsignedLongLong(self->count); }

static PyObject *Words_distinct(Words *self, void *Py_UNUSED(closure)) {
    return PyLong_FromUnsignedLongLong(self->distinct);
}

static PyObject *Words_chars(Words *self, void *Py_UNUSED(closure)) { return PyLong_FromLongLong(self->chars); }

static void Words_dealloc(Words *self) {
    for (uint64_t i = 0; i < self->distinct; i++) Py_DECREF(self->word[i]);
    free(self->word);
    free(self->len);
    free(self->hash);
    free(self->fwd);
    free(self->power);
    free(self->inv);
    free(self->F);
    free(self->Rinv);
    free(self->C);
    free(self->grams);
    free(self->freq);
    free(self->flags);
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
    {"add_text", (PyCFunction)Words_add_text, METH_VARARGS,
     "add_text(text, start=0, end=len(text)): the page's next words, as the tokenizer finds them in the text"},
    {"top_chars", (PyCFunction)Words_top_chars, METH_O,
     "top_chars(n): characters of the most common ' '-joined n-gram times its count; None below n words"},
    {"repeated_chars", (PyCFunction)Words_repeated_chars, METH_VARARGS,
     "repeated_chars(n, n_chars, max_frac): datatrove's find_all_duplicate, stopping once count / n_chars > "
     "max_frac"},
    {"quality_counts", (PyCFunction)Words_quality_counts, METH_NOARGS,
     "quality_counts() -> (words, content words, their characters, words holding a letter)"},
    {"present", (PyCFunction)Words_present, METH_O, "present(words): how many of these distinct words occur"},
    {"words", (PyCFunction)Words_words, METH_NOARGS, "words(): the page's words in order, as a list"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Words_getset[] = {
    {"count", (getter)Words_count, NULL, "words added", NULL},
    {"distinct", (getter)Words_distinct, NULL, "distinct words", NULL},
    {"chars", (getter)Words_chars, NULL, "characters of the words added", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gristmill.native._words.Words",
    .tp_basicsize = sizeof(Words),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A page's words as numbers, and what the Gopher filters count over them",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Words_init,
    .tp_dealloc = (destructor)Words_dealloc,
    .tp_methods = Words_methods,
    .tp_getset = Words_getset,
};

static PyMethodDef module_methods[] = {
    {"set_tables", set_tables, METH_VARARGS, "set_tables(classes, punctuation): the tokenizer's character classes"},
    {"tokenize", tokenize, METH_VARARGS, "tokenize(text, start=0, end=len(text)) -> WORD_TOKEN.findall(text, ...)"},
    {"line_counts", line_counts, METH_O, "line_counts(text) -> (lines, bullet lines, ellipsis lines)"},
    {"duplicate_parts", duplicate_parts, METH_VARARGS,
     "duplicate_parts(text, paragraphs) -> (parts, repeated parts, their characters)"},
    {"utf8_length", utf8_length, METH_O, "utf8_length(text) -> len(text.encode('utf-8', 'surrogatepass'))"},
    {"spaced_word_counts", spaced_word_counts, METH_O,
     "spaced_word_counts(text) -> (len(text.split()), how many of those words hold a letter)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_words", .m_doc = "gristmill's word tokenizer and the Gopher counts",
    .m_size = -1, .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__words(void) {
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
