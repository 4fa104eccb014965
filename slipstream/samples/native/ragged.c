/* Slipstream's native kernels, over variable-length ranges (a history list or an id string per row).
 *
 * take_lists_i32 / take_lists_i64 gather lists by row index. The column may be split into k
 * segments (an Arrow chunked array: one segment a data file); rows row_starts[s] ..
 * row_starts[s + 1] - 1 live in segment s, whose list r (local) is
 * values[s][offsets[s][r] .. offsets[s][r + 1]), each element itemsize bytes.
 *
 * For every i, list idx[i] is copied to the end of `out` and out_offsets[i + 1] is set to the
 * number of elements written so far (out_offsets[0] = 0). Each list is one memcpy. A row is
 * located (its segment found, its offsets prefetched) AHEAD rows before it is copied, and its
 * values are prefetched halfway, so the random reads of a shuffle overlap instead of waiting on
 * memory one after another; each row is located once, into a small ring.
 *
 * The caller checks every idx is in [0, row_starts[k]) and the offsets are Arrow-valid; the kernel
 * still refuses to write past out_capacity elements (returns -1). Returns the elements written.
 *
 * fnv1a_divisible marks the strings whose FNV-1a 64-bit hash (NUL bytes skipped, as
 * slipstream.samples.schema.id_hash does) is a multiple of `modulo` (>= 1): the held-out sample ids. It
 * hashes four ids at a time and tests divisibility with a multiply instead of a division.
 */
#include <stdint.h>
#include <string.h>

/* The segment holding `row`: the last s with row_starts[s] <= row. A branch-free binary search:
 * a shuffle's rows fall in random segments, and a branch on each would be mispredicted half the time. */
static inline int32_t segment_of(int64_t row, int32_t k, const int64_t *row_starts) {
    int32_t lo = 0, n = k;
    while (n > 1) {
        int32_t half = n / 2;
        lo = row_starts[lo + half] <= row ? lo + half : lo;
        n -= half;
    }
    return lo;
}

#define AHEAD 16 /* rows between locating a row's list and copying it */
#define RING 32 /* a power of two above AHEAD */

#define TAKE_LISTS(NAME, OFF_T)                                                               \
    int64_t NAME(int64_t n, const int64_t *idx, int32_t k, const int64_t *row_starts,         \
                 const char *const *values, const OFF_T *const *offsets, int64_t itemsize,    \
                 char *out, int64_t out_capacity, int64_t *out_offsets) {                     \
        /* located rows i .. j: their offsets entry and values base */                        \
        const OFF_T *ring_o[RING];                                                            \
        const char *ring_v[RING];                                                             \
        int64_t written = 0;                                                                  \
        out_offsets[0] = 0;                                                                   \
        for (int64_t j = 0; j < n + AHEAD; j++) {                                             \
            if (j < n) { /* locate row j: prefetch its offsets */                             \
                int64_t row = idx[j];                                                         \
                int32_t s = segment_of(row, k, row_starts);                                   \
                const OFF_T *o = offsets[s] + (row - row_starts[s]);                          \
                ring_o[j & (RING - 1)] = o;                                                   \
                ring_v[j & (RING - 1)] = values[s];                                           \
                __builtin_prefetch(o);                                                        \
            }                                                                                 \
            int64_t h = j - AHEAD / 2; /* halfway: prefetch its values */                     \
            if (h >= 0 && h < n) {                                                            \
                const OFF_T *o = ring_o[h & (RING - 1)];                                      \
                __builtin_prefetch(ring_v[h & (RING - 1)] + (int64_t)o[0] * itemsize);        \
            }                                                                                 \
            int64_t i = j - AHEAD; /* copy it */                                              \
            if (i < 0) continue;                                                              \
            const OFF_T *o = ring_o[i & (RING - 1)];                                          \
            int64_t len = (int64_t)(o[1] - o[0]);                                             \
            if (len < 0 || written + len > out_capacity) return -1;                           \
            if (len)                                                                          \
                memcpy(out + written * itemsize,                                              \
                       ring_v[i & (RING - 1)] + (int64_t)o[0] * itemsize,                     \
                       (size_t)(len * itemsize));                                             \
            written += len;                                                                   \
            out_offsets[i + 1] = written;                                                     \
        }                                                                                     \
        return written;                                                                       \
    }

TAKE_LISTS(take_lists_i32, int32_t)
TAKE_LISTS(take_lists_i64, int64_t)

/* FNV-1a of one id from state h, NUL bytes skipped: a NUL multiplies by 1 (no branch) */
static inline uint64_t fnv1a_step(uint64_t h, uint64_t byte) {
    return (h ^ byte) * (byte ? 0x100000001B3ULL : 1);
}

#define LANES 4 /* ids hashed side by side: each byte costs a multiply, and one chain would wait on it */

void fnv1a_divisible(int64_t n, const int32_t *offsets, const uint8_t *data, uint64_t modulo, uint8_t *out) {
    /* h % modulo == 0 without a division (modulo >= 1): with modulo = 2^k * d, d odd, that is the
     * low k bits of h clear and (h >> k) * d^-1 mod 2^64 <= (2^64 - 1) / d */
    if (modulo == 0) { /* nothing to divide by: mark none (the loop below would never end) */
        memset(out, 0, (size_t)n);
        return;
    }
    int k = 0;
    uint64_t d = modulo;
    while (!(d & 1)) {
        d >>= 1;
        k++;
    }
    uint64_t inverse = d; /* d^-1 mod 2^64 by Newton's method: 3, 6, 12, 24, 48, 96 correct bits */
    for (int step = 0; step < 5; step++) inverse *= 2 - d * inverse;
    const uint64_t low = k ? (1ULL << k) - 1 : 0, limit = UINT64_MAX / d;
#define DIVISIBLE(h) ((((h) & low) == 0) && (((h) >> k) * inverse <= limit))
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        uint64_t h[LANES];
        const uint8_t *p[LANES];
        int32_t len[LANES], common = INT32_MAX;
        for (int l = 0; l < LANES; l++) {
            h[l] = 0xCBF29CE484222325ULL;
            p[l] = data + offsets[i + l];
            len[l] = offsets[i + l + 1] - offsets[i + l];
            common = len[l] < common ? len[l] : common;
        }
        for (int32_t j = 0; j < common; j++)
            for (int l = 0; l < LANES; l++) h[l] = fnv1a_step(h[l], p[l][j]);
        for (int l = 0; l < LANES; l++) {
            for (int32_t j = common; j < len[l]; j++) h[l] = fnv1a_step(h[l], p[l][j]);
            out[i + l] = DIVISIBLE(h[l]);
        }
    }
    for (; i < n; i++) {
        uint64_t h = 0xCBF29CE484222325ULL;
        for (int32_t j = offsets[i]; j < offsets[i + 1]; j++) h = fnv1a_step(h, data[j]);
        out[i] = DIVISIBLE(h);
    }
#undef DIVISIBLE
}
