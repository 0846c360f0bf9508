/* What the compiled block pool (_pool.c) shares with the compiled batch simulation (_batch.c): the pool's layout,
   its operations on C arrays, and CPython's tuple hash, so both compute the block hashes the Python reference does. */

#ifndef KVBENCH_SIM_POOL_H
#define KVBENCH_SIM_POOL_H

#include <Python.h>
#include <stdint.h>

#if SIZEOF_PY_HASH_T != 8
#error "the compiled pool reproduces the 64-bit tuple hash only (the Python reference serves other platforms)"
#endif

/* ---- CPython's tuple hash (Objects/tupleobject.c, 3.8 and later: xxHash's mixing) ---------------------------- */
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)
#define XXROTATE(x) (((x) << 31) | ((x) >> 33))
#define HASH_MODULUS (((uint64_t)1 << 61) - 1) /* an int's hash is the int modulo 2**61 - 1, keeping its sign */

static inline Py_hash_t int_hash(Py_hash_t value)
{
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    Py_hash_t h = (Py_hash_t)(magnitude % HASH_MODULUS);
    if (value < 0)
        h = -h;
    return h == -1 ? -2 : h;
}

/* hash((prev, *lanes)) in three parts: the start (prev is the tuple's first item, an int), one item's own hash
   added, and the end over count items after prev */
static inline Py_uhash_t tuple_hash_add(Py_uhash_t acc, Py_hash_t lane)
{
    acc += (Py_uhash_t)lane * XXPRIME_2;
    acc = XXROTATE(acc);
    return acc * XXPRIME_1;
}

static inline Py_uhash_t tuple_hash_start(Py_hash_t prev)
{
    return tuple_hash_add(XXPRIME_5, int_hash(prev));
}

static inline Py_hash_t tuple_hash_end(Py_uhash_t acc, Py_ssize_t count)
{
    acc += (Py_uhash_t)(count + 1) ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* ---- the pool ------------------------------------------------------------------------------------------------ */
typedef struct {
    int32_t *items;
    Py_ssize_t head, tail, capacity; /* the live entries are items[head:tail] */
} IntQueue;

typedef struct { /* a key and its block side by side: a lookup reads one cache line */
    int64_t key;
    int32_t block; /* -1: an empty slot */
} Slot;

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_blocks;
    Py_ssize_t free;
    long long evictions;
    int32_t *ref;
    int32_t *entries;
    int64_t *hash;
    uint8_t *hashed; /* whether the block holds a hash (any int64 is a valid hash) */
    IntQueue front, queue;
    Slot *slots;
    uint64_t mask;
    int shift;
} BlockPool;

extern PyTypeObject BlockPoolType;

/* the blocks of the longest cached prefix of hashes[0:n], written to out (room for n); with take, referenced.
   How many. */
Py_ssize_t pool_prefix_into(BlockPool *self, const int64_t *hashes, Py_ssize_t n, int32_t *out, int take);
/* register blocks[start:end] under hashes[start:end] */
void pool_register_range(BlockPool *self, const int32_t *blocks, const int64_t *hashes, Py_ssize_t start,
                         Py_ssize_t end);
/* n free blocks (n <= free), referenced, written to out: 0, or -1 with an exception */
int pool_allocate_into(BlockPool *self, Py_ssize_t n, int32_t *out);
/* give blocks[0:n] back (reversed, like vLLM): 0, or -1 with an exception */
int pool_release_from(BlockPool *self, const int32_t *blocks, Py_ssize_t n);

/* _batch.c: the compiled batch simulation's entry point and its helpers' */
PyObject *batch_run(PyObject *module, PyObject *args);
PyObject *batch_random_bytes(PyObject *module, PyObject *args);

#endif
