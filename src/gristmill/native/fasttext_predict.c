/* fastText's supervised prediction, number for number, without its per-word string work.
 *
 * What fastText (0.9.x, and the fasttext-community build gristmill pins) does for `predict` on
 * one line, replicated here step by step so that every label and every probability is the same
 * float, bit for bit (tests/filters/test_fasttext_native.py checks it against the fasttext
 * module on the real sample and on generated text):
 *
 *   1. split the UTF-8 bytes at ' ' '\r' '\t' '\v' '\f' '\0' (and '\n', which gristmill's
 *      callers replace with a space before fastText sees the text), then end with the EOS word
 *      "</s>"; a word "</s>" inside the text ends the line there;
 *   2. each word gives its input rows: its own row if it is in the dictionary, then the rows of
 *      its character n-grams ("<word>", minn..maxn UTF-8 characters, FNV-1a hashed into
 *      `bucket`, kept only if the pruned model kept them); a word spelled like a label gives none;
 *      word n-grams (wordNgrams > 1) are appended after all words, from the words' hashes;
 *   3. hidden = the mean of those rows (float sums in row order, then one multiply);
 *   4. the loss predicts: hierarchical softmax walks its Huffman tree (depth first, pruned by
 *      the best leaf so far); softmax, one-vs-all and negative sampling score every label.
 *
 * What is faster: the rows of a word are a pure function of its bytes, so they are computed
 * once and kept in a cache (an open-addressing table keyed by the word's own FNV hash, which
 * step 2 needs anyway); fastText builds a std::string per character n-gram of every word and
 * looks each up in a hash map, for every occurrence. The sums keep fastText's order exactly
 * (no per-word partial sums: float addition is not associative), and the arithmetic is plain
 * float adds and multiplies, compiled without contraction (-ffp-contract=off), as fastText's
 * own build (no FMA instructions in it) does them. exp and log are libm's, as fastText's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_HS 1
#define LOSS_NS 2
#define LOSS_SOFTMAX 3
#define LOSS_OVA 4

#define TYPE_WORD 0
#define TYPE_LABEL 1

#define SIGMOID_TABLE_SIZE 512
#define MAX_SIGMOID 8
#define MAX_NGRAM_BYTES 4096 /* "<word>" longer than this: its n-grams are computed without the cache */

/* ---- the cache of each word's input rows ------------------------------------------------------ */

typedef struct {
    uint32_t hash;  /* fastText's hash of the word */
    uint32_t klen;  /* word length in bytes; 0 = empty slot (words are never empty) */
    uint32_t koff;  /* the word's bytes in `keys` (the cache's budget keeps the arenas < 4 GB) */
    uint32_t roff;  /* its rows in `rows` */
    uint16_t nrows; /* a word with more rows is not kept */
    uint8_t type;   /* TYPE_WORD or TYPE_LABEL */
} Slot;

/* A fixed budget, split once: a quarter for the table (kept at most half full), a quarter for the
 * words' bytes, half for their rows. Each part is allocated whole at the start; when one is full
 * the cache is emptied and fills again (what it holds never changes a result, only the time). */
typedef struct {
    Slot *slots;
    uint64_t cap; /* slots, a power of two */
    uint64_t used;
    char *keys;
    uint64_t keys_len, keys_max;
    int32_t *rows;
    uint64_t rows_len, rows_max;
} Cache;

typedef struct Token {
    const char *word;
    size_t len;
    uint32_t hash; /* fastText's hash of the word */
} Token;

typedef struct {
    PyObject_HEAD
    int32_t dim, minn, maxn, word_ngrams, bucket, loss, nwords, nlabels, size;
    int64_t prune_size;
    /* the dictionary: words (bytes), their types, an open-addressing table by fastText's hash */
    char *dict_bytes;
    int64_t *dict_off; /* size + 1 offsets */
    uint8_t *dict_type;
    int32_t *dict_table; /* word ids or -1 */
    uint64_t dict_cap;
    /* pruned models: n-gram bucket -> its row among the kept n-grams, an open-addressing table
     * (keys -1 = empty) small enough to stay in the CPU's caches (a bucket-sized array is 8 MB
     * for lid.176 and every lookup of a new word's n-grams missed the caches) */
    int32_t *prune_keys, *prune_values;
    uint32_t prune_mask;
    float *input;      /* input rows, decoded: (rows, dim) */
    int64_t input_rows;
    int input_from_zero; /* quantized input: fastText sums from zero; dense: from the first row */
    float *output;     /* (output_rows, dim) */
    float *output_scale; /* per output row, or NULL (quantized output multiplies the dot by it) */
    int64_t output_rows;
    int32_t *left, *right; /* hierarchical softmax tree (2 * nlabels - 1 nodes) */
    float t_sigmoid[SIGMOID_TABLE_SIZE + 1];
    Cache cache;
    uint64_t cache_hits, cache_misses, cache_resets;
    /* per-line work buffers */
    int32_t *line;
    uint64_t line_len, line_cap;
    int32_t *hashes;
    uint64_t hashes_len, hashes_cap;
    struct Token *tokens; /* the line's words, before their lookups */
    uint64_t tokens_len, tokens_cap;
    float *hidden, *out;
} Predictor;

