/* Fused byte-plane kernels of the checkpoint chunk codec (see codec.py and docs/checkpoint-format.md).
 *
 * forward_split(cur, base, out, width, transform, rotation, permute, offset)
 *     out = the byte planes of the transformed chunk: transform (none / xor / zigzag(sub - offset)), rotate left,
 *     optionally permute into the stable order of the base elements' top exponent bits, split into `width`
 *     planes. One pass over the chunk; exactly the bytes of the numpy reference (codec._split(codec._forward(...))).
 * merge_inverse(planes, base, out, width, transform, rotation, permute, offset)
 *     The inverse: `planes` is a sequence of `width` buffers (the decompressed planes), `out` receives the raw
 *     chunk. One pass (the numpy reference takes about ten). `out` may be `base` itself (a delta decoded in
 *     place over its base): element i of `base` is read before element i of `out` is written, and no other.
 *
 * The permutation is a stable counting sort by an 8-bit key, so it costs a histogram and one pass with 256
 * sequential write (or read) streams instead of a comparison sort. Elements are little-endian (the module
 * refuses to import on a big-endian host). The GIL is released while a kernel runs.
 *
 * Portable C99 (scripts/check_c.sh builds it with -std=c99 -Wall -Wextra -pedantic -Werror): compiler extensions
 * only behind the guards below, `restrict` through RESTRICT (MSVC's C compiler spells it __restrict).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAXW 8

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L
#define RESTRICT restrict
#elif defined(_MSC_VER)
#define RESTRICT __restrict
#elif defined(__GNUC__)
#define RESTRICT __restrict__
#else
#define RESTRICT
#endif

/* The kernels are compiled once per instruction set and the best one for the CPU is picked when the module
 * loads (GCC function multiversioning through an ifunc: x86-64 with glibc): the byte-plane loops vectorise 1.5-3x
 * better with AVX2 / AVX-512 than with the SSE2 baseline a portable build assumes. Elsewhere (clang, macOS, musl,
 * aarch64, whose baseline has NEON) one portable version. Every version computes the same bytes. */
#if defined(GPU_NOTEBOOK_KERNEL_TARGET) /* one version only (the tests build each: -D...='"arch=x86-64-v3"') */
#define KERNEL __attribute__((target(GPU_NOTEBOOK_KERNEL_TARGET)))
#elif defined(GPU_NOTEBOOK_KERNEL_PORTABLE)
#define KERNEL
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && __GNUC__ >= 12
#define KERNEL __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__GLIBC__) && __GNUC__ >= 6
#define KERNEL __attribute__((target_clones("default", "avx2")))
#else
#define KERNEL
#endif

/* Bucket start positions of the stable counting sort by key = (b >> (bits - 9)) & 0xFF, for SEG interleaved
 * segments of the chunk (segment s covers [s*q, (s+1)*q), the last one also the tail): pos[s][k] is where the
 * first element of segment s with key k goes. The segments' running positions are independent, so the main
 * loops advance SEG dependency chains at once (one chain stalls on the store-to-load of pos[k]++); more than two
 * segments multiply the write (read) streams until they thrash the cache: four are twice as slow. */
#define SEG 2
/* The histogram runs over the SEG segments interleaved, each counted into HSUB interleaved sub-histograms (HSUB
 * independent increment chains per segment instead of one: 1.5-2x faster; the counts, so the order, are the same).
 * 32-bit counters where every count fits (smaller tables, fewer cache lines), else one chain of 64-bit ones. */
