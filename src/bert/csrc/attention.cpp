// Attention for the CPU, float32: softmax(q k^T * scale + bias) v for every head of every sequence, reading q, k,
// v as the projections write them ([B, T, N * D]) and writing the context the same way, so no head transposes are
// needed on either side; in inference (`bert_attention`) and in training with dropout on the probabilities,
// forward and backward (`bert_attention_training`). bert/csrc/__init__.py compiles it for the CPU it runs on
// (AVX-512 or AVX2) and bert/cpu_kernels.py calls it; torch's own CPU attention multiplies through MKL, whose
// path on AMD CPUs uses half the vector width, and has no dropout in its fused kernels (bench/RESULTS.md).
//
// Per head, a tile of R query rows at a time: its scores against every key (K transposed once per head so a
// vector holds W keys), the rows' maxima kept as the scores are written; then 2^(s - max) in place, with the
// scale and the bias pre-multiplied by log2(e); then the tile's context, divided by its sums at the end.
// Scores live in an R x T buffer (12 KB at 512 tokens), never [T, T].
//
// Built with AVX512-BF16 (-mavx512bf16: AMD Zen 4 and later, Intel Cooper Lake and Sapphire Rapids and later), it
// also multiplies in bfloat16 pairs when asked (`products` 1 or 2; bert/cpu_kernels.py asks for an encoder whose
// own precision is below float32's: bfloat16 or int8): q, k, the probabilities and v rounded to bfloat16 (nearest
// even), each product summed into float32 by VDPBF16PS, two products an instruction where an FMA makes one.
// Maxima, exponentials and sums stay in float32. A bfloat16 encoder's q, k and v are read as they are and its
// context written in bfloat16 (2), rather than widened and narrowed around the call by torch.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <utility>

#if defined(__AVX512BF16__) && (defined(__clang__) || __GNUC__ >= 12)
#include <immintrin.h>
#define BF16_PAIRS 1
#endif

#ifdef __AVX512F__
constexpr int W = 16;  // floats a vector
#else
constexpr int W = 8;
#endif
// Query rows a tile, and accumulators of a pass over the values (2 vectors a row): the best of 3-12 rows on both
// vector widths (bench/RESULTS.md), within the 16 registers of AVX2 and the 32 of AVX-512.
constexpr int R = 6;
constexpr int ACC = 12;
typedef float vec __attribute__((vector_size(W * 4)));
typedef int32_t ivec __attribute__((vector_size(W * 4)));
typedef uint32_t word;  // two bfloat16, the lower the even element
typedef uint16_t bf16;  // a bfloat16 tensor's element: a float32's upper half

static inline vec splat(float x) { return vec{} + x; }
static inline vec load(const float *p) { vec v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float *p, vec v) { memcpy(p, &v, sizeof v); }
static inline vec vmax(vec a, vec b) { return a > b ? a : b; }
static inline float hmax(vec v) { float m = v[0]; for (int c = 1; c < W; c++) m = v[c] > m ? v[c] : m; return m; }
static inline float hsum(vec v) { float s = 0.f; for (int c = 0; c < W; c++) s += v[c]; return s; }