static uint32_t ft_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h = h ^ (uint32_t)(int8_t)s[i];
        h = h * 16777619u;
    }
    return h;
}

static int grow(void **buf, uint64_t *cap, uint64_t need, size_t item) {
    if (need <= *cap) return 0;
    uint64_t cap2 = *cap ? *cap : 1024;
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

/* Dictionary::find + getId: the word's id, or -1. */
static int32_t dict_get(const Predictor *self, const char *w, size_t n, uint32_t h) {
    uint64_t cap = self->dict_cap;
    uint64_t i = h % cap;
    while (self->dict_table[i] != -1) {
        int32_t id = self->dict_table[i];
        int64_t a = self->dict_off[id], b = self->dict_off[id + 1];
        if ((size_t)(b - a) == n && memcmp(self->dict_bytes + a, w, n) == 0) return id;
        i = (i + 1) % cap;
    }
    return -1;
}

/* Dictionary::pushHash into `out` (a row list being built). */
static int push_hash(Predictor *self, int32_t **out, uint64_t *len, uint64_t *cap, int32_t id) {
    if (self->prune_size == 0 || id < 0) return 0;
    if (self->prune_size > 0) {
        uint32_t i = ((uint32_t)id * 2654435761u) & self->prune_mask;
        while (self->prune_keys[i] != id) {
            if (self->prune_keys[i] == -1) return 0;
            i = (i + 1) & self->prune_mask;
        }
        id = self->prune_values[i];
    }
    if (*len == *cap && grow((void **)out, cap, *len + 1, 4) < 0) return -1;
    (*out)[(*len)++] = self->nwords + id;
    return 0;
}

/* Dictionary::computeSubwords over `word` (already "<...>"), hashing each n-gram as it grows. */
static int compute_subwords(Predictor *self, const char *word, size_t n, int32_t **out, uint64_t *len,
                            uint64_t *cap) {
    for (size_t i = 0; i < n; i++) {
        if ((word[i] & 0xC0) == 0x80) continue;
        uint32_t h = 2166136261u;
        size_t j = i;
        for (int32_t k = 1; j < n && k <= self->maxn; k++) {
            h = (h ^ (uint32_t)(int8_t)word[j]) * 16777619u;
            j++;
            while (j < n && (word[j] & 0xC0) == 0x80) {
                h = (h ^ (uint32_t)(int8_t)word[j]) * 16777619u;
                j++;
            }
            if (k >= self->minn && !(k == 1 && (i == 0 || j == n))) {
                int32_t id = (int32_t)(h % (uint32_t)self->bucket);
                if (push_hash(self, out, len, cap, id) < 0) return -1;
            }
        }
    }
    return 0;
}

static int is_label(const char *w, size_t n) { return n >= 9 && memcmp(w, "__label__", 9) == 0; }

static int is_eos(const char *w, size_t n) { return n == 4 && memcmp(w, "</s>", 4) == 0; }

/* Dictionary::addSubwords for one word: its rows appended to `out`. */
static int word_rows(Predictor *self, const char *w, size_t n, uint32_t h, int32_t **out, uint64_t *len,
                     uint64_t *cap, uint8_t *type) {
    int32_t wid = dict_get(self, w, n, h);
    *type = wid < 0 ? (is_label(w, n) ? TYPE_LABEL : TYPE_WORD) : self->dict_type[wid];
    if (*type != TYPE_WORD) return 0;
    int eos = is_eos(w, n);
    if (wid >= 0) {
        if (*len == *cap && grow((void **)out, cap, *len + 1, 4) < 0) return -1;
        (*out)[(*len)++] = wid;
        if (self->maxn <= 0 || eos) return 0; /* initNgrams: EOS has no n-grams */
    } else if (eos) {
        return 0;
    }
    char stackbuf[MAX_NGRAM_BYTES + 2];
    char *buf = stackbuf;
    if (n + 2 > sizeof(stackbuf)) {
        buf = malloc(n + 2);
        if (!buf) {
            PyErr_NoMemory();
            return -1;
        }
    }
    buf[0] = '<';
    memcpy(buf + 1, w, n);
    buf[n + 1] = '>';
    int rc = compute_subwords(self, buf, n + 2, out, len, cap);
    if (buf != stackbuf) free(buf);
    return rc;
}

static void cache_clear(Cache *c) {
    memset(c->slots, 0, c->cap * sizeof(Slot));
    c->used = 0;
    c->keys_len = 0;
    c->rows_len = 0;
}

/* memcmp(a, b, n) == 0, inline: most words are a few bytes, shorter than a call costs */
static inline int same_bytes(const char *a, const char *b, size_t n) {
    if (n > 16) return memcmp(a, b, n) == 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* The word's rows, appended to the line, through the cache. */
static int add_word(Predictor *self, const char *w, size_t n, uint32_t h, uint8_t *type) {
    Cache *c = &self->cache;
    uint64_t mask = c->cap - 1;
    uint64_t i = h & mask;
    while (c->slots[i].klen) {
        Slot *s = &c->slots[i];
        if (s->hash == h && s->klen == n && same_bytes(c->keys + s->koff, w, n)) {
            self->cache_hits++;
            *type = s->type;
            if (s->nrows) {
                if (grow((void **)&self->line, &self->line_cap, self->line_len + s->nrows, 4) < 0) return -1;
                memcpy(self->line + self->line_len, c->rows + s->roff, s->nrows * 4);
                self->line_len += s->nrows;
            }
            if (*type == TYPE_WORD && self->word_ngrams > 1) {
                if (self->hashes_len == self->hashes_cap &&
                    grow((void **)&self->hashes, &self->hashes_cap, self->hashes_len + 1, 4) < 0)
                    return -1;
                self->hashes[self->hashes_len++] = (int32_t)h;
            }
            return 0;
        }
        i = (i + 1) & mask;
    }
    self->cache_misses++;
    uint64_t start = self->line_len;
    if (word_rows(self, w, n, h, &self->line, &self->line_len, &self->line_cap, type) < 0) return -1;
    if (*type == TYPE_WORD && self->word_ngrams > 1) {
        if (self->hashes_len == self->hashes_cap &&
            grow((void **)&self->hashes, &self->hashes_cap, self->hashes_len + 1, 4) < 0)
            return -1;
        self->hashes[self->hashes_len++] = (int32_t)h;
    }
    uint64_t nrows = self->line_len - start;
    if (n > MAX_NGRAM_BYTES || nrows > UINT16_MAX) return 0; /* very long "words" are not kept */
    if (2 * (c->used + 1) > c->cap || c->keys_len + n > c->keys_max || c->rows_len + nrows > c->rows_max) {
        cache_clear(c);
        self->cache_resets++;
        if (n > c->keys_max || nrows > c->rows_max) return 0;
        i = h & mask;
    }
    while (c->slots[i].klen) i = (i + 1) & mask;
    Slot *s = &c->slots[i];
    s->hash = h;
    s->klen = (uint32_t)n;
    s->koff = (uint32_t)c->keys_len;
    s->roff = (uint32_t)c->rows_len;
    s->nrows = (uint16_t)nrows;
    s->type = *type;
    memcpy(c->keys + c->keys_len, w, n);
    c->keys_len += n;
    memcpy(c->rows + c->rows_len, self->line + start, nrows * 4);
    c->rows_len += nrows;
    c->used++;
    return 0;
}

static int is_sep(unsigned char ch) {
    return ch == ' ' || ch == '\n' || ch == '\r' || ch == '\t' || ch == '\v' || ch == '\f' || ch == '\0';
}

/* Dictionary::getLine for the supervised model: the line's input rows in self->line. */
/* The line's words are split first, then looked up in the cache a few words behind prefetches
 * of their slots, keys and rows: on a cache of many words most lookups miss the CPU's caches,
 * and one at a time their latencies add up (this halved language ID's time). */
#define AHEAD_SLOT 16
#define AHEAD_ROWS 8

static void prefetch_entry(const Predictor *self, uint32_t h) {
    const Cache *c = &self->cache;
    const Slot *s = &c->slots[h & (c->cap - 1)];
    if (s->klen && s->hash == h) {
        __builtin_prefetch(c->keys + s->koff);
        __builtin_prefetch(c->rows + s->roff);
    }
}

static int line_rows(Predictor *self, const char *s, Py_ssize_t n) {
    self->line_len = 0;
    self->hashes_len = 0;
    self->tokens_len = 0;
    Py_ssize_t i = 0;
    int ended = 0;
    while (i < n && !ended) {
        while (i < n && is_sep((unsigned char)s[i])) i++;
        if (i >= n) break;
        Py_ssize_t j = i;
        while (j < n && !is_sep((unsigned char)s[j])) j++;
        if (self->tokens_len == self->tokens_cap &&
            grow((void **)&self->tokens, &self->tokens_cap, self->tokens_len + 1, sizeof(Token)) < 0)
            return -1;
        self->tokens[self->tokens_len++] = (Token){s + i, (size_t)(j - i), ft_hash(s + i, (size_t)(j - i))};
        if (is_eos(s + i, (size_t)(j - i))) ended = 1; /* a "</s>" in the text ends the line */
        i = j;
    }
    if (!ended) { /* the newline fastText's Python API appends: the EOS word */
        if (self->tokens_len == self->tokens_cap &&
            grow((void **)&self->tokens, &self->tokens_cap, self->tokens_len + 1, sizeof(Token)) < 0)
            return -1;
        self->tokens[self->tokens_len++] = (Token){"</s>", 4, ft_hash("</s>", 4)};
    }
    const Token *tok = self->tokens;
    uint64_t count = self->tokens_len, mask = self->cache.cap - 1;
    for (uint64_t t = 0; t < count; t++) {
        if (t + AHEAD_SLOT < count) __builtin_prefetch(&self->cache.slots[tok[t + AHEAD_SLOT].hash & mask]);
        if (t + AHEAD_ROWS < count) prefetch_entry(self, tok[t + AHEAD_ROWS].hash);
        uint8_t type;
        if (add_word(self, tok[t].word, tok[t].len, tok[t].hash, &type) < 0) return -1;
    }
    /* Dictionary::addWordNgrams: hashes are int32, widened to uint64 with their sign */
    for (uint64_t a = 0; a < self->hashes_len; a++) {
        uint64_t h = (uint64_t)(int64_t)self->hashes[a];
        for (uint64_t b = a + 1; b < self->hashes_len && b < a + (uint64_t)self->word_ngrams; b++) {
            h = h * 116049371u + (uint64_t)(int64_t)self->hashes[b];
            if (push_hash(self, &self->line, &self->line_len, &self->line_cap,
                          (int32_t)(h % (uint64_t)(int64_t)self->bucket)) < 0)
                return -1;
        }
    }
    return 0;
}

/* Model::computeHidden: averageRowsToVector, summed in row order. The columns are independent
 * sums, so the compiler may add several at once (vector registers); each column's sum is still
 * taken row by row, as fastText takes it. */
static void sum_rows(const float *restrict input, const int32_t *restrict rows, uint64_t n, int32_t dim,
                     float *restrict x) {
    for (uint64_t r = 0; r < n; r++) {
        const float *restrict row = input + (int64_t)rows[r] * dim;
        for (int32_t j = 0; j < dim; j++) x[j] += row[j];
    }
}

/* Rows of a width that is a multiple of 4: four columns per vector add (GCC's vector extension:
 * SSE on x86-64, NEON on arm64), the accumulators in registers, as fastText's averageRowsFast. */
typedef float v4sf __attribute__((vector_size(16)));

#define SUM_ROWS_FIXED(D)                                                                            \
    static void sum_rows_##D(const float *restrict input, const int32_t *restrict rows, uint64_t n,   \
                             float *restrict x) {                                                    \
        v4sf acc[D / 4];                                                                             \
        memcpy(acc, x, sizeof(acc));                                                                 \
        for (uint64_t r = 0; r < n; r++) {                                                           \
            if (r + 8 < n) __builtin_prefetch(input + (int64_t)rows[r + 8] * D);                     \
            const float *row = input + (int64_t)rows[r] * D;                                         \
            for (int j = 0; j < D / 4; j++) {                                                        \
                v4sf v;                                                                              \
                memcpy(&v, row + 4 * j, sizeof(v));                                                  \
                acc[j] += v;                                                                         \
            }                                                                                        \
        }                                                                                            \
        memcpy(x, acc, sizeof(acc));                                                                 \
    }
SUM_ROWS_FIXED(16)
SUM_ROWS_FIXED(32)
SUM_ROWS_FIXED(64)

static void compute_hidden(Predictor *self) {
    const int32_t dim = self->dim;
    float *x = self->hidden;
    const int32_t *rows = self->line;
    uint64_t n = self->line_len;
    uint64_t r = 0;
    if (self->input_from_zero || n == 0) {
        for (int32_t j = 0; j < dim; j++) x[j] = 0.0f;
    } else { /* averageRowsFast: the first row copied, the others added */
        memcpy(x, self->input + (int64_t)rows[0] * dim, dim * sizeof(float));
        r = 1;
    }
    if (dim == 16) sum_rows_16(self->input, rows + r, n - r, x);
    else if (dim == 32) sum_rows_32(self->input, rows + r, n - r, x);
    else if (dim == 64) sum_rows_64(self->input, rows + r, n - r, x);
    else sum_rows(self->input, rows + r, n - r, dim, x);
    float a = (float)(1.0 / (double)n);
    for (int32_t j = 0; j < dim; j++) x[j] *= a;
}

static float dot_row(const Predictor *self, int64_t i) {
    const float *w = self->output + i * self->dim;
    float d = 0.0f;
    for (int32_t j = 0; j < self->dim; j++) d += w[j] * self->hidden[j];
    if (self->output_scale) d = d * self->output_scale[i];
    return d;
}

static float std_log(float x) { return (float)log((double)x + 1e-5); }

static float table_sigmoid(const Predictor *self, float x) {
    if (x < -MAX_SIGMOID) return 0.0f;
    if (x > MAX_SIGMOID) return 1.0f;
    int64_t i = (int64_t)((x + MAX_SIGMOID) * SIGMOID_TABLE_SIZE / MAX_SIGMOID / 2);
    return self->t_sigmoid[i];
}

/* HierarchicalSoftmaxLoss::dfs with a heap of one (k = 1): the best leaf and its score. On a
 * tie the leaf visited later wins, as fastText's push_heap/pop_heap leave it. */
static void dfs_top(const Predictor *self, float threshold_log, int32_t node, float score, float *best,
                    int32_t *best_leaf) {
    if (score < threshold_log) return;
    if (*best_leaf >= 0 && score < *best) return;
    int32_t osz = self->nlabels;
    if (self->left[node] == -1 && self->right[node] == -1) {
        *best = score;
        *best_leaf = node;
        return;
    }
    float f = dot_row(self, node - osz);
    f = (float)(1. / (double)(1.0f + expf(-f)));
    dfs_top(self, threshold_log, self->left[node], score + std_log((float)(1.0 - (double)f)), best, best_leaf);
    dfs_top(self, threshold_log, self->right[node], score + std_log(f), best, best_leaf);
}

/* The same walk with no heap (k unlimited): every leaf's score at or above the threshold. */
static void dfs_all(const Predictor *self, float threshold_log, int32_t node, float score, float *scores) {
    if (score < threshold_log) return;
    int32_t osz = self->nlabels;
    if (self->left[node] == -1 && self->right[node] == -1) {
        scores[node] = score;
        return;
    }
    float f = dot_row(self, node - osz);
    f = (float)(1. / (double)(1.0f + expf(-f)));
    dfs_all(self, threshold_log, self->left[node], score + std_log((float)(1.0 - (double)f)), scores);
    dfs_all(self, threshold_log, self->right[node], score + std_log(f), scores);
}

/* Loss::computeOutput of the flat losses: each label's probability in self->out. */
static void compute_output(Predictor *self) {
    int32_t osz = self->nlabels;
    float *out = self->out;
    for (int32_t i = 0; i < osz; i++) out[i] = dot_row(self, i);
    if (self->loss == LOSS_SOFTMAX) {
        float max = out[0], z = 0.0f;
        for (int32_t i = 0; i < osz; i++) max = out[i] > max ? out[i] : max; /* std::max(out[i], max) */
        for (int32_t i = 0; i < osz; i++) {
            out[i] = expf(out[i] - max);
            z += out[i];
        }
        for (int32_t i = 0; i < osz; i++) out[i] /= z;
    } else {
        for (int32_t i = 0; i < osz; i++) out[i] = table_sigmoid(self, out[i]);
    }
}

/* ---- reading the text ------------------------------------------------------------------------ */

/* The UTF-8 bytes of `text` (a str): its own buffer when ASCII, else a new bytes object in *tmp. */
static const char *utf8_of(PyObject *text, Py_ssize_t *n, PyObject **tmp) {
    *tmp = NULL;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "expected str, got %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_IS_ASCII(text)) {
        *n = PyUnicode_GET_LENGTH(text);
        return (const char *)PyUnicode_DATA(text);
    }
    *tmp = PyUnicode_AsUTF8String(text);
    if (!*tmp) return NULL;
    *n = PyBytes_GET_SIZE(*tmp);
    return PyBytes_AS_STRING(*tmp);
}

