/* The batch simulation (kvbench_sim.batch.Simulation) compiled, for the case that dominates large runs: request-rate
   or closed-loop arrivals of synthetic multi-turn sessions on engines without KV tiers and without a prefill/decode
   split.

   It is the Python reference step for step: the same event heap and tie order, the same scheduler (chunked prefill,
   prefix cache, vLLM's preemption order), the same step times and jitter stream, the same fused decode runs, the same
   session words (Python's Mersenne Twister, seeded as random.Random seeds a string) and replies (SHAKE-128), the same
   block hashes (CPython's tuple hash over each word's own hash) in the same compiled block pool. So a simulation gives
   the same records bit for bit either way; kvbench_sim.fastpath decides when it applies and moves the engines' state
   in and out, and the tests run both on the same workloads and compare every record.

   Errors (memory, or a Python call made from here) set sim->failed with the exception; the loop stops at the next
   event and run_batch raises it. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_pool.h"

/* ---- Python's random.Random(str): MT19937 seeded by init_by_array over the key and its SHA-512 ---------------- */
#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    int index;
} Twister;

static void mt_init_genrand(Twister *t, uint32_t s)
{
    t->mt[0] = s;
    for (int i = 1; i < MT_N; i++)
        t->mt[i] = 1812433253U * (t->mt[i - 1] ^ (t->mt[i - 1] >> 30)) + (uint32_t)i;
    t->index = MT_N;
}

static void mt_init_by_array(Twister *t, const uint32_t *restrict key, size_t length)
{
    static Twister start; /* init_genrand(19650218), the same every time: worked out once */
    if (start.index != MT_N)
        mt_init_genrand(&start, 19650218U);
    *t = start;
    uint32_t *restrict mt = t->mt;
    /* each word depends on the one before: carried in a register (``prev``), not read back from memory */
    uint32_t prev = mt[0];
    size_t i = 1, j = 0;
    for (size_t k = MT_N > length ? MT_N : length; k; k--) {
        prev = (mt[i] ^ ((prev ^ (prev >> 30)) * 1664525U)) + key[j] + (uint32_t)j;
        mt[i] = prev;
        i++;
        j++;
        if (i >= MT_N) {
            mt[0] = prev;
            i = 1;
        }
        if (j >= length)
            j = 0;
    }
    for (size_t k = MT_N - 1; k; k--) {
        prev = (mt[i] ^ ((prev ^ (prev >> 30)) * 1566083941U)) - (uint32_t)i;
        mt[i] = prev;
        i++;
        if (i >= MT_N) {
            mt[0] = prev;
            i = 1;
        }
    }
    mt[0] = 0x80000000U;
}

static inline uint32_t mt_temper(uint32_t y)
{
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    return y ^ (y >> 18);
}

/* the first ``count`` outputs after seeding (count <= 227) into out: the same as ``count`` calls of mt_next, but
   only the state words they read are twisted (the first 227 read none twisted before them), and the state is left
   as it was: for a turn's 256 words, 64 outputs instead of the whole 624-word twist */
static void mt_first(const Twister *t, int count, uint32_t *out)
{
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    for (int k = 0; k < count; k++) {
        uint32_t y = (t->mt[k] & 0x80000000U) | (t->mt[k + 1] & 0x7fffffffU);
        out[k] = mt_temper(t->mt[k + MT_M] ^ (y >> 1) ^ mag01[y & 1U]);
    }
}

static uint32_t mt_next(Twister *t)
{
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    if (t->index >= MT_N) {
        int k;
        uint32_t y;
        for (k = 0; k < MT_N - MT_M; k++) {
            y = (t->mt[k] & 0x80000000U) | (t->mt[k + 1] & 0x7fffffffU);
            t->mt[k] = t->mt[k + MT_M] ^ (y >> 1) ^ mag01[y & 1U];
        }
        for (; k < MT_N - 1; k++) {
            y = (t->mt[k] & 0x80000000U) | (t->mt[k + 1] & 0x7fffffffU);
            t->mt[k] = t->mt[k + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 1U];
        }
        y = (t->mt[MT_N - 1] & 0x80000000U) | (t->mt[0] & 0x7fffffffU);
        t->mt[MT_N - 1] = t->mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 1U];
        t->index = 0;
    }
    return mt_temper(t->mt[t->index++]);
}

static PyObject *sha512_new; /* hashlib.sha512 */
static PyObject *shake128_new; /* hashlib.shake_128 */
static PyObject *digest_name;  /* "digest" */

/* hashlib's constructors, looked up once: 0, or -1 with an exception */
static int hashers_ready(void)
{
    if (sha512_new != NULL && shake128_new != NULL && digest_name != NULL)
        return 0;
    if (digest_name == NULL && (digest_name = PyUnicode_InternFromString("digest")) == NULL)
        return -1;
    PyObject *hashlib = PyImport_ImportModule("hashlib");
    if (hashlib == NULL)
        return -1;
    Py_XSETREF(sha512_new, PyObject_GetAttrString(hashlib, "sha512"));
    Py_XSETREF(shake128_new, PyObject_GetAttrString(hashlib, "shake_128"));
    Py_DECREF(hashlib);
    return sha512_new == NULL || shake128_new == NULL ? -1 : 0;
}

/* digest = hasher(data).digest(*size): a new bytes object, or NULL */
static PyObject *digest_of(PyObject *hasher, const char *data, Py_ssize_t n, Py_ssize_t size)
{
    PyObject *bytes = PyBytes_FromStringAndSize(data, n);
    if (bytes == NULL)
        return NULL;
    PyObject *h = PyObject_CallOneArg(hasher, bytes);
    Py_DECREF(bytes);
    if (h == NULL)
        return NULL;
    PyObject *out;
    if (size < 0)
        out = PyObject_CallMethodNoArgs(h, digest_name);
    else {
        PyObject *length = PyLong_FromSsize_t(size);
        out = length ? PyObject_CallMethodOneArg(h, digest_name, length) : NULL;
        Py_XDECREF(length);
    }
    Py_DECREF(h);
    if (out != NULL && !PyBytes_Check(out)) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "a hash's digest is not bytes");
        return NULL;
    }
    return out;
}

/* random.Random(key).randbytes(n) into out: version 2 seeding (the key's bytes and their SHA-512, one big-endian
   integer, whose little-endian 32-bit words seed init_by_array), then getrandbits(8 n) as little-endian bytes. */
