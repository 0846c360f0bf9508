/* The GPU KV block pool and the chained block hashes of kvbench_sim.blocks, compiled.

   The same behaviour as the Python reference (PyBlockPool, py_chain_hashes in blocks.py), step for step: the same
   free order, the same evictions, the same hash values (CPython's own tuple hash, reproduced), so a simulation gives
   the same results bit for bit with either. A simulated request takes and gives back a hundred blocks or more every
   turn; in Python those per-block loops were a third of a large batch simulation. The tests run both through the same
   random steps and compare them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "_pool.h"

/* hash((prev, *items[0:count])), or -1 with an exception set */
static Py_hash_t block_hash(Py_hash_t prev, PyObject **items, Py_ssize_t count)
{
    Py_uhash_t acc = tuple_hash_start(prev);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_hash_t lane = PyObject_Hash(items[i]);
        if (lane == -1)
            return -1;
        acc = tuple_hash_add(acc, lane);
    }
    return tuple_hash_end(acc, count);
}

/* 1 when a[0:n] == b[0:n] element by element, 0 when not, -1 on error */
static int same_items(PyObject **a, PyObject **b, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (a[i] == b[i])
            continue;
        int eq = PyObject_RichCompareBool(a[i], b[i], Py_EQ);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

/* ---- integer arrays in and out ---------------------------------------------------------------------------------
   Hashes leave as array('q') and blocks as array('i'): eight or four bytes each in one buffer, where a list holds a
   pointer to a separate int object per item (a large pool's lists of them did not fit the cache). Either, or any
   sequence of ints, is read back. */

static PyTypeObject *array_type; /* array.array */

typedef struct {
    int64_t *values;
    Py_ssize_t n;
} Ints;

static void ints_free(Ints *ints)
{
    PyMem_Free(ints->values);
    ints->values = NULL;
    ints->n = 0;
}

static int ints_read(PyObject *obj, Ints *out, const char *what)
{
    out->values = NULL;
    out->n = 0;
    if (PyObject_TypeCheck(obj, array_type)) {
        Py_buffer view;
        if (PyObject_GetBuffer(obj, &view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        const char *format = view.format ? view.format : "B";
        Py_ssize_t n = view.itemsize ? view.len / view.itemsize : 0;
        out->values = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        if (out->values == NULL) {
            PyBuffer_Release(&view);
            PyErr_NoMemory();
            return -1;
        }
        if ((format[0] == 'q' || format[0] == 'l') && view.itemsize == 8)
            memcpy(out->values, view.buf, (size_t)n * sizeof(int64_t));
        else if (format[0] == 'i' && view.itemsize == 4)
            for (Py_ssize_t j = 0; j < n; j++)
                out->values[j] = ((const int32_t *)view.buf)[j];
        else {
            PyBuffer_Release(&view);
            ints_free(out);
            PyErr_Format(PyExc_TypeError, "%s: an array of type code '%s' (integers of 4 or 8 bytes expected)", what,
                         format);
            return -1;
        }
        out->n = n;
        PyBuffer_Release(&view);
        return 0;
    }
    PyObject *seq = PySequence_Fast(obj, what);
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    out->values = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (out->values == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        long long value = PyLong_AsLongLong(items[j]);
        if (value == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            ints_free(out);
            return -1;
        }
        out->values[j] = (int64_t)value;
    }
    out->n = n;
    Py_DECREF(seq);
    return 0;
}

/* array(typecode, the bytes at data) */
static PyObject *new_array(const char *typecode, const void *data, Py_ssize_t bytes)
{
    return PyObject_CallFunction((PyObject *)array_type, "sy#", typecode, (const char *)data, bytes);
}

static PyObject *new_block_array(const int32_t *blocks, Py_ssize_t n)
{
    return new_array("i", blocks, n * (Py_ssize_t)sizeof(int32_t));
}

static PyObject *chain_hashes(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"tokens", "block_size", "known", NULL};
    PyObject *tokens_obj, *known = Py_None;
    Py_ssize_t block_size;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "On|O:chain_hashes", keywords, &tokens_obj, &block_size, &known))
        return NULL;
    if (block_size <= 0) {
        PyErr_SetString(PyExc_ValueError, "chain_hashes: block_size must be at least 1");
        return NULL;
    }
    PyObject *tokens = PySequence_Fast(tokens_obj, "chain_hashes: tokens must be a sequence");
    if (tokens == NULL)
        return NULL;
    PyObject *out = NULL, *old_tokens = NULL;
    Ints old_hashes = {NULL, 0};
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tokens);
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    Py_ssize_t blocks = n / block_size, shared = 0;
    int64_t *hashes = PyMem_Malloc((size_t)(blocks ? blocks : 1) * sizeof(int64_t));
    if (hashes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_hash_t prev = 0;
    if (known != Py_None) {
        PyObject *old_tokens_obj, *old_hashes_obj;
        if (!PyArg_ParseTuple(known, "OO:chain_hashes known", &old_tokens_obj, &old_hashes_obj))
            goto done;
        old_tokens = PySequence_Fast(old_tokens_obj, "chain_hashes: known's tokens must be a sequence");
        if (old_tokens == NULL || ints_read(old_hashes_obj, &old_hashes, "chain_hashes: known's hashes") < 0)
            goto done;
        Py_ssize_t old_n = PySequence_Fast_GET_SIZE(old_tokens);
        shared = old_hashes.n;
        if (shared > old_n / block_size) {
            PyErr_SetString(PyExc_ValueError, "chain_hashes: known holds more hashes than its tokens make blocks");
            goto done;
        }
        while (shared) { /* the reference compares the two slices tokens[:shared * block_size] */
            Py_ssize_t span = shared * block_size;
            Py_ssize_t old_span = old_n < span ? old_n : span, new_span = n < span ? n : span;
            if (old_span == new_span) {
                int same = same_items(PySequence_Fast_ITEMS(old_tokens), items, new_span);
                if (same < 0)
                    goto done;
                if (same)
                    break;
            }
            shared /= 2; /* the conversation was not resent verbatim: fall back to the blocks that still agree */
        }
        if (shared) { /* the shared blocks are whole blocks of these tokens too: shared <= blocks */
            memcpy(hashes, old_hashes.values, (size_t)shared * sizeof(int64_t));
            prev = (Py_hash_t)old_hashes.values[shared - 1];
        }
    }
    for (Py_ssize_t j = shared; j < blocks; j++) {
        prev = block_hash(prev, items + j * block_size, block_size);
        if (prev == -1)
            goto done;
        hashes[j] = prev;
    }
    out = new_array("q", hashes, blocks * (Py_ssize_t)sizeof(int64_t));
done:
    Py_DECREF(tokens);
    Py_XDECREF(old_tokens);
    ints_free(&old_hashes);
    PyMem_Free(hashes);
    return out;
}