// 2^x for x <= 0: x = n + f with n an integer and |f| <= 1/2, 2^f by a degree-6 polynomial (Cephes' exp2f
// coefficients: relative error 2e-9 in exact arithmetic, under float32's rounding), 2^n put into the exponent bits.
// Below -127 it is 0, as exp() of a masked key is.
static inline vec exp2_nonpositive(vec x) {
    x = vmax(x, splat(-127.0f));
    const vec round = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer, kept in the low bits
    vec t = x + round;
    vec n = t - round;
    vec f = x - n;
    vec p = splat(1.535336188319500e-4f);
    p = p * f + 1.339887440266574e-3f;
    p = p * f + 9.618437357674640e-3f;
    p = p * f + 5.550332471162809e-2f;
    p = p * f + 2.402264791363012e-1f;
    p = p * f + 6.931472028550421e-1f;
    p = p * f + 1.0f;
    ivec bits;
    memcpy(&bits, &t, sizeof t);
    bits = (bits - (0x4B400000 - 127)) << 23;  // n + 127, the biased exponent of 2^n (0 at n = -127: zero)
    vec scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// KT[d][j] = k[j][d] for D columns of T rows, rows T..Tp-1 zero. A W x W block at a time, transposed in registers
// by block swaps where the compiler has __builtin_shufflevector (GCC 12+, clang): 1.02x-1.35x the whole kernel
// (bench/RESULTS.md); element by element elsewhere. Not inlined into head(): inlined, it slowed the products.
#if defined(__clang__) || __GNUC__ >= 12
template <int s, int... I>
static inline void swap_blocks(vec &a, vec &b, std::integer_sequence<int, I...>) {
    // Rows a (i) and b (i + s): a takes b's left half of each 2s-wide block, b takes a's right half.
    const vec x = __builtin_shufflevector(a, b, ((I & s) ? W + I - s : I)...);
    const vec y = __builtin_shufflevector(a, b, ((I & s) ? W + I : I + s)...);
    a = x;
    b = y;
}

template <int s>
static inline void transpose_in_registers(vec *r) {
    for (int i = 0; i < W; i++)
        if (!(i & s)) swap_blocks<s>(r[i], r[i + s], std::make_integer_sequence<int, W>{});
    if constexpr (s > 1) transpose_in_registers<s / 2>(r);
}

__attribute__((noinline)) static void transpose_keys(const float *k, float *KT, int T, int D, int stride, int Tp) {
    for (int j0 = 0; j0 < Tp; j0 += W)
        for (int d0 = 0; d0 < D; d0 += W) {
            vec r[W];
            for (int c = 0; c < W; c++) r[c] = j0 + c < T ? load(k + (size_t)(j0 + c) * stride + d0) : splat(0.f);
            transpose_in_registers<W / 2>(r);
            for (int c = 0; c < W; c++) store(KT + (d0 + c) * Tp + j0, r[c]);
        }
}
#else
__attribute__((noinline)) static void transpose_keys(const float *k, float *KT, int T, int D, int stride, int Tp) {
    for (int j = 0; j < Tp; j++)
        for (int d = 0; d < D; d++) KT[d * Tp + j] = j < T ? k[(size_t)j * stride + d] : 0.f;
}
#endif

// Training's dropout on the probabilities. The keep mask is a hash of (seed, row, key) rather than stored random
// numbers, so the backward pass draws it again for nothing: row `row` (head g's query i is row g * Tq + i) has the
// key mix(mix(row) ^ seed), and its key j is kept where mix(that + j) >= threshold (p * 2^32). mix is a bijective
// 32-bit integer hash (the "lowbias32" constants of C. Wellons' hash prospector, among the least biased
// two-multiply hashes it found); tests/unit/test_compiled_attention.py checks the kept fraction and that
// neighbouring keys', rows', heads' and sequences' draws are uncorrelated. Each row also keeps its log2 of the
// softmax's sum (`lse`, the scores in log2 units, max added) for the backward pass to rebuild the probabilities
// from the scores alone.
struct Dropout {
    uint32_t seed, threshold;
    float keep_scale;  // 1 / (1 - p)
    int first_row;     // the head's first query row, g * Tq
    float *lse;        // the head's Tq entries
};

typedef uint32_t uvec __attribute__((vector_size(W * 4)));
// One word (uint32_t) or a vector of them (uvec), lane by lane.
template <typename U>
static inline U mix(U x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}
static inline uint32_t row_key(int64_t row, uint32_t seed) { return mix(mix((uint32_t)row) ^ seed); }
// Lanes of keys j..j+W-1 of the row whose key is `key`: all ones where kept, zero where dropped.
static inline ivec kept(uint32_t key, int j, uint32_t threshold) {
    uvec lanes;
    for (int c = 0; c < W; c++) lanes[c] = key + (uint32_t)(j + c);
    return (ivec)(mix(lanes) >= threshold);
}
static inline vec select(ivec mask, vec x) { return (vec)(mask & (ivec)x); }
static inline uint32_t threshold_of(float p) {
    return p <= 0.f ? 0u : (uint32_t)fmin((double)p * 4294967296.0, 4294967295.0);
}

// A tile's rows of P x times each row's factor into `rows` rows of out: P is R x Tp weights over the T rows of x
// (D floats each), x's and out's rows `stride` floats apart. The context (P the probabilities, x the values) and,
// in training's backward pass, dq (P the scores' gradient, x the keys).
template <int D>
static inline void tile_times(const float *P, int Tp, const float *x, int T, int stride, const float *factor, int rows,
                              float *out) {
    constexpr int DV = D / W;    // vectors a row
    constexpr int DC = ACC / R;  // of them a pass over x
    static_assert(DV % DC == 0, "a head's size must be a multiple of the pass's width");
    for (int c0 = 0; c0 < DV; c0 += DC) {
        vec o[R][DC];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < DC; c++) o[r][c] = splat(0.f);
        for (int j = 0; j < T; j++) {
            vec xj[DC];
            for (int c = 0; c < DC; c++) xj[c] = load(x + (size_t)j * stride + (c0 + c) * W);
            for (int r = 0; r < R; r++) {
                const vec p = splat(P[r * Tp + j]);
                for (int c = 0; c < DC; c++) o[r][c] += p * xj[c];
            }
        }
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < DC; c++) store(out + (size_t)r * stride + (c0 + c) * W, o[r][c] * factor[r]);
    }
}

