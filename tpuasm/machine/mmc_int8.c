/* MatrixMultiply as the TPU does it: integer products summed in int32.  Built and loaded by
 * native.py; called from the numba core (kernels.py) whenever the array size is a multiple
 * of 16.  The float path (gemm.py) serves other array sizes and CPUs without AVX2.
 *
 * Two instruction-set levels, chosen at run time (tpuasm_i8_level):
 *
 * LEVEL_VNNI (AVX-512 VNNI): vpdpbusd multiplies unsigned by signed bytes and sums four
 *   products into each int32 lane.  The input takes the slot of its own signedness (signed
 *   inputs the signed slot, as the broadcast operand; unsigned ones the unsigned slot), so
 *   input bytes are used as they are, and the weights the other slot: as they are when
 *   their signedness fits it (s8 x u8, u8 x s8), else shifted by 128 when packed:
 *       s8 x s8: (w + 128) * x summed = sum_k x*w + 128 * sum_k x
 *       u8 x u8: x * (w - 128) summed = sum_k x*w - 128 * sum_k x
 *   The input term 128 * sum_k x is summed once per input row (vnni_terms) and starts
 *   the accumulators.  (Before, the input was always the unsigned operand, XORed with
 *   0x80 at every broadcast for signed inputs, with a column term per tile and the input
 *   term summed again for every 64-column panel: u8 x u8 ran 11% slower than the rest,
 *   now all four run alike.)  A block of
 *   6 rows x 64 columns keeps its 24 accumulators in registers through all of K (4 weight
 *   loads and 6 broadcasts per 24 vpdpbusd): one thread runs at ~0.9-1.0 of the core's
 *   measured vpdpbusd rate, level with onnxruntime's MatMulInteger u8 x s8
 *   (benchmarks/bench_kernels.py).
 *   16-bit operands (H, D, HD: tpuasm_i16_mmc) take one pass of vpdpwssd (int16 pairs summed
 *   into int32 lanes, 32 MACs per instruction) with the same shift-and-pay-back for
 *   unsigned 16-bit operands (ox, ow = 32768), in place of one 8-bit pass per byte pair
 *   (four with H and D).
 *
 * LEVEL_AVX2: vpmaddwd multiplies int16 pairs and sums each pair into an int32 lane.  The
 *   operands' true values fit int16, so no shift is needed: the weights are packed as
 *   int16 pairs, each input row is widened to int16 once per group of rows.  A 16-bit
 *   operand is two 8-bit ones (the low byte unsigned): its products are two or four passes
 *   of the kernel, shifted by 8 or 16 bits (kernels.py).
 *
 * Every sum is exact modulo 2^32, and the accumulators wrap modulo 2^32 anyway
 * (spec/isa.md), so no bound on K is needed.  A call of enough work splits its rows into
 * 48-row blocks (the last 96 rows in 12-row ones) that the calling thread and one helper
 * thread per extra core take in turn from a shared counter, so a core that another process
 * keeps busy simply takes fewer blocks; the helpers are kept between calls and poll
 * briefly for the next one (see "helper threads").  The same pool runs large plain
 * Activates (tpuasm_act_rows), and tpuasm_pool_prepare wakes it before a large
 * MatrixMultiply's set-up, so that an emulated MLP keeps every core busy (native.py).
 */
#define _GNU_SOURCE                        /* sched_getcpu, pthread_setaffinity_np */
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { LEVEL_NONE = 0, LEVEL_AVX2 = 1, LEVEL_VNNI = 2 };
enum { WIDE16 = 16 };                     /* job->level of a 16-bit call (VNNI only) */
enum { ACT_JOB = 32 };                    /* job->level of an Activate (tpuasm_act_rows) */
enum { ACT_OUT_INT8, ACT_OUT_UINT8, ACT_OUT_INT16, ACT_OUT_WRAP8 };   /* as decoded.py */
enum { ACT_BLOCK_ROWS = 64 };             /* Activate rows per work item (64 KB of acc) */
static const int64_t ACT_SPLIT_VALUES = 1 << 17;   /* ~40 us of Activate on one core */
enum { MAX_THREADS = 8 };
enum { BLOCK_ROWS = 48 };   /* rows per work item: a multiple of both groups; small
                               enough that two threads end together (1024 rows: 22) */
static const int64_t SPLIT_MACS = 1 << 23;   /* below this, waking the pool costs more */

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TPUASM_X86 1
#define INLINE static inline __attribute__((always_inline))
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX2 __attribute__((target("avx2")))
#else
#define INLINE static inline
#endif

int tpuasm_i8_level(void)
{
#ifdef TPUASM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vnni"))
        return LEVEL_VNNI;
    if (__builtin_cpu_supports("avx2"))
        return LEVEL_AVX2;
#endif
    return LEVEL_NONE;
}

static int64_t true_value(uint8_t byte, int32_t is_signed)
{
    return is_signed ? (int8_t)byte : byte;
}

/* The (n x n) tile w (row k feeds input k) in the layout of `level`; n % 16 == 0.
 * VNNI: packed int8 [k/4][j][k%4]: the weight bytes for the vpdpbusd slot the input leaves
 *   free (signed inputs take the signed slot, unsigned ones the unsigned slot), as they are
 *   where they fit it, else XOR 0x80 (shifted by 128; vnni_terms pays it back).
 * AVX2: packed int16 [k/2][j][k%2] = w (2 n^2 bytes).
 * bias[j] = 0: no column term is needed at either level. */
void tpuasm_i8_pack(const uint8_t *w, int64_t n, int32_t signed_w, int32_t signed_x,
                    int32_t level, int8_t *packed, int32_t *bias)
{
    int16_t *pairs = (int16_t *)packed;
    const uint8_t shift = signed_x == signed_w ? 0x80 : 0;   /* the slot's range differs */
    if (level == LEVEL_VNNI) {
        /* four rows at a time, the packed bytes written in order: it runs before every
         * MatrixMultiply with a new tile, on one thread (38 us for n = 256 when written
         * row by row, each byte 4 apart; the pool's helpers stopped polling meanwhile) */
        for (int64_t k4 = 0; k4 < n / 4; k4++) {
            const uint8_t *r0 = w + 4 * k4 * n, *r1 = r0 + n, *r2 = r1 + n, *r3 = r2 + n;
            uint8_t *to = (uint8_t *)packed + 4 * k4 * n;
            for (int64_t j = 0; j < n; j++) {
                to[4 * j] = r0[j] ^ shift;
                to[4 * j + 1] = r1[j] ^ shift;
                to[4 * j + 2] = r2[j] ^ shift;
                to[4 * j + 3] = r3[j] ^ shift;
            }
        }
        for (int64_t j = 0; j < n; j++)
            bias[j] = 0;
        return;
    }
    for (int64_t k = 0; k < n; k++) {       /* row by row: the tile is read in order */
        const uint8_t *row = w + k * n;
        if (level == LEVEL_VNNI) {
            int8_t *to = packed + (k / 4) * n * 4 + k % 4;
            for (int64_t j = 0; j < n; j++)
                to[4 * j] = (int8_t)(row[j] ^ shift);
        } else {
            int16_t *to = pairs + (k / 2) * n * 2 + k % 2;
            for (int64_t j = 0; j < n; j++)
                to[2 * j] = (int16_t)true_value(row[j], signed_w);
        }
    }
    for (int64_t j = 0; j < n; j++)
        bias[j] = 0;
}