#define HSUB 4
#define DEF_STARTS(U, BITS)                                                                         \
    KERNEL static void starts_##BITS(const U *b, Py_ssize_t n, Py_ssize_t pos[SEG][256]) {          \
        Py_ssize_t q = n / SEG;                                                                     \
        memset(pos, 0, sizeof(Py_ssize_t) * SEG * 256);                                             \
        if (n <= (Py_ssize_t)UINT32_MAX) {                                                          \
            uint32_t h[SEG][HSUB][256];                                                             \
            Py_ssize_t m = q - q % HSUB; /* elements of each segment counted interleaved */         \
            memset(h, 0, sizeof(h));                                                                \
            for (Py_ssize_t i = 0; i < m; i += HSUB)                                                \
                for (int s = 0; s < SEG; s++)                                                       \
                    for (int u = 0; u < HSUB; u++) h[s][u][(b[s * q + i + u] >> (BITS - 9)) & 0xFF]++; \
            for (int s = 0; s < SEG; s++) {                                                         \
                Py_ssize_t hi = s == SEG - 1 ? n : (s + 1) * q;                                     \
                for (Py_ssize_t i = s * q + m; i < hi; i++) pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;  \
                for (int k = 0; k < 256; k++)                                                       \
                    for (int u = 0; u < HSUB; u++) pos[s][k] += h[s][u][k];                         \
            }                                                                                       \
        } else {                                                                                    \
            for (int s = 0; s < SEG; s++) {                                                         \
                Py_ssize_t lo = s * q, hi = s == SEG - 1 ? n : lo + q;                              \
                for (Py_ssize_t i = lo; i < hi; i++) pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;         \
            }                                                                                       \
        }                                                                                           \
        Py_ssize_t at = 0;                                                                          \
        for (int k = 0; k < 256; k++)                                                               \
            for (int s = 0; s < SEG; s++) {                                                         \
                Py_ssize_t c = pos[s][k];                                                           \
                pos[s][k] = at;                                                                     \
                at += c;                                                                            \
            }                                                                                       \
    }
/* visit every element once, the SEG segments interleaved: BODY(i, s) */
#define FOR_SEGMENTS(n, BODY)                                                                       \
    do {                                                                                            \
        Py_ssize_t q_ = (n) / SEG;                                                                  \
        for (Py_ssize_t i_ = 0; i_ < q_; i_++)                                                      \
            for (int s_ = 0; s_ < SEG; s_++) BODY(s_ * q_ + i_, s_);                                \
        for (Py_ssize_t i_ = SEG * q_; i_ < (n); i_++) BODY(i_, SEG - 1);                           \
    } while (0)

#define FWD_PERM_BODY(U, BITS, W, i, s)                                                             \
    do {                                                                                            \
        Py_ssize_t j = pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;                                       \
        U d = fwd_##BITS(c[i], b[i], t, rot, off);                                                  \
        for (int k = 0; k < W; k++) out[(Py_ssize_t)k * n + j] = (uint8_t)(d >> (8 * k));           \
    } while (0)
#define INV_PERM_BODY(U, BITS, W, i, s)                                                             \
    do {                                                                                            \
        Py_ssize_t j = pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;                                       \
        U z = 0;                                                                                    \
        for (int k = 0; k < W; k++) z |= (U)((U)q[k][j] << (8 * k));                                \
        out[i] = inv_##BITS(z, b[i], t, rot, off);                                                  \
    } while (0)
/* the same through a whole-element scratch array: the scatter (gather) has 256 streams of elements instead of
 * 256 * width streams of bytes, which is what makes the direct version slow; the planes are then split
 * (merged) sequentially */
#define FWD_PERM_TMP_BODY(U, BITS, i, s)                                                            \
    do {                                                                                            \
        Py_ssize_t j = pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;                                       \
        tmp[j] = fwd_##BITS(c[i], b[i], t, rot, off);                                               \
    } while (0)
#define INV_PERM_TMP_BODY(U, BITS, i, s)                                                            \
    do {                                                                                            \
        Py_ssize_t j = pos[s][(b[i] >> (BITS - 9)) & 0xFF]++;                                       \
        out[i] = inv_##BITS(tmp[j], b[i], t, rot, off);                                             \
    } while (0)
#define FWD_PERM_TMP_16(i, s) FWD_PERM_TMP_BODY(uint16_t, 16, i, s)
#define FWD_PERM_TMP_32(i, s) FWD_PERM_TMP_BODY(uint32_t, 32, i, s)
#define FWD_PERM_TMP_64(i, s) FWD_PERM_TMP_BODY(uint64_t, 64, i, s)
#define INV_PERM_TMP_16(i, s) INV_PERM_TMP_BODY(uint16_t, 16, i, s)
#define INV_PERM_TMP_32(i, s) INV_PERM_TMP_BODY(uint32_t, 32, i, s)
#define INV_PERM_TMP_64(i, s) INV_PERM_TMP_BODY(uint64_t, 64, i, s)
#define FWD_PERM_16(i, s) FWD_PERM_BODY(uint16_t, 16, 2, i, s)
#define FWD_PERM_32(i, s) FWD_PERM_BODY(uint32_t, 32, 4, i, s)
#define FWD_PERM_64(i, s) FWD_PERM_BODY(uint64_t, 64, 8, i, s)
#define INV_PERM_16(i, s) INV_PERM_BODY(uint16_t, 16, 2, i, s)
#define INV_PERM_32(i, s) INV_PERM_BODY(uint32_t, 32, 4, i, s)
#define INV_PERM_64(i, s) INV_PERM_BODY(uint64_t, 64, 8, i, s)