// One head: q, out rows of Tq queries, k, v rows of T keys, each row `stride` floats apart; bias has Tp entries
// (log2(e) times the mask's, -inf past T). KT: D x Tp, S: R x Tp. With `drop`, training's forward pass: the
// probabilities dropped out and each row's lse kept.
template <int D>
static void head(const float *q, const float *k, const float *v, const float *bias, float *out, int Tq, int T,
                 int stride, float scale, float *KT, float *S, int Tp, const Dropout *drop = nullptr) {
    transpose_keys(k, KT, T, D, stride, Tp);
    for (int i0 = 0; i0 < Tq; i0 += R) {
        const int rows = Tq - i0 < R ? Tq - i0 : R;
        float qs[R][D];
        for (int r = 0; r < R; r++)
            for (int d = 0; d < D; d++) qs[r][d] = r < rows ? q[(size_t)(i0 + r) * stride + d] * scale : 0.f;
        vec m[R];
        for (int r = 0; r < R; r++) m[r] = splat(-INFINITY);
        for (int j = 0; j < Tp; j += 2 * W) {
            vec a0[R], a1[R];
            for (int r = 0; r < R; r++) a0[r] = a1[r] = splat(0.f);
            for (int d = 0; d < D; d++) {
                const vec k0 = load(KT + d * Tp + j), k1 = load(KT + d * Tp + j + W);
                for (int r = 0; r < R; r++) {
                    const vec s = splat(qs[r][d]);
                    a0[r] += s * k0;
                    a1[r] += s * k1;
                }
            }
            const vec b0 = load(bias + j), b1 = load(bias + j + W);
            for (int r = 0; r < R; r++) {
                const vec s0 = a0[r] + b0, s1 = a1[r] + b1;
                m[r] = vmax(m[r], vmax(s0, s1));
                store(S + r * Tp + j, s0);
                store(S + r * Tp + j + W, s1);
            }
        }
        float inv[R];
        for (int r = 0; r < R; r++) {
            float *s = S + r * Tp;
            const vec top = splat(hmax(m[r]));
            vec sum = splat(0.f);
            for (int j = 0; j < Tp; j += W) {
                const vec e = exp2_nonpositive(load(s + j) - top);
                store(s + j, e);
                sum += e;
            }
            const float total = hsum(sum);
            inv[r] = 1.f / total;
            if (drop && r < rows) {
                drop->lse[i0 + r] = top[0] + log2f(total);
                inv[r] *= drop->keep_scale;
                const uint32_t key = row_key(drop->first_row + i0 + r, drop->seed);
                for (int j = 0; j < Tp; j += W) store(s + j, select(kept(key, j, drop->threshold), load(s + j)));
            }
        }
        tile_times<D>(S, Tp, v, T, stride, inv, rows, out + (size_t)i0 * stride);
    }
}

#ifdef BF16_PAIRS
// 32 floats as 16 words of bfloat16 pairs, in order: (x[0], x[1]), (x[2], x[3]), ...
static inline vec pairs_of(const float *x) {
    return (vec)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}
static inline vec pairs_of(vec lo, vec hi) { return (vec)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo); }
// A bfloat16 tensor's 32 elements are its pairs already.
static inline vec pairs_of(const bf16 *x) { vec v; memcpy(&v, x, sizeof v); return v; }
// 16 elements of row a, then 16 of row b (zero without b), as bfloat16.
static inline __m512i two_rows(const float *a, const float *b) {
    return (__m512i)_mm512_cvtne2ps_pbh(b ? _mm512_loadu_ps(b) : _mm512_setzero_ps(), _mm512_loadu_ps(a));
}
static inline __m512i two_rows(const bf16 *a, const bf16 *b) {
    const __m256i lo = _mm256_loadu_si256((const __m256i *)a);
    return _mm512_inserti64x4(_mm512_zextsi256_si512(lo), b ? _mm256_loadu_si256((const __m256i *)b) : __m256i{}, 1);
}
static inline void store_row(float *p, vec x) { store(p, x); }
static inline void store_row(bf16 *p, vec x) {
    const __m256bh h = _mm512_cvtneps_pbh((__m512)x);  // rounded to nearest even
    memcpy(p, &h, sizeof h);
}
static inline vec dot_pairs(vec acc, vec a, vec b) {
    return (vec)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b);
}
static inline vec splat_word(word w) { return (vec)_mm512_set1_epi32((int)w); }