/* A 16-bit operand's value from its two bytes: the low one unsigned, the high one worth
 * 256 and signed unless the operand is unsigned. */
static int64_t wide_value(uint8_t low, uint8_t high, int32_t is_signed)
{
    return (int64_t)low + 256 * true_value(high, is_signed);
}

/* The (n x n) tile for tpuasm_i16_mmc: weights of 8 bits (lo, wide_w = 0) or 16 (lo and hi
 * bytes, wide_w = 1) as int16 pairs [k/2][j][k%2] = w - ow (n^2 int16), ow = 32768 for
 * unsigned 16-bit weights, else 0, and bias[j] = ox * sum_k w[k][j], ox = 32768 for
 * unsigned 16-bit inputs (see tpuasm_i16_mmc).  n % 16 == 0. */
void tpuasm_i16_pack(const uint8_t *lo, const uint8_t *hi, int64_t n, int32_t signed_w,
                     int32_t wide_w, int32_t signed_x, int32_t wide_x, int16_t *packed,
                     int32_t *bias)
{
    const int64_t ow = wide_w && !signed_w ? 32768 : 0;
    const uint32_t ox = wide_x && !signed_x ? 32768u : 0u;
    for (int64_t j = 0; j < n; j++) {
        uint32_t column = 0;
        for (int64_t k = 0; k < n; k++) {
            int64_t w = wide_w ? wide_value(lo[k * n + j], hi[k * n + j], signed_w)
                               : true_value(lo[k * n + j], signed_w);
            column += (uint32_t)w;
            packed[((k / 2) * n + j) * 2 + k % 2] = (int16_t)(w - ow);
        }
        bias[j] = (int32_t)(ox * column);
    }
}

struct job {
    const uint8_t *ub;
    const int64_t *ub_rows;
    int64_t m, n;
    const void *packed;
    const int32_t *bias;
    int32_t signed_x, signed_w, overwrite, shift, level;
    int32_t wide_x, wide_w;               /* WIDE16 only: 16-bit input (row r + 1 holds its
                                             high bytes), 16-bit weights */
    int32_t *acc;
    int64_t acc_row;
    int64_t next_block;                   /* shared: the next block to take */
    /* An Activate (level ACT_JOB, tpuasm_act_rows): rows are output vectors, read from
     * acc (row 0 = the instruction's first) and written to ub (per rows each) */
    const int32_t *act_acc;
    uint8_t *act_ub;
    int64_t mult, act_shift, zero;
    int32_t relu, out_kind, act_level;
    /* LEVEL_VNNI: the tile's rows from k_live on are zero (a multiple of 16; the rest
     * of the tile's K is skipped, its products being zero) */
    int64_t k_live;
};

#ifdef TPUASM_X86
/* ------------------------------------------------------------------ AVX-512 VNNI */
enum { VNNI_ROWS = 6, VNNI_VECTORS = 4 };    /* 6 x 64: 24 accumulators + 4 weight registers */

/* The accumulators' start for each input row (see the file's comment): -128 * sum_k x
 * for s8 x s8, +128 * sum_k x for u8 x u8, else 0.  Byte sums by vpsadbw, 16 at a time. */
static VNNI void vnni_terms(const uint8_t *const *x, int rows, int64_t kn, int32_t signed_x,
                            int32_t signed_w, int32_t *terms)
{
    for (int i = 0; i < rows; i++) {
        if (signed_x != signed_w) {
            terms[i] = 0;
            continue;
        }
        const __m128i flip = _mm_set1_epi8(signed_x ? (char)0x80 : 0), zero = _mm_setzero_si128();
        __m128i sums = zero;
        for (int64_t k = 0; k < kn; k += 16) {
            __m128i bytes = _mm_xor_si128(_mm_loadu_si128((const __m128i *)(x[i] + k)), flip);
            sums = _mm_add_epi64(sums, _mm_sad_epu8(bytes, zero));
        }
        uint32_t total = (uint32_t)(_mm_cvtsi128_si64(sums) + _mm_extract_epi64(sums, 1));
        if (signed_x)
            total -= (uint32_t)(128 * kn);     /* sum of x ^ 0x80 = sum of x + 128 kn */
        terms[i] = (int32_t)(signed_x ? 0u - 128u * total : 128u * total);
    }
}

/* out[0..15] (+)= c << shift */
INLINE VNNI void vnni_store(int32_t *p, __m512i c, int shift, int overwrite)
{
    if (shift)
        c = _mm512_sll_epi32(c, _mm_cvtsi32_si128(shift));
    _mm512_storeu_si512(p, overwrite ? c : _mm512_add_epi32(c, _mm512_loadu_si512(p)));
}

/* c + the four byte products of input a and weights b per lane, the input in the slot of
 * its signedness (signed_x: the signed one) */
INLINE VNNI __m512i vnni_dp(__m512i c, __m512i a, __m512i b, int signed_x)
{
    return signed_x ? _mm512_dpbusd_epi32(c, b, a) : _mm512_dpbusd_epi32(c, a, b);
}

