/* Slipstream's one native kernel: gather variable-length lists (a history per row) by row index.
 *
 * The column may be split into k segments (an Arrow chunked array: one segment a data file); rows
 * row_starts[s] .. row_starts[s + 1] - 1 live in segment s, whose list r (local) is
 * values[s][offsets[s][r] .. offsets[s][r + 1]), each element itemsize bytes.
 *
 * For every i, list idx[i] is copied to the end of `out` and out_offsets[i + 1] is set to the
 * number of elements written so far (out_offsets[0] = 0). Each list is one memcpy; the offsets of
 * the row 16 ahead and the values of the row 8 ahead are prefetched, so the random reads of a
 * shuffle overlap instead of waiting on memory one after another.
 *
 * The caller checks every idx is in [0, row_starts[k]) and the offsets are Arrow-valid; the kernel
 * still refuses to write past out_capacity elements (returns -1). Returns the elements written.
 */
#include <stdint.h>
#include <string.h>

#define SEGMENT_OF(row, seg)                                        \
    do {                                                            \
        seg = 0;                                                    \
        while (seg + 1 < k && (row) >= row_starts[seg + 1]) seg++;  \
    } while (0)

#define TAKE_LISTS(NAME, OFF_T)                                                               \
    int64_t NAME(int64_t n, const int64_t *idx, int32_t k, const int64_t *row_starts,          \
                 const char *const *values, const OFF_T *const *offsets, int64_t itemsize,     \
                 char *out, int64_t out_capacity, int64_t *out_offsets) {                     \
        int64_t written = 0;                                                                  \
        int32_t s;                                                                            \
        out_offsets[0] = 0;                                                                   \
        for (int64_t i = 0; i < n; i++) {                                                     \
            if (i + 16 < n) {                                                                 \
                int64_t ahead = idx[i + 16];                                                  \
                SEGMENT_OF(ahead, s);                                                         \
                __builtin_prefetch(offsets[s] + (ahead - row_starts[s]));                     \
            }                                                                                 \
            if (i + 8 < n) {                                                                  \
                int64_t ahead = idx[i + 8];                                                   \
                SEGMENT_OF(ahead, s);                                                         \
                const OFF_T *o = offsets[s] + (ahead - row_starts[s]);                        \
                __builtin_prefetch(values[s] + (int64_t)o[0] * itemsize);                     \
            }                                                                                 \
            int64_t row = idx[i];                                                             \
            SEGMENT_OF(row, s);                                                               \
            const OFF_T *o = offsets[s] + (row - row_starts[s]);                              \
            int64_t len = (int64_t)(o[1] - o[0]);                                             \
            if (len < 0 || written + len > out_capacity) return -1;                           \
            if (len)                                                                          \
                memcpy(out + written * itemsize, values[s] + (int64_t)o[0] * itemsize,        \
                       (size_t)(len * itemsize));                                             \
            written += len;                                                                   \
            out_offsets[i + 1] = written;                                                     \
        }                                                                                     \
        return written;                                                                       \
    }

TAKE_LISTS(take_lists_i32, int32_t)
TAKE_LISTS(take_lists_i64, int64_t)