// One head as head() above, the products in bfloat16 pairs. KP: D/2 x Tp words, key j's pairs in column j;
// VP: Tp/2 x D words, row m the pairs (v[2m][d], v[2m+1][d]); S: R x Tp floats; P: R x Tp/2 words.
template <int D, typename E>
static void head_pairs(const E *q, const E *k, const E *v, const float *bias, E *out, int Tq, int T, int stride,
                       float scale, word *KP, word *VP, float *S, word *P, int Tp) {
    static_assert(W == 16 && D % 32 == 0, "bfloat16 pairs are built for AVX-512 and head sizes of 32s");
    constexpr int DP = D / 2;    // pairs a row of q or k
    constexpr int DV = D / W;    // vectors a context row
    constexpr int DC = ACC / R;  // of them a pass over the values
    // The keys: each row's pairs, W rows at a time, transposed in registers as 32-bit elements.
    for (int j0 = 0; j0 < Tp; j0 += W)
        for (int p0 = 0; p0 < DP; p0 += W) {
            vec r[W];
            for (int c = 0; c < W; c++) r[c] = j0 + c < T ? pairs_of(k + (size_t)(j0 + c) * stride + 2 * p0) : splat(0.f);
            transpose_in_registers<W / 2>(r);
            for (int c = 0; c < W; c++) store((float *)KP + (p0 + c) * Tp + j0, r[c]);
        }
    // The values: rows 2m and 2m + 1 interleaved, bfloat16 by bfloat16 (a key past T is zero).
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22,
                                                6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int pairs = (T + 1) / 2;
    for (int m = 0; m < pairs; m++)
        for (int c = 0; c < DV; c++) {
            const E *a = v + (size_t)(2 * m) * stride + c * W;
            const __m512i halves = two_rows(a, 2 * m + 1 < T ? a + stride : nullptr);  // a's 16, then b's
            store((float *)VP + m * D + c * W, (vec)_mm512_permutexvar_epi16(interleave, halves));
        }
    for (int i0 = 0; i0 < Tq; i0 += R) {
        const int rows = Tq - i0 < R ? Tq - i0 : R;
        word qw[R][DP];  // unscaled, so that a bfloat16 encoder's q is taken exactly
        for (int r = 0; r < R; r++)
            for (int p0 = 0; p0 < DP; p0 += W) {
                vec w = splat(0.f);
                if (r < rows) w = pairs_of(q + (size_t)(i0 + r) * stride + 2 * p0);
                store((float *)qw[r] + p0, w);
            }
        vec m[R];
        for (int r = 0; r < R; r++) m[r] = splat(-INFINITY);
        for (int j = 0; j < Tp; j += 2 * W) {
            vec a0[R], a1[R];
            for (int r = 0; r < R; r++) a0[r] = a1[r] = splat(0.f);
            for (int p = 0; p < DP; p++) {
                const vec k0 = load((const float *)KP + p * Tp + j), k1 = load((const float *)KP + p * Tp + j + W);
                for (int r = 0; r < R; r++) {
                    const vec s = splat_word(qw[r][p]);
                    a0[r] = dot_pairs(a0[r], s, k0);
                    a1[r] = dot_pairs(a1[r], s, k1);
                }
            }
            const vec b0 = load(bias + j), b1 = load(bias + j + W);
            for (int r = 0; r < R; r++) {
                const vec s0 = a0[r] * scale + b0, s1 = a1[r] * scale + b1;
                m[r] = vmax(m[r], vmax(s0, s1));
                store(S + r * Tp + j, s0);
                store(S + r * Tp + j + W, s1);
            }
        }
        // The probabilities rounded to bfloat16 pairs, and summed as rounded: the weights the context is made of.
        float inv[R];
        for (int r = 0; r < R; r++) {
            const float *s = S + r * Tp;
            const vec top = splat(hmax(m[r]));
            vec sum = splat(0.f);
            for (int j = 0; j < Tp; j += 2 * W) {
                const vec w = pairs_of(exp2_nonpositive(load(s + j) - top), exp2_nonpositive(load(s + j + W) - top));
                store((float *)P + r * Tp / 2 + j / 2, w);
                sum = dot_pairs(sum, w, splat_word(0x3F803F80u));  // each pair times (1, 1)
            }
            inv[r] = 1.f / hsum(sum);
        }
        for (int c0 = 0; c0 < DV; c0 += DC) {
            vec o[R][DC];
            for (int r = 0; r < R; r++)
                for (int c = 0; c < DC; c++) o[r][c] = splat(0.f);
            for (int j = 0; j < pairs; j++) {
                vec vj[DC];
                for (int c = 0; c < DC; c++) vj[c] = load((const float *)VP + j * D + (c0 + c) * W);
                for (int r = 0; r < R; r++) {
                    const vec p = splat_word(P[r * Tp / 2 + j]);
                    for (int c = 0; c < DC; c++) o[r][c] = dot_pairs(o[r][c], p, vj[c]);
                }
            }
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < DC; c++)
                    store_row(out + (size_t)(i0 + r) * stride + (c0 + c) * W, o[r][c] * inv[r]);
        }
    }
}
#endif