/* `rows` input rows x `vectors` groups of 16 columns from column j0. */
INLINE VNNI void vnni_block(int rows, int vectors, const uint8_t *const *x, int64_t n,
                            int64_t kn, const int32_t *packed, const int32_t *bias, int64_t j0,
                            const int32_t *row_terms, int signed_x, int shift,
                            int32_t *const *out, int overwrite)
{
    __m512i c[VNNI_ROWS][VNNI_VECTORS];
    for (int i = 0; i < rows; i++) {
        const __m512i term = _mm512_set1_epi32(row_terms[i]);
        for (int v = 0; v < vectors; v++)
            c[i][v] = _mm512_add_epi32(_mm512_loadu_si512(bias + j0 + 16 * v), term);
    }
    for (int64_t k4 = 0; k4 < kn / 4; k4++) {
        __m512i b[VNNI_VECTORS];
        for (int v = 0; v < vectors; v++)
            b[v] = _mm512_loadu_si512(packed + k4 * n + j0 + 16 * v);
        for (int i = 0; i < rows; i++) {
            int32_t four;
            memcpy(&four, x[i] + 4 * k4, 4);
            const __m512i a = _mm512_set1_epi32(four);
            for (int v = 0; v < vectors; v++)
                c[i][v] = vnni_dp(c[i][v], a, b[v], signed_x);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < vectors; v++)
            vnni_store(out[i] + j0 + 16 * v, c[i][v], shift, overwrite);
}

/* The full 6 x 64 block, the one nearly all the work goes through, with its 24
 * accumulators as named variables: written as arrays (vnni_block), gcc's code for this
 * size kept them in registers or spilled them to the stack every iteration depending on
 * unrelated changes elsewhere in the file (measured 210 vs 75-85 GMAC/s). */
#define VNNI_INIT(i)                                                                       \
    const __m512i term##i = _mm512_set1_epi32(row_terms[i]);                               \
    __m512i c##i##0 = _mm512_add_epi32(bias0, term##i);                                    \
    __m512i c##i##1 = _mm512_add_epi32(bias1, term##i);                                    \
    __m512i c##i##2 = _mm512_add_epi32(bias2, term##i);                                    \
    __m512i c##i##3 = _mm512_add_epi32(bias3, term##i);
#define VNNI_STEP(i)                                                                       \
    {                                                                                      \
        int32_t four;                                                                      \
        memcpy(&four, x##i + 4 * k4, 4);                                                   \
        const __m512i a = _mm512_set1_epi32(four);                                         \
        c##i##0 = vnni_dp(c##i##0, a, b0, signed_x);                                       \
        c##i##1 = vnni_dp(c##i##1, a, b1, signed_x);                                       \
        c##i##2 = vnni_dp(c##i##2, a, b2, signed_x);                                       \
        c##i##3 = vnni_dp(c##i##3, a, b3, signed_x);                                       \
    }
#define VNNI_STORE(i)                                                                      \
    vnni_store(out[i] + j0, c##i##0, shift, overwrite);                                    \
    vnni_store(out[i] + j0 + 16, c##i##1, shift, overwrite);                               \
    vnni_store(out[i] + j0 + 32, c##i##2, shift, overwrite);                               \
    vnni_store(out[i] + j0 + 48, c##i##3, shift, overwrite);

INLINE VNNI void vnni_6x64_body(const uint8_t *const *x, int64_t n, int64_t kn,
                                const int32_t *packed,
                                const int32_t *bias, int64_t j0, const int32_t *row_terms,
                                const int signed_x, int shift, int32_t *const *out,
                                int overwrite)
{
    const uint8_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
    const __m512i bias0 = _mm512_loadu_si512(bias + j0);
    const __m512i bias1 = _mm512_loadu_si512(bias + j0 + 16);
    const __m512i bias2 = _mm512_loadu_si512(bias + j0 + 32);
    const __m512i bias3 = _mm512_loadu_si512(bias + j0 + 48);
    VNNI_INIT(0) VNNI_INIT(1) VNNI_INIT(2) VNNI_INIT(3) VNNI_INIT(4) VNNI_INIT(5)
    const int32_t *w = packed + j0;
    for (int64_t k4 = 0; k4 < kn / 4; k4++, w += n) {
        const __m512i b0 = _mm512_loadu_si512(w), b1 = _mm512_loadu_si512(w + 16),
                      b2 = _mm512_loadu_si512(w + 32), b3 = _mm512_loadu_si512(w + 48);
        VNNI_STEP(0) VNNI_STEP(1) VNNI_STEP(2) VNNI_STEP(3) VNNI_STEP(4) VNNI_STEP(5)
    }
    VNNI_STORE(0) VNNI_STORE(1) VNNI_STORE(2) VNNI_STORE(3) VNNI_STORE(4) VNNI_STORE(5)
}

/* One copy per input signedness, so that the slot choice is a constant. */
static __attribute__((noinline)) VNNI void vnni_6x64_unsigned(
    const uint8_t *const *x, int64_t n, int64_t kn, const int32_t *packed, const int32_t *bias,
    int64_t j0, const int32_t *terms, int shift, int32_t *const *out, int overwrite)
{ vnni_6x64_body(x, n, kn, packed, bias, j0, terms, 0, shift, out, overwrite); }
static __attribute__((noinline)) VNNI void vnni_6x64_signed(
    const uint8_t *const *x, int64_t n, int64_t kn, const int32_t *packed, const int32_t *bias,
    int64_t j0, const int32_t *terms, int shift, int32_t *const *out, int overwrite)
{ vnni_6x64_body(x, n, kn, packed, bias, j0, terms, 1, shift, out, overwrite); }
static VNNI void vnni_6x64(const uint8_t *const *x, int64_t n, int64_t kn,
                           const int32_t *packed, const int32_t *bias, int64_t j0,
                           const int32_t *terms, int signed_x, int shift, int32_t *const *out,
                           int overwrite)
{
    (signed_x ? vnni_6x64_signed : vnni_6x64_unsigned)(x, n, kn, packed, bias, j0, terms,
                                                       shift, out, overwrite);
}

/* Edges (fewer rows or columns): the array form, one function per count so that the
 * counts are constants. */
typedef void vnni_kernel(const uint8_t *const *, int64_t, int64_t, const int32_t *,
                         const int32_t *, int64_t, const int32_t *, int, int, int32_t *const *,
                         int);
#define VNNI_KERNEL(R, V)                                                                  \
    static __attribute__((noinline)) VNNI void vnni_##R##x##V(                            \
        const uint8_t *const *x, int64_t n, int64_t kn, const int32_t *packed,             \
        const int32_t *bias, int64_t j0, const int32_t *terms, int signed_x, int shift,    \
        int32_t *const *out, int overwrite)                                                \
    {                                                                                      \
        if (signed_x)                                                                      \
            vnni_block(R, V, x, n, kn, packed, bias, j0, terms, 1, shift, out, overwrite); \
        else                                                                               \
            vnni_block(R, V, x, n, kn, packed, bias, j0, terms, 0, shift, out, overwrite); \
    }
#define VNNI_KERNELS(R) VNNI_KERNEL(R, 1) VNNI_KERNEL(R, 2) VNNI_KERNEL(R, 3) VNNI_KERNEL(R, 4)
VNNI_KERNELS(1) VNNI_KERNELS(2) VNNI_KERNELS(3) VNNI_KERNELS(4) VNNI_KERNELS(5)
VNNI_KERNEL(6, 1) VNNI_KERNEL(6, 2) VNNI_KERNEL(6, 3)
#define VNNI_ROW(R) {vnni_##R##x1, vnni_##R##x2, vnni_##R##x3, vnni_##R##x4}
static vnni_kernel *const vnni_kernels[VNNI_ROWS][VNNI_VECTORS] = {
    VNNI_ROW(1), VNNI_ROW(2), VNNI_ROW(3), VNNI_ROW(4), VNNI_ROW(5),
    {vnni_6x1, vnni_6x2, vnni_6x3, vnni_6x64}};

/* Rows r0..r1-1 (at most BLOCK_ROWS): their input terms once, then a 64-column panel of
 * the tile (K x 64 bytes, 16 KB at n = 256, stays in L1) against every row of the range,
 * then the next panel. */
static VNNI void vnni_rows(const struct job *job, int64_t r0, int64_t r1)
{
    const int64_t n = job->n;
    const int64_t kn = job->k_live > 0 && job->k_live < n ? job->k_live : n;
    const int32_t *packed = (const int32_t *)job->packed;
    const uint8_t *x[BLOCK_ROWS];
    int32_t *out[BLOCK_ROWS];
    int32_t terms[BLOCK_ROWS];
    const int count = (int)(r1 - r0);
    for (int i = 0; i < count; i++) {
        x[i] = job->ub + job->ub_rows[r0 + i] * n;
        out[i] = job->acc + (job->acc_row + r0 + i) * n;
    }
    vnni_terms(x, count, kn, job->signed_x, job->signed_w, terms);
    for (int64_t j0 = 0; j0 < n; j0 += 16 * VNNI_VECTORS) {
        int vectors = (n - j0) >= 16 * VNNI_VECTORS ? VNNI_VECTORS : (int)((n - j0) / 16);
        for (int i = 0; i < count; i += VNNI_ROWS) {
            int rows = count - i < VNNI_ROWS ? count - i : VNNI_ROWS;
            vnni_kernels[rows - 1][vectors - 1](x + i, n, kn, packed, job->bias, j0, terms + i,
                                                job->signed_x, job->shift, out + i,
                                                job->overwrite);
        }
    }
}

/* ------------------------------------------------------------------ AVX-512 VNNI, 16-bit
 * vpdpwssd multiplies int16 pairs and sums each pair into an int32 lane: a 16-bit operand
 * in one pass instead of one per byte (H with D: one instead of four).  Both operands are
 * shifted into int16 and the shift paid back as in the 8-bit kernel:
 *     a = x - ox, b = w - ow (ox, ow = 32768 for unsigned 16-bit operands, else 0)
 *     sum_k x*w = sum_k a*b + ow * sum_k a + ox * sum_k w   (mod 2^32)
 * ox * sum_k w is the packed tile's bias; ow * sum_k a is summed per input row.  (The pair
 * sums themselves can wrap only at -32768 * -32768 * 2 = 2^31, and vpdpwssd wraps, which is
 * exact modulo 2^32 like everything else here.) */

/* `rows` int16 rows x `vectors` groups of 16 columns from column j0. */
INLINE VNNI void wide_block(int rows, int vectors, const int16_t *const *x, int64_t n,
                            const int32_t *pairs, const int32_t *bias, int64_t j0,
                            const int32_t *row_terms, int32_t *const *out, int overwrite)
{
    __m512i c[VNNI_ROWS][VNNI_VECTORS];
    for (int i = 0; i < rows; i++) {
        const __m512i term = _mm512_set1_epi32(row_terms[i]);
        for (int v = 0; v < vectors; v++)
            c[i][v] = _mm512_add_epi32(_mm512_loadu_si512(bias + j0 + 16 * v), term);
    }
    for (int64_t k2 = 0; k2 < n / 2; k2++) {
        __m512i b[VNNI_VECTORS];
        for (int v = 0; v < vectors; v++)
            b[v] = _mm512_loadu_si512(pairs + k2 * n + j0 + 16 * v);
        for (int i = 0; i < rows; i++) {
            int32_t two;
            memcpy(&two, x[i] + 2 * k2, 4);
            const __m512i a = _mm512_set1_epi32(two);
            for (int v = 0; v < vectors; v++)
                c[i][v] = _mm512_dpwssd_epi32(c[i][v], a, b[v]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < vectors; v++)
            vnni_store(out[i] + j0 + 16 * v, c[i][v], 0, overwrite);
}

/* The full 6 x 64 block with named accumulators (see vnni_6x64 for why). */
#define WIDE_STEP(i)                                                                       \
    {                                                                                      \
        int32_t two;                                                                       \
        memcpy(&two, x##i + 2 * k2, 4);                                                    \
        const __m512i a = _mm512_set1_epi32(two);                                          \
        c##i##0 = _mm512_dpwssd_epi32(c##i##0, a, b0);                                     \
        c##i##1 = _mm512_dpwssd_epi32(c##i##1, a, b1);                                     \
        c##i##2 = _mm512_dpwssd_epi32(c##i##2, a, b2);                                     \
        c##i##3 = _mm512_dpwssd_epi32(c##i##3, a, b3);                                     \
    }

static VNNI void wide_6x64(const int16_t *const *x, int64_t n, const int32_t *pairs,
                           const int32_t *bias, int64_t j0, const int32_t *row_terms,
                           int32_t *const *out, int overwrite)
{
    const int16_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3], *x4 = x[4], *x5 = x[5];
    const int shift = 0;
    const __m512i bias0 = _mm512_loadu_si512(bias + j0);
    const __m512i bias1 = _mm512_loadu_si512(bias + j0 + 16);
    const __m512i bias2 = _mm512_loadu_si512(bias + j0 + 32);
    const __m512i bias3 = _mm512_loadu_si512(bias + j0 + 48);
    VNNI_INIT(0) VNNI_INIT(1) VNNI_INIT(2) VNNI_INIT(3) VNNI_INIT(4) VNNI_INIT(5)
    const int32_t *w = pairs + j0;
    for (int64_t k2 = 0; k2 < n / 2; k2++, w += n) {
        const __m512i b0 = _mm512_loadu_si512(w), b1 = _mm512_loadu_si512(w + 16),
                      b2 = _mm512_loadu_si512(w + 32), b3 = _mm512_loadu_si512(w + 48);
        WIDE_STEP(0) WIDE_STEP(1) WIDE_STEP(2) WIDE_STEP(3) WIDE_STEP(4) WIDE_STEP(5)
    }
    VNNI_STORE(0) VNNI_STORE(1) VNNI_STORE(2) VNNI_STORE(3) VNNI_STORE(4) VNNI_STORE(5)
}

typedef void wide_kernel(const int16_t *const *, int64_t, const int32_t *, const int32_t *,
                         int64_t, const int32_t *, int32_t *const *, int);
#define WIDE_KERNEL(R, V)                                                                  \
    static __attribute__((noinline)) VNNI void wide_##R##x##V(                            \
        const int16_t *const *x, int64_t n, const int32_t *pairs, const int32_t *bias,     \
        int64_t j0, const int32_t *terms, int32_t *const *out, int overwrite)              \
    { wide_block(R, V, x, n, pairs, bias, j0, terms, out, overwrite); }
#define WIDE_KERNELS(R) WIDE_KERNEL(R, 1) WIDE_KERNEL(R, 2) WIDE_KERNEL(R, 3) WIDE_KERNEL(R, 4)
WIDE_KERNELS(1) WIDE_KERNELS(2) WIDE_KERNELS(3) WIDE_KERNELS(4) WIDE_KERNELS(5)
WIDE_KERNEL(6, 1) WIDE_KERNEL(6, 2) WIDE_KERNEL(6, 3)
#define WIDE_ROW(R) {wide_##R##x1, wide_##R##x2, wide_##R##x3, wide_##R##x4}
static wide_kernel *const wide_kernels[VNNI_ROWS][VNNI_VECTORS] = {
    WIDE_ROW(1), WIDE_ROW(2), WIDE_ROW(3), WIDE_ROW(4), WIDE_ROW(5),
    {wide_6x1, wide_6x2, wide_6x3, wide_6x64}};

/* Input row r as int16 a = x - ox into `a`; returns ow * sum_k a (0 unless ow). */
static VNNI int32_t wide_row(const struct job *job, int64_t r, int16_t *a)
{
    const int64_t n = job->n;
    const uint8_t *lo = job->ub + job->ub_rows[r] * n;
    if (job->wide_x) {
        const uint8_t *hi = lo + n;
        const uint16_t flip = job->signed_x ? 0 : 0x8000;     /* x - 32768 for unsigned */
        for (int64_t k = 0; k < n; k++)
            a[k] = (int16_t)(uint16_t)((lo[k] | (hi[k] << 8)) ^ flip);
    } else if (job->signed_x) {
        for (int64_t k = 0; k < n; k++)
            a[k] = (int8_t)lo[k];
    } else {
        for (int64_t k = 0; k < n; k++)
            a[k] = lo[k];
    }
    if (job->signed_w || !job->wide_w)
        return 0;                          /* ow = 0 */
    uint32_t total = 0;
    for (int64_t k = 0; k < n; k++)
        total += (uint32_t)(int32_t)a[k];
    return (int32_t)(32768u * total);
}

/* Rows r0..r1-1, six at a time: made int16 once (on the stack: 12 n bytes), then every
 * 64-column panel (the whole packed tile, 2 n^2 bytes, stays in L2). */
static VNNI void wide_rows(const struct job *job, int64_t r0, int64_t r1)
{
    const int64_t n = job->n;
    int16_t converted[VNNI_ROWS * n];
    const int32_t *pairs = (const int32_t *)job->packed;
    for (int64_t r = r0; r < r1; r += VNNI_ROWS) {
        int rows = (r1 - r) < VNNI_ROWS ? (int)(r1 - r) : VNNI_ROWS;
        const int16_t *x[VNNI_ROWS];
        int32_t *out[VNNI_ROWS];
        int32_t terms[VNNI_ROWS];
        for (int i = 0; i < rows; i++) {
            terms[i] = wide_row(job, r + i, converted + i * n);
            x[i] = converted + i * n;
            out[i] = job->acc + (job->acc_row + r + i) * n;
        }
        for (int64_t j0 = 0; j0 < n; j0 += 16 * VNNI_VECTORS) {
            int vectors = (n - j0) >= 16 * VNNI_VECTORS ? VNNI_VECTORS : (int)((n - j0) / 16);
            wide_kernels[rows - 1][vectors - 1](x, n, pairs, job->bias, j0, terms, out,
                                                job->overwrite);
        }
    }
}

/* For the benchmarks' peak figure: `iterations` x 12 independent 512-bit vpdpbusd (more
 * chains than the instruction's latency times its rate), returns how many ran. */
VNNI int64_t tpuasm_i8_vnni_probe(int64_t iterations)
{
    __m512i c[12];
    for (int i = 0; i < 12; i++)
        c[i] = _mm512_set1_epi32(i);                /* distinct: no two chains merge */
    __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101);
    for (int64_t it = 0; it < iterations; it++) {
        __asm__ volatile("" : "+v"(a), "+v"(b));  /* operands unknown to the compiler */
        for (int i = 0; i < 12; i++)
            c[i] = _mm512_dpbusd_epi32(c[i], a, b);
    }
    __m512i s = c[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_epi32(s, c[i]);
    volatile int32_t sink = _mm512_reduce_add_epi32(s);
    (void)sink;
    return 12 * iterations;
}

/* ------------------------------------------------------------------ AVX2 */
enum { AVX2_ROWS = 4, AVX2_VECTORS = 2 };    /* 4 x 16: 8 accumulators of 16 registers */

/* out[0..7] (+)= c << shift */
INLINE AVX2 void avx2_store(int32_t *p, __m256i c, int shift, int overwrite)
{
    if (shift)
        c = _mm256_sll_epi32(c, _mm_cvtsi32_si128(shift));
    __m256i *q = (__m256i *)p;
    _mm256_storeu_si256(q, overwrite ? c : _mm256_add_epi32(c, _mm256_loadu_si256(q)));
}

/* `rows` widened input rows (x[i]: n int16) x 16 columns from column j0. */
INLINE AVX2 void avx2_block(int rows, const int16_t *const *x, int64_t n,
                            const int32_t *pairs, int64_t j0, int shift,
                            int32_t *const *out, int overwrite)
{
    __m256i c[AVX2_ROWS][AVX2_VECTORS];
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < AVX2_VECTORS; v++)
            c[i][v] = _mm256_setzero_si256();
    for (int64_t k2 = 0; k2 < n / 2; k2++) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(pairs + k2 * n + j0));
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(pairs + k2 * n + j0 + 8));
        for (int i = 0; i < rows; i++) {
            int32_t two;
            memcpy(&two, x[i] + 2 * k2, 4);
            const __m256i a = _mm256_set1_epi32(two);
            c[i][0] = _mm256_add_epi32(c[i][0], _mm256_madd_epi16(a, b0));
            c[i][1] = _mm256_add_epi32(c[i][1], _mm256_madd_epi16(a, b1));
        }
    }
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < AVX2_VECTORS; v++)
            avx2_store(out[i] + j0 + 8 * v, c[i][v], shift, overwrite);
}

/* The full 4 x 16 block with named accumulators (see vnni_6x64 for why). */
#define AVX2_STEP(i)                                                                       \
    {                                                                                      \
        int32_t two;                                                                       \
        memcpy(&two, x##i + 2 * k2, 4);                                                    \
        const __m256i a = _mm256_set1_epi32(two);                                          \
        c##i##0 = _mm256_add_epi32(c##i##0, _mm256_madd_epi16(a, b0));                     \
        c##i##1 = _mm256_add_epi32(c##i##1, _mm256_madd_epi16(a, b1));                     \
    }
#define AVX2_STORE(i)                                                                      \
    avx2_store(out[i] + j0, c##i##0, shift, overwrite);                                    \
    avx2_store(out[i] + j0 + 8, c##i##1, shift, overwrite);

static AVX2 void avx2_4x16(const int16_t *const *x, int64_t n, const int32_t *pairs,
                           int64_t j0, int shift, int32_t *const *out, int overwrite)
{
    const int16_t *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
    __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00,
            c21 = c00, c30 = c00, c31 = c00;
    const int32_t *w = pairs + j0;
    for (int64_t k2 = 0; k2 < n / 2; k2++, w += n) {
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)w);
        const __m256i b1 = _mm256_loadu_si256((const __m256i *)(w + 8));
        AVX2_STEP(0) AVX2_STEP(1) AVX2_STEP(2) AVX2_STEP(3)
    }
    AVX2_STORE(0) AVX2_STORE(1) AVX2_STORE(2) AVX2_STORE(3)
}

typedef void avx2_kernel(const int16_t *const *, int64_t, const int32_t *, int64_t, int,
                         int32_t *const *, int);
#define AVX2_KERNEL(R)                                                                     \
    static __attribute__((noinline)) AVX2 void avx2_##R(                                  \
        const int16_t *const *x, int64_t n, const int32_t *pairs, int64_t j0, int shift,   \
        int32_t *const *out, int overwrite)                                                \
    { avx2_block(R, x, n, pairs, j0, shift, out, overwrite); }
AVX2_KERNEL(1) AVX2_KERNEL(2) AVX2_KERNEL(3)
static avx2_kernel *const avx2_kernels[AVX2_ROWS] = {avx2_1, avx2_2, avx2_3, avx2_4x16};

/* Rows r0..r1-1, four at a time: widen them to int16 once (on the stack: 8 n bytes), then
 * every 16-column panel. */
static AVX2 void avx2_rows(const struct job *job, int64_t r0, int64_t r1)
{
    const int64_t n = job->n;
    int16_t widened[AVX2_ROWS * n];
    const int32_t *pairs = (const int32_t *)job->packed;
    const int ov = job->overwrite;
    const int sh = job->shift;
    for (int64_t r = r0; r < r1; r += AVX2_ROWS) {
        int rows = (r1 - r) < AVX2_ROWS ? (int)(r1 - r) : AVX2_ROWS;
        const int16_t *x[AVX2_ROWS];
        int32_t *out[AVX2_ROWS];
        for (int i = 0; i < rows; i++) {
            const uint8_t *bytes = job->ub + job->ub_rows[r + i] * n;
            int16_t *row = widened + i * n;
            for (int64_t k = 0; k < n; k++)
                row[k] = (int16_t)true_value(bytes[k], job->signed_x);
            x[i] = row;
            out[i] = job->acc + (job->acc_row + r + i) * n;
        }
        for (int64_t j0 = 0; j0 < n; j0 += 8 * AVX2_VECTORS)
            avx2_kernels[rows - 1](x, n, pairs, j0, sh, out, ov);
    }
}
#endif

/* ------------------------------------------------------------------ Activate
 * The plain Activate (spec/isa.md 5.5: no pooling, ReLU or no function, the requantization
 * registers, no extension) on rows of output vectors, so that a large one is shared by the
 * pool like a MatrixMultiply: kernels.py's _execute_act computes the same, one row at a time
 * on the calling thread.  y = ((v * mult + rounding) >> shift) + zero in int64 (|v * mult|
 * <= 2^62), then saturated or wrapped to the output type.  One loop per output type so each
 * vectorizes. */
INLINE int64_t act_value(int32_t a, int relu, int64_t mult, int64_t rounding, int64_t shift,
                         int64_t zero)
{
    int64_t v = a;
    if (relu && v < 0)
        v = 0;
    return ((v * mult + rounding) >> shift) + zero;
}

INLINE int64_t clamp64(int64_t y, int64_t lo, int64_t hi)
{
    return y < lo ? lo : (y > hi ? hi : y);
}

INLINE void act_rows_body(const struct job *job, int64_t r0, int64_t r1)
{
    const int64_t n = job->n, mult = job->mult, shift = job->act_shift, zero = job->zero;
    const int64_t rounding = shift > 0 ? (int64_t)1 << (shift - 1) : 0;
    const int relu = job->relu;
    const int64_t per = job->out_kind == ACT_OUT_INT16 ? 2 : 1;
    for (int64_t o = r0; o < r1; o++) {
        const int32_t *src = job->act_acc + o * n;
        uint8_t *u = job->act_ub + o * per * n;
        switch (job->out_kind) {
        case ACT_OUT_INT8:
            for (int64_t j = 0; j < n; j++)
                u[j] = (uint8_t)clamp64(act_value(src[j], relu, mult, rounding, shift, zero),
                                        -128, 127);
            break;
        case ACT_OUT_UINT8:
            for (int64_t j = 0; j < n; j++)
                u[j] = (uint8_t)clamp64(act_value(src[j], relu, mult, rounding, shift, zero),
                                        0, 255);
            break;
        case ACT_OUT_INT16:
            for (int64_t j = 0; j < n; j++) {
                int64_t y = clamp64(act_value(src[j], relu, mult, rounding, shift, zero),
                                    -32768, 32767);
                u[j] = (uint8_t)y;
                u[n + j] = (uint8_t)(y >> 8);
            }
            break;
        default:                                   /* ACT_OUT_WRAP8: the low 8 bits */
            for (int64_t j = 0; j < n; j++)
                u[j] = (uint8_t)act_value(src[j], relu, mult, rounding, shift, zero);
        }
    }
}

#ifdef TPUASM_X86
static __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl"))) void act_rows_avx512(
    const struct job *job, int64_t r0, int64_t r1)
{ act_rows_body(job, r0, r1); }
static AVX2 void act_rows_avx2(const struct job *job, int64_t r0, int64_t r1)
{ act_rows_body(job, r0, r1); }
#endif
static void act_rows_plain(const struct job *job, int64_t r0, int64_t r1)
{ act_rows_body(job, r0, r1); }