static int prepare_line(Predictor *self, PyObject *text) {
    Py_ssize_t n;
    PyObject *tmp;
    const char *s = utf8_of(text, &n, &tmp);
    if (!s) return -1;
    int rc = line_rows(self, s, n);
    Py_XDECREF(tmp);
    return rc;
}

/* predict_top(texts) -> (labels: list[int], scores: list[float]): fastText's predict with k=1 and
 * threshold 0; label -1 (and score 0) when fastText returns no prediction. */
static PyObject *Predictor_predict_top(Predictor *self, PyObject *args) {
    PyObject *texts;
    if (!PyArg_ParseTuple(args, "O", &texts)) return NULL;
    PyObject *seq = PySequence_Fast(texts, "predict_top: expected a list of str");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *labels = PyList_New(count), *scores = PyList_New(count);
    if (!labels || !scores) goto fail;
    float threshold_log = std_log(0.0f);
    for (Py_ssize_t t = 0; t < count; t++) {
        if (prepare_line(self, PySequence_Fast_GET_ITEM(seq, t)) < 0) goto fail;
        int32_t label = -1;
        float score = 0.0f;
        if (self->line_len > 0) {
            compute_hidden(self);
            if (self->loss == LOSS_HS) {
                float best = 0.0f;
                dfs_top(self, threshold_log, 2 * self->nlabels - 2, 0.0f, &best, &label);
                if (label >= 0) score = expf(best);
            } else {
                compute_output(self);
                /* Loss::findKBest with k = 1: the first of the largest std_log(p), threshold 0 */
                float best = 0.0f;
                for (int32_t i = 0; i < self->nlabels; i++) {
                    float p = self->out[i];
                    if (p < 0.0f) continue;
                    float lp = std_log(p);
                    if (label >= 0 && lp < best) continue;
                    if (label < 0 || lp >= best) { /* equal: the later one, as the heap leaves it */
                        best = lp;
                        label = i;
                    }
                }
                if (label >= 0) score = expf(best);
            }
        }
        PyObject *l = PyLong_FromLong(label), *s = PyFloat_FromDouble((double)score);
        if (!l || !s) {
            Py_XDECREF(l);
            Py_XDECREF(s);
            goto fail;
        }
        PyList_SET_ITEM(labels, t, l);
        PyList_SET_ITEM(scores, t, s);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", labels, scores);
fail:
    Py_DECREF(seq);
    Py_XDECREF(labels);
    Py_XDECREF(scores);
    return NULL;
}

/* predict_label(texts, label) -> list[float]: the probability fastText's predict with k=-1 and
 * threshold 0 reports for `label` (exp of its std_log), 0.0 where it reports none. */
static PyObject *Predictor_predict_label(Predictor *self, PyObject *args) {
    PyObject *texts;
    int label;
    if (!PyArg_ParseTuple(args, "Oi", &texts, &label)) return NULL;
    if (label < 0 || label >= self->nlabels) {
        PyErr_Format(PyExc_ValueError, "label index %d out of range [0, %d)", label, self->nlabels);
        return NULL;
    }
    PyObject *seq = PySequence_Fast(texts, "predict_label: expected a list of str");
    if (!seq) return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject *out = PyList_New(count);
    if (!out) goto fail;
    float threshold_log = std_log(0.0f);
    for (Py_ssize_t t = 0; t < count; t++) {
        if (prepare_line(self, PySequence_Fast_GET_ITEM(seq, t)) < 0) goto fail;
        float prob = 0.0f;
        if (self->line_len > 0) {
            compute_hidden(self);
            if (self->loss == LOSS_HS) {
                float *scores = self->out + self->nlabels; /* room for 2 * nlabels */
                for (int32_t i = 0; i < self->nlabels; i++) scores[i] = -INFINITY;
                dfs_all(self, threshold_log, 2 * self->nlabels - 2, 0.0f, scores);
                if (scores[label] != -INFINITY) prob = expf(scores[label]);
            } else {
                compute_output(self);
                float p = self->out[label];
                if (!(p < 0.0f)) prob = expf(std_log(p));
            }
        }
        PyObject *f = PyFloat_FromDouble((double)prob);
        if (!f) goto fail;
        PyList_SET_ITEM(out, t, f);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_XDECREF(out);
    return NULL;
}

/* rows(text) -> list[int]: the input rows of a line (for tests: fastText's get_line ids). */
static PyObject *Predictor_rows(Predictor *self, PyObject *args) {
    PyObject *text;
    if (!PyArg_ParseTuple(args, "O", &text)) return NULL;
    if (prepare_line(self, text) < 0) return NULL;
    PyObject *out = PyList_New((Py_ssize_t)self->line_len);
    if (!out) return NULL;
    for (uint64_t i = 0; i < self->line_len; i++) {
        PyObject *v = PyLong_FromLong(self->line[i]);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

static PyObject *Predictor_cache_stats(Predictor *self, PyObject *Py_UNUSED(ignored)) {
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K}", "hits", (unsigned long long)self->cache_hits, "misses",
                         (unsigned long long)self->cache_misses, "resets", (unsigned long long)self->cache_resets,
                         "words", (unsigned long long)self->cache.used, "bytes",
                         (unsigned long long)(self->cache.keys_max + 4 * self->cache.rows_max +
                                              sizeof(Slot) * self->cache.cap));
}

/* ---- construction ---------------------------------------------------------------------------- */

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len != itemsize * count) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd bytes, got %zd", what, itemsize * count, view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static void *copy_buffer(PyObject *obj, Py_ssize_t itemsize, Py_ssize_t count, const char *what) {
    Py_buffer view;
    if (get_buffer(obj, &view, itemsize, count, what) < 0) return NULL;
    void *p = malloc(view.len ? view.len : 1);
    if (!p) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(p, view.buf, view.len);
    PyBuffer_Release(&view);
    return p;
}