#define DEF_FORWARD(U, BITS, W)                                                                     \
    static inline U fwd_##BITS(U d, U b, int t, int rot, U off) {                                   \
        if (t == 1) d ^= b;                                                                         \
        else if (t == 2) {                                                                          \
            d = (U)((U)(d - b) - off);                                                              \
            U sign = (U)(0 - (U)(d >> (BITS - 1)));                                                 \
            d = (U)((U)(d << 1) ^ sign);                                                            \
        }                                                                                           \
        if (rot) d = (U)((U)(d << rot) | (U)(d >> (BITS - rot)));                                   \
        return d;                                                                                   \
    }                                                                                               \
    KERNEL static void forward_##BITS(const U *RESTRICT c, const U *RESTRICT b, uint8_t *RESTRICT out, \
                               Py_ssize_t n, int t, int rot, int perm, U off) {                     \
        static const U zero = 0;                                                                    \
        if (perm) {                                                                                 \
            Py_ssize_t pos[SEG][256];                                                               \
            starts_##BITS(b, n, pos);                                                               \
            U *tmp = (U *)malloc(sizeof(U) * (size_t)(n > 0 ? n : 1));                              \
            if (tmp == NULL) { /* no memory for the scratch: the direct (slower) way */              \
                FOR_SEGMENTS(n, FWD_PERM_##BITS);                                                   \
                return;                                                                             \
            }                                                                                       \
            FOR_SEGMENTS(n, FWD_PERM_TMP_##BITS);                                                   \
            for (Py_ssize_t j = 0; j < n; j++)                                                      \
                for (int k = 0; k < W; k++) out[(Py_ssize_t)k * n + j] = (uint8_t)(tmp[j] >> (8 * k)); \
            free(tmp);                                                                              \
        } else if (t == 0) {                                                                        \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                U d = fwd_##BITS(c[i], zero, 0, rot, off);                                          \
                for (int k = 0; k < W; k++) out[(Py_ssize_t)k * n + i] = (uint8_t)(d >> (8 * k));   \
            }                                                                                       \
        } else {                                                                                    \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                U d = fwd_##BITS(c[i], b[i], t, rot, off);                                          \
                for (int k = 0; k < W; k++) out[(Py_ssize_t)k * n + i] = (uint8_t)(d >> (8 * k));   \
            }                                                                                       \
        }                                                                                           \
    }