static void act_rows(const struct job *job, int64_t r0, int64_t r1)
{
#ifdef TPUASM_X86
    if (job->act_level == LEVEL_VNNI && __builtin_cpu_supports("avx512dq")
            && __builtin_cpu_supports("avx512vl"))
        act_rows_avx512(job, r0, r1);
    else if (job->act_level == LEVEL_AVX2)
        act_rows_avx2(job, r0, r1);
    else
#endif
        act_rows_plain(job, r0, r1);
}

/* Take blocks from the shared counter until none is left.  A MatrixMultiply's last
 * TAIL_ROWS rows come in blocks of TAIL_BLOCK_ROWS: the thread that takes the last block
 * is waited for by the others, so the last blocks are short (with 48-row ones the caller
 * waited 43 us a call for its helper, a sixth of a 2,048-row MatrixMultiply on two cores). */
enum { TAIL_BLOCK_ROWS = 12, TAIL_ROWS = 2 * BLOCK_ROWS };

static int64_t work(struct job *job)
{
    int64_t taken = 0;
    const int act = job->level == ACT_JOB;
    const int64_t rows = act ? ACT_BLOCK_ROWS : BLOCK_ROWS;
    const int64_t tail = act || job->m < 2 * TAIL_ROWS ? 0 : TAIL_ROWS;
    const int64_t head = job->m - tail;                 /* rows in full-size blocks */
    const int64_t head_blocks = (head + rows - 1) / rows;
    const int64_t blocks = head_blocks + tail / TAIL_BLOCK_ROWS;
    for (;;) {
        int64_t b = __atomic_fetch_add(&job->next_block, 1, __ATOMIC_RELAXED);
        if (b >= blocks)
            break;
        taken++;
        int64_t r0, r1;
        if (b < head_blocks) {
            r0 = b * rows;
            r1 = r0 + rows < head ? r0 + rows : head;
        } else {
            r0 = head + (b - head_blocks) * TAIL_BLOCK_ROWS;
            r1 = r0 + TAIL_BLOCK_ROWS;
        }
        if (act)
            act_rows(job, r0, r1);
#ifdef TPUASM_X86
        else if (job->level == WIDE16)
            wide_rows(job, r0, r1);
        else if (job->level == LEVEL_VNNI)
            vnni_rows(job, r0, r1);
        else
            avx2_rows(job, r0, r1);
#endif
    }
    return taken;
}