constexpr float LOG2E = 1.44269504088896341f;

// Sequence seq's mask bias ([B, T]) times log2(e) for its first `keys` keys, -inf past them (to Tp), 0 without a
// mask.
static void log2_bias(float *b, const float *bias, int seq, int T, int keys, int Tp) {
    for (int j = 0; j < Tp; j++) b[j] = j >= keys ? -INFINITY : bias ? bias[(size_t)seq * T + j] * LOG2E : 0.f;
}

// Rows first..last-1 of a head's D columns set to zero.
template <int D>
static void zero_rows(float *x, int first, int last, int stride) {
    for (int i = first; i < last; i++) memset(x + (size_t)i * stride, 0, sizeof(float) * D);
}

template <int D, bool PAIRS, typename E = float>
static int heads(const E *q, const E *k, const E *v, const float *bias, E *out, int Tq, int T, int N, float scale,
                 int first, int last) {
    const int stride = N * D, Tp = (T + 2 * W - 1) / (2 * W) * (2 * W);
    // The keys transposed (D x Tp floats, or D/2 x Tp words of pairs), the scores, the bias; with pairs also the
    // values' pairs (Tp/2 x D words) and the probabilities' (R x Tp/2 words).
    float *KT = (float *)aligned_alloc(64, sizeof(float) * D * Tp);
    float *S = (float *)aligned_alloc(64, sizeof(float) * R * Tp);
    float *b = (float *)aligned_alloc(64, sizeof(float) * Tp);
    word *VP = PAIRS ? (word *)aligned_alloc(64, sizeof(word) * D * Tp / 2) : nullptr;
    word *P = PAIRS ? (word *)aligned_alloc(64, sizeof(word) * R * Tp / 2) : nullptr;
    int status = KT && S && b && (!PAIRS || (VP && P)) ? 0 : 2;
    for (int g = first, seq = -1; g < last && status == 0; g++) {
        const int n = g % N;
        if (g / N != seq) {
            seq = g / N;
            log2_bias(b, bias, seq, T, T, Tp);
        }
        const E *qh = q + ((size_t)seq * Tq * stride + n * D), *kh = k + ((size_t)seq * T * stride + n * D);
        const E *vh = v + ((size_t)seq * T * stride + n * D);
        E *oh = out + ((size_t)seq * Tq * stride + n * D);
#ifdef BF16_PAIRS
        if constexpr (PAIRS) {
            head_pairs<D>(qh, kh, vh, b, oh, Tq, T, stride, scale * LOG2E, (word *)KT, VP, S, P, Tp);
            continue;
        }
#endif
        if constexpr (!PAIRS) head<D>(qh, kh, vh, b, oh, Tq, T, stride, scale * LOG2E, KT, S, Tp);
    }
    free(KT);
    free(S);
    free(b);
    free(VP);
    free(P);
    return status;
}