/* ---- the pool --------------------------------------------------------------------------------------------------
   As the reference: the free list is two queues, ``front`` (blocks given back without a hash, the last first) and
   ``queue`` (the rest, in order); an entry counts only if it is its block's latest (``entries``) and the block is
   still free. ``cached`` maps a block hash to the block holding it: open addressing, linear probing, deletion by
   backward shift; it never holds more than one hash a block, so twice the blocks' slots keep it at most half full. */

static int queue_push(IntQueue *q, int32_t value)
{
    if (q->tail == q->capacity) {
        if (q->head > q->capacity / 2) { /* half of it already taken from the front: move the rest down */
            memmove(q->items, q->items + q->head, (size_t)(q->tail - q->head) * sizeof(int32_t));
            q->tail -= q->head;
            q->head = 0;
        } else {
            Py_ssize_t capacity = q->capacity ? q->capacity * 2 : 64;
            int32_t *grown = PyMem_Realloc(q->items, (size_t)capacity * sizeof(int32_t));
            if (grown == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            q->items = grown;
            q->capacity = capacity;
        }
    }
    q->items[q->tail++] = value;
    return 0;
}

static inline uint64_t slot_of(const BlockPool *self, int64_t key)
{
    return ((uint64_t)key * 0x9E3779B97F4A7C15ULL) >> self->shift;
}

static inline int32_t cached_get(const BlockPool *self, int64_t key)
{
    for (uint64_t i = slot_of(self, key);; i = (i + 1) & self->mask) {
        const Slot *slot = &self->slots[i];
        if (slot->block < 0)
            return -1;
        if (slot->key == key)
            return slot->block;
    }
}

static inline void cached_set(BlockPool *self, int64_t key, int32_t block)
{
    uint64_t i = slot_of(self, key);
    while (self->slots[i].block >= 0 && self->slots[i].key != key)
        i = (i + 1) & self->mask;
    self->slots[i].key = key;
    self->slots[i].block = block;
}

static void cached_delete(BlockPool *self, int64_t key)
{
    uint64_t i = slot_of(self, key);
    while (1) {
        if (self->slots[i].block < 0)
            return;
        if (self->slots[i].key == key)
            break;
        i = (i + 1) & self->mask;
    }
    /* backward shift: move up every later entry of the run that its own slot allows */
    uint64_t hole = i;
    for (uint64_t j = (i + 1) & self->mask; self->slots[j].block >= 0; j = (j + 1) & self->mask) {
        uint64_t home = slot_of(self, self->slots[j].key);
        /* the entry at j may fill the hole unless its home lies cyclically in (hole, j] */
        if (((j - home) & self->mask) >= ((j - hole) & self->mask)) {
            self->slots[hole] = self->slots[j];
            hole = j;
        }
    }
    self->slots[hole].block = -1;
}

static int as_key(PyObject *obj, int64_t *key)
{
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    *key = (int64_t)value;
    return 0;
}

static int as_block(const BlockPool *self, PyObject *obj, int32_t *block)
{
    Py_ssize_t value = PyLong_AsSsize_t(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value >= self->num_blocks) {
        PyErr_Format(PyExc_IndexError, "block %zd is not in a pool of %zd blocks", value, self->num_blocks);
        return -1;
    }
    *block = (int32_t)value;
    return 0;
}

static void pool_free_arrays(BlockPool *self)
{
    PyMem_Free(self->ref);
    PyMem_Free(self->entries);
    PyMem_Free(self->hash);
    PyMem_Free(self->hashed);
    PyMem_Free(self->front.items);
    PyMem_Free(self->queue.items);
    PyMem_Free(self->slots);
    self->ref = self->entries = NULL;
    self->hash = NULL;
    self->hashed = NULL;
    self->front = (IntQueue){0};
    self->queue = (IntQueue){0};
    self->slots = NULL;
}

static int pool_init(BlockPool *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"num_blocks", NULL};
    Py_ssize_t n;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:BlockPool", keywords, &n))
        return -1;
    if (n <= 0) {
        PyErr_SetString(PyExc_ValueError, "the GPU KV cache holds no block; lower the model size or raise memory");
        return -1;
    }
    if (n > INT32_MAX / 4) {
        PyErr_Format(PyExc_ValueError, "a pool of %zd blocks is more than the compiled pool holds", n);
        return -1;
    }
    pool_free_arrays(self);
    int bits = 3;
    while (((Py_ssize_t)1 << bits) < 2 * n)
        bits++;
    Py_ssize_t slots = (Py_ssize_t)1 << bits;
    self->num_blocks = n;
    self->free = n;
    self->evictions = 0;
    self->ref = PyMem_Calloc((size_t)n, sizeof(int32_t));
    self->entries = PyMem_Malloc((size_t)n * sizeof(int32_t));
    self->hash = PyMem_Calloc((size_t)n, sizeof(int64_t));
    self->hashed = PyMem_Calloc((size_t)n, 1);
    self->slots = PyMem_Malloc((size_t)slots * sizeof(Slot));
    self->queue.items = PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!self->ref || !self->entries || !self->hash || !self->hashed || !self->slots ||
        !self->queue.items) {
        pool_free_arrays(self);
        PyErr_NoMemory();
        return -1;
    }
    self->mask = (uint64_t)slots - 1;
    self->shift = 64 - bits;
    for (Py_ssize_t s = 0; s < slots; s++)
        self->slots[s].block = -1;
    for (Py_ssize_t b = 0; b < n; b++) {
        self->entries[b] = 1;
        self->queue.items[b] = (int32_t)b;
    }
    self->queue.capacity = n;
    self->queue.tail = n;
    return 0;
}