/* ------------------------------------------------------------------ helper threads
 * Started on first need and kept: a thread created per call often starts on the caller's
 * core and is not moved to the idle one before a sub-millisecond call is over.  After a job
 * a helper polls for the next one for SPIN_NS before it sleeps on a condition variable, and
 * the caller polls for the helpers' end the same way: a MatrixMultiply of 1024 rows takes
 * ~0.2 ms on two cores, and a helper woken from sleep often came after the caller had done
 * all the work (2 threads at a median 92 GMAC/s against 273 polling, load 9; 387-392 for
 * both 200 and 30 us of polling at load 5).  Polling is short because it is not free: with
 * the scheduler's autogroups a process's threads share its group's part of the CPU, and
 * 200 us after every MatrixMultiply of the emulator's MLPs (its other work is single-
 * threaded) cost their main thread 10-40% at load 5.  One job at a time: a call that
 * finds the pool in use by another thread works alone.  After fork() the child starts
 * without helpers. */
#include <time.h>

static const int64_t SPIN_NS = 30000;
/* What the pool did, for measuring it (tpuasm_pool_stats; indices as STAT_*): updated by
 * the pool's owner, the helpers' two with atomic adds. */
enum { STAT_SHARED, STAT_ALONE, STAT_WORKED_NS, STAT_WAITED_NS, STAT_WAITED_LONGER,
       STAT_HELPER_DELAY_NS, STAT_HELPER_BLOCKS, STAT_CALLER_BLOCKS, STAT_COUNT };