static int random_bytes(const char *key, Py_ssize_t key_len, Py_ssize_t n, uint8_t *out)
{
    PyObject *digest = digest_of(sha512_new, key, key_len, -1);
    if (digest == NULL)
        return -1;
    Py_ssize_t total = key_len + PyBytes_GET_SIZE(digest);
    uint8_t *joined = PyMem_Malloc((size_t)total + 4);
    uint32_t *words = PyMem_Malloc(((size_t)total / 4 + 2) * sizeof(uint32_t));
    Twister *twister = PyMem_Malloc(sizeof(Twister));
    if (joined == NULL || words == NULL || twister == NULL) {
        Py_DECREF(digest);
        PyMem_Free(joined);
        PyMem_Free(words);
        PyMem_Free(twister);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(joined, key, (size_t)key_len);
    memcpy(joined + key_len, PyBytes_AS_STRING(digest), (size_t)PyBytes_GET_SIZE(digest));
    Py_DECREF(digest);
    Py_ssize_t first = 0; /* leading zero bytes carry no bits */
    while (first < total && joined[first] == 0)
        first++;
    size_t used = 1, bits = 0;
    if (first < total) {
        unsigned top = joined[first], top_bits = 0;
        while (top) {
            top_bits++;
            top >>= 1;
        }
        bits = (size_t)(total - first - 1) * 8 + top_bits;
        used = (bits - 1) / 32 + 1;
    }
    for (size_t w = 0; w < used; w++) {
        uint32_t value = 0;
        for (int b = 0; b < 4; b++) {
            Py_ssize_t from_end = (Py_ssize_t)(w * 4 + (size_t)b); /* little-endian byte w*4+b of the integer */
            uint32_t byte = from_end < total ? joined[total - 1 - from_end] : 0;
            value |= byte << (8 * b);
        }
        words[w] = value;
    }
    mt_init_by_array(twister, words, used);
    Py_ssize_t outputs = (n + 3) / 4;
    uint32_t leading[MT_N - MT_M];
    if (outputs <= MT_N - MT_M)
        mt_first(twister, (int)outputs, leading);
    size_t k = (size_t)n * 8;
    for (Py_ssize_t i = 0; i < n; i += 4, k -= 32) {
        uint32_t r = outputs <= MT_N - MT_M ? leading[i / 4] : mt_next(twister);
        if (k < 32)
            r >>= (32 - k);
        for (Py_ssize_t b = 0; b < 4 && i + b < n; b++)
            out[i + b] = (uint8_t)(r >> (8 * b));
        if (k < 32)
            break;
    }
    PyMem_Free(joined);
    PyMem_Free(words);
    PyMem_Free(twister);
    return 0;
}

PyObject *batch_random_bytes(PyObject *module, PyObject *args)
{
    const char *key;
    Py_ssize_t key_len, n;
    if (!PyArg_ParseTuple(args, "s#n:random_bytes", &key, &key_len, &n))
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "random_bytes: n must be at least 0");
        return NULL;
    }
    if (hashers_ready() < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, n);
    if (out == NULL)
        return NULL;
    if (random_bytes(key, key_len, n, (uint8_t *)PyBytes_AS_STRING(out)) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* ---- growable arrays ---------------------------------------------------------------------------------------- */
static int grow_to(void **items, Py_ssize_t *capacity, Py_ssize_t need, size_t item_size)
{
    if (need <= *capacity)
        return 0;
    Py_ssize_t capacity_new = *capacity ? *capacity : 16;
    while (capacity_new < need)
        capacity_new *= 2;
    void *grown = PyMem_Realloc(*items, (size_t)capacity_new * item_size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *items = grown;
    *capacity = capacity_new;
    return 0;
}

#define GROW(array, capacity, need) grow_to((void **)&(array), &(capacity), (need), sizeof(*(array)))

/* ---- sessions, requests, engines ----------------------------------------------------------------------------- */
typedef struct Session {
    PyObject *session_id;
    int32_t *tokens; /* word ids: the prefix, then every turn's input and reply (a prompt is a prefix of the next) */
    Py_ssize_t n_tokens, cap_tokens;
    int64_t *hashes; /* chained block hashes of tokens' full blocks, as far as worked out */
    Py_ssize_t n_hashes, cap_hashes;
    long turn, turns, input_tokens, output_tokens;
    double think_s;
    int built; /* turn ``turn``'s input is in tokens (SyntheticSession._built) */
    Py_ssize_t prompt_len;
    int route; /* routing fixed per session: the engine; -1 when routed per request */
    long user; /* closed loop: the user it belongs to */
} Session;

typedef struct Request {
    Session *session;
    int64_t number;
    long turn;
    double start_s;
    Py_ssize_t prompt_len, n_hashes;
    long max_tokens, output;
    int32_t *blocks;
    Py_ssize_t n_blocks, cap_blocks;
    Py_ssize_t num_computed, cached_tokens, registered, device;
    char admitted, finished, in_running, has_device;
    double *times; /* chunk times after its send */
    Py_ssize_t n_times, cap_times;
    int engine;
} Request;

typedef struct {
    Request **prefill;
    Py_ssize_t *chunks, *computed; /* per prefill request: its chunk, and its tokens already in KV */
    Py_ssize_t n_prefill, cap_prefill;
    Request **decode;
    Py_ssize_t n_decode, cap_decode;
    double duration_s;
    double *steps; /* fused decode steps: each one's duration; none for one ordinary step */
    Py_ssize_t n_steps, cap_steps;
} Plan;

typedef struct {
    BlockPool *pool;
    Py_ssize_t block_size, max_num_seqs, max_num_batched_tokens;
    int prefix_caching;
    double serving_from_s, clock_s;
    int first_step_pending;
    uint64_t seen_shapes; /* bit k: prefill shape 2**k ran */
    double first_request_s, first_use_ms_per_token, request_ms, request_us_per_token;
    /* the step timer's constants (StepTimer) */
    double flops, bw, fixed_s, prefill_fixed_s, attn_coeff, kv_read_per_token_s, mfu_max, t_half, mfu_attn;
    double weight_bytes, two_params_active, moe_keep, weights_without_experts, expert_bytes;
    int moe;
    long tensor_parallel_size, layers, q_heads, head_dim;
    double sigma, lognormal_mean;
    PyObject *lognormal; /* the timer's numpy Generator.lognormal */
    double *jitter;      /* the jitter factors still to use, in order, from jitter_at */
    Py_ssize_t n_jitter, jitter_at, cap_jitter;
    double *affine_zero, *affine_slope; /* per decode batch size: step time at 0 context, and per 1,000,000 */
    char *affine_known;
    long long prompt_tokens, generation_tokens, prefix_queries, prefix_hits, preemptions, requests_finished;
    Request **waiting; /* a ring: waiting_head, n_waiting */
    Py_ssize_t waiting_head, n_waiting, cap_waiting;
    Request **running;
    Py_ssize_t n_running, cap_running;
    Request **snapshot;
    Py_ssize_t cap_snapshot;
    int busy, has_wake, has_plan;
    double wake_at, plan_start;
    uint64_t plan_token;
    Plan plan;
} Engine;

enum { EV_ARRIVAL, EV_STEP, EV_WAKE, EV_READY, EV_INTAKE, EV_SESSION, EV_SEND };

typedef struct {
    double at;
    uint64_t seq;
    int kind, index;
    uint64_t token;
    void *item;
} Event;

enum { ROUTE_ROUND_ROBIN, ROUTE_LEAST_QUEUED, ROUTE_PER_SESSION, ROUTE_PER_REQUEST };

typedef struct {
    Engine *engines;
    Py_ssize_t n_engines;
    Event *heap;
    Py_ssize_t n_heap, cap_heap;
    uint64_t seq;
    double now, t0, deadline;
    unsigned long long seed;
    int routing, honor_gaps;
    int closed_loop, one_session_each; /* closed loop: each user one session (no duration, an endless source) */
    long *users;                       /* closed loop: the source's users */
    Py_ssize_t n_users;
    Py_ssize_t rr_next, max_concurrency, in_flight, pending;
    int64_t next_number;
    Session **ready; /* a ring */
    Py_ssize_t ready_head, n_ready, cap_ready;
    Session **queued; /* over the concurrency cap: a ring */
    Py_ssize_t queued_head, n_queued, cap_queued;
    long long opened;
    int exhausted;
    PyObject *gaps, *next_session, *session_type, *prefix_ids, *pick, *words, *flush, *progress;
    Py_ssize_t n_words;
    Py_hash_t *lanes; /* each word's str hash */
    const char **text;
    Py_ssize_t *text_len, cap_words;
    int32_t byte_word[256];
    int32_t *value_word; /* a reply's 16-bit value -> its word */
    int64_t **prefix_hashes; /* per prefix index: its full blocks' hashes (NULL until first used) */
    Py_ssize_t n_prefixes;
    int hashing;
    Py_ssize_t block_size;
    /* finished requests not yet handed to flush */
    int64_t *numbers, *turns, *prompts, *cached, *counts, *source_values;
    double *starts, *times;
    uint16_t *orders;
    PyObject *sessions;
    Py_ssize_t n_out, cap_out, n_times_out, cap_times_out, n_values_out, cap_values_out;
    long long flushed;
    uint16_t order_device, order_recomputed;
    double progress_every_s, progress_at;
    Request **done_list; /* step_done's scratch */
    char *done;
    double *step_times;
    Py_ssize_t cap_done, cap_step_times;
    int failed;
} Sim;

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- the event heap: (at, seq) order, as heapq over (at, seq, kind, payload) tuples -------------------------- */
static inline int event_before(const Event *a, const Event *b)
{
    return a->at < b->at || (a->at == b->at && a->seq < b->seq);
}

static void push(Sim *sim, double at, int kind, int index, uint64_t token, void *item)
{
    if (GROW(sim->heap, sim->cap_heap, sim->n_heap + 1) < 0) {
        sim->failed = 1;
        return;
    }
    Event event = {at, sim->seq++, kind, index, token, item};
    Py_ssize_t i = sim->n_heap++;
    while (i > 0) {
        Py_ssize_t parent = (i - 1) / 2;
        if (!event_before(&event, &sim->heap[parent]))
            break;
        sim->heap[i] = sim->heap[parent];
        i = parent;
    }
    sim->heap[i] = event;
}

static Event pop(Sim *sim)
{
    Event top = sim->heap[0];
    Event last = sim->heap[--sim->n_heap];
    Py_ssize_t i = 0, n = sim->n_heap;
    while (1) {
        Py_ssize_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && event_before(&sim->heap[child + 1], &sim->heap[child]))
            child++;
        if (!event_before(&sim->heap[child], &last))
            break;
        sim->heap[i] = sim->heap[child];
        i = child;
    }
    if (n)
        sim->heap[i] = last;
    return top;
}

/* ---- rings of pointers ------------------------------------------------------------------------------------- */
static int ring_push(void ***items, Py_ssize_t *head, Py_ssize_t *count, Py_ssize_t *capacity, void *value, int front)
{
    if (*count == *capacity) {
        Py_ssize_t capacity_new = *capacity ? *capacity * 2 : 16;
        void **grown = PyMem_Malloc((size_t)capacity_new * sizeof(void *));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = 0; k < *count; k++)
            grown[k] = (*items)[(*head + k) % *capacity];
        PyMem_Free(*items);
        *items = grown;
        *head = 0;
        *capacity = capacity_new;
    }
    if (front) {
        *head = (*head - 1 + *capacity) % *capacity;
        (*items)[*head] = value;
    } else
        (*items)[(*head + *count) % *capacity] = value;
    (*count)++;
    return 0;
}

static void *ring_pop_front(void **items, Py_ssize_t *head, Py_ssize_t *count, Py_ssize_t capacity)
{
    void *value = items[*head];
    *head = (*head + 1) % capacity;
    (*count)--;
    return value;
}

#define WAITING_PUSH(sim, e, req, front)                                                                             \
    do {                                                                                                             \
        if (ring_push((void ***)&(e)->waiting, &(e)->waiting_head, &(e)->n_waiting, &(e)->cap_waiting, (req),       \
                      (front)) < 0)                                                                                  \
            (sim)->failed = 1;                                                                                       \
    } while (0)

/* ---- words: the table's hashes and texts --------------------------------------------------------------------- */
static int refresh_words(Sim *sim)
{
    Py_ssize_t n = PyList_GET_SIZE(sim->words), first_new = sim->n_words;
    if (n == first_new)
        return 0;
    Py_ssize_t cap_text = sim->cap_words, cap_len = sim->cap_words; /* the three columns grow together */
    if (GROW(sim->lanes, sim->cap_words, n) < 0 || GROW(sim->text, cap_text, n) < 0 ||
        GROW(sim->text_len, cap_len, n) < 0)
        return -1;
    for (Py_ssize_t i = first_new; i < n; i++) {
        PyObject *word = PyList_GET_ITEM(sim->words, i); /* the list holds it for the run */
        if (!PyUnicode_Check(word)) {
            PyErr_SetString(PyExc_TypeError, "the word table holds a non-string");
            return -1;
        }
        sim->lanes[i] = PyObject_Hash(word);
        sim->text[i] = PyUnicode_AsUTF8AndSize(word, &sim->text_len[i]);
        if (sim->lanes[i] == -1 || sim->text[i] == NULL)
            return -1;
    }
    sim->n_words = n;
    return 0;
}