#define DEF_INVERSE(U, BITS, W)                                                                     \
    static inline U inv_##BITS(U z, U b, int t, int rot, U off) {                                   \
        if (rot) z = (U)((U)(z >> rot) | (U)(z << (BITS - rot)));                                   \
        if (t == 1) z ^= b;                                                                         \
        else if (t == 2) {                                                                          \
            U neg = (U)(0 - (U)(z & 1));                                                            \
            z = (U)((U)(z >> 1) ^ neg);                                                             \
            z = (U)(z + off);                                                                       \
            z = (U)(z + b);                                                                         \
        }                                                                                           \
        return z;                                                                                   \
    }                                                                                               \
    KERNEL static void inverse_##BITS(const uint8_t *const *p, const U *b, U *out,                  \
                               Py_ssize_t n, int t, int rot, int perm, U off) {                     \
        const uint8_t *q[W];                                                                        \
        for (int k = 0; k < W; k++) q[k] = p[k];                                                    \
        if (perm) {                                                                                 \
            Py_ssize_t pos[SEG][256];                                                               \
            starts_##BITS(b, n, pos);                                                               \
            U *tmp = (U *)malloc(sizeof(U) * (size_t)(n > 0 ? n : 1));                              \
            if (tmp == NULL) { /* no memory for the scratch: the direct (slower) way */              \
                FOR_SEGMENTS(n, INV_PERM_##BITS);                                                   \
                return;                                                                             \
            }                                                                                       \
            for (Py_ssize_t j = 0; j < n; j++) {                                                    \
                U z = 0;                                                                            \
                for (int k = 0; k < W; k++) z |= (U)((U)q[k][j] << (8 * k));                        \
                tmp[j] = z;                                                                         \
            }                                                                                       \
            FOR_SEGMENTS(n, INV_PERM_TMP_##BITS);                                                   \
            free(tmp);                                                                              \
        } else if (t == 0) {                                                                        \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                U z = 0;                                                                            \
                for (int k = 0; k < W; k++) z |= (U)((U)q[k][i] << (8 * k));                        \
                out[i] = inv_##BITS(z, 0, 0, rot, off);                                             \
            }                                                                                       \
        } else {                                                                                    \
            for (Py_ssize_t i = 0; i < n; i++) {                                                    \
                U z = 0;                                                                            \
                for (int k = 0; k < W; k++) z |= (U)((U)q[k][i] << (8 * k));                        \
                out[i] = inv_##BITS(z, b[i], t, rot, off);                                          \
            }                                                                                       \
        }                                                                                           \
    }

/* width 1: no permutation (the key needs at least 9 bits) */
KERNEL static void forward_8(const uint8_t *c, const uint8_t *b, uint8_t *out, Py_ssize_t n, int t, int rot, uint8_t off) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t d = c[i];
        if (t == 1) d ^= b[i];
        else if (t == 2) {
            d = (uint8_t)((uint8_t)(d - b[i]) - off);
            uint8_t sign = (uint8_t)(0 - (uint8_t)(d >> 7));
            d = (uint8_t)((uint8_t)(d << 1) ^ sign);
        }
        if (rot) d = (uint8_t)((uint8_t)(d << rot) | (uint8_t)(d >> (8 - rot)));
        out[i] = d;
    }
}

KERNEL static void inverse_8(const uint8_t *p, const uint8_t *b, uint8_t *out, Py_ssize_t n, int t, int rot, uint8_t off) {
    for (Py_ssize_t i = 0; i < n; i++) {
        uint8_t z = p[i];
        if (rot) z = (uint8_t)((uint8_t)(z >> rot) | (uint8_t)(z << (8 - rot)));
        if (t == 1) z ^= b[i];
        else if (t == 2) {
            uint8_t neg = (uint8_t)(0 - (uint8_t)(z & 1));
            z = (uint8_t)((uint8_t)(z >> 1) ^ neg);
            z = (uint8_t)(z + off);
            z = (uint8_t)(z + b[i]);
        }
        out[i] = z;
    }
}

DEF_STARTS(uint16_t, 16)
DEF_STARTS(uint32_t, 32)
DEF_STARTS(uint64_t, 64)
DEF_FORWARD(uint16_t, 16, 2)
DEF_FORWARD(uint32_t, 32, 4)
DEF_FORWARD(uint64_t, 64, 8)
DEF_INVERSE(uint16_t, 16, 2)
DEF_INVERSE(uint32_t, 32, 4)
DEF_INVERSE(uint64_t, 64, 8)

static int check_args(int width, int t, int rot, int perm) {
    if (width != 1 && width != 2 && width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "width must be 1, 2, 4 or 8");
        return -1;
    }
    if (t < 0 || t > 2) {
        PyErr_SetString(PyExc_ValueError, "unknown transform");
        return -1;
    }
    if (rot < 0 || rot >= 8 * width) {
        PyErr_SetString(PyExc_ValueError, "rotation out of range");
        return -1;
    }
    if (perm && width == 1) {
        PyErr_SetString(PyExc_ValueError, "the exponent order needs elements of at least 2 bytes");
        return -1;
    }
    return 0;
}