static void pool_dealloc(BlockPool *self)
{
    pool_free_arrays(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pool_free_blocks(BlockPool *self, void *closure)
{
    return PyLong_FromSsize_t(self->free);
}

static PyObject *pool_usage(BlockPool *self, void *closure)
{
    return PyFloat_FromDouble(1.0 - (double)self->free / (double)self->num_blocks);
}

/* the free blocks in the order allocate takes them, written to ``out`` (room for num_blocks); how many, or -1 */
static Py_ssize_t free_order_into(const BlockPool *self, int32_t *out)
{
    int32_t *seen = PyMem_Calloc((size_t)self->num_blocks, sizeof(int32_t));
    if (seen == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t count = 0, in_front = self->front.tail - self->front.head;
    Py_ssize_t total = in_front + (self->queue.tail - self->queue.head);
    for (Py_ssize_t k = 0; k < total; k++) {
        int32_t b = k < in_front ? self->front.items[self->front.tail - 1 - k]
                                 : self->queue.items[self->queue.head + (k - in_front)];
        if (++seen[b] == self->entries[b] && self->ref[b] == 0)
            out[count++] = b;
    }
    PyMem_Free(seen);
    return count;
}

static PyObject *pool_free_order(BlockPool *self, PyObject *unused)
{
    int32_t *order = PyMem_Malloc((size_t)self->num_blocks * sizeof(int32_t));
    if (order == NULL)
        return PyErr_NoMemory();
    Py_ssize_t count = free_order_into(self, order);
    PyObject *out = count < 0 ? NULL : PyList_New(count);
    for (Py_ssize_t j = 0; out != NULL && j < count; j++) {
        PyObject *value = PyLong_FromLong(order[j]);
        if (value == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, j, value);
    }
    PyMem_Free(order);
    return out;
}

Py_ssize_t pool_prefix_into(BlockPool *self, const int64_t *hashes, Py_ssize_t n, int32_t *out, int take)
{
    Py_ssize_t hit = 0;
    for (Py_ssize_t j = 0; j < n; j++) /* the slots are far apart in a large pool: asked for before the first read */
        __builtin_prefetch(&self->slots[slot_of(self, hashes[j])]);
    for (; hit < n; hit++) {
        int32_t block = cached_get(self, hashes[hit]);
        if (block < 0)
            break;
        out[hit] = block;
        __builtin_prefetch(&self->ref[block], 1);
    }
    if (take) {
        Py_ssize_t taken = 0;
        for (Py_ssize_t j = 0; j < hit; j++)
            if (self->ref[out[j]]++ == 0)
                taken++;
        self->free -= taken;
    }
    return hit;
}

/* the longest cached prefix of ``hashes``; with ``take``, each block referenced */
static PyObject *prefix_blocks(BlockPool *self, PyObject *hashes_obj, int take)
{
    Ints keys;
    if (ints_read(hashes_obj, &keys, "hashes") < 0)
        return NULL;
    int32_t *blocks = PyMem_Malloc((size_t)(keys.n ? keys.n : 1) * sizeof(int32_t));
    if (blocks == NULL) {
        ints_free(&keys);
        return PyErr_NoMemory();
    }
    Py_ssize_t hit = pool_prefix_into(self, keys.values, keys.n, blocks, take);
    PyObject *out = new_block_array(blocks, hit);
    ints_free(&keys);
    PyMem_Free(blocks);
    return out;
}

static PyObject *pool_match(BlockPool *self, PyObject *hashes)
{
    return prefix_blocks(self, hashes, 0);
}

static PyObject *pool_acquire_prefix(BlockPool *self, PyObject *hashes)
{
    return prefix_blocks(self, hashes, 1);
}

static void register_one(BlockPool *self, int32_t block, int64_t key)
{
    if (self->hashed[block] || cached_get(self, key) >= 0)
        return;
    cached_set(self, key, block);
    self->hash[block] = key;
    self->hashed[block] = 1;
}

void pool_register_range(BlockPool *self, const int32_t *blocks, const int64_t *hashes, Py_ssize_t start,
                         Py_ssize_t end)
{
    for (Py_ssize_t j = start; j < end; j++) /* the slots far apart: asked for before the first is read */
        __builtin_prefetch(&self->slots[slot_of(self, hashes[j])]);
    for (Py_ssize_t j = start; j < end; j++)
        register_one(self, blocks[j], hashes[j]);
}

/* 0, or -1 with IndexError when a block is not one of the pool's */
static int check_blocks(const BlockPool *self, const Ints *blocks, Py_ssize_t start, Py_ssize_t end)
{
    for (Py_ssize_t j = start; j < end; j++)
        if (blocks->values[j] < 0 || blocks->values[j] >= self->num_blocks) {
            PyErr_Format(PyExc_IndexError, "block %lld is not in a pool of %zd blocks", (long long)blocks->values[j],
                         self->num_blocks);
            return -1;
        }
    return 0;
}

/* ``obj``'s blocks, every one of them the pool's (0), or -1 with an exception and nothing to free */
static int read_blocks(const BlockPool *self, PyObject *obj, Ints *blocks)
{
    if (ints_read(obj, blocks, "blocks") < 0)
        return -1;
    if (check_blocks(self, blocks, 0, blocks->n) < 0) {
        ints_free(blocks);
        return -1;
    }
    return 0;
}

static PyObject *pool_register_prefix(BlockPool *self, PyObject *args)
{
    PyObject *blocks_obj, *hashes_obj;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "OOnn:register_prefix", &blocks_obj, &hashes_obj, &start, &end))
        return NULL;
    Ints blocks, hashes = {NULL, 0};
    if (ints_read(blocks_obj, &blocks, "blocks") < 0)
        return NULL;
    PyObject *out = NULL;
    if (ints_read(hashes_obj, &hashes, "hashes") < 0)
        goto done;
    if (start < end && (start < 0 || end > blocks.n || end > hashes.n)) {
        PyErr_SetString(PyExc_IndexError, "register_prefix: start:end is outside the blocks or hashes");
        goto done;
    }
    if (check_blocks(self, &blocks, start, end) < 0)
        goto done;
    for (Py_ssize_t j = start; j < end; j++) /* the slots far apart: asked for before the first is read */
        __builtin_prefetch(&self->slots[slot_of(self, hashes.values[j])]);
    for (Py_ssize_t j = start; j < end; j++)
        register_one(self, (int32_t)blocks.values[j], hashes.values[j]);
    out = Py_None;
    Py_INCREF(out);
done:
    ints_free(&blocks);
    ints_free(&hashes);
    return out;
}

static PyObject *pool_register(BlockPool *self, PyObject *args)
{
    PyObject *block_obj, *key_obj;
    if (!PyArg_ParseTuple(args, "OO:register", &block_obj, &key_obj))
        return NULL;
    int32_t block;
    int64_t key;
    if (as_block(self, block_obj, &block) < 0 || as_key(key_obj, &key) < 0)
        return NULL;
    register_one(self, block, key);
    Py_RETURN_NONE;
}

static PyObject *pool_touch(BlockPool *self, PyObject *blocks_obj)
{
    Ints blocks;
    if (read_blocks(self, blocks_obj, &blocks) < 0)
        return NULL;
    for (Py_ssize_t j = 0; j < blocks.n; j++)
        if (self->ref[blocks.values[j]]++ == 0)
            self->free--;
    ints_free(&blocks);
    Py_RETURN_NONE;
}

int pool_allocate_into(BlockPool *self, Py_ssize_t n, int32_t *out)
{
    Py_ssize_t got = 0;
    while (got < n) {
        if (self->front.tail == self->front.head && self->queue.head == self->queue.tail) {
            /* the count of free blocks disagrees with the queues: a bug, never a result */
            PyErr_SetString(PyExc_RuntimeError, "BlockPool.allocate: the free list ran out before the free count");
            return -1;
        }
        int32_t b = self->front.tail > self->front.head ? self->front.items[--self->front.tail]
                                                         : self->queue.items[self->queue.head++];
        int32_t left = --self->entries[b];
        if (left || self->ref[b])
            continue; /* an older entry, or the block was taken back by a hit */
        if (self->hashed[b]) {
            int64_t old = self->hash[b];
            if (cached_get(self, old) == b)
                cached_delete(self, old);
            self->hashed[b] = 0;
            self->evictions++;
        }
        self->ref[b] = 1;
        out[got++] = b;
    }
    if (self->queue.head == self->queue.tail)
        self->queue.head = self->queue.tail = 0;
    self->free -= n;
    return 0;
}

static PyObject *pool_allocate(BlockPool *self, PyObject *arg)
{
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n > self->free)
        Py_RETURN_NONE;
    int32_t *out = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (out == NULL)
        return PyErr_NoMemory();
    PyObject *blocks = pool_allocate_into(self, n, out) < 0 ? NULL : new_block_array(out, n > 0 ? n : 0);
    PyMem_Free(out);
    return blocks;
}

