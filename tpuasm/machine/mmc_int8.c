/* MatrixMultiply on 8-bit operands as the TPU does it: integer products summed in int32,
 * using the CPU's AVX-512 VNNI instruction vpdpbusd (unsigned byte x signed byte, four
 * products summed into each int32 lane).  Built and loaded by native.py; called from the
 * numba core (kernels.py) whenever both operands are 8-bit and the array size is a multiple
 * of 16.  The float path (gemm.py) serves every other case and every other CPU.
 *
 * vpdpbusd wants one unsigned and one signed operand, whatever the instruction's U and W
 * flags say, so both are shifted into those ranges and the shift is paid back exactly:
 *     a = x + ox  (u8; ox = 128 for signed inputs, else 0: the byte XOR 0x80)
 *     b = w - ow  (s8; ow = 128 for unsigned weights, else 0: the byte XOR 0x80)
 *     sum_k a*b = sum_k x*w - ow * sum_k x + ox * sum_k w - ox * ow * K, and with
 *     sum_k x = sum_k a - ox * K the K terms cancel:
 *     sum_k x*w = sum_k a*b + ow * sum_k a - ox * sum_k w
 * The weight term (bias[j]) is computed once per tile by tpuasm_i8_pack; the input term
 * only exists with unsigned weights (ow = 128) and is summed per input row.  Every sum is exact modulo 2^32,
 * and the accumulators wrap modulo 2^32 anyway (spec/isa.md), so no bound on K is needed.
 */
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TPUASM_VNNI 1
#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define INLINE static inline __attribute__((always_inline))
#endif

enum { ROWS = 6, PANEL = 4 };   /* 6 rows x 64 columns: 24 accumulators + 4 weight registers */