static int64_t stats[STAT_COUNT];

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void relax(void)
{
#ifdef TPUASM_X86
    __builtin_ia32_pause();
#endif
}

static struct {
    pthread_mutex_t in_use;                /* held by the call that owns the pool */
    pthread_mutex_t lock;                  /* guards sleeping and waking on the conditions */
    pthread_cond_t wake, done;
    struct job *job;                       /* written before generation is bumped */
    uint64_t generation;                   /* (atomic) job number << 8 | helpers wanted for
                                              it: one store publishes both */
    int helpers;                           /* started so far */
    int running;                           /* wanted helpers still working on the job (atomic) */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, NULL, 0, 0, 0};

/* The next generation after `seen`: polled for SPIN_NS, then waited for. */
static uint64_t next_generation(uint64_t seen)
{
    const int64_t start = now_ns();
    for (int i = 0;; i++) {
        uint64_t g = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE);
        if (g != seen)
            return g;
        if ((i & 255) == 255 && now_ns() - start > SPIN_NS)
            break;
        relax();
    }
    pthread_mutex_lock(&pool.lock);
    uint64_t g;
    while ((g = __atomic_load_n(&pool.generation, __ATOMIC_ACQUIRE)) == seen)
        pthread_cond_wait(&pool.wake, &pool.lock);
    pthread_mutex_unlock(&pool.lock);
    return g;
}