static int pool_compact(BlockPool *self)
{
    int32_t *order = PyMem_Malloc((size_t)self->num_blocks * sizeof(int32_t));
    if (order == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t count = free_order_into(self, order);
    if (count < 0) {
        PyMem_Free(order);
        return -1;
    }
    /* the free list as one queue, an entry a block: the queue never holds fewer than num_blocks slots */
    memset(self->entries, 0, (size_t)self->num_blocks * sizeof(int32_t));
    for (Py_ssize_t j = 0; j < count; j++) {
        self->entries[order[j]] = 1;
        self->queue.items[j] = order[j];
    }
    self->front.head = self->front.tail = 0;
    self->queue.head = 0;
    self->queue.tail = count;
    PyMem_Free(order);
    return 0;
}

int pool_release_from(BlockPool *self, const int32_t *blocks, Py_ssize_t n)
{
    for (Py_ssize_t j = 0; j < n; j++) /* far apart in a large pool: asked for before the first is read */
        __builtin_prefetch(&self->ref[blocks[j]], 1);
    Py_ssize_t freed = 0;
    for (Py_ssize_t j = n - 1; j >= 0; j--) { /* reversed, like vLLM: a request's tail blocks go first */
        int32_t b = blocks[j];
        if (--self->ref[b] == 0) {
            freed++;
            self->entries[b]++;
            if (queue_push(self->hashed[b] ? &self->queue : &self->front, b) < 0) {
                self->free += freed;
                return -1;
            }
        }
    }
    self->free += freed;
    /* hits leave dead entries behind, which allocate drops as it reaches them; one that is only hit would grow
       without bound */
    if (self->queue.tail - self->queue.head > 4 * self->num_blocks && pool_compact(self) < 0)
        return -1;
    return 0;
}

static PyObject *pool_release(BlockPool *self, PyObject *blocks_obj)
{
    Ints blocks;
    if (read_blocks(self, blocks_obj, &blocks) < 0)
        return NULL;
    int32_t *values = PyMem_Malloc((size_t)(blocks.n ? blocks.n : 1) * sizeof(int32_t));
    if (values == NULL) {
        ints_free(&blocks);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t j = 0; j < blocks.n; j++)
        values[j] = (int32_t)blocks.values[j];
    int failed = pool_release_from(self, values, blocks.n) < 0;
    PyMem_Free(values);
    ints_free(&blocks);
    if (failed)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *pool_reset(BlockPool *self, PyObject *unused)
{
    Py_ssize_t dropped = 0;
    for (Py_ssize_t b = 0; b < self->num_blocks; b++) {
        if (self->hashed[b] && self->ref[b] == 0) {
            if (cached_get(self, self->hash[b]) >= 0)
                cached_delete(self, self->hash[b]);
            self->hashed[b] = 0;
            dropped++;
        }
    }
    return PyLong_FromSsize_t(dropped);
}

static PyMethodDef pool_methods[] = {
    {"free_order", (PyCFunction)pool_free_order, METH_NOARGS, "The free blocks in the order allocate takes them."},
    {"match", (PyCFunction)pool_match, METH_O, "Blocks of the longest cached prefix."},
    {"acquire_prefix", (PyCFunction)pool_acquire_prefix, METH_O,
     "match and touch in one pass: the blocks of the longest cached prefix, referenced."},
    {"register_prefix", (PyCFunction)pool_register_prefix, METH_VARARGS,
     "register for blocks[start:end] under hashes[start:end]."},
    {"register", (PyCFunction)pool_register, METH_VARARGS,
     "Mark a computed full block as reusable under its chained hash."},
    {"touch", (PyCFunction)pool_touch, METH_O, "Reference each block."},
    {"allocate", (PyCFunction)pool_allocate, METH_O, "n free blocks, referenced (None when fewer are free)."},
    {"release", (PyCFunction)pool_release, METH_O, "Give the blocks back (reversed, like vLLM)."},
    {"reset", (PyCFunction)pool_reset, METH_NOARGS,
     "Forget every cached hash of a free block (POST /reset_prefix_cache); returns how many."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef pool_members[] = {
    {"num_blocks", T_PYSSIZET, offsetof(BlockPool, num_blocks), READONLY, "Blocks in the pool."},
    {"evictions", T_LONGLONG, offsetof(BlockPool, evictions), 0, "Cached blocks reused for other content."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef pool_getset[] = {
    {"free_blocks", (getter)pool_free_blocks, NULL, "Blocks no running request references.", NULL},
    {"usage", (getter)pool_usage, NULL, "Share of blocks referenced by running requests (0..1).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject BlockPoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kvbench_sim._pool.BlockPool",
    .tp_doc = "The GPU KV block pool of kvbench_sim.blocks, compiled (the same behaviour as PyBlockPool).",
    .tp_basicsize = sizeof(BlockPool),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pool_init,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_methods = pool_methods,
    .tp_members = pool_members,
    .tp_getset = pool_getset,
};

static PyMethodDef module_methods[] = {
    {"chain_hashes", (PyCFunction)(void (*)(void))chain_hashes, METH_VARARGS | METH_KEYWORDS,
     "h_j = hash((h_{j-1}, *tokens of block j)), full blocks only; known: an earlier prompt and its hashes."},
    {"run_batch", batch_run, METH_VARARGS, "The compiled batch simulation (kvbench_sim.fastpath runs it)."},
    {"random_bytes", batch_random_bytes, METH_VARARGS,
     "random.Random(key).randbytes(n), as the compiled simulation draws a synthetic turn's words."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef pool_module = {
    PyModuleDef_HEAD_INIT, "kvbench_sim._pool", "The block pool and block hashes of kvbench_sim.blocks, compiled.",
    -1, module_methods,
};

PyMODINIT_FUNC PyInit__pool(void)
{
    if (PyType_Ready(&BlockPoolType) < 0)
        return NULL;
    PyObject *array_module = PyImport_ImportModule("array");
    if (array_module == NULL)
        return NULL;
    array_type = (PyTypeObject *)PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (array_type == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&pool_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&BlockPoolType);
    if (PyModule_AddObject(module, "BlockPool", (PyObject *)&BlockPoolType) < 0) {
        Py_DECREF(&BlockPoolType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