static void Predictor_dealloc(Predictor *self) {
    free(self->dict_bytes);
    free(self->dict_off);
    free(self->dict_type);
    free(self->dict_table);
    free(self->prune_keys);
    free(self->prune_values);
    free(self->input);
    free(self->output);
    free(self->output_scale);
    free(self->left);
    free(self->right);
    free(self->cache.slots);
    free(self->cache.keys);
    free(self->cache.rows);
    free(self->line);
    free(self->hashes);
    free(self->tokens);
    free(self->hidden);
    free(self->out);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Predictor(dim, minn, maxn, word_ngrams, bucket, loss, words, types, counts, prune_size, prune,
 *           input, input_rows, input_from_zero, output, output_rows, output_scale, cache_bytes)
 *
 * words: the dictionary's words joined by NUL bytes (nwords words, then nlabels labels, in the
 * file's order); types: one byte per entry; counts: int64 per label (the tree's counts); prune:
 * the pruning index's (bucket, row) pairs as int32 (prune_size of them; None when not pruned); input: float32 (input_rows, dim); output: float32 (output_rows,
 * dim); output_scale: float32 per output row or None. The Python side (fasttext_native.py)
 * reads the model file and decodes quantized matrices into these. */
static int Predictor_init(Predictor *self, PyObject *args, PyObject *kwds) {
    int dim, minn, maxn, word_ngrams, bucket, loss, input_from_zero;
    PyObject *words, *types, *counts, *prune, *input, *output, *output_scale;
    long long prune_size, input_rows, output_rows, cache_bytes;
    static char *kwlist[] = {"dim", "minn", "maxn", "word_ngrams", "bucket", "loss", "words", "types",
                             "counts", "prune_size", "prune", "input", "input_rows", "input_from_zero",
                             "output", "output_rows", "output_scale", "cache_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iiiiiiOOOLOOLpOLOL", kwlist, &dim, &minn, &maxn, &word_ngrams,
                                     &bucket, &loss, &words, &types, &counts, &prune_size, &prune, &input,
                                     &input_rows, &input_from_zero, &output, &output_rows, &output_scale,
                                     &cache_bytes))
        return -1;
    if (dim <= 0 || bucket < 0 || word_ngrams < 1 || loss < LOSS_HS || loss > LOSS_OVA ||
        (bucket == 0 && (maxn > 0 || word_ngrams > 1))) {
        PyErr_SetString(PyExc_ValueError, "fastText model: bad dim, bucket, wordNgrams or loss");
        return -1;
    }
    self->dim = dim;
    self->minn = minn;
    self->maxn = maxn;
    self->word_ngrams = word_ngrams;
    self->bucket = bucket;
    self->loss = loss;
    self->prune_size = prune_size;
    self->input_rows = input_rows;
    self->input_from_zero = input_from_zero;
    self->output_rows = output_rows;

    /* the dictionary */
    Py_buffer wv, tv;
    if (PyObject_GetBuffer(words, &wv, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(types, &tv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&wv);
        return -1;
    }
    int32_t size = (int32_t)tv.len;
    self->size = size;
    self->dict_bytes = malloc(wv.len ? wv.len : 1);
    self->dict_off = malloc(sizeof(int64_t) * (size + 1));
    self->dict_type = malloc(size ? size : 1);
    if (!self->dict_bytes || !self->dict_off || !self->dict_type) {
        PyBuffer_Release(&wv);
        PyBuffer_Release(&tv);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->dict_bytes, wv.buf, wv.len);
    memcpy(self->dict_type, tv.buf, size);
    /* the words without their NULs, each at dict_off[i] .. dict_off[i + 1] */
    int64_t pos = 0, w = 0;
    int32_t nwords = 0, nlabels = 0;
    for (int32_t i = 0; i < size; i++) {
        const char *end = memchr(self->dict_bytes + pos, 0, wv.len - pos);
        if (!end) {
            PyBuffer_Release(&wv);
            PyBuffer_Release(&tv);
            PyErr_SetString(PyExc_ValueError, "fastText model: dictionary words and types disagree");
            return -1;
        }
        int64_t len = end - (self->dict_bytes + pos);
        memmove(self->dict_bytes + w, self->dict_bytes + pos, len);
        self->dict_off[i] = w;
        w += len;
        pos += len + 1;
        if (self->dict_type[i] == TYPE_WORD) nwords++;
        else nlabels++;
    }
    self->dict_off[size] = w;
    PyBuffer_Release(&wv);
    PyBuffer_Release(&tv);
    self->nwords = nwords;
    self->nlabels = nlabels;
    if (nlabels < 1) {
        PyErr_SetString(PyExc_ValueError, "fastText model: no labels (not a supervised model)");
        return -1;
    }
    self->dict_cap = (uint64_t)ceil(size / 0.7);
    if (self->dict_cap < 1) self->dict_cap = 1;
    self->dict_table = malloc(sizeof(int32_t) * self->dict_cap);
    if (!self->dict_table) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = 0; i < self->dict_cap; i++) self->dict_table[i] = -1;
    for (int32_t id = 0; id < size; id++) {
        const char *w = self->dict_bytes + self->dict_off[id];
        size_t n = (size_t)(self->dict_off[id + 1] - self->dict_off[id]);
        uint64_t i = ft_hash(w, n) % self->dict_cap;
        while (self->dict_table[i] != -1) i = (i + 1) % self->dict_cap;
        self->dict_table[i] = id;
    }

    if (prune_size > 0) {
        if (prune == Py_None) {
            PyErr_SetString(PyExc_ValueError, "fastText model: pruned, but no prune index given");
            return -1;
        }
        int32_t *pairs = copy_buffer(prune, 4, 2 * prune_size, "prune");
        if (!pairs) return -1;
        uint64_t cap = 16;
        while (cap < 2 * (uint64_t)prune_size) cap *= 2;
        self->prune_mask = (uint32_t)(cap - 1);
        self->prune_keys = malloc(sizeof(int32_t) * cap);
        self->prune_values = malloc(sizeof(int32_t) * cap);
        if (!self->prune_keys || !self->prune_values) {
            free(pairs);
            PyErr_NoMemory();
            return -1;
        }
        for (uint64_t i = 0; i < cap; i++) self->prune_keys[i] = -1;
        for (int64_t k = 0; k < prune_size; k++) { /* a later pair for the same n-gram wins, as in fastText's map */
            int32_t key = pairs[2 * k], value = pairs[2 * k + 1];
            if (key < 0 || value < 0) {
                free(pairs);
                PyErr_SetString(PyExc_ValueError, "fastText model: negative entry in the pruning index");
                return -1;
            }
            uint32_t i = ((uint32_t)key * 2654435761u) & self->prune_mask;
            while (self->prune_keys[i] != -1 && self->prune_keys[i] != key) i = (i + 1) & self->prune_mask;
            self->prune_keys[i] = key;
            self->prune_values[i] = value;
        }
        free(pairs);
    }
    self->input = copy_buffer(input, 4, (Py_ssize_t)(input_rows * dim), "input");
    if (!self->input) return -1;
    self->output = copy_buffer(output, 4, (Py_ssize_t)(output_rows * dim), "output");
    if (!self->output) return -1;
    if (output_scale != Py_None) {
        self->output_scale = copy_buffer(output_scale, 4, (Py_ssize_t)output_rows, "output_scale");
        if (!self->output_scale) return -1;
    }
    int64_t need_out = loss == LOSS_HS ? nlabels - 1 : nlabels;
    if (output_rows < need_out) {
        PyErr_SetString(PyExc_ValueError, "fastText model: output matrix has too few rows for its labels");
        return -1;
    }

    /* HierarchicalSoftmaxLoss::buildTree */
    int64_t *label_counts = copy_buffer(counts, 8, nlabels, "counts");
    if (!label_counts) return -1;
    int32_t nodes = 2 * nlabels - 1;
    self->left = malloc(sizeof(int32_t) * nodes);
    self->right = malloc(sizeof(int32_t) * nodes);
    int64_t *tcount = malloc(sizeof(int64_t) * nodes);
    if (!self->left || !self->right || !tcount) {
        free(label_counts);
        free(tcount);
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t i = 0; i < nodes; i++) {
        self->left[i] = self->right[i] = -1;
        tcount[i] = (int64_t)1e15;
    }
    for (int32_t i = 0; i < nlabels; i++) tcount[i] = label_counts[i];
    free(label_counts);
    int32_t leaf = nlabels - 1, node = nlabels;
    for (int32_t i = nlabels; i < nodes; i++) {
        int32_t mini[2] = {0, 0};
        for (int j = 0; j < 2; j++) {
            if (leaf >= 0 && tcount[leaf] < tcount[node]) mini[j] = leaf--;
            else mini[j] = node++;
        }
        self->left[i] = mini[0];
        self->right[i] = mini[1];
        tcount[i] = tcount[mini[0]] + tcount[mini[1]];
    }
    free(tcount);

    /* Loss's sigmoid table */
    for (int i = 0; i < SIGMOID_TABLE_SIZE + 1; i++) {
        float x = (float)(i * 2 * MAX_SIGMOID) / SIGMOID_TABLE_SIZE - MAX_SIGMOID;
        self->t_sigmoid[i] = (float)(1.0 / (1.0 + (double)expf(-x)));
    }

    self->hidden = malloc(sizeof(float) * dim);
    self->out = malloc(sizeof(float) * 2 * nlabels);
    /* the cache's parts (see Cache); offsets are 32-bit, so at most 2 GB in all */
    uint64_t budget = cache_bytes < (1ll << 20)   ? (1ull << 20)
                      : cache_bytes > (1ll << 31) ? (1ull << 31)
                                                  : (uint64_t)cache_bytes;
    self->cache.cap = 1024;
    while (2 * self->cache.cap * sizeof(Slot) <= budget / 4) self->cache.cap *= 2;
    self->cache.keys_max = budget / 4;
    self->cache.rows_max = budget / 2 / sizeof(int32_t);
    self->cache.slots = calloc(self->cache.cap, sizeof(Slot));
    self->cache.keys = malloc(self->cache.keys_max);
    self->cache.rows = malloc(self->cache.rows_max * sizeof(int32_t));
    if (!self->hidden || !self->out || !self->cache.slots || !self->cache.keys || !self->cache.rows) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyMethodDef Predictor_methods[] = {
    {"predict_top", (PyCFunction)Predictor_predict_top, METH_VARARGS,
     "predict_top(texts) -> (label indices, scores): fastText's predict(k=1) of each text"},
    {"predict_label", (PyCFunction)Predictor_predict_label, METH_VARARGS,
     "predict_label(texts, label) -> probabilities of one label, as predict(k=-1) reports them"},
    {"rows", (PyCFunction)Predictor_rows, METH_VARARGS, "rows(text) -> the input rows of a line"},
    {"cache_stats", (PyCFunction)Predictor_cache_stats, METH_NOARGS, "the word cache's counters"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PredictorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gristmill.native._fasttext.Predictor",
    .tp_basicsize = sizeof(Predictor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "fastText supervised prediction with a cache of each word's input rows",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Predictor_init,
    .tp_dealloc = (destructor)Predictor_dealloc,
    .tp_methods = Predictor_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_fasttext", .m_doc = "fastText prediction, number for number", .m_size = -1,
    .m_methods = NULL,
};

PyMODINIT_FUNC PyInit__fasttext(void) {
    if (PyType_Ready(&PredictorType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&PredictorType);
    if (PyModule_AddObject(m, "Predictor", (PyObject *)&PredictorType) < 0) {
        Py_DECREF(&PredictorType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