// Heads first..last-1 of the B * N (sequence-major), so that threads can share a call's heads. q, out:
// [B, Tq, N * D], k, v: [B, T, N * D] (T >= 1), bias: [B, T] or null, all float32 but for `products`: 0 for the
// products in float32, 1 in bfloat16 pairs, 2 in bfloat16 pairs with q, k, v and out bfloat16 tensors. Returns 0;
// 1 for a head size, or bfloat16 pairs, not built here; 2 when its buffers (a few KB) could not be allocated.
extern "C" int bert_attention(const void *q, const void *k, const void *v, const float *bias, void *out, int Tq, int T,
                              int N, int D, float scale, int first, int last, int products) {
    if (D != 32 && D != 64) return 1;
    const float *q32 = (const float *)q, *k32 = (const float *)k, *v32 = (const float *)v;
#ifdef BF16_PAIRS
    if (products == 2) {
        const bf16 *q16 = (const bf16 *)q, *k16 = (const bf16 *)k, *v16 = (const bf16 *)v;
        return D == 32 ? heads<32, true>(q16, k16, v16, bias, (bf16 *)out, Tq, T, N, scale, first, last)
                       : heads<64, true>(q16, k16, v16, bias, (bf16 *)out, Tq, T, N, scale, first, last);
    }
    if (products == 1)
        return D == 32 ? heads<32, true>(q32, k32, v32, bias, (float *)out, Tq, T, N, scale, first, last)
                       : heads<64, true>(q32, k32, v32, bias, (float *)out, Tq, T, N, scale, first, last);
#else
    if (products) return 1;  // pairs not built: their instantiations are left out too
#endif
    return D == 32 ? heads<32, false>(q32, k32, v32, bias, (float *)out, Tq, T, N, scale, first, last)
                   : heads<64, false>(q32, k32, v32, bias, (float *)out, Tq, T, N, scale, first, last);
}

// Training's backward pass for one head whose forward pass was head() with `drop`: dq, dk, dv from the context's
// gradient dout, the context out and each row's lse, the probabilities and the keep mask rebuilt from q, k and the
// seed (KT, VT: keys and values transposed, D x Tp). Per tile of R query rows: the scores and dout v^T again, from
// which P (the probabilities dropped out and scaled, R x Tp) and G (the scores' gradient, R x Tp); then over the
// tile dv += P^T dout and dk += G^T q into the head's sums dK, dV (Tp x D), and the tile's own dq = G k.
template <int D>
static void head_backward(const float *q, const float *k, const float *v, const float *out, const float *dout,
                          const float *bias, float *dq, float *dk, float *dv, int Tq, int T, int stride, float scale,
                          const Dropout &drop, float *KT, float *VT, float *P, float *G, float *dK, float *dV, int Tp) {
    constexpr int NV = D / W;  // vectors a row
    const float scale2 = scale * LOG2E;  // the scores in log2 units, as head() made them
    transpose_keys(k, KT, T, D, stride, Tp);
    transpose_keys(v, VT, T, D, stride, Tp);
    memset(dK, 0, sizeof(float) * Tp * D);
    memset(dV, 0, sizeof(float) * Tp * D);
    for (int i0 = 0; i0 < Tq; i0 += R) {
        const int rows = Tq - i0 < R ? Tq - i0 : R;
        float qs[R][D], dos[R][D], lse[R], di[R];
        uint32_t keys[R];
        for (int r = 0; r < R; r++) {
            di[r] = 0.f;
            for (int d = 0; d < D; d++) {
                const size_t at = (size_t)(i0 + r) * stride + d;
                qs[r][d] = r < rows ? q[at] * scale2 : 0.f;
                dos[r][d] = r < rows ? dout[at] : 0.f;
                if (r < rows) di[r] += dout[at] * out[at];  // sum_j P_ij dP_ij, the softmax's correction
            }
            lse[r] = r < rows ? drop.lse[i0 + r] : INFINITY;  // a row past Tq: probabilities 0
            keys[r] = row_key(drop.first_row + i0 + r, drop.seed);
        }
        for (int j = 0; j < Tp; j += W) {
            vec a[R], g[R];
            for (int r = 0; r < R; r++) a[r] = g[r] = splat(0.f);
            for (int d = 0; d < D; d++) {
                const vec kd = load(KT + d * Tp + j), vd = load(VT + d * Tp + j);
                for (int r = 0; r < R; r++) {
                    a[r] += splat(qs[r][d]) * kd;
                    g[r] += splat(dos[r][d]) * vd;
                }
            }
            const vec b = load(bias + j);
            for (int r = 0; r < R; r++) {
                const vec p = exp2_nonpositive(a[r] + b - lse[r]);
                const ivec keep = kept(keys[r], j, drop.threshold);
                store(P + r * Tp + j, select(keep, p * drop.keep_scale));
                store(G + r * Tp + j, p * (select(keep, g[r] * drop.keep_scale) - di[r]));
            }
        }
        for (int c = 0; c < NV; c++) {
            vec dov[R], qv[R];
            for (int r = 0; r < R; r++) {
                dov[r] = load(dos[r] + c * W);
                qv[r] = load(qs[r] + c * W);
            }
            for (int j = 0; j < T; j++) {
                vec x = load(dV + j * D + c * W), y = load(dK + j * D + c * W);
                for (int r = 0; r < R; r++) {
                    x += splat(P[r * Tp + j]) * dov[r];
                    y += splat(G[r * Tp + j]) * qv[r];
                }
                store(dV + j * D + c * W, x);
                store(dK + j * D + c * W, y);
            }
        }
        float scales[R];
        for (int r = 0; r < R; r++) scales[r] = scale;
        tile_times<D>(G, Tp, k, T, stride, scales, rows, dq + (size_t)i0 * stride);
    }
    // dK summed G^T (q * scale * log2(e)): the log2(e) comes off here
    for (int j = 0; j < T; j++)
        for (int c = 0; c < NV; c++) {
            store(dk + (size_t)j * stride + c * W, load(dK + j * D + c * W) * (1.f / LOG2E));
            store(dv + (size_t)j * stride + c * W, load(dV + j * D + c * W));
        }
}