/* the session's chained block hashes up to ``blocks`` full blocks (chain_hashes: hash((prev, *block's words))) */
static void hash_blocks(Sim *sim, Session *s, Py_ssize_t blocks)
{
    if (blocks <= s->n_hashes)
        return;
    if (GROW(s->hashes, s->cap_hashes, blocks) < 0) {
        sim->failed = 1;
        return;
    }
    Py_ssize_t bs = sim->block_size;
    Py_hash_t prev = s->n_hashes ? (Py_hash_t)s->hashes[s->n_hashes - 1] : 0;
    for (Py_ssize_t j = s->n_hashes; j < blocks; j++) {
        Py_uhash_t acc = tuple_hash_start(prev);
        const int32_t *block = s->tokens + j * bs;
        for (Py_ssize_t i = 0; i < bs; i++)
            acc = tuple_hash_add(acc, sim->lanes[block[i]]);
        prev = tuple_hash_end(acc, bs);
        s->hashes[j] = prev;
    }
    s->n_hashes = blocks;
}

static int append_tokens(Sim *sim, Session *s, Py_ssize_t n)
{
    if (GROW(s->tokens, s->cap_tokens, s->n_tokens + n) < 0) {
        sim->failed = 1;
        return -1;
    }
    return 0;
}

/* ---- sessions (SyntheticSession) ------------------------------------------------------------------------------- */
static void session_free(Session *s)
{
    if (s == NULL)
        return;
    Py_XDECREF(s->session_id);
    PyMem_Free(s->tokens);
    PyMem_Free(s->hashes);
    PyMem_Free(s);
}

static void request_free(Request *req)
{
    session_free(req->session); /* a session has one request at a time: it goes with it (NULL: it goes on) */
    PyMem_Free(req->blocks);
    PyMem_Free(req->times);
    PyMem_Free(req);
}

static long get_long(PyObject *obj, const char *name, int *failed)
{
    PyObject *value = PyObject_GetAttrString(obj, name);
    long out = value ? PyLong_AsLong(value) : -1;
    Py_XDECREF(value);
    if (out == -1 && PyErr_Occurred())
        *failed = 1;
    return out;
}

static double get_double(PyObject *obj, const char *name, int *failed)
{
    PyObject *value = PyObject_GetAttrString(obj, name);
    double out = value ? PyFloat_AsDouble(value) : -1.0;
    Py_XDECREF(value);
    if (out == -1.0 && PyErr_Occurred())
        *failed = 1;
    return out;
}

/* engine index from cluster.pick(session_id, head): -1 on error */
static int pick_with(Sim *sim, PyObject *session_id, PyObject *head)
{
    PyObject *got = PyObject_CallFunctionObjArgs(sim->pick, session_id, head, NULL);
    long index = got ? PyLong_AsLong(got) : -1;
    Py_XDECREF(got);
    if (index < 0 || index >= sim->n_engines) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_IndexError, "the router picked engine %ld of %zd", index, sim->n_engines);
        sim->failed = 1;
        return -1;
    }
    return (int)index;
}