int tpuasm_i8_supported(void)
{
#ifdef TPUASM_VNNI
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

/* packed[k/4][j][k%4] = b = w[k][j] - ow for the (n x n) tile w (row k feeds input k);
 * bias[j] = -ox * sum_k w[k][j].  Requires n % 4 == 0. */
void tpuasm_i8_pack(const uint8_t *w, int64_t n, int32_t signed_w, int32_t signed_x,
                    int8_t *packed, int32_t *bias)
{
    const uint32_t ox = signed_x ? 128u : 0u;
    for (int64_t j = 0; j < n; j++) {
        uint32_t column = 0;
        for (int64_t k = 0; k < n; k++) {
            uint8_t byte = w[k * n + j];
            column += signed_w ? (uint32_t)(int32_t)(int8_t)byte : (uint32_t)byte;
            packed[((k / 4) * n + j) * 4 + k % 4] = (int8_t)(byte ^ (signed_w ? 0 : 0x80));
        }
        bias[j] = (int32_t)(0u - ox * column);
    }
}

#ifdef TPUASM_VNNI
/* ow * sum_k a for one input row with unsigned weights (ow = 128). */
static int32_t row_term(const uint8_t *x, int64_t n, int32_t signed_x)
{
    uint32_t total = 0;
    for (int64_t k = 0; k < n; k++)
        total += (uint32_t)(x[k] ^ (signed_x ? 0x80 : 0));
    return (int32_t)(128u * total);
}

/* `rows` (1..ROWS) input rows x `vectors` (1..PANEL) groups of 16 columns from column j0. */
INLINE TARGET void block(int rows, int vectors, const uint8_t *const *x, int64_t n,
                         const int32_t *packed, const int32_t *bias, int64_t j0,
                         const int32_t *row_terms, __m512i flip, int32_t *const *out,
                         int overwrite)
{
    __m512i c[ROWS][PANEL];
    for (int i = 0; i < rows; i++) {
        const __m512i shift = _mm512_set1_epi32(row_terms[i]);
        for (int v = 0; v < vectors; v++)
            c[i][v] = _mm512_add_epi32(_mm512_loadu_si512(bias + j0 + 16 * v), shift);
    }
    for (int64_t k4 = 0; k4 < n / 4; k4++) {
        __m512i b[PANEL];
        for (int v = 0; v < vectors; v++)
            b[v] = _mm512_loadu_si512(packed + k4 * n + j0 + 16 * v);
        for (int i = 0; i < rows; i++) {
            int32_t four;
            memcpy(&four, x[i] + 4 * k4, 4);
            __m512i a = _mm512_xor_si512(_mm512_set1_epi32(four), flip);
            for (int v = 0; v < vectors; v++)
                c[i][v] = _mm512_dpbusd_epi32(c[i][v], a, b[v]);
        }
    }
    for (int i = 0; i < rows; i++)
        for (int v = 0; v < vectors; v++) {
            int32_t *p = out[i] + j0 + 16 * v;
            __m512i sum = overwrite ? c[i][v] : _mm512_add_epi32(c[i][v], _mm512_loadu_si512(p));
            _mm512_storeu_si512(p, sum);
        }
}

/* The compiler must see constant row and vector counts to keep the accumulators in
 * registers: one instantiation per count. */
#define ROWS_CASES(V)                                                                   \
    switch (rows) {                                                                     \
    case 6: block(6, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    case 5: block(5, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    case 4: block(4, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    case 3: block(3, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    case 2: block(2, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    default: block(1, V, x, n, packed, bias, j0, row_terms, flip, out, overwrite); break; \
    }
#endif

#ifdef TPUASM_VNNI
static TARGET void mmc_vnni(const uint8_t *ub, const int64_t *ub_rows, int64_t m, int64_t n,
                            const int32_t *packed, const int32_t *bias, int32_t signed_x,
                            int32_t signed_w, int32_t *acc, int64_t acc_row, int32_t overwrite)
{
    const __m512i flip = _mm512_set1_epi32(signed_x ? (int32_t)0x80808080u : 0);
    for (int64_t j0 = 0; j0 < n; j0 += 16 * PANEL) {
        int vectors = (n - j0) >= 16 * PANEL ? PANEL : (int)((n - j0) / 16);
        for (int64_t r = 0; r < m; r += ROWS) {
            int rows = (m - r) < ROWS ? (int)(m - r) : ROWS;
            const uint8_t *x[ROWS];
            int32_t *out[ROWS];
            int32_t row_terms[ROWS];
            for (int i = 0; i < rows; i++) {
                x[i] = ub + ub_rows[r + i] * n;
                out[i] = acc + (acc_row + r + i) * n;
                row_terms[i] = signed_w ? 0 : row_term(x[i], n, signed_x);
            }
            switch (vectors) {
            case 4: ROWS_CASES(4) break;
            case 3: ROWS_CASES(3) break;
            case 2: ROWS_CASES(2) break;
            default: ROWS_CASES(1) break;
            }
        }
    }
}
#endif

/* Accumulator rows acc_row + r (r < m) get (overwrite) or add (wrapping) the products of
 * UB row ub_rows[r] with the packed tile.  ub and acc are (rows x n) C arrays, n % 16 == 0.
 * Loop order: a 64-column panel of the tile (K x 64 bytes, 16 KB at n = 256, stays in L1)
 * against every input row, then the next panel.  Call only if tpuasm_i8_supported(). */
void tpuasm_i8_mmc(const uint8_t *ub, const int64_t *ub_rows, int64_t m, int64_t n,
                   const int8_t *packed, const int32_t *bias, int32_t signed_x,
                   int32_t signed_w, int32_t *acc, int64_t acc_row, int32_t overwrite)
{
#ifdef TPUASM_VNNI
    mmc_vnni(ub, ub_rows, m, n, (const int32_t *)packed, bias, signed_x, signed_w, acc,
             acc_row, overwrite);
#else
    (void)ub; (void)ub_rows; (void)m; (void)n; (void)packed; (void)bias;
    (void)signed_x; (void)signed_w; (void)acc; (void)acc_row; (void)overwrite;
#endif
}