/* base: None or a buffer of `len` bytes; required when t != 0 or perm */
static int get_base(PyObject *obj, Py_buffer *view, Py_ssize_t len, int need) {
    view->buf = NULL;
    view->obj = NULL;
    if (obj == Py_None) {
        if (need) {
            PyErr_SetString(PyExc_ValueError, "this transform needs its base chunk");
            return -1;
        }
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) return -1;
    if (view->len != len) {
        PyBuffer_Release(view);
        view->buf = NULL;
        PyErr_SetString(PyExc_ValueError, "base chunk has the wrong length");
        return -1;
    }
    return 0;
}

static PyObject *forward_split(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer cur, out, base;
    PyObject *base_obj;
    int width, t, rot, perm;
    long long off;
    if (!PyArg_ParseTuple(args, "y*Ow*iiipL", &cur, &base_obj, &out, &width, &t, &rot, &perm, &off)) return NULL;
    PyObject *res = NULL;
    base.buf = NULL;
    if (check_args(width, t, rot, perm) < 0) goto done;
    if (cur.len % width || out.len != cur.len) {
        PyErr_SetString(PyExc_ValueError, "chunk and output must have the same length, a multiple of width");
        goto done;
    }
    if (get_base(base_obj, &base, cur.len, t != 0 || perm) < 0) goto done;
    Py_ssize_t n = cur.len / width;
    const void *b = base.buf;
    Py_BEGIN_ALLOW_THREADS
    switch (width) {
    case 1: forward_8(cur.buf, b, out.buf, n, t, rot, (uint8_t)off); break;
    case 2: forward_16(cur.buf, b, out.buf, n, t, rot, perm, (uint16_t)off); break;
    case 4: forward_32(cur.buf, b, out.buf, n, t, rot, perm, (uint32_t)off); break;
    default: forward_64(cur.buf, b, out.buf, n, t, rot, perm, (uint64_t)off); break;
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    if (base.buf) PyBuffer_Release(&base);
    PyBuffer_Release(&cur);
    PyBuffer_Release(&out);
    return res;
}

static PyObject *merge_inverse(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *planes_obj, *base_obj;
    Py_buffer out, base, pv[MAXW];
    int width, t, rot, perm, got = 0;
    long long off;
    if (!PyArg_ParseTuple(args, "OOw*iiipL", &planes_obj, &base_obj, &out, &width, &t, &rot, &perm, &off)) return NULL;
    PyObject *res = NULL, *seq = NULL;
    base.buf = NULL;
    if (check_args(width, t, rot, perm) < 0) goto done;
    if (out.len % width) {
        PyErr_SetString(PyExc_ValueError, "output length is not a multiple of width");
        goto done;
    }
    Py_ssize_t n = out.len / width;
    seq = PySequence_Fast(planes_obj, "planes must be a sequence of buffers");
    if (!seq) goto done;
    if (PySequence_Fast_GET_SIZE(seq) != width) {
        PyErr_SetString(PyExc_ValueError, "need one plane per byte of an element");
        goto done;
    }
    const uint8_t *p[MAXW];
    for (; got < width; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &pv[got], PyBUF_SIMPLE) < 0) goto done;
        if (pv[got].len != n) {
            got++;
            PyErr_SetString(PyExc_ValueError, "plane has the wrong length");
            goto done;
        }
        p[got] = pv[got].buf;
    }
    if (get_base(base_obj, &base, out.len, t != 0 || perm) < 0) goto done;
    const void *b = base.buf;
    Py_BEGIN_ALLOW_THREADS
    switch (width) {
    case 1: inverse_8(p[0], b, out.buf, n, t, rot, (uint8_t)off); break;
    case 2: inverse_16(p, b, out.buf, n, t, rot, perm, (uint16_t)off); break;
    case 4: inverse_32(p, b, out.buf, n, t, rot, perm, (uint32_t)off); break;
    default: inverse_64(p, b, out.buf, n, t, rot, perm, (uint64_t)off); break;
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&pv[k]);
    if (base.buf) PyBuffer_Release(&base);
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    return res;
}

static PyMethodDef methods[] = {
    {"forward_split", forward_split, METH_VARARGS, "Transform a chunk and split it into byte planes."},
    {"merge_inverse", merge_inverse, METH_VARARGS, "Merge byte planes and undo the transform."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_planes", "Fused byte-plane codec kernels.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__planes(void) {
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "the byte-plane kernels assume a little-endian host");
        return NULL;
    }
    return PyModule_Create(&module);
}