/* The generation current when each helper was started (under in_use, before the next job
 * is posted): a helper started for a later job, or in a forked child whose generation is
 * not 0, must not take the job before as its own. */
static uint64_t started_at[MAX_THREADS];
static pthread_t threads_of[MAX_THREADS];   /* the helpers (under in_use) */
static int64_t posted_ns;

static void *helper(void *arg)
{
    const int index = (int)(intptr_t)arg;
    uint64_t seen = started_at[index];
    for (;;) {
        seen = next_generation(seen);
        /* A helper wanted for a job always sees its generation (the caller does not post
         * the next one before every wanted helper has finished this one), and pool.job
         * stays until it has. */
        if (index >= (int)(seen & 0xFF))
            continue;                      /* not needed for this job */
        __atomic_add_fetch(&stats[STAT_HELPER_DELAY_NS], now_ns() - posted_ns,
                           __ATOMIC_RELAXED);
        __atomic_add_fetch(&stats[STAT_HELPER_BLOCKS], work(pool.job), __ATOMIC_RELAXED);
        if (__atomic_sub_fetch(&pool.running, 1, __ATOMIC_ACQ_REL) == 0) {
            pthread_mutex_lock(&pool.lock);
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.lock);
        }
    }
    return NULL;
}

/* Calls the helpers made slower: a helper that another process preempts in the middle
 * of a block holds the caller until the scheduler runs it again (milliseconds, for a call
 * of a fraction of one).  When the caller waited for the helpers longer than it worked
 * itself, the next 2, 4, 8 or 16 calls work alone, then the helpers get another try; on a
 * quiet machine no call waits that long.  (bench_emulator.py 1 at load 6: the MLPs on two
 * threads ran at 0.43-0.75 of their speed on one.)  Touched only by the pool's owner. */
static struct {
    int skip;                              /* calls to make alone from now */
    int penalty;                           /* log2 of the last skip */
} backoff;

/* The counters (see STAT_*) into out[STAT_COUNT], then zeroed if `reset`.  Helpers'
 * delay: from the job's posting to a helper's start on it, summed over helpers. */
void tpuasm_pool_stats(int64_t *out, int32_t reset)
{
    for (int i = 0; i < STAT_COUNT; i++)
        out[i] = reset ? __atomic_exchange_n(&stats[i], 0, __ATOMIC_RELAXED)
                       : __atomic_load_n(&stats[i], __ATOMIC_RELAXED);
}

/* steer_helpers's state (touched by the pool's owner) */
static struct {
    int ready;                             /* 1: mask read; -1: steering is off */
    cpu_set_t allowed;                     /* the process's cores when the pool started */
    int away_from;                         /* the core the helpers avoid now, or -1 */
    int helpers;                           /* helpers steered so far */
} steer = {0};

static void forget_helpers(void)           /* in a forked child: they do not exist there */
{
    pthread_mutex_init(&pool.in_use, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.done, NULL);
    pool.helpers = pool.running = 0;
    pool.job = NULL;
    backoff.skip = backoff.penalty = 0;
    steer.ready = 0;
    steer.helpers = 0;
}

/* Start helpers up to `count` (under in_use); returns how many there are. */
static int start_helpers(int count)
{
    static int fork_handler;
    if (!fork_handler)
        fork_handler = pthread_atfork(NULL, NULL, forget_helpers) == 0 ? 1 : -1;
    if (fork_handler < 0)
        return 0;                          /* without the handler a child would hang */
    while (pool.helpers < count) {
        pthread_t thread;
        started_at[pool.helpers] = __atomic_load_n(&pool.generation, __ATOMIC_RELAXED);
        if (pthread_create(&thread, NULL, helper, (void *)(intptr_t)pool.helpers) != 0)
            break;
        pthread_detach(thread);
        threads_of[pool.helpers] = thread;
        pool.helpers++;
    }
    return pool.helpers;
}

/* Keep the helpers off the caller's core (under in_use).  A helper sleeping between calls
 * is woken on a core the scheduler picks, and on a loaded machine it often picked the
 * caller's: the two then took turns on one core while the other ran another process
 * (bench_emulator.py 1 at load 7: an MLP on "two threads" at the speed of one, with as
 * much CPU time as wall time, its helper doing half the blocks).  So each helper may run
 * on any core this process could use when the pool started except the one the caller is
 * on; when the caller moves, the helpers' cores follow (one system call per helper, only
 * then).  Nothing changes with one core, or where the calls fail. */
static void steer_helpers(void)
{
    if (steer.ready == 0) {
        steer.ready = sched_getaffinity(0, sizeof steer.allowed, &steer.allowed) == 0
                      && CPU_COUNT(&steer.allowed) > 1 ? 1 : -1;
        steer.away_from = -1;
    }
    if (steer.ready < 0 || pool.helpers == 0)
        return;
    const int cpu = sched_getcpu();
    if (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &steer.allowed))
        return;
    if (cpu == steer.away_from && steer.helpers == pool.helpers)
        return;
    cpu_set_t others = steer.allowed;
    CPU_CLR(cpu, &others);
    for (int i = 0; i < pool.helpers; i++)
        if (pthread_setaffinity_np(threads_of[i], sizeof others, &others) != 0) {
            steer.ready = -1;                  /* not allowed here: leave them be */
            return;
        }
    steer.away_from = cpu;
    steer.helpers = pool.helpers;
}