/* source.next_session(opened) as a compiled session, NULL when the source has no more (or on error) */
static Session *session_open(Sim *sim, long long opened)
{
    PyObject *obj = PyObject_CallFunction(sim->next_session, "L", opened);
    if (obj == NULL) {
        sim->failed = 1;
        return NULL;
    }
    if (obj == Py_None) {
        Py_DECREF(obj);
        return NULL;
    }
    Session *s = PyMem_Calloc(1, sizeof(Session));
    PyObject *prefix = NULL, *ids = NULL;
    if (s == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (!Py_IS_TYPE(obj, (PyTypeObject *)sim->session_type)) {
        PyErr_Format(PyExc_TypeError, "the compiled batch simulation got a %s session", Py_TYPE(obj)->tp_name);
        goto fail;
    }
    int failed = 0;
    s->session_id = PyObject_GetAttrString(obj, "session_id");
    s->turn = get_long(obj, "turn", &failed);
    s->turns = get_long(obj, "turns", &failed);
    s->input_tokens = get_long(obj, "input_tokens", &failed);
    s->output_tokens = get_long(obj, "output_tokens", &failed);
    s->think_s = get_double(obj, "think_time_s", &failed);
    prefix = PyObject_GetAttrString(obj, "prefix");
    if (failed || s->session_id == NULL || prefix == NULL)
        goto fail;
    /* (index, word ids as bytes of int32): the prefix's words in the table, which may grow */
    ids = PyObject_CallOneArg(sim->prefix_ids, prefix);
    Py_ssize_t index;
    const char *raw;
    Py_ssize_t raw_len;
    if (ids == NULL || !PyArg_ParseTuple(ids, "ny#", &index, &raw, &raw_len) || refresh_words(sim) < 0)
        goto fail;
    Py_ssize_t n = raw_len / (Py_ssize_t)sizeof(int32_t);
    Py_ssize_t whole = n + (s->turns > 0 ? s->turns : 0) * (s->input_tokens + s->output_tokens);
    /* room for the whole conversation at once (a reply is at most output_tokens long) */
    if (append_tokens(sim, s, whole) < 0 ||
        (sim->hashing && GROW(s->hashes, s->cap_hashes, whole / sim->block_size + 1) < 0))
        goto fail;
    memcpy(s->tokens, raw, (size_t)n * sizeof(int32_t));
    s->n_tokens = n;
    if (sim->hashing) { /* a prefix's whole blocks hash the same in every session: worked out once */
        Py_ssize_t blocks = n / sim->block_size, known = sim->n_prefixes;
        if (index >= known) {
            if (GROW(sim->prefix_hashes, sim->n_prefixes, index + 1) < 0)
                goto fail;
            memset(sim->prefix_hashes + known, 0, (size_t)(sim->n_prefixes - known) * sizeof(int64_t *));
        }
        if (sim->prefix_hashes[index] == NULL) {
            hash_blocks(sim, s, blocks);
            sim->prefix_hashes[index] = PyMem_Malloc((size_t)(blocks ? blocks : 1) * sizeof(int64_t));
            if (sim->prefix_hashes[index] == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            memcpy(sim->prefix_hashes[index], s->hashes, (size_t)blocks * sizeof(int64_t));
        } else { /* the session's hashes have room for the whole conversation already */
            memcpy(s->hashes, sim->prefix_hashes[index], (size_t)blocks * sizeof(int64_t));
            s->n_hashes = blocks;
        }
    }
    s->route = -1;
    if (sim->routing == ROUTE_PER_SESSION) {
        PyObject *none = PyTuple_New(0);
        s->route = none ? pick_with(sim, s->session_id, none) : -1;
        Py_XDECREF(none);
        if (s->route < 0)
            goto fail;
    }
    if (sim->failed)
        goto fail;
    Py_DECREF(obj);
    Py_DECREF(prefix);
    Py_DECREF(ids);
    return s;
fail:
    sim->failed = 1;
    Py_DECREF(obj);
    Py_XDECREF(prefix);
    Py_XDECREF(ids);
    session_free(s);
    return NULL;
}

/* SyntheticSession.next_turn: 1 when there is one (its input is then in tokens, once), 0 when the session is over */
static int next_turn(Sim *sim, Session *s)
{
    if (s->turn >= s->turns)
        return 0;
    if (s->built)
        return 1;
    char key[256];
    const char *id = PyUnicode_AsUTF8(s->session_id);
    if (id == NULL) {
        sim->failed = 1;
        return 0;
    }
    /* words(f"{session_id}/t{turn}", input_tokens) */
    size_t id_len = strlen(id);
    char digits[24];
    int n_digits = 0;
    for (unsigned long turn = (unsigned long)s->turn; n_digits == 0 || turn; turn /= 10)
        digits[n_digits++] = (char)('0' + turn % 10);
    int key_len = (int)id_len + 2 + n_digits;
    if (id_len + 2 + (size_t)n_digits > sizeof key) {
        PyErr_SetString(PyExc_ValueError, "a session id too long for the compiled batch simulation");
        sim->failed = 1;
        return 0;
    }
    memcpy(key, id, id_len);
    key[id_len] = '/';
    key[id_len + 1] = 't';
    for (int d = 0; d < n_digits; d++)
        key[id_len + 2 + d] = digits[n_digits - 1 - d];
    Py_ssize_t n = s->input_tokens;
    uint8_t *bytes = PyMem_Malloc((size_t)(n ? n : 1));
    if (bytes == NULL || append_tokens(sim, s, n) < 0 || random_bytes(key, key_len, n, bytes) < 0) {
        if (bytes == NULL)
            PyErr_NoMemory();
        PyMem_Free(bytes);
        sim->failed = 1;
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        s->tokens[s->n_tokens + i] = sim->byte_word[bytes[i]];
    PyMem_Free(bytes);
    s->n_tokens += n;
    s->prompt_len = s->n_tokens;
    s->built = 1;
    return 1;
}

/* output_words(prompt, count, seed) appended to the session (record_words): SHAKE-128 of the prompt's last 64
   words joined by spaces and the seed's 8 big-endian bytes, two bytes a word */
static void record_reply(Sim *sim, Session *s, Py_ssize_t prompt_len, Py_ssize_t count)
{
    Py_ssize_t from = prompt_len > 64 ? prompt_len - 64 : 0, size = 8;
    for (Py_ssize_t i = from; i < prompt_len; i++)
        size += sim->text_len[s->tokens[i]] + 1;
    char *key = PyMem_Malloc((size_t)size);
    if (key == NULL) {
        PyErr_NoMemory();
        sim->failed = 1;
        return;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = from; i < prompt_len; i++) {
        if (i > from)
            key[at++] = ' ';
        memcpy(key + at, sim->text[s->tokens[i]], (size_t)sim->text_len[s->tokens[i]]);
        at += sim->text_len[s->tokens[i]];
    }
    for (int b = 7; b >= 0; b--)
        key[at++] = (char)((sim->seed >> (8 * b)) & 0xFF);
    PyObject *digest = digest_of(shake128_new, key, at, 2 * count);
    PyMem_Free(key);
    if (digest == NULL || append_tokens(sim, s, count) < 0) {
        Py_XDECREF(digest);
        sim->failed = 1;
        return;
    }
    const uint8_t *stream = (const uint8_t *)PyBytes_AS_STRING(digest);
    for (Py_ssize_t i = 0; i < count; i++) { /* memoryview.cast("H"): native (little-endian) 16-bit values */
        uint16_t value;
        memcpy(&value, stream + 2 * i, 2);
        s->tokens[s->n_tokens + i] = sim->value_word[value];
    }
    Py_DECREF(digest);
    s->n_tokens += count;
    s->turn++;
    s->built = 0;
}

/* ---- the step timer (StepTimer) ------------------------------------------------------------------------------ */
/* the next n jitter factors start at e->jitter[e->jitter_at] (blocks of 4,096 drawn as the reference draws them) */
static int jitter_ready(Sim *sim, Engine *e, Py_ssize_t n)
{
    while (e->n_jitter - e->jitter_at < n) {
        Py_ssize_t size = n > 4096 ? n : 4096;
        PyObject *block = PyObject_CallFunction(e->lognormal, "ddn", e->lognormal_mean, e->sigma, size);
        Py_buffer view;
        if (block == NULL || PyObject_GetBuffer(block, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            Py_XDECREF(block);
            sim->failed = 1;
            return -1;
        }
        Py_ssize_t left = e->n_jitter - e->jitter_at;
        if (view.itemsize != 8 || view.len != size * 8 || !view.format || strcmp(view.format, "d") != 0) {
            PyBuffer_Release(&view);
            Py_DECREF(block);
            PyErr_SetString(PyExc_TypeError, "the jitter draw did not return float64 values");
            sim->failed = 1;
            return -1;
        }
        memmove(e->jitter, e->jitter + e->jitter_at, (size_t)left * sizeof(double));
        e->jitter_at = 0;
        e->n_jitter = left;
        if (GROW(e->jitter, e->cap_jitter, left + size) < 0) {
            PyBuffer_Release(&view);
            Py_DECREF(block);
            sim->failed = 1;
            return -1;
        }
        memcpy(e->jitter + left, view.buf, (size_t)size * sizeof(double));
        e->n_jitter = left + size;
        PyBuffer_Release(&view);
        Py_DECREF(block);
    }
    return 0;
}

/* StepTimer.step_s; chunks[i] new tokens over computed[i] already in KV */
static double step_s(Sim *sim, Engine *e, const Py_ssize_t *chunks, const Py_ssize_t *computed, Py_ssize_t n_chunks,
                     long long ctx_sum, Py_ssize_t n_decodes, int jitter)
{
    long long tokens = n_decodes;
    double attn_flops = 0.0;
    int long_chunk = 0;
    for (Py_ssize_t i = 0; i < n_chunks; i++) {
        long long c = chunks[i], p = computed[i];
        tokens += c;
        attn_flops += (double)c * ((double)p + (double)c / 2);
        long_chunk = long_chunk || c > 1;
    }
    if (tokens == 0)
        return 0.0;
    double mfu = e->mfu_max * (double)tokens / ((double)tokens + e->t_half);
    double weights_read = e->weight_bytes;
    if (e->moe) { /* only the experts the batch's tokens route to are read */
        double touched = 1 - pow(e->moe_keep, (double)tokens);
        weights_read = e->weights_without_experts + e->expert_bytes * touched;
    }
    double compute = e->two_params_active * (double)tokens / (e->flops * mfu), read = weights_read / e->bw;
    double t_lin = read > compute ? read : compute;
    double t_attn = e->attn_coeff * attn_flops / (e->flops * e->mfu_attn) + (double)ctx_sum * e->kv_read_per_token_s;
    double t_comm = 0.0;
    if (e->tensor_parallel_size > 1) {
        long long act_bytes = tokens * e->q_heads * e->head_dim * 2;
        t_comm = (double)(2 * e->layers) * (25e-6 + (double)act_bytes / 450e9);
    }
    double fixed = e->fixed_s;
    if (long_chunk)
        fixed += e->prefill_fixed_s;
    double base = fixed + t_lin + t_attn + t_comm;
    if (jitter && e->sigma != 0.0) {
        if (jitter_ready(sim, e, 1) < 0)
            return base;
        base *= e->jitter[e->jitter_at++];
    }
    return base;
}

/* StepTimer.decode_run_s into out[0:steps] */
static void decode_run(Sim *sim, Engine *e, long long ctx_sum, Py_ssize_t n_decodes, Py_ssize_t steps, double *out)
{
    if (steps <= 0)
        return;
    if (!e->affine_known[n_decodes]) {
        double zero = step_s(sim, e, NULL, NULL, 0, 0, n_decodes, 0);
        e->affine_zero[n_decodes] = zero;
        e->affine_slope[n_decodes] = step_s(sim, e, NULL, NULL, 0, 1000000, n_decodes, 0) - zero;
        e->affine_known[n_decodes] = 1;
    }
    double at_zero = e->affine_zero[n_decodes], slope = e->affine_slope[n_decodes];
    double step_slope = slope * (double)n_decodes / 1000000;
    double first = at_zero + slope * (double)ctx_sum / 1000000;
    if (e->sigma == 0.0) {
        for (Py_ssize_t i = 0; i < steps; i++)
            out[i] = first + (double)i * step_slope;
        return;
    }
    if (jitter_ready(sim, e, steps) < 0)
        return;
    /* _draw(n) hands the next n factors over last first */
    const double *factors = e->jitter + e->jitter_at;
    for (Py_ssize_t i = 0; i < steps; i++)
        out[i] = (first + (double)i * step_slope) * factors[steps - 1 - i];
    e->jitter_at += steps;
}

static double cold_penalty_s(Engine *e, const Py_ssize_t *chunks, Py_ssize_t n_chunks)
{
    double penalty = 0.0;
    if (e->first_step_pending) {
        penalty += e->first_request_s;
        e->first_step_pending = 0;
    }
    for (Py_ssize_t i = 0; i < n_chunks; i++) {
        Py_ssize_t tokens = chunks[i];
        double exponent = ceil(log2((double)(tokens > 1 ? tokens : 1)));
        int k = exponent > 0 ? (int)exponent : 0;
        uint64_t shape = (uint64_t)1 << k;
        if (!(e->seen_shapes & shape)) {
            e->seen_shapes |= shape;
            penalty += e->first_use_ms_per_token * (double)tokens / 1e3;
        }
    }
    return penalty;
}

/* ---- the engine core (Engine) -------------------------------------------------------------------------------- */
static inline Py_ssize_t blocks_for(const Engine *e, Py_ssize_t tokens)
{
    return (tokens + e->block_size - 1) / e->block_size;
}

/* 1 when req holds blocks for ``tokens``, 0 when the pool is short */
static int grow(Sim *sim, Engine *e, Request *req, Py_ssize_t tokens)
{
    Py_ssize_t need = blocks_for(e, tokens) - req->n_blocks;
    if (need <= 0)
        return 1;
    if (need > e->pool->free)
        return 0;
    if (GROW(req->blocks, req->cap_blocks, req->n_blocks + need) < 0 ||
        pool_allocate_into(e->pool, need, req->blocks + req->n_blocks) < 0) {
        sim->failed = 1;
        return 0;
    }
    req->n_blocks += need;
    return 1;
}

static void free_blocks(Sim *sim, Engine *e, Request *req)
{
    if (pool_release_from(e->pool, req->blocks, req->n_blocks) < 0)
        sim->failed = 1;
    req->n_blocks = 0;
}

static void running_remove(Engine *e, Request *req)
{
    for (Py_ssize_t i = 0; i < e->n_running; i++)
        if (e->running[i] == req) {
            memmove(e->running + i, e->running + i + 1, (size_t)(e->n_running - i - 1) * sizeof(Request *));
            e->n_running--;
            break;
        }
    req->in_running = 0;
}

/* vLLM's order: the newest running request gives its blocks back; 0 when that was ``keep`` itself (or none ran) */
static int preempt_newest(Sim *sim, Engine *e, Request *keep)
{
    if (!e->n_running)
        return 0;
    Request *victim = e->running[--e->n_running];
    victim->in_running = 0;
    free_blocks(sim, e, victim);
    victim->num_computed = 0;
    victim->registered = 0;
    victim->admitted = 0;
    e->preemptions++;
    WAITING_PUSH(sim, e, victim, 1);
    return victim != keep;
}

static void plan_prefill(Sim *sim, Plan *plan, Request *req, Py_ssize_t chunk)
{
    if (plan->n_prefill == plan->cap_prefill) { /* the three columns grow together */
        Py_ssize_t cap = plan->cap_prefill, cap_chunks = cap, cap_computed = cap;
        if (GROW(plan->prefill, cap, cap + 1) < 0 || GROW(plan->chunks, cap_chunks, cap + 1) < 0 ||
            GROW(plan->computed, cap_computed, cap + 1) < 0) {
            sim->failed = 1;
            return;
        }
        plan->cap_prefill = cap;
    }
    plan->prefill[plan->n_prefill] = req;
    plan->chunks[plan->n_prefill++] = chunk;
}

static void plan_decode(Sim *sim, Plan *plan, Request *req)
{
    if (GROW(plan->decode, plan->cap_decode, plan->n_decode + 1) < 0) {
        sim->failed = 1;
        return;
    }
    plan->decode[plan->n_decode++] = req;
}

/* Engine.schedule: 1 with e->plan made, 0 when there is nothing to run */
static int schedule(Sim *sim, Engine *e)
{
    e->clock_s = e->clock_s > sim->now ? e->clock_s : sim->now;
    if (e->clock_s < e->serving_from_s)
        return 0; /* still starting */
    Plan *plan = &e->plan;
    plan->n_prefill = plan->n_decode = plan->n_steps = 0;
    Py_ssize_t budget = e->max_num_batched_tokens, bs = e->block_size;
    long long preemptions = e->preemptions;
    if (GROW(e->snapshot, e->cap_snapshot, e->n_running) < 0) {
        sim->failed = 1;
        return 0;
    }
    Py_ssize_t n_snapshot = e->n_running;
    memcpy(e->snapshot, e->running, (size_t)n_snapshot * sizeof(Request *));
    for (Py_ssize_t k = 0; k < n_snapshot; k++) {
        Request *req = e->snapshot[k];
        if (e->preemptions != preemptions && !req->in_running)
            continue; /* preempted while making room for an earlier one */
        if (req->num_computed < req->prompt_len) {
            Py_ssize_t chunk = req->prompt_len - req->num_computed;
            chunk = chunk < budget ? chunk : budget;
            if (chunk <= 0)
                continue;
            int placed = 1;
            while (!grow(sim, e, req, req->num_computed + chunk))
                if (!preempt_newest(sim, e, req)) {
                    placed = 0;
                    break;
                }
            if (placed) {
                plan_prefill(sim, plan, req, chunk);
                budget -= chunk;
            }
            continue;
        }
        if (budget <= 0)
            break;
        if (req->n_blocks * bs > req->prompt_len + req->output) { /* room for the next token already */
            plan_decode(sim, plan, req);
            budget -= 1;
            continue;
        }
        int placed = 1;
        while (!grow(sim, e, req, req->prompt_len + req->output + 1))
            if (!preempt_newest(sim, e, req)) {
                placed = 0;
                break;
            }
        if (placed) {
            plan_decode(sim, plan, req);
            budget -= 1;
        }
    }
    /* as vLLM: a step that had to preempt admits nobody from the waiting queue (not even the preempted) */
    while (e->n_waiting && budget > 0 && e->n_running < e->max_num_seqs && e->preemptions == preemptions &&
           !sim->failed) {
        Request *req = e->waiting[e->waiting_head];
        int fresh = !req->admitted; /* looked up now: its hit blocks are taken only with the blocks it needs */
        char had_device = req->has_device;
        Py_ssize_t device_before = req->device;
        if (fresh) {
            Py_ssize_t max_hit = req->prompt_len >= 1 ? (req->prompt_len - 1) / bs : 0;
            if (max_hit > req->n_hashes)
                max_hit = req->n_hashes;
            Py_ssize_t hit = 0;
            if (e->prefix_caching && max_hit > 0) {
                if (GROW(req->blocks, req->cap_blocks, max_hit) < 0) {
                    sim->failed = 1;
                    return 0;
                }
                hit = pool_prefix_into(e->pool, req->session->hashes, max_hit, req->blocks, 1);
            }
            req->n_blocks = hit; /* a new sequence: the request's own */
            req->registered = hit;
            req->num_computed = hit * bs;
            if (req->num_computed) {
                req->has_device = 1;
                req->device = req->num_computed;
            }
            e->prefix_queries += req->prompt_len;
            e->prefix_hits += req->num_computed;
            e->prompt_tokens += req->prompt_len;
            req->admitted = 1;
            req->cached_tokens = req->num_computed; /* no tiers: what the GPU hit gave */
        }
        Py_ssize_t chunk = req->prompt_len - req->num_computed;
        chunk = chunk < budget ? chunk : budget;
        if (!grow(sim, e, req, req->num_computed + chunk)) {
            if (fresh) { /* wait for blocks to free up, holding none (Engine._unadmit) */
                Py_ssize_t hit_tokens = req->num_computed;
                free_blocks(sim, e, req);
                req->num_computed = req->registered = 0;
                req->admitted = 0;
                e->prefix_queries -= req->prompt_len;
                e->prefix_hits -= hit_tokens;
                e->prompt_tokens -= req->prompt_len;
                req->has_device = had_device;
                req->device = device_before;
            }
            break;
        }
        ring_pop_front((void **)e->waiting, &e->waiting_head, &e->n_waiting, e->cap_waiting);
        if (GROW(e->running, e->cap_running, e->n_running + 1) < 0) {
            sim->failed = 1;
            return 0;
        }
        e->running[e->n_running++] = req;
        req->in_running = 1;
        plan_prefill(sim, plan, req, chunk);
        budget -= chunk;
    }
    if (!plan->n_prefill && !plan->n_decode)
        return 0;
    for (Py_ssize_t i = 0; i < plan->n_prefill; i++)
        plan->computed[i] = plan->prefill[i]->num_computed;
    long long ctx_sum = 0;
    for (Py_ssize_t i = 0; i < plan->n_decode; i++)
        ctx_sum += plan->decode[i]->prompt_len + plan->decode[i]->output;
    double step = step_s(sim, e, plan->chunks, plan->computed, plan->n_prefill, ctx_sum, plan->n_decode, 1);
    plan->duration_s = step + cold_penalty_s(e, plan->chunks, plan->n_prefill);
    return 1;
}

/* Engine.schedule_run: the next step, with the identical pure-decode steps after it fused into it */
static int schedule_run(Sim *sim, Engine *e)
{
    if (!schedule(sim, e))
        return 0;
    Plan *plan = &e->plan;
    if (plan->n_prefill || e->n_waiting || !plan->n_decode)
        return 1;
    long steps = 256;
    for (Py_ssize_t i = 0; i < plan->n_decode; i++) {
        long left = plan->decode[i]->max_tokens - plan->decode[i]->output;
        steps = left < steps ? left : steps;
    }
    if (steps <= 1)
        return 1;
    Py_ssize_t need = 0;
    for (Py_ssize_t i = 0; i < plan->n_decode; i++) {
        Request *r = plan->decode[i];
        Py_ssize_t more = blocks_for(e, r->prompt_len + r->output + steps) - r->n_blocks;
        need += more > 0 ? more : 0;
    }
    if (need > e->pool->free)
        return 1; /* the pool is short: step by step, so the ordinary scheduler can preempt */
    long long ctx = 0;
    for (Py_ssize_t i = 0; i < plan->n_decode; i++) {
        Request *r = plan->decode[i];
        grow(sim, e, r, r->prompt_len + r->output + steps);
        ctx += r->prompt_len + r->output;
    }
    if (GROW(plan->steps, plan->cap_steps, steps) < 0) {
        sim->failed = 1;
        return 1;
    }
    plan->steps[0] = plan->duration_s;
    decode_run(sim, e, ctx + plan->n_decode, plan->n_decode, steps - 1, plan->steps + 1);
    plan->n_steps = steps;
    double total = plan->steps[0]; /* left to right, as the reference adds them */
    for (Py_ssize_t i = 1; i < steps; i++)
        total += plan->steps[i];
    plan->duration_s = total;
    return 1;
}

/* ``tokens`` more output tokens; 1 when that finishes the request (its blocks go back) */
static int produce(Sim *sim, Engine *e, Request *req, long tokens)
{
    req->output += tokens;
    e->generation_tokens += tokens;
    if (req->output < req->max_tokens)
        return 0;
    req->finished = 1;
    running_remove(e, req);
    free_blocks(sim, e, req);
    e->requests_finished++;
    return 1;
}

static void register_full_blocks(Engine *e, Request *req)
{
    Py_ssize_t full = req->num_computed / e->block_size;
    full = full < req->n_hashes ? full : req->n_hashes;
    full = full < req->n_blocks ? full : req->n_blocks;
    if (full > req->registered) { /* blocks hit or registered before are cached already */
        pool_register_range(e->pool, req->blocks, req->session->hashes, req->registered, full);
        req->registered = full;
    }
}

/* ---- the simulation (Simulation) ----------------------------------------------------------------------------- */
static void send(Sim *sim, Session *s);
static void kick(Sim *sim, int index);

static int add_time(Sim *sim, Request *req, double t)
{
    if (GROW(req->times, req->cap_times, req->n_times + 1) < 0) {
        sim->failed = 1;
        return -1;
    }
    req->times[req->n_times++] = t;
    return 0;
}

static int flush_records(Sim *sim)
{
    if (!sim->n_out)
        return 0;
    PyObject *result = PyObject_CallFunction(
        sim->flush, "y#Oy#y#y#y#y#y#y#y#", (const char *)sim->numbers, sim->n_out * 8, sim->sessions,
        (const char *)sim->turns, sim->n_out * 8, (const char *)sim->starts, sim->n_out * 8, (const char *)sim->prompts,
        sim->n_out * 8, (const char *)sim->cached, sim->n_out * 8, (const char *)sim->times, sim->n_times_out * 8,
        (const char *)sim->counts, sim->n_out * 8, (const char *)sim->orders, sim->n_out * 2,
        (const char *)sim->source_values, sim->n_values_out * 8);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    sim->flushed += sim->n_out;
    sim->n_out = sim->n_times_out = sim->n_values_out = 0;
    Py_SETREF(sim->sessions, PyList_New(0));
    return sim->sessions == NULL ? -1 : 0;
}

static void record(Sim *sim, Request *req)
{
    Py_ssize_t n = sim->n_out;
    if (n == sim->cap_out) { /* the per-request columns grow together */
        Py_ssize_t c[7] = {n, n, n, n, n, n, n};
        if (GROW(sim->numbers, c[0], n + 1) < 0 || GROW(sim->turns, c[1], n + 1) < 0 ||
            GROW(sim->prompts, c[2], n + 1) < 0 || GROW(sim->cached, c[3], n + 1) < 0 ||
            GROW(sim->counts, c[4], n + 1) < 0 || GROW(sim->starts, c[5], n + 1) < 0 ||
            GROW(sim->orders, c[6], n + 1) < 0) {
            sim->failed = 1;
            return;
        }
        sim->cap_out = c[0];
    }
    if (GROW(sim->times, sim->cap_times_out, sim->n_times_out + req->n_times) < 0 ||
        GROW(sim->source_values, sim->cap_values_out, sim->n_values_out + 2) < 0 ||
        PyList_Append(sim->sessions, req->session->session_id) < 0) {
        sim->failed = 1;
        return;
    }
    sim->numbers[n] = req->number;
    sim->turns[n] = req->turn;
    sim->starts[n] = req->start_s - sim->t0;
    sim->prompts[n] = req->prompt_len;
    sim->cached[n] = req->cached_tokens;
    sim->counts[n] = req->n_times;
    memcpy(sim->times + sim->n_times_out, req->times, (size_t)req->n_times * sizeof(double));
    sim->n_times_out += req->n_times;
    /* the engine's account: {"device": hit} if the GPU hit, then "recomputed": the rest */
    Py_ssize_t device = req->has_device ? req->device : 0, recomputed = req->prompt_len - device;
    if (req->has_device) {
        sim->orders[n] = sim->order_device;
        sim->source_values[sim->n_values_out++] = device;
    } else
        sim->orders[n] = sim->order_recomputed;
    sim->source_values[sim->n_values_out++] = recomputed > 0 ? recomputed : 0;
    sim->n_out = n + 1;
    if (sim->n_out >= 16384 && flush_records(sim) < 0)
        sim->failed = 1;
}

static void ready_push(Sim *sim, Session *s)
{
    if (ring_push((void ***)&sim->ready, &sim->ready_head, &sim->n_ready, &sim->cap_ready, s, 0) < 0)
        sim->failed = 1;
}

/* Simulation._next_turn: request rate, the session waits for an arrival to carry its turn; closed loop, it sends
   the turn after its gap, and a finished session's user begins another */
static void after_turn(Sim *sim, Session *s, int first)
{
    if (!next_turn(sim, s)) {
        long user = s->user;
        session_free(s);
        if (sim->closed_loop && !sim->one_session_each)
            push(sim, sim->now, EV_SESSION, (int)user, 0, NULL);
        return;
    }
    double gap = !first && sim->honor_gaps && s->turn > 0 ? s->think_s : 0.0;
    if (sim->closed_loop) {
        if (sim->now + gap >= sim->deadline)
            session_free(s); /* the user is done */
        else
            push(sim, sim->now + gap, EV_SEND, 0, 0, s);
    } else if (gap <= 0)
        ready_push(sim, s);
    else
        push(sim, sim->now + gap, EV_READY, 0, 0, s);
}

/* Simulation._begin_session: closed loop, a user's next session */
static void begin_session(Sim *sim, long user)
{
    if (sim->now >= sim->deadline)
        return;
    Session *s = session_open(sim, user);
    if (s == NULL)
        return;
    s->user = user;
    after_turn(sim, s, 1);
}

static void finish(Sim *sim, Request *req)
{
    sim->pending--;
    sim->in_flight--;
    record(sim, req);
    Session *s = req->session;
    record_reply(sim, s, req->prompt_len, req->n_times);
    req->session = NULL; /* the session goes on */
    request_free(req);
    if (sim->n_queued) {
        Session *next = ring_pop_front((void **)sim->queued, &sim->queued_head, &sim->n_queued, sim->cap_queued);
        send(sim, next);
    }
    after_turn(sim, s, 0);
}

/* Simulation._cut_short: a request reached an engine in the middle of fused decode steps */
static void cut_short(Sim *sim, int index)
{
    Engine *e = &sim->engines[index];
    if (!e->has_plan || !e->plan.n_steps)
        return;
    double t = e->plan_start;
    Py_ssize_t keep = 0;
    for (Py_ssize_t i = 0; i < e->plan.n_steps; i++) {
        t += e->plan.steps[i];
        keep++;
        if (t >= sim->now)
            break;
    }
    if (keep == e->plan.n_steps)
        return;
    e->plan.n_steps = keep;
    e->plan.duration_s = t - e->plan_start;
    e->plan_token = sim->seq++;
    push(sim, t, EV_STEP, index, e->plan_token, NULL);
}

static void intake(Sim *sim, Request *req)
{
    int index = req->engine;
    Engine *e = &sim->engines[index];
    if (sim->hashing) { /* Engine.add: the prompt's block hashes (the conversation's earlier ones reused) */
        req->n_hashes = req->prompt_len / sim->block_size;
        hash_blocks(sim, req->session, req->n_hashes);
    }
    WAITING_PUSH(sim, e, req, 0);
    cut_short(sim, index);
    kick(sim, index);
}

static int route(Sim *sim, Session *s)
{
    Py_ssize_t n = sim->n_engines;
    if (n == 1)
        return 0;
    switch (sim->routing) {
    case ROUTE_PER_SESSION:
        return s->route;
    case ROUTE_LEAST_QUEUED: {
        int best = 0;
        for (Py_ssize_t i = 1; i < n; i++)
            if (sim->engines[i].n_running + sim->engines[i].n_waiting <
                sim->engines[best].n_running + sim->engines[best].n_waiting)
                best = (int)i;
        return best;
    }
    case ROUTE_PER_REQUEST: { /* cluster.pick with the prompt's first 256 words */
        Py_ssize_t head = s->prompt_len < 256 ? s->prompt_len : 256;
        PyObject *words = PyTuple_New(head);
        if (words == NULL) {
            sim->failed = 1;
            return 0;
        }
        for (Py_ssize_t i = 0; i < head; i++) {
            PyObject *word = PyList_GET_ITEM(sim->words, s->tokens[i]);
            Py_INCREF(word);
            PyTuple_SET_ITEM(words, i, word);
        }
        int index = pick_with(sim, s->session_id, words);
        Py_DECREF(words);
        return index < 0 ? 0 : index;
    }
    default: {
        int index = (int)sim->rr_next;
        sim->rr_next = (sim->rr_next + 1) % n;
        return index;
    }
    }
}

/* Simulation._send of the session's built turn */
static void send(Sim *sim, Session *s)
{
    if (sim->max_concurrency && sim->in_flight >= sim->max_concurrency) {
        if (ring_push((void ***)&sim->queued, &sim->queued_head, &sim->n_queued, &sim->cap_queued, s, 0) < 0)
            sim->failed = 1;
        return;
    }
    sim->in_flight++;
    Request *req = PyMem_Calloc(1, sizeof(Request));
    if (req == NULL) {
        PyErr_NoMemory();
        sim->failed = 1;
        return;
    }
    req->session = s;
    req->number = sim->next_number++;
    req->turn = s->turn;
    req->start_s = sim->now;
    req->prompt_len = s->prompt_len;
    req->max_tokens = s->output_tokens;
    sim->pending++;
    req->engine = route(sim, s);
    Engine *e = &sim->engines[req->engine];
    double intake_s = (e->request_ms + e->request_us_per_token * (double)req->prompt_len / 1e3) / 1e3;
    if (intake_s > 0) /* the serving path in front of the engine: the request reaches its queue later */
        push(sim, sim->now + intake_s, EV_INTAKE, 0, 0, req);
    else
        intake(sim, req);
}

static void kick(Sim *sim, int index)
{
    Engine *e = &sim->engines[index];
    if (e->busy || sim->failed)
        return;
    if (schedule_run(sim, e)) {
        e->busy = 1;
        e->has_wake = 0;
        e->has_plan = 1;
        e->plan_start = sim->now;
        e->plan_token = sim->seq++;
        push(sim, sim->now + e->plan.duration_s, EV_STEP, index, e->plan_token, NULL);
        return;
    }
    /* idle until the engine is up (no tiers: no transfer lands) */
    if (e->serving_from_s > sim->now && !(e->has_wake && e->wake_at == e->serving_from_s)) {
        e->has_wake = 1;
        e->wake_at = e->serving_from_s;
        push(sim, e->serving_from_s, EV_WAKE, index, 0, NULL);
    }
}

static void step_done(Sim *sim, int index)
{
    Engine *e = &sim->engines[index];
    Plan *plan = &e->plan;
    e->busy = 0;
    e->has_plan = 0;
    e->clock_s = e->clock_s > sim->now ? e->clock_s : sim->now;
    /* what the step produced, before any of it is acted on (a finish may send a request to this engine); the
       scratch is the simulation's: a step's completion never runs inside another's */
    Py_ssize_t n = plan->n_steps ? plan->n_decode : plan->n_prefill + plan->n_decode;
    Py_ssize_t count = 0, k = plan->n_steps;
    Py_ssize_t cap_done = sim->cap_done; /* done_list's and done's, which grow together */
    if (GROW(sim->done_list, sim->cap_done, n) < 0 || GROW(sim->done, cap_done, n) < 0 ||
        GROW(sim->step_times, sim->cap_step_times, k) < 0) {
        sim->failed = 1;
        kick(sim, index);
        return;
    }
    Request **done_list = sim->done_list;
    char *done = sim->done;
    double *times = sim->step_times;
    if (k) { /* fused decode steps: each request's token times at once */
        double t = sim->now - plan->duration_s;
        for (Py_ssize_t i = 0; i < k; i++) {
            t += plan->steps[i];
            times[i] = t;
        }
        for (Py_ssize_t i = 0; i < plan->n_decode; i++) {
            Request *req = plan->decode[i];
            if (req->finished)
                continue;
            done_list[count] = req;
            done[count++] = (char)produce(sim, e, req, k);
        }
        for (Py_ssize_t i = 0; i < count && !sim->failed; i++) {
            Request *req = done_list[i];
            double start = req->start_s;
            for (Py_ssize_t j = 0; j < k; j++)
                if (add_time(sim, req, times[j] - start) < 0)
                    break;
            if (done[i])
                finish(sim, req);
        }
    } else {
        for (Py_ssize_t i = 0; i < plan->n_prefill; i++) {
            Request *req = plan->prefill[i];
            if (req->finished || !req->admitted) /* preempted after this plan was made */
                continue;
            req->num_computed += plan->chunks[i];
            register_full_blocks(e, req);
            if (req->num_computed >= req->prompt_len) {
                done_list[count] = req;
                done[count++] = (char)produce(sim, e, req, 1);
            }
        }
        for (Py_ssize_t i = 0; i < plan->n_decode; i++) {
            Request *req = plan->decode[i];
            if (req->finished || !req->admitted)
                continue;
            done_list[count] = req;
            done[count++] = (char)produce(sim, e, req, 1);
        }
        for (Py_ssize_t i = 0; i < count && !sim->failed; i++) {
            Request *req = done_list[i];
            if (add_time(sim, req, sim->now - req->start_s) < 0)
                break;
            if (done[i])
                finish(sim, req);
        }
    }
    kick(sim, index);
}

static double next_gap(Sim *sim)
{
    PyObject *gap = PyIter_Next(sim->gaps);
    if (gap == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the arrival gaps ran out");
        sim->failed = 1;
        return 0.0;
    }
    double value = PyFloat_AsDouble(gap);
    Py_DECREF(gap);
    if (value == -1.0 && PyErr_Occurred())
        sim->failed = 1;
    return value;
}

/* Simulation._arrival */
static void arrival(Sim *sim)
{
    if (sim->now >= sim->deadline)
        return;
    Session *s = NULL;
    if (sim->n_ready)
        s = ring_pop_front((void **)sim->ready, &sim->ready_head, &sim->n_ready, sim->cap_ready);
    if (s == NULL && !sim->exhausted) {
        s = session_open(sim, sim->opened);
        sim->opened++;
        sim->exhausted = s == NULL;
        if (sim->failed)
            return;
    }
    if (s != NULL) {
        if (next_turn(sim, s))
            send(sim, s);
        else
            session_free(s);
    } else if (sim->exhausted && !sim->pending)
        return;
    push(sim, sim->now + next_gap(sim), EV_ARRIVAL, 0, 0, NULL);
}

static void report_progress(Sim *sim)
{
    double wall = monotonic_s();
    if (wall - sim->progress_at >= sim->progress_every_s) {
        sim->progress_at = wall;
        PyObject *r = PyObject_CallFunction(sim->progress, "dL", sim->now - sim->t0, sim->flushed + sim->n_out);
        if (r == NULL)
            sim->failed = 1;
        Py_XDECREF(r);
    }
}

static void run_loop(Sim *sim)
{
    if (sim->closed_loop)
        for (Py_ssize_t i = 0; i < sim->n_users; i++)
            push(sim, sim->t0, EV_SESSION, (int)sim->users[i], 0, NULL);
    else
        push(sim, sim->t0 + next_gap(sim), EV_ARRIVAL, 0, 0, NULL);
    unsigned long long events = 0;
    while (sim->n_heap && !sim->failed) {
        Event event = pop(sim);
        sim->now = event.at;
        events++;
        if (!(events & 4095)) { /* the clock is read once per 4,096 events, and Ctrl-C heard */
            if (PyErr_CheckSignals() < 0) {
                sim->failed = 1;
                break;
            }
            if (sim->progress != Py_None)
                report_progress(sim);
        }
        switch (event.kind) {
        case EV_STEP: {
            Engine *e = &sim->engines[event.index];
            if (e->has_plan && e->plan_token == event.token)
                step_done(sim, event.index);
            break;
        }
        case EV_WAKE: {
            Engine *e = &sim->engines[event.index];
            if (e->has_wake && e->wake_at == event.at) {
                e->has_wake = 0;
                kick(sim, event.index);
            }
            break;
        }
        case EV_ARRIVAL:
            arrival(sim);
            break;
        case EV_READY:
            ready_push(sim, event.item);
            break;
        case EV_INTAKE:
            intake(sim, event.item);
            break;
        case EV_SESSION:
            begin_session(sim, event.index);
            break;
        case EV_SEND:
            send(sim, event.item);
            break;
        }
    }
}

/* ---- state in and out ---------------------------------------------------------------------------------------- */
static int engine_in(Engine *e, PyObject *spec)
{
    int failed = 0;
    PyObject *pool = PyObject_GetAttrString(spec, "pool");
    if (pool == NULL)
        return -1;
    if (!PyObject_TypeCheck(pool, &BlockPoolType)) {
        Py_DECREF(pool);
        PyErr_SetString(PyExc_TypeError, "the compiled batch simulation needs the compiled block pool");
        return -1;
    }
    e->pool = (BlockPool *)pool; /* a reference held until the run ends */
    e->lognormal = PyObject_GetAttrString(spec, "lognormal");
    if (e->lognormal == NULL)
        return -1;
#define LONG(field) e->field = get_long(spec, #field, &failed)
#define DOUBLE(field) e->field = get_double(spec, #field, &failed)
    LONG(block_size);
    LONG(max_num_seqs);
    LONG(max_num_batched_tokens);
    LONG(prefix_caching);
    DOUBLE(serving_from_s);
    DOUBLE(clock_s);
    LONG(first_step_pending);
    DOUBLE(first_request_s);
    DOUBLE(first_use_ms_per_token);
    DOUBLE(request_ms);
    DOUBLE(request_us_per_token);
    DOUBLE(flops);
    DOUBLE(bw);
    DOUBLE(fixed_s);
    DOUBLE(prefill_fixed_s);
    DOUBLE(attn_coeff);
    DOUBLE(kv_read_per_token_s);
    DOUBLE(mfu_max);
    DOUBLE(t_half);
    DOUBLE(mfu_attn);
    DOUBLE(weight_bytes);
    DOUBLE(two_params_active);
    LONG(moe);
    DOUBLE(moe_keep);
    DOUBLE(weights_without_experts);
    DOUBLE(expert_bytes);
    LONG(tensor_parallel_size);
    LONG(layers);
    LONG(q_heads);
    LONG(head_dim);
    DOUBLE(sigma);
    DOUBLE(lognormal_mean);
#undef LONG
#undef DOUBLE
    PyObject *shapes = PyObject_GetAttrString(spec, "seen_shapes");
    e->seen_shapes = shapes ? PyLong_AsUnsignedLongLong(shapes) : 0;
    Py_XDECREF(shapes);
    PyObject *counters = PyObject_GetAttrString(spec, "counters");
    if (counters == NULL ||
        !PyArg_ParseTuple(counters, "LLLLLL", &e->prompt_tokens, &e->generation_tokens, &e->prefix_queries,
                          &e->prefix_hits, &e->preemptions, &e->requests_finished)) {
        Py_XDECREF(counters);
        return -1;
    }
    Py_DECREF(counters);
    PyObject *jitter = PyObject_GetAttrString(spec, "jitter"); /* the factors still to use, next first */
    if (jitter == NULL || failed || PyErr_Occurred()) {
        Py_XDECREF(jitter);
        return -1;
    }
    PyObject *fast = PySequence_Fast(jitter, "jitter must be a sequence");
    Py_DECREF(jitter);
    if (fast == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (GROW(e->jitter, e->cap_jitter, n ? n : 1) < 0) {
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        e->jitter[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
    Py_DECREF(fast);
    e->n_jitter = n;
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t sizes = e->max_num_seqs + 1;
    e->affine_zero = PyMem_Calloc((size_t)sizes, sizeof(double));
    e->affine_slope = PyMem_Calloc((size_t)sizes, sizeof(double));
    e->affine_known = PyMem_Calloc((size_t)sizes, 1);
    if (!e->affine_zero || !e->affine_slope || !e->affine_known) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static PyObject *engine_out(Engine *e)
{
    PyObject *jitter = PyList_New(e->n_jitter - e->jitter_at);
    for (Py_ssize_t i = 0; jitter && i < e->n_jitter - e->jitter_at; i++) {
        PyObject *value = PyFloat_FromDouble(e->jitter[e->jitter_at + i]);
        if (value == NULL) {
            Py_CLEAR(jitter);
            break;
        }
        PyList_SET_ITEM(jitter, i, value);
    }
    if (jitter == NULL)
        return NULL;
    return Py_BuildValue("{s:d,s:i,s:K,s:(LLLLLL),s:N}", "clock_s", e->clock_s, "first_step_pending",
                         e->first_step_pending, "seen_shapes", (unsigned long long)e->seen_shapes, "counters",
                         e->prompt_tokens, e->generation_tokens, e->prefix_queries, e->prefix_hits, e->preemptions,
                         e->requests_finished, "jitter", jitter);
}

static void engine_free(Engine *e)
{
    Py_XDECREF(e->pool);
    Py_XDECREF(e->lognormal);
    PyMem_Free(e->jitter);
    PyMem_Free(e->affine_zero);
    PyMem_Free(e->affine_slope);
    PyMem_Free(e->affine_known);
    PyMem_Free(e->waiting);
    PyMem_Free(e->running);
    PyMem_Free(e->snapshot);
    PyMem_Free(e->plan.prefill);
    PyMem_Free(e->plan.chunks);
    PyMem_Free(e->plan.computed);
    PyMem_Free(e->plan.decode);
    PyMem_Free(e->plan.steps);
}

static void sim_free(Sim *sim)
{
    for (Py_ssize_t i = 0; sim->engines && i < sim->n_engines; i++) {
        /* requests a stalled or failed run left (their blocks stay taken in the engine's pool, as the Python
           reference leaves them in its queues) */
        Engine *e = &sim->engines[i];
        for (Py_ssize_t k = 0; k < e->n_waiting; k++)
            request_free(e->waiting[(e->waiting_head + k) % e->cap_waiting]);
        for (Py_ssize_t k = 0; k < e->n_running; k++)
            request_free(e->running[k]);
        engine_free(e);
    }
    PyMem_Free(sim->engines);
    /* whatever a failed run left: requests in flight (their sessions with them), waiting sessions */
    for (Py_ssize_t i = 0; i < sim->n_heap; i++) {
        if (sim->heap[i].kind == EV_READY || sim->heap[i].kind == EV_SEND)
            session_free(sim->heap[i].item);
        else if (sim->heap[i].kind == EV_INTAKE)
            request_free(sim->heap[i].item);
    }
    PyMem_Free(sim->heap);
    for (Py_ssize_t k = 0; k < sim->n_ready; k++)
        session_free(sim->ready[(sim->ready_head + k) % sim->cap_ready]);
    for (Py_ssize_t k = 0; k < sim->n_queued; k++)
        session_free(sim->queued[(sim->queued_head + k) % sim->cap_queued]);
    PyMem_Free(sim->ready);
    PyMem_Free(sim->queued);
    PyMem_Free(sim->lanes);
    PyMem_Free((void *)sim->text);
    PyMem_Free(sim->text_len);
    PyMem_Free(sim->value_word);
    for (Py_ssize_t k = 0; k < sim->n_prefixes; k++)
        PyMem_Free(sim->prefix_hashes[k]);
    PyMem_Free(sim->prefix_hashes);
    PyMem_Free(sim->numbers);
    PyMem_Free(sim->turns);
    PyMem_Free(sim->prompts);
    PyMem_Free(sim->cached);
    PyMem_Free(sim->counts);
    PyMem_Free(sim->source_values);
    PyMem_Free(sim->starts);
    PyMem_Free(sim->times);
    PyMem_Free(sim->orders);
    PyMem_Free(sim->users);
    PyMem_Free(sim->done_list);
    PyMem_Free(sim->done);
    PyMem_Free(sim->step_times);
    Py_XDECREF(sim->sessions);
}

static int table_in(PyObject *obj, int32_t *out, Py_ssize_t n, const char *what)
{
    PyObject *fast = PySequence_Fast(obj, what);
    if (fast == NULL)
        return -1;
    if (PySequence_Fast_GET_SIZE(fast) != n) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_ValueError, "%s: %zd entries expected", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long value = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
        out[i] = (int32_t)value;
    }
    Py_DECREF(fast);
    return PyErr_Occurred() ? -1 : 0;
}

/* run_batch(spec): spec's attributes are the run's (kvbench_sim.fastpath.NativeRun); returns what it leaves */
PyObject *batch_run(PyObject *module, PyObject *args)
{
    PyObject *spec;
    if (!PyArg_ParseTuple(args, "O:run_batch", &spec))
        return NULL;
    if (hashers_ready() < 0)
        return NULL;
    Sim sim_storage = {0};
    Sim *sim = &sim_storage;
    PyObject *out = NULL, *engines = NULL, *byte_word = NULL, *value_word = NULL;
    int failed = 0;
    sim->sessions = PyList_New(0);
    engines = PyObject_GetAttrString(spec, "engines");
    byte_word = PyObject_GetAttrString(spec, "byte_word");
    value_word = PyObject_GetAttrString(spec, "value_word");
    sim->value_word = PyMem_Malloc(65536 * sizeof(int32_t));
    if (sim->sessions == NULL || engines == NULL || byte_word == NULL || value_word == NULL ||
        sim->value_word == NULL || table_in(byte_word, sim->byte_word, 256, "byte_word") < 0 ||
        table_in(value_word, sim->value_word, 65536, "value_word") < 0)
        goto done;
    sim->now = sim->t0 = get_double(spec, "t0", &failed);
    sim->deadline = get_double(spec, "deadline", &failed);
    sim->routing = (int)get_long(spec, "routing", &failed);
    sim->honor_gaps = (int)get_long(spec, "honor_gaps", &failed);
    sim->closed_loop = (int)get_long(spec, "closed_loop", &failed);
    sim->one_session_each = (int)get_long(spec, "one_session_each", &failed);
    sim->rr_next = get_long(spec, "rr_next", &failed);
    sim->max_concurrency = get_long(spec, "max_concurrency", &failed);
    sim->next_number = get_long(spec, "next_number", &failed);
    sim->hashing = (int)get_long(spec, "hashing", &failed);
    sim->block_size = get_long(spec, "block_size", &failed);
    sim->order_device = (uint16_t)get_long(spec, "order_device", &failed);
    sim->order_recomputed = (uint16_t)get_long(spec, "order_recomputed", &failed);
    sim->progress_every_s = get_double(spec, "progress_every_s", &failed);
    sim->progress_at = get_double(spec, "progress_at", &failed);
    PyObject *seed = PyObject_GetAttrString(spec, "seed");
    sim->seed = seed ? PyLong_AsUnsignedLongLong(seed) : 0;
    Py_XDECREF(seed);
    if (failed || PyErr_Occurred())
        goto done;
    if (sim->block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be at least 1");
        goto done;
    }
    /* borrowed for the run: spec holds them */
    PyObject **slots[] = {&sim->gaps, &sim->next_session, &sim->session_type, &sim->prefix_ids,
                          &sim->pick,  &sim->words,        &sim->flush,        &sim->progress};
    const char *names[] = {"gaps", "next_session", "session_type", "prefix_ids", "pick", "words", "flush", "progress"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *slots[i] = PyObject_GetAttrString(spec, names[i]);
        if (*slots[i] == NULL)
            goto done;
        Py_DECREF(*slots[i]);
    }
    PyObject *users = PyObject_GetAttrString(spec, "users");
    PyObject *users_fast = users ? PySequence_Fast(users, "users must be a sequence") : NULL;
    Py_XDECREF(users);
    if (users_fast == NULL)
        goto done;
    sim->n_users = PySequence_Fast_GET_SIZE(users_fast);
    sim->users = PyMem_Malloc((size_t)(sim->n_users ? sim->n_users : 1) * sizeof(long));
    for (Py_ssize_t i = 0; sim->users && i < sim->n_users; i++)
        sim->users[i] = PyLong_AsLong(PySequence_Fast_GET_ITEM(users_fast, i));
    Py_DECREF(users_fast);
    if (sim->users == NULL || PyErr_Occurred()) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    if (!PyList_Check(sim->words)) {
        PyErr_SetString(PyExc_TypeError, "words must be a list");
        goto done;
    }
    if (refresh_words(sim) < 0)
        goto done;
    PyObject *fast = PySequence_Fast(engines, "engines must be a sequence");
    if (fast == NULL)
        goto done;
    sim->n_engines = PySequence_Fast_GET_SIZE(fast);
    sim->engines = PyMem_Calloc((size_t)(sim->n_engines ? sim->n_engines : 1), sizeof(Engine));
    if (sim->engines == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < sim->n_engines; i++)
        if (engine_in(&sim->engines[i], PySequence_Fast_GET_ITEM(fast, i)) < 0) {
            Py_DECREF(fast);
            goto done;
        }
    Py_DECREF(fast);
    if (sim->n_engines == 0) {
        PyErr_SetString(PyExc_ValueError, "no engines");
        goto done;
    }
    run_loop(sim);
    if (sim->failed || flush_records(sim) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "the compiled batch simulation failed");
        goto done;
    }
    PyObject *states = PyList_New(sim->n_engines);
    for (Py_ssize_t i = 0; states && i < sim->n_engines; i++) {
        PyObject *state = engine_out(&sim->engines[i]);
        if (state == NULL) {
            Py_CLEAR(states);
            break;
        }
        PyList_SET_ITEM(states, i, state);
    }
    /* requests an engine could never run (they need more KV blocks than it holds): the longest one's tokens */
    Py_ssize_t longest = 0;
    for (Py_ssize_t i = 0; i < sim->n_engines; i++) {
        Engine *e = &sim->engines[i];
        for (Py_ssize_t k = 0; k < e->n_waiting + e->n_running; k++) {
            Request *req = k < e->n_waiting ? e->waiting[(e->waiting_head + k) % e->cap_waiting]
                                            : e->running[k - e->n_waiting];
            Py_ssize_t tokens = req->prompt_len + req->max_tokens;
            longest = tokens > longest ? tokens : longest;
        }
    }
    if (states != NULL)
        out = Py_BuildValue("{s:d,s:L,s:n,s:d,s:N,s:n,s:n}", "now", sim->now, "next_number",
                            (long long)sim->next_number, "rr_next", sim->rr_next, "progress_at", sim->progress_at,
                            "engines", states, "unfinished", sim->pending, "longest_unfinished", longest);
done:
    Py_XDECREF(engines);
    Py_XDECREF(byte_word);
    Py_XDECREF(value_word);
    sim_free(sim);
    return out;
}