// Training's attention, heads first..last-1 of the B * N: the forward pass (dout null: out and lse written) or the
// backward one (dq, dk, dv written from dout, out and lse). q, out, dout, dq: [B, Tq, N * D], k, v, dk, dv:
// [B, T, N * D], all float32; bias: [B, T] or null, lse: [B * N, Tq]; p the dropout probability, seed its draw.
// lengths ([B], or null; only with Tq == T): sequence b's tokens past lengths[b] are padding, which the bias masks
// as keys; they are skipped as keys and as queries, their rows of out, dq, dk and dv zero.
template <int D>
static int heads_training(const float *q, const float *k, const float *v, const float *bias, const int *lengths,
                          float *out, const float *dout, float *lse, float *dq, float *dk, float *dv, int Tq, int T,
                          int N, float scale, float p, uint32_t seed, int first, int last) {
    const int stride = N * D, Tp = (T + 2 * W - 1) / (2 * W) * (2 * W);
    const bool forward = dout == nullptr;
    // forward: KT (D x Tp), S (R x Tp); backward also VT (D x Tp), G (R x Tp), dK and dV (Tp x D each)
    const size_t floats = forward ? (size_t)D * Tp + R * Tp : 2 * ((size_t)D * Tp + R * Tp) + 2 * (size_t)Tp * D;
    float *buffer = (float *)aligned_alloc(64, sizeof(float) * (floats + Tp));
    if (!buffer) return 2;
    float *KT = buffer, *S = KT + D * Tp, *b = S + R * Tp;
    float *VT = b + Tp, *G = VT + D * Tp, *dK = G + R * Tp, *dV = dK + Tp * D;
    Dropout drop;
    drop.seed = seed;
    drop.threshold = threshold_of(p);
    drop.keep_scale = 1.f / (1.f - p);
    for (int g = first, seq = -1, keys = T, queries = Tq, Tk = Tp; g < last; g++) {
        const int n = g % N;
        if (g / N != seq) {
            seq = g / N;
            keys = lengths ? lengths[seq] : T;
            queries = lengths ? keys : Tq;
            Tk = (keys + 2 * W - 1) / (2 * W) * (2 * W);
            log2_bias(b, bias, seq, T, keys, Tk);
        }
        const size_t at = (size_t)seq * Tq * stride + n * D, kat = (size_t)seq * T * stride + n * D;
        drop.first_row = g * Tq;
        drop.lse = lse + (size_t)g * Tq;
        if (forward) {
            head<D>(q + at, k + kat, v + kat, b, out + at, queries, keys, stride, scale * LOG2E, KT, S, Tk, &drop);
            zero_rows<D>(out + at, queries, Tq, stride);
        } else {
            head_backward<D>(q + at, k + kat, v + kat, out + at, dout + at, b, dq + at, dk + kat, dv + kat, queries,
                             keys, stride, scale, drop, KT, VT, S, G, dK, dV, Tk);
            zero_rows<D>(dq + at, queries, Tq, stride);
            zero_rows<D>(dk + kat, keys, T, stride);
            zero_rows<D>(dv + kat, keys, T, stride);
        }
    }
    free(buffer);
    return 0;
}