/* Run the job on this thread and up to `extra` helpers; returns when every block is done
 * and no helper will touch the job again (it lives on the caller's stack). */
static void share(struct job *job, int extra)
{
    if (extra <= 0 || pthread_mutex_trylock(&pool.in_use) != 0) {
        work(job);
        return;
    }
    if (backoff.skip > 0) {
        stats[STAT_ALONE]++;
        backoff.skip--;
        pthread_mutex_unlock(&pool.in_use);
        work(job);
        return;
    }
    int helpers = start_helpers(extra);
    steer_helpers();
    int wanted = helpers < extra ? helpers : extra;
    pool.job = job;
    __atomic_store_n(&pool.running, wanted, __ATOMIC_RELAXED);
    posted_ns = now_ns();
    pthread_mutex_lock(&pool.lock);
    uint64_t next = ((__atomic_load_n(&pool.generation, __ATOMIC_RELAXED) >> 8) + 1) << 8;
    __atomic_store_n(&pool.generation, next | (uint64_t)wanted, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    const int64_t began = now_ns();
    stats[STAT_CALLER_BLOCKS] += work(job);
    const int64_t start = now_ns();
    for (int i = 0; __atomic_load_n(&pool.running, __ATOMIC_ACQUIRE) > 0; i++) {
        if ((i & 255) == 255 && now_ns() - start > SPIN_NS) {
            pthread_mutex_lock(&pool.lock);
            while (__atomic_load_n(&pool.running, __ATOMIC_ACQUIRE) > 0)
                pthread_cond_wait(&pool.done, &pool.lock);
            pthread_mutex_unlock(&pool.lock);
            break;
        }
        relax();
    }
    const int64_t waited = now_ns() - start;
    stats[STAT_SHARED]++;
    stats[STAT_WORKED_NS] += start - began;
    stats[STAT_WAITED_NS] += waited;
    stats[STAT_WAITED_LONGER] += waited > start - began;
    if (waited > start - began) {
        backoff.penalty = backoff.penalty < 4 ? backoff.penalty + 1 : 4;
        backoff.skip = 1 << backoff.penalty;
    } else {
        backoff.penalty = 0;
    }
    pool.job = NULL;
    pthread_mutex_unlock(&pool.in_use);
}

/* A hint that a call to share among `threads` threads comes soon (the caller is about to
 * pack a tile, say): helpers asleep are woken now, by a generation that wants none of
 * them, so that they poll for the job when it comes instead of being woken then (in a
 * virtual machine waking a thread on an idle core took ~100-140 us, half of a 2,048-row
 * MatrixMultiply's share).  Does nothing when the pool is busy or backing off. */
void tpuasm_pool_prepare(int32_t threads)
{
    if (threads <= 1 || pthread_mutex_trylock(&pool.in_use) != 0)
        return;
    if (pool.helpers > 0 && backoff.skip == 0) {
        steer_helpers();
        pthread_mutex_lock(&pool.lock);
        uint64_t next = ((__atomic_load_n(&pool.generation, __ATOMIC_RELAXED) >> 8) + 1) << 8;
        __atomic_store_n(&pool.generation, next, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    pthread_mutex_unlock(&pool.in_use);
}

/* Accumulator rows acc_row + r (r < m) get (overwrite) or add (wrapping) the products of
 * UB row ub_rows[r] with the tile packed for `level`, times 2^shift, on up to `threads`
 * threads.  ub and acc are (rows x n) C arrays, n % 16 == 0.  Call only with
 * 0 < level <= tpuasm_i8_level().  (A 16-bit operand is two 8-bit ones, low byte unsigned:
 * its products are the sum of 8-bit products shifted by 0, 8 or 16 bits, exact mod 2^32.)
 * k_live: the tile's rows from k_live on are zero (a multiple of 16; 0 or n: not known);
 * LEVEL_VNNI skips them (a layer of K < n, e.g. a first convolution's 48 channels). */
void tpuasm_i8_mmc(const uint8_t *ub, const int64_t *ub_rows, int64_t m, int64_t n,
                   int64_t k_live, const int8_t *packed, const int32_t *bias, int32_t signed_x,
                   int32_t signed_w, int32_t *acc, int64_t acc_row, int32_t overwrite,
                   int32_t shift, int32_t level, int32_t threads)
{
    struct job job = {ub, ub_rows, m, n, packed, bias, signed_x, signed_w, overwrite, shift,
                      level, 0, 0, acc, acc_row, 0};
    job.k_live = k_live;
    const int64_t kn = k_live > 0 && k_live < n ? k_live : n;
    int extra = m * kn * n >= SPLIT_MACS && m > BLOCK_ROWS ? threads - 1 : 0;
    share(&job, extra < MAX_THREADS ? extra : MAX_THREADS - 1);
}

/* As tpuasm_i8_mmc for operands of which one or both are 16-bit, in one pass of vpdpwssd
 * (call only where tpuasm_i8_level() is LEVEL_VNNI): input r is UB row ub_rows[r] (its low
 * bytes) and, with wide_x, row ub_rows[r] + 1 (its high bytes, signed unless !signed_x);
 * the tile is packed by tpuasm_i16_pack with the same signedness and widths. */
void tpuasm_i16_mmc(const uint8_t *ub, const int64_t *ub_rows, int64_t m, int64_t n,
                    const int16_t *packed, const int32_t *bias, int32_t signed_x,
                    int32_t wide_x, int32_t signed_w, int32_t wide_w, int32_t *acc,
                    int64_t acc_row, int32_t overwrite, int32_t threads)
{
    struct job job = {ub, ub_rows, m, n, packed, bias, signed_x, signed_w, overwrite, 0,
                      WIDE16, wide_x, wide_w, acc, acc_row, 0};
    /* twice the instructions of an 8-bit call per MAC: worth splitting at half the size */
    int extra = 2 * m * n * n >= SPLIT_MACS && m > BLOCK_ROWS ? threads - 1 : 0;
    share(&job, extra < MAX_THREADS ? extra : MAX_THREADS - 1);
}

/* An Activate's plain arithmetic (see act_rows_body) on output vectors 0..m-1: vector o
 * reads acc row o (of n int32) and writes ub row o (8-bit outputs) or rows 2o, 2o + 1
 * (int16: low bytes, high bytes), on up to `threads` threads.  acc and ub point at the
 * iteration's first rows; the two do not overlap (separate memories).  level: what the
 * vector code may use (tpuasm_i8_level's values). */
void tpuasm_act_rows(const int32_t *acc, uint8_t *ub, int64_t m, int64_t n, int32_t relu,
                     int64_t mult, int64_t shift, int64_t zero, int32_t out_kind,
                     int32_t level, int32_t threads)
{
    struct job job;
    memset(&job, 0, sizeof job);
    job.m = m;
    job.n = n;
    job.level = ACT_JOB;
    job.act_acc = acc;
    job.act_ub = ub;
    job.relu = relu;
    job.mult = mult;
    job.act_shift = shift;
    job.zero = zero;
    job.out_kind = out_kind;
    job.act_level = level;
    int extra = m * n >= ACT_SPLIT_VALUES && m > ACT_BLOCK_ROWS ? threads - 1 : 0;
    share(&job, extra < MAX_THREADS ? extra : MAX_THREADS - 1);
}