// Training's attention with dropout, forward (dout null) or backward, heads first..last-1 (`heads_training`).
// Returns 0; 1 for a head size not built here; 2 when its buffers (tens of KB) could not be allocated.
extern "C" int bert_attention_training(const float *q, const float *k, const float *v, const float *bias,
                                       const int *lengths, float *out, const float *dout, float *lse, float *dq,
                                       float *dk, float *dv, int Tq, int T, int N, int D, float scale, float p,
                                       uint32_t seed, int first, int last) {
    if (D == 32)
        return heads_training<32>(q, k, v, bias, lengths, out, dout, lse, dq, dk, dv, Tq, T, N, scale, p, seed, first,
                                  last);
    if (D == 64)
        return heads_training<64>(q, k, v, bias, lengths, out, dout, lse, dq, dk, dv, Tq, T, N, scale, p, seed, first,
                                  last);
    return 1;
}

// The hidden layers' dropout by the same hash as attention's: x (rows first..last-1 of `width` floats) times the
// keep mask of row r's key mix(mix(r) ^ seed), times 1 / (1 - p), into out. Its backward pass is the same call on
// the gradient with the same seed. Returns 0.
extern "C" int bert_dropout(const float *x, float *out, int width, float p, uint32_t seed, int64_t first,
                             int64_t last) {
    const uint32_t threshold = threshold_of(p);
    const float scale = 1.f / (1.f - p);
    for (int64_t row = first; row < last; row++) {
        const uint32_t key = row_key(row, seed);
        const float *a = x + row * width;
        float *b = out + row * width;
        int j = 0;
        for (; j + W <= width; j += W) store(b + j, select(kept(key, j, threshold), load(a + j) * scale));
        for (; j < width; j++) b[j] = mix(key + (uint32_t)j) >= threshold ? a[j] * scale : 0.f;
    }
    return 0;
}

// int8 Linear's input (cpu_kernels.Int8Linear): x ([rows, width] floats), each column j times mul[j] where mul is
// given (the layer's smoothing, quantization.quantize_int8), to bytes q with x * mul ~ scale * (q - zero), the range
// [min(x * mul, 0), max(x * mul, 0)] over 256 levels (0 exact), as torch.quantize_per_tensor_dynamic takes it, in two
// passes and no quantized tensor (whose bytes torch copies out again). Rounds half to even (the magic-number addition).
static inline float column(const float *mul, int64_t j) { return mul ? mul[j] : 1.f; }
static inline vec columns(const float *mul, int64_t j) { return mul ? load(mul + j) : splat(1.f); }

extern "C" int bert_quantize(const float *x, uint8_t *q, int64_t rows, int64_t width, const float *mul, float *scale,
                             int *zero) {
    vec lo = splat(0.f), hi = splat(0.f);
    float l = 0.f, h = 0.f;
    for (int64_t r = 0; r < rows; r++) {
        const float *a = x + r * width;
        int64_t j = 0;
        for (; j + W <= width; j += W) {
            const vec v = load(a + j) * columns(mul, j);
            lo = v < lo ? v : lo;
            hi = vmax(hi, v);
        }
        for (; j < width; j++) {
            const float v = a[j] * column(mul, j);
            l = v < l ? v : l;
            h = v > h ? v : h;
        }
    }
    l = -hmax(-lo) < l ? -hmax(-lo) : l;
    h = hmax(hi) > h ? hmax(hi) : h;
    float s = (h - l) / 255.f;
    if (!(s > 0.f) || !(1.f / s < __builtin_inff())) s = 0.1f;  // all zeros (or a range too small to invert)
    const float inv = 1.f / s, magic = 12582912.f;                // 1.5 * 2^23: adding it rounds to an integer
    float z = -l * inv + magic - magic;
    z = z < 0.f ? 0.f : z > 255.f ? 255.f : z;
    *scale = s;
    *zero = (int)z;
    typedef uint8_t bvec __attribute__((vector_size(W)));
    const vec zv = splat(z + magic), low = splat(magic), high = splat(magic + 255.f);
    for (int64_t r = 0; r < rows; r++) {
        const float *a = x + r * width;
        uint8_t *b = q + r * width;
        int64_t j = 0;
        for (; j + W <= width; j += W) {
            vec v = load(a + j) * (columns(mul, j) * inv) + zv;  // magic + round(x * mul / s) + zero
            v = v < low ? low : v;
            v = v > high ? high : v;
            const bvec c = __builtin_convertvector(__builtin_convertvector(v - low, ivec), bvec);
            memcpy(b + j, &c, sizeof c);
        }
        for (; j < width; j++) {
            float v = a[j] * (column(mul, j) * inv) + z + magic - magic;
            b[j] = (uint8_t)(v < 0.f ? 0.f : v > 255.f ? 255.f : v);
        }
    }
    return 0;
}
