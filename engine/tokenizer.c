/*
 * tokenizer.c - byte-level BPE ("gpt2") and SentencePiece BPE ("llama")
 * tokenizers read from GGUF metadata, with llama.cpp's results.
 *
 * Why it is built this way:
 *
 * - Byte-level BPE works on raw bytes. The vocabulary and merges are stored
 *   in GPT-2's printable byte alphabet ("Ġthe"); they are decoded to raw
 *   bytes once at create, so encoding never re-encodes the input. Every
 *   string that occurs in a merge or as a token gets a small integer id
 *   ("sid") in one interned table, and merges become a hash map from
 *   (sid left, sid right) to (rank, sid merged): the merge loop does
 *   integer lookups only. The loop is llama.cpp's: a linked list of symbols
 *   and a priority queue of candidate pairs ordered by (rank, position),
 *   stale entries skipped when popped. O(n log n) in the piece length.
 *
 * - Pre-tokenization follows llama.cpp's unicode_regex_split: a list of
 *   regexes per `tokenizer.ggml.pre`, each one splitting every segment left
 *   by the previous one (matches and the text between them both become
 *   segments), a regex never looking across a segment boundary. llama.cpp
 *   runs the common regexes through hand-written splitters; the PCRE2
 *   patterns below are written to give the same splits (its whitespace set
 *   instead of PCRE2's \s, `\s+(?!\S)` as "whitespace not followed by a
 *   non-whitespace character").
 *
 * - SentencePiece BPE is llama.cpp's llm_tokenizer_spm_session: symbols are
 *   UTF-8 characters (by lead byte), a pair is a candidate when its
 *   concatenation is a token, the highest score merges first, and symbols
 *   left without a token become byte tokens <0xNN>.
 *
 * - Special tokens are split out before any of that, token by token in
 *   order of decreasing length over all text fragments, exactly as
 *   llama.cpp's tokenizer_st_partition does (this is not the same as
 *   leftmost-longest matching when special strings overlap).
 *
 * - Pieces (the bytes each token stands for) are computed once at create,
 *   so decoding is a copy per token.
 *
 * The tokenizer is immutable after create; encode allocates its scratch
 * space per call, so any number of threads can encode at once. PCRE2
 * patterns are compiled (and JIT-compiled when available) once and shared;
 * match data is per call.
 */
#include "tokenizer.h"

/* CINFER_HAVE_PCRE2 is 0 only in the GPU-check build (CMake's
 * CINFER_GPU_CHECK: the device machine has no -dev packages): there a
 * pre-tokenizer that needs a regex beyond the hand-written splitters is
 * refused at create, and everything else works as here. */
#ifndef CINFER_HAVE_PCRE2
#define CINFER_HAVE_PCRE2 1
#endif
#if CINFER_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ======================================================================== */
/* Token attributes (as llama.cpp's llama_token_attr)                       */
/* ======================================================================== */

enum {
    ATTR_UNKNOWN = 1 << 0,
    ATTR_UNUSED = 1 << 1,
    ATTR_NORMAL = 1 << 2,
    ATTR_CONTROL = 1 << 3,
    ATTR_USER_DEFINED = 1 << 4,
    ATTR_BYTE = 1 << 5,
};

/* GGUF token_type values (llama.cpp's llama_token_type). */
enum {
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

#define MAX_REGEX 4

/* ======================================================================== */
/* Interned byte strings: string -> index, each with an int32 value         */
/* ======================================================================== */

typedef struct {
    char *arena;       /* all strings back to back */
    size_t arena_len;
    size_t arena_cap;
    size_t *off;       /* [n] offset of string i in arena */
    uint32_t *len;     /* [n] length of string i */
    uint32_t *hash;    /* [n] hash of string i */
    int32_t *val;      /* [n] value (token id or -1) */
    int32_t n;
    int32_t cap;
    int32_t *slots;    /* open addressing; -1 = empty */
    uint32_t n_slots;  /* power of two, > 2 * n */
} strtab;

static uint32_t hash_bytes(const char *s, size_t n)
{
    /* FNV-1a, 32 bit: short keys, good enough spread. */
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 16777619u;
    }
    return h;
}

static void strtab_free(strtab *t)
{
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->hash);
    free(t->val);
    free(t->slots);
    memset(t, 0, sizeof *t);
}

static int strtab_rehash(strtab *t, uint32_t n_slots)
{
    int32_t *slots = malloc(sizeof(int32_t) * n_slots);
    if (!slots)
        return -1;
    for (uint32_t i = 0; i < n_slots; i++)
        slots[i] = -1;
    for (int32_t i = 0; i < t->n; i++) {
        uint32_t j = t->hash[i] & (n_slots - 1);
        while (slots[j] >= 0)
            j = (j + 1) & (n_slots - 1);
        slots[j] = i;
    }
    free(t->slots);
    t->slots = slots;
    t->n_slots = n_slots;
    return 0;
}

static int32_t strtab_find_h(const strtab *t, const char *s, size_t n,
                             uint32_t h)
{
    if (t->n_slots == 0)
        return -1;
    uint32_t j = h & (t->n_slots - 1);
    for (;;) {
        int32_t i = t->slots[j];
        if (i < 0)
            return -1;
        if (t->hash[i] == h && t->len[i] == n &&
            memcmp(t->arena + t->off[i], s, n) == 0)
            return i;
        j = (j + 1) & (t->n_slots - 1);
    }
}

static int32_t strtab_find(const strtab *t, const char *s, size_t n)
{
    return strtab_find_h(t, s, n, hash_bytes(s, n));
}

/* Index of s, added (with value -1) if absent; -1 on out of memory. */
static int32_t strtab_intern(strtab *t, const char *s, size_t n)
{
    uint32_t h = hash_bytes(s, n);
    int32_t i = strtab_find_h(t, s, n, h);
    if (i >= 0)
        return i;
    if (n > UINT32_MAX || t->n == INT32_MAX)
        return -1;
    if (t->n == t->cap) {
        int32_t cap = t->cap ? t->cap * 2 : 1024;
        size_t *off = realloc(t->off, sizeof(size_t) * (size_t)cap);
        if (!off)
            return -1;
        t->off = off;
        uint32_t *len = realloc(t->len, sizeof(uint32_t) * (size_t)cap);
        if (!len)
            return -1;
        t->len = len;
        uint32_t *hash = realloc(t->hash, sizeof(uint32_t) * (size_t)cap);
        if (!hash)
            return -1;
        t->hash = hash;
        int32_t *val = realloc(t->val, sizeof(int32_t) * (size_t)cap);
        if (!val)
            return -1;
        t->val = val;
        t->cap = cap;
    }
    if (t->arena_len + n + 1 > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap * 2 : 65536;
        while (cap < t->arena_len + n + 1)
            cap *= 2;
        char *a = realloc(t->arena, cap);
        if (!a)
            return -1;
        t->arena = a;
        t->arena_cap = cap;
    }
    if ((uint32_t)(t->n + 1) * 2 > t->n_slots) {
        if (strtab_rehash(t, t->n_slots ? t->n_slots * 2 : 2048) != 0)
            return -1;
    }
    i = t->n++;
    memcpy(t->arena + t->arena_len, s, n);
    t->arena[t->arena_len + n] = '\0';
    t->off[i] = t->arena_len;
    t->len[i] = (uint32_t)n;
    t->hash[i] = h;
    t->val[i] = -1;
    t->arena_len += n + 1;
    uint32_t j = h & (t->n_slots - 1);
    while (t->slots[j] >= 0)
        j = (j + 1) & (t->n_slots - 1);
    t->slots[j] = i;
    return i;
}

/* ======================================================================== */
/* Merge table: (sid left, sid right) -> (rank, sid merged)                 */
/* ======================================================================== */

typedef struct {
    uint64_t key; /* ((left + 1) << 32) | (right + 1); 0 = empty */
    int32_t rank;
    int32_t merged;
} pair_slot;

typedef struct {
    pair_slot *slots;
    uint64_t n_slots; /* power of two */
    uint64_t n;
} pairmap;

static uint64_t pair_key(int32_t l, int32_t r)
{
    return ((uint64_t)(uint32_t)(l + 1) << 32) | (uint64_t)(uint32_t)(r + 1);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static int pairmap_init(pairmap *m, uint64_t expected)
{
    uint64_t n = 1024;
    while (n < expected * 2 + 1)
        n *= 2;
    m->slots = calloc(n, sizeof(pair_slot));
    if (!m->slots)
        return -1;
    m->n_slots = n;
    m->n = 0;
    return 0;
}

static const pair_slot *pairmap_find(const pairmap *m, int32_t l, int32_t r)
{
    if (!m->slots)
        return NULL;
    uint64_t key = pair_key(l, r);
    uint64_t j = hash_u64(key) & (m->n_slots - 1);
    for (;;) {
        const pair_slot *s = &m->slots[j];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        j = (j + 1) & (m->n_slots - 1);
    }
}

/* Inserts unless present (the first merge of a pair keeps its rank, as
 * llama.cpp's emplace does). The map is sized at init and never grows. */
static void pairmap_insert(pairmap *m, int32_t l, int32_t r, int32_t rank,
                           int32_t merged)
{
    uint64_t key = pair_key(l, r);
    uint64_t j = hash_u64(key) & (m->n_slots - 1);
    for (;;) {
        pair_slot *s = &m->slots[j];
        if (s->key == key)
            return;
        if (s->key == 0) {
            s->key = key;
            s->rank = rank;
            s->merged = merged;
            m->n++;
            return;
        }
        j = (j + 1) & (m->n_slots - 1);
    }
}

/* ======================================================================== */
/* The tokenizer                                                            */
/* ======================================================================== */

struct cinfer_tokenizer {
    cinfer_tokenizer_kind kind;
    char pre[64];
    int32_t n_vocab;

    /* Token strings as stored in the file. */
    char *text_arena;
    size_t *text_off;   /* [n_vocab] */
    uint32_t *text_len; /* [n_vocab] */
    uint32_t max_text;  /* longest token string */
    strtab texts;       /* string -> id (the last id of a duplicate) */

    /* Pieces: the bytes each token stands for with special rendering on;
     * hidden[id] = 1 when special=false renders it as nothing. */
    char *piece_arena;
    size_t *piece_off;   /* [n_vocab] */
    uint32_t *piece_len; /* [n_vocab] */
    uint8_t *hidden;     /* [n_vocab] */
    size_t max_piece;

    float *scores;  /* [n_vocab] (SPM) */
    uint16_t *attr; /* [n_vocab] ATTR_* */
    uint8_t *eog;   /* [n_vocab] 1 = end of generation */
    int32_t *eog_ids;
    size_t n_eog;

    /* Special tokens split out before tokenizing, longest first. */
    int32_t *special;
    size_t n_special;

    int32_t bos, eos, eot, eom, unk, pad, sep;
    int32_t fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    int add_bos, add_eos, add_space_prefix;

    /* BPE: byte strings (decoded) of tokens and merge parts. */
    strtab bstr;            /* val = token id or -1 */
    pairmap merges;
    int32_t byte_sid[256];  /* sid of the one-byte string, or -1 */
    int32_t byte_tok[256];  /* token of the raw byte (BPE: decoded string of
                               one byte; SPM: <0xNN> or the byte itself) */

    /* Pre-tokenizer regexes, applied in order. */
    int ignore_merges;
#if CINFER_HAVE_PCRE2
    pcre2_code *re[MAX_REGEX];
    int re_jit[MAX_REGEX];
#endif
    int n_re;
};

/* ======================================================================== */
/* UTF-8 helpers                                                            */
/* ======================================================================== */

/* Length of the strictly valid UTF-8 character at s[0..n), or 0 when the
 * bytes there are not one (overlong, surrogate, > U+10FFFF, truncated). */
static size_t utf8_valid_len(const unsigned char *s, size_t n)
{
    unsigned char b = s[0];
    if (b < 0x80)
        return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1;
    } else if (b == 0xE0) {
        need = 2;
        lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
        need = 2;
    } else if (b == 0xED) {
        need = 2;
        hi = 0x9F;
    } else if (b == 0xF0) {
        need = 3;
        lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
        need = 3;
    } else if (b == 0xF4) {
        need = 3;
        hi = 0x8F;
    } else {
        return 0;
    }
    if (n < need + 1)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t k = 2; k <= need; k++)
        if (s[k] < 0x80 || s[k] > 0xBF)
            return 0;
    return need + 1;
}

/* llama.cpp's unicode_len_utf8: character length from the lead byte only. */
static size_t utf8_lead_len(unsigned char b)
{
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[b >> 4];
}

/* Decodes one valid UTF-8 character; *adv = its length (0 if invalid). */
static uint32_t utf8_decode(const unsigned char *s, size_t n, size_t *adv)
{
    size_t l = utf8_valid_len(s, n);
    *adv = l;
    switch (l) {
    case 1:
        return s[0];
    case 2:
        return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3:
        return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) |
               (s[2] & 0x3F);
    case 4:
        return ((uint32_t)(s[0] & 0x07) << 18) |
               ((uint32_t)(s[1] & 0x3F) << 12) |
               ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    default:
        return 0;
    }
}

/* ======================================================================== */
/* GPT-2 byte alphabet                                                      */
/* ======================================================================== */

/* The code point GPT-2 prints byte b as: printable Latin-1 bytes stand for
 * themselves, the other 68 bytes are numbered from U+0100 in byte order. */
static uint32_t byte_to_cpt(unsigned b)
{
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
        (b >= 0xAE && b <= 0xFF))
        return b;
    uint32_t n = 0;
    for (unsigned c = 0; c < b; c++)
        if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) ||
              (c >= 0xAE && c <= 0xFF)))
            n++;
    return 256 + n;
}

/* Inverse of byte_to_cpt over code points 0..323; -1 = not in the alphabet. */
typedef struct {
    int16_t byte_of[324];
} byte_alphabet;

static void byte_alphabet_init(byte_alphabet *a)
{
    for (int i = 0; i < 324; i++)
        a->byte_of[i] = -1;
    for (unsigned b = 0; b < 256; b++)
        a->byte_of[byte_to_cpt(b)] = (int16_t)b;
}

/* Decodes a string written in the byte alphabet into raw bytes at out
 * (out has room for n bytes: every character is at least one byte).
 * Returns the byte count, or -1 if some character is not in the alphabet. */
static long byte_decode(const byte_alphabet *a, const char *s, size_t n,
                        char *out)
{
    size_t i = 0, o = 0;
    while (i < n) {
        size_t adv;
        uint32_t c = utf8_decode((const unsigned char *)s + i, n - i, &adv);
        if (adv == 0 || c >= 324 || a->byte_of[c] < 0)
            return -1;
        out[o++] = (char)a->byte_of[c];
        i += adv;
    }
    return (long)o;
}

/* ======================================================================== */
/* Pre-tokenizer regexes                                                    */
/* ======================================================================== */

/* llama.cpp's whitespace set (unicode_set_whitespace), used wherever its
 * splitters say \s: PCRE2's \s differs at U+0085. */
#define WS "\\t\\n\\x0B\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}" \
           "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

/* llama.cpp's character classes come from Unicode 15.1; PCRE2 10.42 knows
 * Unicode 14. The letters, numbers and punctuation added since are listed
 * here so both agree on every code point (checked over all of them). */
#define L_NEW "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}" \
              "\\x{11F12}-\\x{11F33}\\x{1342F}\\x{13441}-\\x{13446}" \
              "\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}" \
              "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{2B739}" \
              "\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define N_NEW "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define P_NEW "\\x{11B00}-\\x{11B09}\\x{11F43}-\\x{11F4F}"
/* class bodies, for use inside [...] */
#define UL "\\p{L}" L_NEW
#define UN "\\p{N}" N_NEW
#define UP "\\p{P}" P_NEW

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static const char RE_GPT2[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?[" UL "]+| ?[" UN "]+| ?[^" WS UL UN "]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static const char RE_LLAMA3[] =
    "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
    "|[^\\r\\n" UL UN "]?[" UL "]+|[" UN "]{1,3}"
    "| ?[^" WS UL UN "]+[\\r\\n]*|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";

/* As llama3 with single digits. */
static const char RE_QWEN2[] =
    "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
    "|[^\\r\\n" UL UN "]?[" UL "]+|[" UN "]"
    "| ?[^" WS UL UN "]+[\\r\\n]*|[" WS "]*[\\r\\n]+"
    "|[" WS "]+(?![^" WS "])|[" WS "]+";

typedef struct {
    const char *names;     /* '|'-separated tokenizer.ggml.pre values */
    const char *re[MAX_REGEX];
    int ignore_merges;     /* a piece that is a token as a whole is taken
                              as is, without running the merges */
    int add_bos;           /* default of add_bos_token */
} pre_def;

/* The `pre` names whose effect in llama.cpp is the choice of these regexes
 * and flags (names with further special cases there are not listed). */
static const pre_def PRE_DEFS[] = {
    /* llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT */
    {"default",
     {"[" UP "$+<=>^~|]+", RE_GPT2, "[" UN "]+", "[0-9][0-9][0-9]"},
     0,
     0},
    {"gpt-2|phi-2|mpt|olmo|jais|exaone4|trillion|granite-docling|a.x-4.0|"
     "gigachat|mellum",
     {RE_GPT2, NULL, NULL, NULL},
     0,
     0},
    {"smollm|starcoder|refact|command-r|codeshell|exaone|minerva-7b|mellum2",
     {"[" UN "]", RE_GPT2, NULL, NULL},
     0,
     0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2",
     {RE_LLAMA3, NULL, NULL, NULL},
     1,
     1},
    {"dbrx|smaug-bpe", {RE_LLAMA3, NULL, NULL, NULL}, 0, 0},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|"
     "solar-open|grok-2",
     {RE_QWEN2, NULL, NULL, NULL},
     0,
     0},
};

static int name_in_list(const char *list, const char *name)
{
    size_t n = strlen(name);
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, '|');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        if (l == n && memcmp(p, name, n) == 0)
            return 1;
        if (!e)
            break;
        p = e + 1;
    }
    return 0;
}

static cinfer_status compile_regexes(cinfer_tokenizer *t, const pre_def *d)
{
#if !CINFER_HAVE_PCRE2
    if (d->re[0])
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "tokenizer: pre-tokenizer '%s' needs PCRE2, "
                                "which this build (CINFER_GPU_CHECK) leaves "
                                "out",
                                t->pre);
    return CINFER_OK;
#else
    for (int i = 0; i < MAX_REGEX && d->re[i]; i++) {
        int err;
        PCRE2_SIZE erroff;
        pcre2_code *re = pcre2_compile((PCRE2_SPTR)d->re[i],
                                       PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &erroff,
                                       NULL);
        if (!re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return cinfer_set_error(CINFER_E_INTERNAL,
                                    "tokenizer: pre-tokenizer regex %d of "
                                    "'%s' does not compile at %zu: %s",
                                    i, t->pre, (size_t)erroff, (char *)msg);
        }
        t->re[i] = re;
        t->re_jit[i] = pcre2_jit_compile(re, PCRE2_JIT_COMPLETE) == 0;
        t->n_re = i + 1;
    }
    return CINFER_OK;
#endif
}

/* ======================================================================== */
/* Create                                                                   */
/* ======================================================================== */

cinfer_tokenizer_params cinfer_tokenizer_default_params(void)
{
    cinfer_tokenizer_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static int32_t read_i32(const void *data, uint64_t i)
{
    int32_t v;
    memcpy(&v, (const char *)data + i * 4, 4);
    return v;
}

static float read_f32(const void *data, uint64_t i)
{
    float v;
    memcpy(&v, (const char *)data + i * 4, 4);
    return v;
}

static int32_t lookup_text(const cinfer_tokenizer *t, const char *s)
{
    int32_t i = strtab_find(&t->texts, s, strlen(s));
    return i < 0 ? -1 : t->texts.val[i];
}

/* Reads an optional token-id key: out of range values keep the default. */
static cinfer_status read_id_key(const cinfer_gguf *g, const char *key,
                                 int32_t n_vocab, int32_t *id)
{
    int64_t v;
    cinfer_status st = cinfer_gguf_get_i64(g, key, &v);
    if (st == CINFER_E_NOT_FOUND)
        return CINFER_OK;
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: %s is not an integer", key);
    if (v >= 0 && v < n_vocab)
        *id = (int32_t)v;
    return CINFER_OK;
}

static cinfer_status read_bool_key(const cinfer_gguf *g, const char *key,
                                   int *val)
{
    int v;
    cinfer_status st = cinfer_gguf_get_bool(g, key, &v);
    if (st == CINFER_E_NOT_FOUND)
        return CINFER_OK;
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: %s is not a bool", key);
    *val = v ? 1 : 0;
    return CINFER_OK;
}

/* Finds the first of `names` in the vocabulary (for ids the file does not
 * give) and marks it a control token, as llama.cpp's name detection does. */
static void detect_by_name(cinfer_tokenizer *t, int32_t *id,
                           const char *const *names)
{
    if (*id >= 0)
        return;
    for (size_t i = 0; names[i]; i++) {
        int32_t k = lookup_text(t, names[i]);
        if (k >= 0) {
            *id = k;
            t->attr[k] |= ATTR_CONTROL;
            return;
        }
    }
}

static int text_is(const cinfer_tokenizer *t, int32_t id, const char *s)
{
    size_t n = strlen(s);
    return t->text_len[id] == n &&
           memcmp(t->text_arena + t->text_off[id], s, n) == 0;
}

static void find_special_tokens(cinfer_tokenizer *t)
{
    static const char *const eot_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
        "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "<end_of_utterance>", NULL};
    static const char *const eom_names[] = {"<|eom_id|>", NULL};
    static const char *const fim_pre_names[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>", "<PRE>",
        "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", NULL};
    static const char *const fim_suf_names[] = {
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81hole\xef\xbd\x9c>", "<SUF>",
        "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>", NULL};
    static const char *const fim_mid_names[] = {
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>", "<MID>",
        "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>", NULL};
    static const char *const fim_pad_names[] = {
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
    static const char *const fim_rep_names[] = {
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
        NULL};
    static const char *const fim_sep_names[] = {"<|file_sep|>", NULL};
    static const char *const eog_names[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
        "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
        "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
        "[e~[", NULL};
    static const char *const always_render[] = {
        "<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", NULL};

    detect_by_name(t, &t->eot, eot_names);
    detect_by_name(t, &t->eom, eom_names);
    detect_by_name(t, &t->fim_pre, fim_pre_names);
    detect_by_name(t, &t->fim_suf, fim_suf_names);
    detect_by_name(t, &t->fim_mid, fim_mid_names);
    detect_by_name(t, &t->fim_pad, fim_pad_names);
    detect_by_name(t, &t->fim_rep, fim_rep_names);
    detect_by_name(t, &t->fim_sep, fim_sep_names);

    if (t->fim_pad >= 0)
        t->eog[t->fim_pad] = 1;
    if (t->fim_rep >= 0)
        t->eog[t->fim_rep] = 1;
    if (t->fim_sep >= 0)
        t->eog[t->fim_sep] = 1;
    for (size_t i = 0; eog_names[i]; i++) {
        int32_t k = lookup_text(t, eog_names[i]);
        if (k >= 0) {
            t->eog[k] = 1;
            t->attr[k] |= ATTR_CONTROL;
        }
    }
    /* Tokens llama.cpp always renders (harmony format). */
    for (size_t i = 0; always_render[i]; i++) {
        int32_t k = lookup_text(t, always_render[i]);
        if (k >= 0)
            t->attr[k] = ATTR_USER_DEFINED;
    }
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (t->eot >= 0)
        t->eog[t->eot] = 1;
    if (t->eom >= 0)
        t->eog[t->eom] = 1;

    /* <|end|> ends a message, not generation, where <|return|> and
     * <|call|> exist (harmony) or <|calls|> and <|flush|> (solar-open). */
    int has_return = 0, has_call = 0, has_flush = 0;
    int32_t end_id = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->eog[i])
            continue;
        if (text_is(t, i, "<|return|>"))
            has_return = 1;
        else if (text_is(t, i, "<|call|>") || text_is(t, i, "<|calls|>"))
            has_call = 1;
        else if (text_is(t, i, "<|flush|>"))
            has_flush = 1;
        else if (text_is(t, i, "<|end|>"))
            end_id = i;
    }
    if (end_id >= 0 && ((has_return && has_call) || (has_call && has_flush))) {
        t->eog[end_id] = 0;
        t->attr[end_id] = ATTR_USER_DEFINED;
    }
    /* </s> is a normal token where <|tool_response> or <|plamo:eos|> ends
     * generation. */
    int has_marker = 0;
    int32_t s_id = -1;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (!t->eog[i])
            continue;
        if (text_is(t, i, "<|tool_response>") || text_is(t, i, "<|plamo:eos|>"))
            has_marker = 1;
        else if (text_is(t, i, "</s>"))
            s_id = i;
    }
    if (has_marker && s_id >= 0) {
        t->eog[s_id] = 0;
        t->attr[s_id] = ATTR_NORMAL;
    }
}

/* Piece of token i with special rendering; written to buf (room for
 * text_len bytes, enough: pieces are never longer than the text). */
static size_t make_piece(const cinfer_tokenizer *t, const byte_alphabet *a,
                         int32_t i, char *buf, uint8_t *hidden)
{
    const char *s = t->text_arena + t->text_off[i];
    size_t n = t->text_len[i];
    uint16_t at = t->attr[i];
    *hidden = 0;
    if (at & (ATTR_UNKNOWN | ATTR_CONTROL)) {
        *hidden = 1;
        memcpy(buf, s, n);
        return n;
    }
    if (at & ATTR_USER_DEFINED) {
        memcpy(buf, s, n);
        return n;
    }
    if (at & ATTR_NORMAL) {
        if (t->kind == CINFER_TOKENIZER_SPM) {
            size_t o = 0;
            for (size_t k = 0; k < n;) {
                if (k + 3 <= n && memcmp(s + k, "\xe2\x96\x81", 3) == 0) {
                    buf[o++] = ' ';
                    k += 3;
                } else {
                    buf[o++] = s[k++];
                }
            }
            return o;
        }
        /* Byte-level: characters outside the alphabet are kept as UTF-8. */
        size_t o = 0;
        for (size_t k = 0; k < n;) {
            size_t adv;
            uint32_t c = utf8_decode((const unsigned char *)s + k, n - k, &adv);
            if (adv > 0 && c < 324 && a->byte_of[c] >= 0) {
                buf[o++] = (char)a->byte_of[c];
                k += adv;
            } else {
                size_t l = adv ? adv : 1;
                memcpy(buf + o, s + k, l);
                o += l;
                k += l;
            }
        }
        return o;
    }
    if (at & ATTR_BYTE) {
        /* "<0xNN>" */
        if (n == 6 && memcmp(s, "<0x", 3) == 0 && s[5] == '>') {
            char hex[3] = {s[3], s[4], 0};
            char *end;
            long v = strtol(hex, &end, 16);
            if (end == hex + 2) {
                buf[0] = (char)v;
                return 1;
            }
        }
        memcpy(buf, s, n);
        return n;
    }
    return 0; /* unused / undefined: renders as nothing, as in llama.cpp */
}


/* qsort has no context argument in C17: the sort keys are copied. */
typedef struct {
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special_key(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static cinfer_status load_tokens(cinfer_tokenizer *t, const cinfer_gguf *g)
{
    cinfer_gguf_arr toks;
    cinfer_status st = cinfer_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks);
    if (st != CINFER_OK || toks.type != CINFER_GGUF_STRING)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.tokens is %s",
                                st == CINFER_E_NOT_FOUND
                                    ? "missing"
                                    : "not an array of strings");
    if (toks.n == 0 || toks.n > INT32_MAX)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.tokens has %llu "
                                "entries",
                                (unsigned long long)toks.n);
    int32_t n = (int32_t)toks.n;
    t->n_vocab = n;

    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&toks, (uint64_t)i);
        total += (s.len ? s.len : 32) + 1;
    }
    t->text_arena = malloc(total);
    t->text_off = malloc(sizeof(size_t) * (size_t)n);
    t->text_len = malloc(sizeof(uint32_t) * (size_t)n);
    t->attr = malloc(sizeof(uint16_t) * (size_t)n);
    t->scores = calloc((size_t)n, sizeof(float));
    t->eog = calloc((size_t)n, 1);
    if (!t->text_arena || !t->text_off || !t->text_len || !t->attr ||
        !t->scores || !t->eog)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory "
                                                "for %d tokens", n);
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&toks, (uint64_t)i);
        if (s.len > UINT32_MAX)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "tokenizer: token %d is too long", i);
        t->text_off[i] = o;
        if (s.len == 0) {
            /* llama.cpp names empty tokens so they stay distinct */
            int w = snprintf(t->text_arena + o, 32, "[EMPTY_%d]", i);
            t->text_len[i] = (uint32_t)w;
            o += (size_t)w + 1;
        } else {
            memcpy(t->text_arena + o, s.ptr, s.len);
            t->text_arena[o + s.len] = '\0';
            t->text_len[i] = (uint32_t)s.len;
            o += s.len + 1;
        }
        int32_t k = strtab_intern(&t->texts, t->text_arena + t->text_off[i],
                                  t->text_len[i]);
        if (k < 0)
            return cinfer_set_error(CINFER_E_NOMEM,
                                    "tokenizer: out of memory");
        t->texts.val[k] = i;
        t->attr[i] = ATTR_NORMAL;
        if (t->text_len[i] > t->max_text)
            t->max_text = t->text_len[i];
    }

    cinfer_gguf_arr arr;
    st = cinfer_gguf_get_arr(g, "tokenizer.ggml.scores", &arr);
    if (st == CINFER_OK) {
        if (arr.type != CINFER_GGUF_FLOAT32 && arr.type != CINFER_GGUF_INT32)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "tokenizer: tokenizer.ggml.scores is not "
                                    "an array of float32 or int32");
        if (arr.n < (uint64_t)n)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "tokenizer: tokenizer.ggml.scores has "
                                    "%llu entries for %d tokens",
                                    (unsigned long long)arr.n, n);
        for (int32_t i = 0; i < n; i++)
            t->scores[i] = arr.type == CINFER_GGUF_FLOAT32
                               ? read_f32(arr.data, (uint64_t)i)
                               : (float)read_i32(arr.data, (uint64_t)i);
    } else if (st != CINFER_E_NOT_FOUND) {
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.scores is not an "
                                "array");
    }

    st = cinfer_gguf_get_arr(g, "tokenizer.ggml.token_type", &arr);
    if (st == CINFER_OK) {
        if (arr.type != CINFER_GGUF_INT32)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "tokenizer: tokenizer.ggml.token_type is "
                                    "not an array of int32");
        if (arr.n < (uint64_t)n)
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "tokenizer: tokenizer.ggml.token_type has "
                                    "%llu entries for %d tokens",
                                    (unsigned long long)arr.n, n);
        for (int32_t i = 0; i < n; i++) {
            switch (read_i32(arr.data, (uint64_t)i)) {
            case TT_NORMAL:
                t->attr[i] = ATTR_NORMAL;
                break;
            case TT_UNKNOWN:
                t->attr[i] = ATTR_UNKNOWN;
                break;
            case TT_CONTROL:
                t->attr[i] = ATTR_CONTROL;
                break;
            case TT_USER_DEFINED:
                t->attr[i] = ATTR_USER_DEFINED;
                break;
            case TT_UNUSED:
                t->attr[i] = ATTR_UNUSED;
                break;
            case TT_BYTE:
                t->attr[i] = ATTR_BYTE;
                break;
            default:
                t->attr[i] = 0;
                break;
            }
        }
    } else if (st != CINFER_E_NOT_FOUND) {
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.token_type is not "
                                "an array");
    }
    return CINFER_OK;
}

static cinfer_status load_merges(cinfer_tokenizer *t, const cinfer_gguf *g,
                                 const byte_alphabet *a)
{
    /* Byte strings of all tokens that a byte sequence can spell. */
    size_t max_len = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->text_len[i] > max_len)
            max_len = t->text_len[i];
    cinfer_gguf_arr arr;
    cinfer_status st = cinfer_gguf_get_arr(g, "tokenizer.ggml.merges", &arr);
    if (st != CINFER_OK || arr.type != CINFER_GGUF_STRING)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.merges is %s",
                                st == CINFER_E_NOT_FOUND
                                    ? "missing"
                                    : "not an array of strings");
    if (arr.n > INT32_MAX)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.merges has %llu "
                                "entries",
                                (unsigned long long)arr.n);
    for (uint64_t m = 0; m < arr.n; m++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&arr, m);
        if (s.len > max_len)
            max_len = s.len;
    }
    char *buf = malloc(max_len * 2 + 2);
    if (!buf)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");

    for (int32_t i = 0; i < t->n_vocab; i++) {
        long l = byte_decode(a, t->text_arena + t->text_off[i],
                             t->text_len[i], buf);
        if (l < 0)
            continue;
        int32_t k = strtab_intern(&t->bstr, buf, (size_t)l);
        if (k < 0)
            goto fail_nomem;
        t->bstr.val[k] = i;
    }
    if (pairmap_init(&t->merges, arr.n) != 0)
        goto fail_nomem;
    for (uint64_t m = 0; m < arr.n; m++) {
        cinfer_gguf_str s = cinfer_gguf_arr_str(&arr, m);
        /* split at the first space after the first byte, as llama.cpp */
        size_t sp = 0;
        for (size_t k = 1; k < s.len; k++) {
            if (s.ptr[k] == ' ') {
                sp = k;
                break;
            }
        }
        if (sp == 0)
            continue;
        long l1 = byte_decode(a, s.ptr, sp, buf);
        if (l1 < 0)
            continue;
        long l2 = byte_decode(a, s.ptr + sp + 1, s.len - sp - 1, buf + l1);
        if (l2 < 0)
            continue;
        int32_t sl = strtab_intern(&t->bstr, buf, (size_t)l1);
        int32_t sr = strtab_intern(&t->bstr, buf + l1, (size_t)l2);
        int32_t sm = strtab_intern(&t->bstr, buf, (size_t)(l1 + l2));
        if (sl < 0 || sr < 0 || sm < 0)
            goto fail_nomem;
        pairmap_insert(&t->merges, sl, sr, (int32_t)m, sm);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int32_t k = strtab_find(&t->bstr, &c, 1);
        t->byte_sid[b] = k;
        t->byte_tok[b] = k >= 0 ? t->bstr.val[k] : -1;
    }
    free(buf);
    return CINFER_OK;

fail_nomem:
    free(buf);
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}

static void spm_byte_tokens(cinfer_tokenizer *t)
{
    static const char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; b++) {
        char name[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        int32_t k = lookup_text(t, name);
        if (k < 0) {
            char c = (char)b;
            int32_t i = strtab_find(&t->texts, &c, 1);
            k = i < 0 ? -1 : t->texts.val[i];
        }
        t->byte_tok[b] = k;
        t->byte_sid[b] = -1;
    }
}

static cinfer_status build_pieces(cinfer_tokenizer *t, const byte_alphabet *a)
{
    size_t total = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        total += t->text_len[i];
    t->piece_arena = malloc(total + 1);
    t->piece_off = malloc(sizeof(size_t) * (size_t)t->n_vocab);
    t->piece_len = malloc(sizeof(uint32_t) * (size_t)t->n_vocab);
    t->hidden = malloc((size_t)t->n_vocab);
    if (!t->piece_arena || !t->piece_off || !t->piece_len || !t->hidden)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
    size_t o = 0;
    t->max_piece = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        size_t l = make_piece(t, a, i, t->piece_arena + o, &t->hidden[i]);
        CINFER_ASSERT(l <= t->text_len[i]);
        t->piece_off[i] = o;
        t->piece_len[i] = (uint32_t)l;
        o += l;
        if (l > t->max_piece)
            t->max_piece = l;
    }
    return CINFER_OK;
}

static cinfer_status build_special_list(cinfer_tokenizer *t)
{
    size_t n = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
            n++;
    special_key *keys = malloc(sizeof(special_key) * (n ? n : 1));
    t->special = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!keys || !t->special) {
        free(keys);
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
    }
    size_t k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        if (t->attr[i] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)) {
            keys[k].len = t->text_len[i];
            keys[k].id = i;
            k++;
        }
    }
    qsort(keys, n, sizeof(special_key), cmp_special_key);
    for (size_t i = 0; i < n; i++)
        t->special[i] = keys[i].id;
    t->n_special = n;
    free(keys);

    size_t n_eog = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        n_eog += t->eog[i];
    t->eog_ids = malloc(sizeof(int32_t) * (n_eog ? n_eog : 1));
    if (!t->eog_ids)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
    k = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->eog[i])
            t->eog_ids[k++] = i;
    t->n_eog = n_eog;
    return CINFER_OK;
}

cinfer_status cinfer_tokenizer_create(const cinfer_tokenizer_params *p,
                                      cinfer_tokenizer **out)
{
    if (!p || !p->gguf || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tokenizer: params, params.gguf and out are "
                                "required");
    const cinfer_gguf *g = p->gguf;
    cinfer_gguf_str model;
    cinfer_status st = cinfer_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st != CINFER_OK)
        return cinfer_set_error(CINFER_E_FORMAT,
                                "tokenizer: tokenizer.ggml.model is %s",
                                st == CINFER_E_NOT_FOUND ? "missing"
                                                         : "not a string");
    cinfer_tokenizer_kind kind;
    if (model.len == 4 && memcmp(model.ptr, "gpt2", 4) == 0) {
        kind = CINFER_TOKENIZER_BPE;
    } else if (model.len == 5 && memcmp(model.ptr, "llama", 5) == 0) {
        kind = CINFER_TOKENIZER_SPM;
    } else {
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "tokenizer: tokenizer.ggml.model '%.*s' is "
                                "not supported (gpt2 and llama are)",
                                (int)(model.len > 64 ? 64 : model.len),
                                model.ptr);
    }

    cinfer_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
    t->kind = kind;
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = t->sep = -1;
    t->fim_pre = t->fim_suf = t->fim_mid = -1;
    t->fim_pad = t->fim_rep = t->fim_sep = -1;

    const pre_def *pre = NULL;
    if (kind == CINFER_TOKENIZER_BPE) {
        cinfer_gguf_str ps;
        st = cinfer_gguf_get_str(g, "tokenizer.ggml.pre", &ps);
        if (st == CINFER_E_NOT_FOUND) {
            /* llama.cpp falls back to its default pre-tokenizer (with a
             * warning that quality may suffer) */
            strcpy(t->pre, "default");
        } else if (st != CINFER_OK) {
            st = cinfer_set_error(CINFER_E_FORMAT, "tokenizer: "
                                  "tokenizer.ggml.pre is not a string");
            goto fail;
        } else if (ps.len >= sizeof t->pre) {
            st = cinfer_set_error(CINFER_E_UNSUPPORTED,
                                  "tokenizer: pre-tokenizer '%.*s...' is not "
                                  "supported", 32, ps.ptr);
            goto fail;
        } else {
            memcpy(t->pre, ps.ptr, ps.len);
            t->pre[ps.len] = '\0';
        }
        for (size_t i = 0; i < sizeof PRE_DEFS / sizeof PRE_DEFS[0]; i++)
            if (name_in_list(PRE_DEFS[i].names, t->pre))
                pre = &PRE_DEFS[i];
        if (!pre) {
            st = cinfer_set_error(CINFER_E_UNSUPPORTED,
                                  "tokenizer: pre-tokenizer '%s' "
                                  "(tokenizer.ggml.pre) is not supported",
                                  t->pre);
            goto fail;
        }
        t->ignore_merges = pre->ignore_merges;
        t->add_bos = pre->add_bos;
    } else {
        t->add_space_prefix = 1;
        t->add_bos = 1;
    }

    st = load_tokens(t, g);
    if (st != CINFER_OK)
        goto fail;
    if (kind == CINFER_TOKENIZER_SPM) {
        t->bos = 1 < t->n_vocab ? 1 : -1;
        t->eos = 2 < t->n_vocab ? 2 : -1;
        t->unk = 0;
    }

    byte_alphabet alpha;
    byte_alphabet_init(&alpha);
    if (kind == CINFER_TOKENIZER_BPE) {
        st = load_merges(t, g, &alpha);
        if (st != CINFER_OK)
            goto fail;
        st = compile_regexes(t, pre);
        if (st != CINFER_OK)
            goto fail;
    } else {
        spm_byte_tokens(t);
    }

    static const struct {
        const char *key;
        size_t field;
    } id_keys[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(cinfer_tokenizer, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(cinfer_tokenizer, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(cinfer_tokenizer, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(cinfer_tokenizer, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(cinfer_tokenizer, unk)},
        {"tokenizer.ggml.seperator_token_id", offsetof(cinfer_tokenizer, sep)},
        {"tokenizer.ggml.padding_token_id", offsetof(cinfer_tokenizer, pad)},
        {"tokenizer.ggml.fim_pre_token_id", offsetof(cinfer_tokenizer, fim_pre)},
        {"tokenizer.ggml.fim_suf_token_id", offsetof(cinfer_tokenizer, fim_suf)},
        {"tokenizer.ggml.fim_mid_token_id", offsetof(cinfer_tokenizer, fim_mid)},
        {"tokenizer.ggml.fim_pad_token_id", offsetof(cinfer_tokenizer, fim_pad)},
        {"tokenizer.ggml.fim_rep_token_id", offsetof(cinfer_tokenizer, fim_rep)},
        {"tokenizer.ggml.fim_sep_token_id", offsetof(cinfer_tokenizer, fim_sep)},
        {"tokenizer.ggml.prefix_token_id", offsetof(cinfer_tokenizer, fim_pre)},
        {"tokenizer.ggml.suffix_token_id", offsetof(cinfer_tokenizer, fim_suf)},
        {"tokenizer.ggml.middle_token_id", offsetof(cinfer_tokenizer, fim_mid)},
    };
    for (size_t i = 0; i < sizeof id_keys / sizeof id_keys[0]; i++) {
        int32_t *field = (int32_t *)((char *)t + id_keys[i].field);
        st = read_id_key(g, id_keys[i].key, t->n_vocab, field);
        if (st != CINFER_OK)
            goto fail;
    }
    st = read_bool_key(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    if (st != CINFER_OK)
        goto fail;
    st = read_bool_key(g, "tokenizer.ggml.add_eos_token", &t->add_eos);
    if (st != CINFER_OK)
        goto fail;
    /* read for both kinds, as llama.cpp does: it also governs dropping the
     * leading space of the first decoded token */
    st = read_bool_key(g, "tokenizer.ggml.add_space_prefix",
                       &t->add_space_prefix);
    if (st != CINFER_OK)
        goto fail;
    if (t->add_bos && t->bos < 0) {
        st = cinfer_set_error(CINFER_E_FORMAT, "tokenizer: add_bos_token is "
                              "set but the vocabulary has no BOS token");
        goto fail;
    }
    if (t->add_eos && t->eos < 0) {
        st = cinfer_set_error(CINFER_E_FORMAT, "tokenizer: add_eos_token is "
                              "set but the vocabulary has no EOS token");
        goto fail;
    }

    find_special_tokens(t);
    st = build_pieces(t, &alpha);
    if (st != CINFER_OK)
        goto fail;
    st = build_special_list(t);
    if (st != CINFER_OK)
        goto fail;
    *out = t;
    return CINFER_OK;

fail:
    cinfer_tokenizer_destroy(t);
    return st;
}

void cinfer_tokenizer_destroy(cinfer_tokenizer *t)
{
    if (!t)
        return;
#if CINFER_HAVE_PCRE2
    for (int i = 0; i < t->n_re; i++)
        pcre2_code_free(t->re[i]);
#endif
    free(t->merges.slots);
    strtab_free(&t->bstr);
    strtab_free(&t->texts);
    free(t->eog_ids);
    free(t->special);
    free(t->hidden);
    free(t->piece_len);
    free(t->piece_off);
    free(t->piece_arena);
    free(t->eog);
    free(t->attr);
    free(t->scores);
    free(t->text_len);
    free(t->text_off);
    free(t->text_arena);
    free(t);
}

/* ======================================================================== */
/* Accessors                                                                */
/* ======================================================================== */

int32_t cinfer_tokenizer_n_vocab(const cinfer_tokenizer *t)
{
    return t->n_vocab;
}

cinfer_tokenizer_kind cinfer_tokenizer_kind_of(const cinfer_tokenizer *t)
{
    return t->kind;
}

const char *cinfer_tokenizer_pre(const cinfer_tokenizer *t) { return t->pre; }

int32_t cinfer_tokenizer_bos(const cinfer_tokenizer *t) { return t->bos; }
int32_t cinfer_tokenizer_eos(const cinfer_tokenizer *t) { return t->eos; }
int32_t cinfer_tokenizer_eot(const cinfer_tokenizer *t) { return t->eot; }
int32_t cinfer_tokenizer_eom(const cinfer_tokenizer *t) { return t->eom; }
int32_t cinfer_tokenizer_unk(const cinfer_tokenizer *t) { return t->unk; }
int32_t cinfer_tokenizer_pad(const cinfer_tokenizer *t) { return t->pad; }
int32_t cinfer_tokenizer_sep(const cinfer_tokenizer *t) { return t->sep; }
int cinfer_tokenizer_add_bos(const cinfer_tokenizer *t) { return t->add_bos; }
int cinfer_tokenizer_add_eos(const cinfer_tokenizer *t) { return t->add_eos; }

int cinfer_tokenizer_is_eog(const cinfer_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->eog[id];
}

void cinfer_tokenizer_eog_ids(const cinfer_tokenizer *t, const int32_t **ids,
                              size_t *n)
{
    *ids = t->eog_ids;
    *n = t->n_eog;
}

int cinfer_tokenizer_is_control(const cinfer_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->attr[id] & ATTR_CONTROL) != 0;
}

static cinfer_status bad_id(const cinfer_tokenizer *t, int32_t id)
{
    return cinfer_set_error(CINFER_E_RANGE,
                            "tokenizer: token id %d is out of range "
                            "[0, %d)",
                            (int)id, (int)t->n_vocab);
}

cinfer_status cinfer_tokenizer_token_piece(const cinfer_tokenizer *t,
                                           int32_t id, const char **bytes,
                                           size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return bad_id(t, id);
    *bytes = t->piece_arena + t->piece_off[id];
    *len = t->hidden[id] ? 0 : t->piece_len[id];
    return CINFER_OK;
}

cinfer_status cinfer_tokenizer_token_piece_special(const cinfer_tokenizer *t,
                                                   int32_t id,
                                                   const char **bytes,
                                                   size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return bad_id(t, id);
    *bytes = t->piece_arena + t->piece_off[id];
    *len = t->piece_len[id];
    return CINFER_OK;
}

cinfer_status cinfer_tokenizer_token_text(const cinfer_tokenizer *t,
                                          int32_t id, const char **bytes,
                                          size_t *len)
{
    if (id < 0 || id >= t->n_vocab)
        return bad_id(t, id);
    *bytes = t->text_arena + t->text_off[id];
    *len = t->text_len[id];
    return CINFER_OK;
}

int32_t cinfer_tokenizer_token_id(const cinfer_tokenizer *t, const char *text,
                                  size_t len)
{
    if (!text && len)
        return -1;
    int32_t i = strtab_find(&t->texts, text ? text : "", len);
    return i < 0 ? -1 : t->texts.val[i];
}

size_t cinfer_tokenizer_max_piece(const cinfer_tokenizer *t)
{
    return t->max_piece;
}

/* ======================================================================== */
/* Encoding                                                                 */
/* ======================================================================== */

/* Output ids: counts all, stores the first cap. */
typedef struct {
    int32_t *ids;
    size_t cap;
    size_t n;
} id_sink;

static void sink_push(id_sink *s, int32_t id)
{
    if (s->n < s->cap)
        s->ids[s->n] = id;
    s->n++;
}

typedef struct {
    size_t start;
    size_t len;
    int32_t id;  /* special token, or -1 for text */
    int opaque;  /* text that no regex may touch (an invalid UTF-8 byte) */
} span;

typedef struct {
    span *v;
    size_t n;
    size_t cap;
} span_vec;

static int span_push(span_vec *s, size_t start, size_t len, int32_t id,
                     int opaque)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        span *v = realloc(s->v, sizeof(span) * cap);
        if (!v)
            return -1;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].start = start;
    s->v[s->n].len = len;
    s->v[s->n].id = id;
    s->v[s->n].opaque = opaque;
    s->n++;
    return 0;
}

/* A merge candidate: higher key first, then lower left index. */
typedef struct {
    double key;
    int32_t left;
    int32_t right;
    uint32_t size;
    int32_t merged; /* BPE: sid of the merged string */
} bigram;

typedef struct {
    int32_t prev;
    int32_t next;
    uint32_t start; /* within the piece */
    uint32_t len;   /* 0 = merged away */
    int32_t sid;    /* BPE: interned string id or -1 */
} symbol;

/* Per-call scratch space. */
typedef struct {
    span_vec frags;
    span_vec segs;
    span_vec segs2;
    symbol *sym;
    size_t sym_cap;
    bigram *heap;
    size_t heap_n;
    size_t heap_cap;
    char *buf; /* SPM escaped text */
    size_t buf_cap;
#if CINFER_HAVE_PCRE2
    pcre2_match_data *md;
#endif
} scratch;

static void scratch_free(scratch *s)
{
    free(s->frags.v);
    free(s->segs.v);
    free(s->segs2.v);
    free(s->sym);
    free(s->heap);
    free(s->buf);
#if CINFER_HAVE_PCRE2
    if (s->md)
        pcre2_match_data_free(s->md);
#endif
}

static int bigram_before(const bigram *a, const bigram *b)
{
    if (a->key != b->key)
        return a->key > b->key;
    return a->left < b->left;
}

static int heap_push(scratch *s, const bigram *b)
{
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 256;
        bigram *h = realloc(s->heap, sizeof(bigram) * cap);
        if (!h)
            return -1;
        s->heap = h;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_before(b, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = *b;
    return 0;
}

static bigram heap_pop(scratch *s)
{
    bigram top = s->heap[0];
    bigram last = s->heap[--s->heap_n];
    size_t i = 0, n = s->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && bigram_before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!bigram_before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (n > 0)
        s->heap[i] = last;
    return top;
}

static int ensure_symbols(scratch *s, size_t n)
{
    if (n <= s->sym_cap)
        return 0;
    symbol *v = realloc(s->sym, sizeof(symbol) * n);
    if (!v)
        return -1;
    s->sym = v;
    s->sym_cap = n;
    return 0;
}

/* ---- byte-level BPE ---------------------------------------------------- */

static int bpe_add_bigram(const cinfer_tokenizer *t, scratch *s, int32_t l,
                          int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    const symbol *sl = &s->sym[l], *sr = &s->sym[r];
    if (sl->sid < 0 || sr->sid < 0)
        return 0;
    const pair_slot *m = pairmap_find(&t->merges, sl->sid, sr->sid);
    if (!m)
        return 0;
    bigram b;
    b.key = -(double)m->rank;
    b.left = l;
    b.right = r;
    b.size = sl->len + sr->len;
    b.merged = m->merged;
    return heap_push(s, &b);
}

/* Merges one pre-tokenized piece and appends its tokens. */
static cinfer_status bpe_piece(const cinfer_tokenizer *t, scratch *s,
                               const char *p, size_t n, id_sink *out)
{
    if (n == 0)
        return CINFER_OK;
    if (n > INT32_MAX)
        return cinfer_set_error(CINFER_E_RANGE, "tokenizer: a piece of %zu "
                                "bytes is too long", n);
    if (t->ignore_merges) {
        int32_t k = strtab_find(&t->bstr, p, n);
        if (k >= 0 && t->bstr.val[k] >= 0) {
            sink_push(out, t->bstr.val[k]);
            return CINFER_OK;
        }
    }
    if (ensure_symbols(s, n) != 0)
        return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
    symbol *sym = s->sym;
    for (size_t i = 0; i < n; i++) {
        sym[i].prev = (int32_t)i - 1;
        sym[i].next = i + 1 < n ? (int32_t)i + 1 : -1;
        sym[i].start = (uint32_t)i;
        sym[i].len = 1;
        sym[i].sid = t->byte_sid[(unsigned char)p[i]];
    }
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        if (bpe_add_bigram(t, s, (int32_t)i - 1, (int32_t)i) != 0)
            goto fail_nomem;
    while (s->heap_n > 0) {
        bigram b = heap_pop(s);
        symbol *l = &sym[b.left], *r = &sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue; /* stale: one side changed since it was queued */
        l->len += r->len;
        l->sid = b.merged;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = b.left;
        if (bpe_add_bigram(t, s, l->prev, b.left) != 0 ||
            bpe_add_bigram(t, s, b.left, l->next) != 0)
            goto fail_nomem;
    }
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        const symbol *y = &sym[i];
        int32_t tok = y->sid >= 0 ? t->bstr.val[y->sid] : -1;
        if (tok >= 0) {
            sink_push(out, tok);
            continue;
        }
        /* no token for the whole symbol: one token per byte (bytes without
         * a token are dropped, as llama.cpp does) */
        for (uint32_t k = 0; k < y->len; k++) {
            int32_t bt = t->byte_tok[(unsigned char)p[y->start + k]];
            if (bt >= 0)
                sink_push(out, bt);
        }
    }
    return CINFER_OK;

fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}

/* Splits every text segment of `in` by regex `re` into `out`: matches and
 * the text between them each become a segment. */
#if CINFER_HAVE_PCRE2
static cinfer_status regex_split(const cinfer_tokenizer *t, scratch *s,
                                 int ri, const char *text,
                                 const span_vec *in, span_vec *out)
{
    out->n = 0;
    for (size_t k = 0; k < in->n; k++) {
        const span *g = &in->v[k];
        if (g->opaque) {
            if (span_push(out, g->start, g->len, -1, 1) != 0)
                goto fail_nomem;
            continue;
        }
        PCRE2_SPTR subj = (PCRE2_SPTR)(text + g->start);
        size_t pos = 0, prev_end = 0;
        while (pos < g->len) {
            int rc;
            if (t->re_jit[ri]) {
                rc = pcre2_jit_match(t->re[ri], subj, g->len, pos, 0, s->md,
                                     NULL);
                if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                    rc = pcre2_match(t->re[ri], subj, g->len, pos,
                                     PCRE2_NO_UTF_CHECK, s->md, NULL);
            } else {
                rc = pcre2_match(t->re[ri], subj, g->len, pos,
                                 PCRE2_NO_UTF_CHECK, s->md, NULL);
            }
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0) {
                PCRE2_UCHAR msg[256];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return cinfer_set_error(CINFER_E_INTERNAL,
                                        "tokenizer: pre-tokenizer regex "
                                        "failed: %s",
                                        (char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
            size_t ms = ov[0], me = ov[1];
            if (me <= ms) {
                /* empty match (no pattern here makes one): step over a
                 * character */
                size_t adv = utf8_lead_len(subj[pos]);
                pos += adv;
                continue;
            }
            if (ms > prev_end &&
                span_push(out, g->start + prev_end, ms - prev_end, -1, 0) != 0)
                goto fail_nomem;
            if (span_push(out, g->start + ms, me - ms, -1, 0) != 0)
                goto fail_nomem;
            prev_end = me;
            pos = me;
        }
        if (prev_end < g->len &&
            span_push(out, g->start + prev_end, g->len - prev_end, -1, 0) != 0)
            goto fail_nomem;
    }
    return CINFER_OK;

fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}
#endif

static cinfer_status bpe_fragment(const cinfer_tokenizer *t, scratch *s,
                                  const char *text, size_t start, size_t len,
                                  id_sink *out)
{
    /* Valid UTF-8 runs go through the regexes; each invalid byte is a piece
     * of its own. */
    s->segs.n = 0;
    size_t i = start, run = start, end = start + len;
    while (i < end) {
        size_t l = utf8_valid_len((const unsigned char *)text + i, end - i);
        if (l > 0) {
            i += l;
            continue;
        }
        if (i > run && span_push(&s->segs, run, i - run, -1, 0) != 0)
            goto fail_nomem;
        if (span_push(&s->segs, i, 1, -1, 1) != 0)
            goto fail_nomem;
        i++;
        run = i;
    }
    if (end > run && span_push(&s->segs, run, end - run, -1, 0) != 0)
        goto fail_nomem;

#if CINFER_HAVE_PCRE2
    for (int r = 0; r < t->n_re; r++) {
        cinfer_status st = regex_split(t, s, r, text, &s->segs, &s->segs2);
        if (st != CINFER_OK)
            return st;
        span_vec tmp = s->segs;
        s->segs = s->segs2;
        s->segs2 = tmp;
    }
#endif
    for (size_t k = 0; k < s->segs.n; k++) {
        cinfer_status st = bpe_piece(t, s, text + s->segs.v[k].start,
                                     s->segs.v[k].len, out);
        if (st != CINFER_OK)
            return st;
    }
    return CINFER_OK;

fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}

/* ---- SentencePiece BPE ------------------------------------------------- */

static int32_t text_token(const cinfer_tokenizer *t, const char *s, size_t n)
{
    int32_t i = strtab_find(&t->texts, s, n);
    return i < 0 ? -1 : t->texts.val[i];
}

static int spm_add_bigram(const cinfer_tokenizer *t, scratch *s, int32_t l,
                          int32_t r)
{
    if (l < 0 || r < 0)
        return 0;
    const symbol *sl = &s->sym[l], *sr = &s->sym[r];
    if (sl->len + sr->len > t->max_text)
        return 0; /* longer than any token */
    int32_t tok = text_token(t, s->buf + sl->start, sl->len + sr->len);
    if (tok < 0)
        return 0;
    bigram b;
    b.key = t->scores[tok];
    b.left = l;
    b.right = r;
    b.size = sl->len + sr->len;
    b.merged = tok;
    return heap_push(s, &b);
}

static cinfer_status spm_fragment(const cinfer_tokenizer *t, scratch *s,
                                  const char *text, size_t len, int prefix,
                                  id_sink *out)
{
    /* escaped text: optional leading space, spaces as U+2581 */
    size_t n_sp = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++)
        n_sp += text[i] == ' ';
    size_t n = len + (prefix ? 1 : 0) + 2 * n_sp;
    if (n == 0)
        return CINFER_OK;
    if (n > INT32_MAX)
        return cinfer_set_error(CINFER_E_RANGE, "tokenizer: a text of %zu "
                                "bytes is too long", len);
    if (n > s->buf_cap) {
        char *b = realloc(s->buf, n);
        if (!b)
            goto fail_nomem;
        s->buf = b;
        s->buf_cap = n;
    }
    char *b = s->buf;
    size_t o = 0;
    if (prefix) {
        memcpy(b, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(b + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            b[o++] = text[i];
        }
    }
    CINFER_ASSERT(o == n);

    if (ensure_symbols(s, n) != 0)
        goto fail_nomem;
    symbol *sym = s->sym;
    int32_t ns = 0;
    for (size_t off = 0; off < n;) {
        size_t l = utf8_lead_len((unsigned char)b[off]);
        if (l > n - off)
            l = n - off;
        sym[ns].start = (uint32_t)off;
        sym[ns].len = (uint32_t)l;
        sym[ns].prev = ns - 1;
        off += l;
        sym[ns].next = off == n ? -1 : ns + 1;
        sym[ns].sid = -1;
        ns++;
    }
    s->heap_n = 0;
    for (int32_t i = 1; i < ns; i++)
        if (spm_add_bigram(t, s, i - 1, i) != 0)
            goto fail_nomem;
    while (s->heap_n > 0) {
        bigram g = heap_pop(s);
        symbol *l = &sym[g.left], *r = &sym[g.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != g.size)
            continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = g.left;
        if (spm_add_bigram(t, s, l->prev, g.left) != 0 ||
            spm_add_bigram(t, s, g.left, l->next) != 0)
            goto fail_nomem;
    }
    for (int32_t i = 0; i != -1; i = sym[i].next) {
        const symbol *y = &sym[i];
        int32_t tok = text_token(t, b + y->start, y->len);
        if (tok >= 0) {
            sink_push(out, tok);
            continue;
        }
        /* byte fallback; a byte without a token becomes UNK */
        for (uint32_t k = 0; k < y->len; k++) {
            int32_t bt = t->byte_tok[(unsigned char)b[y->start + k]];
            if (bt < 0)
                bt = t->unk;
            if (bt >= 0)
                sink_push(out, bt);
        }
    }
    return CINFER_OK;

fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}

/* ---- special tokens ---------------------------------------------------- */

static const char *find_bytes(const char *h, size_t hn, const char *n,
                              size_t nn)
{
    if (nn == 0 || nn > hn)
        return NULL;
    const char *end = h + hn - nn;
    const char *p = h;
    while (p <= end) {
        p = memchr(p, n[0], (size_t)(end - p) + 1);
        if (!p)
            return NULL;
        if (memcmp(p, n, nn) == 0)
            return p;
        p++;
    }
    return NULL;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest
 * first, split every text fragment at each of its occurrences. */
static cinfer_status partition(const cinfer_tokenizer *t, scratch *s,
                               const char *text, size_t len,
                               int parse_special)
{
    s->frags.n = 0;
    if (len == 0)
        return CINFER_OK;
    if (span_push(&s->frags, 0, len, -1, 0) != 0)
        goto fail_nomem;
    for (size_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        if (!parse_special && (t->attr[id] & (ATTR_CONTROL | ATTR_UNKNOWN)))
            continue;
        const char *tok = t->text_arena + t->text_off[id];
        size_t tl = t->text_len[id];
        /* Quick check: any text fragment holding it at all? */
        int found = 0;
        for (size_t f = 0; f < s->frags.n && !found; f++) {
            const span *g = &s->frags.v[f];
            found = g->id < 0 &&
                    find_bytes(text + g->start, g->len, tok, tl) != NULL;
        }
        if (!found)
            continue;
        s->segs.n = 0;
        for (size_t f = 0; f < s->frags.n; f++) {
            span g = s->frags.v[f];
            if (g.id >= 0) {
                if (span_push(&s->segs, g.start, g.len, g.id, 0) != 0)
                    goto fail_nomem;
                continue;
            }
            size_t pos = g.start, end = g.start + g.len;
            for (;;) {
                const char *m = find_bytes(text + pos, end - pos, tok, tl);
                if (!m)
                    break;
                size_t ms = (size_t)(m - text);
                if (ms > pos && span_push(&s->segs, pos, ms - pos, -1, 0) != 0)
                    goto fail_nomem;
                if (span_push(&s->segs, ms, tl, id, 0) != 0)
                    goto fail_nomem;
                pos = ms + tl;
            }
            if (end > pos && span_push(&s->segs, pos, end - pos, -1, 0) != 0)
                goto fail_nomem;
        }
        span_vec tmp = s->frags;
        s->frags = s->segs;
        s->segs = tmp;
    }
    return CINFER_OK;

fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
}

cinfer_status cinfer_tokenizer_encode(const cinfer_tokenizer *t,
                                      const char *text, size_t len,
                                      int add_special, int parse_special,
                                      int32_t *ids, size_t cap, size_t *n_ids)
{
    if (!t || !n_ids || (!text && len) || (!ids && cap))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tokenizer: encode needs t, n_ids, text (if "
                                "len > 0) and ids (if cap > 0)");
    id_sink out = {ids, cap, 0};
    scratch s;
    memset(&s, 0, sizeof s);
    cinfer_status st = CINFER_OK;
    if (t->kind == CINFER_TOKENIZER_BPE) {
#if CINFER_HAVE_PCRE2
        s.md = pcre2_match_data_create(1, NULL);
        if (!s.md) {
            st = cinfer_set_error(CINFER_E_NOMEM, "tokenizer: out of memory");
            goto done;
        }
#endif
    }
    st = partition(t, &s, text, len, parse_special);
    if (st != CINFER_OK)
        goto done;

    if (add_special && t->add_bos)
        sink_push(&out, t->bos);
    int prev_special = 1; /* SPM: a space goes in front of the first text */
    for (size_t f = 0; f < s.frags.n; f++) {
        span g = s.frags.v[f];
        if (g.id >= 0) {
            sink_push(&out, g.id);
            prev_special = 1;
            continue;
        }
        if (t->kind == CINFER_TOKENIZER_BPE) {
            st = bpe_fragment(t, &s, text, g.start, g.len, &out);
        } else {
            st = spm_fragment(t, &s, text + g.start, g.len,
                              t->add_space_prefix && prev_special, &out);
            prev_special = 0;
        }
        if (st != CINFER_OK)
            goto done;
    }
    if (add_special && t->add_eos)
        sink_push(&out, t->eos);

    *n_ids = out.n;
    if (out.n > cap)
        st = cinfer_set_error(CINFER_E_RANGE,
                              "tokenizer: %zu tokens do not fit in %zu",
                              out.n, cap);
done:
    scratch_free(&s);
    return st;
}

/* ======================================================================== */
/* Decoding                                                                 */
/* ======================================================================== */

/* The piece of id as decode renders it, after the first-token strip. */
static void render(const cinfer_tokenizer *t, int32_t id, int special,
                   int first, const char **p, size_t *n)
{
    *p = t->piece_arena + t->piece_off[id];
    *n = (t->hidden[id] && !special) ? 0 : t->piece_len[id];
    if (first && t->add_space_prefix && *n > 0 && (*p)[0] == ' ') {
        (*p)++;
        (*n)--;
    }
}

cinfer_status cinfer_tokenizer_decode(const cinfer_tokenizer *t,
                                      const int32_t *ids, size_t n,
                                      int special, char *out, size_t cap,
                                      size_t *n_out)
{
    if (!t || !n_out || (!ids && n) || (!out && cap))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "tokenizer: decode needs t, n_out, ids (if "
                                "n > 0) and out (if cap > 0)");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_vocab) {
            *n_out = 0;
            return bad_id(t, ids[i]);
        }
        const char *p;
        size_t l;
        render(t, ids[i], special, i == 0, &p, &l);
        if (l > 0 && total + l <= cap)
            memcpy(out + total, p, l);
        total += l;
    }
    *n_out = total;
    if (total > cap)
        return cinfer_set_error(CINFER_E_RANGE,
                                "tokenizer: decoded text of %zu bytes does "
                                "not fit in %zu",
                                total, cap);
    return CINFER_OK;
}

/* ---- incremental ------------------------------------------------------- */

void cinfer_detok_init(cinfer_detok *d)
{
    memset(d, 0, sizeof *d);
    d->at_start = 1;
}

size_t cinfer_detok_out_max(const cinfer_tokenizer *t)
{
    return 3 * (t->max_piece + 3);
}

/* Decodes pend ++ bytes, replacing invalid subparts by U+FFFD. Writes to
 * out when out != NULL; returns the output size and sets *tail to the
 * number of trailing bytes forming an incomplete character (held back). */
static size_t utf8_stream(const unsigned char *p0, size_t n0,
                          const unsigned char *p1, size_t n1, char *out,
                          size_t *tail)
{
#define AT(i) ((i) < n0 ? p0[(i)] : p1[(i) - n0])
#define EMIT(c)                                                                \
    do {                                                                       \
        if (out)                                                               \
            out[o] = (char)(c);                                                \
        o++;                                                                   \
    } while (0)
#define EMIT_FFFD()                                                            \
    do {                                                                       \
        EMIT(0xEF);                                                            \
        EMIT(0xBF);                                                            \
        EMIT(0xBD);                                                            \
    } while (0)
    size_t n = n0 + n1, i = 0, o = 0;
    *tail = 0;
    while (i < n) {
        unsigned char b = AT(i);
        if (b < 0x80) {
            EMIT(b);
            i++;
            continue;
        }
        size_t need;
        unsigned char lo = 0x80, hi = 0xBF;
        if (b >= 0xC2 && b <= 0xDF) {
            need = 1;
        } else if (b == 0xE0) {
            need = 2;
            lo = 0xA0;
        } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
            need = 2;
        } else if (b == 0xED) {
            need = 2;
            hi = 0x9F;
        } else if (b == 0xF0) {
            need = 3;
            lo = 0x90;
        } else if (b >= 0xF1 && b <= 0xF3) {
            need = 3;
        } else if (b == 0xF4) {
            need = 3;
            hi = 0x8F;
        } else {
            EMIT_FFFD();
            i++;
            continue;
        }
        size_t k = 1;
        int bad = 0;
        for (; k <= need; k++) {
            if (i + k >= n) {
                *tail = n - i;
                return o;
            }
            unsigned char c = AT(i + k);
            unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
            if (c < l || c > h) {
                bad = 1;
                break;
            }
        }
        if (bad) {
            EMIT_FFFD();
            i += k; /* the maximal subpart: lead and the good continuations */
            continue;
        }
        for (k = 0; k <= need; k++)
            EMIT(AT(i + k));
        i += need + 1;
    }
    return o;
#undef EMIT_FFFD
#undef EMIT
#undef AT
}

static cinfer_status detok_bytes(cinfer_detok *d, const unsigned char *p,
                                 size_t n, char *out, size_t cap,
                                 size_t *n_out)
{
    size_t tail;
    size_t need = utf8_stream(d->pend, d->n_pend, p, n, NULL, &tail);
    *n_out = need;
    if (need > cap)
        return cinfer_set_error(CINFER_E_RANGE,
                                "detok: %zu bytes of output do not fit in %zu",
                                need, cap);
    utf8_stream(d->pend, d->n_pend, p, n, out, &tail);
    /* keep the last `tail` bytes of pend ++ p */
    unsigned char keep[4];
    size_t total = d->n_pend + n;
    CINFER_ASSERT(tail <= 3);
    for (size_t k = 0; k < tail; k++) {
        size_t j = total - tail + k;
        keep[k] = j < d->n_pend ? d->pend[j] : p[j - d->n_pend];
    }
    memcpy(d->pend, keep, tail);
    d->n_pend = (unsigned)tail;
    return CINFER_OK;
}

cinfer_status cinfer_detok_push(const cinfer_tokenizer *t, cinfer_detok *d,
                                int32_t id, char *out, size_t cap,
                                size_t *n_out)
{
    if (!t || !d || !n_out || (!out && cap))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "detok: push needs t, d, n_out and out (if "
                                "cap > 0)");
    if (id < 0 || id >= t->n_vocab) {
        *n_out = 0;
        return bad_id(t, id);
    }
    const char *p;
    size_t n;
    render(t, id, d->special, d->at_start, &p, &n);
    cinfer_status st =
        detok_bytes(d, (const unsigned char *)p, n, out, cap, n_out);
    if (st == CINFER_OK)
        d->at_start = 0;
    return st;
}

cinfer_status cinfer_detok_push_bytes(cinfer_detok *d, const char *bytes,
                                      size_t n, char *out, size_t cap,
                                      size_t *n_out)
{
    if (!d || !n_out || (!bytes && n) || (!out && cap))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "detok: push_bytes needs d, n_out, bytes (if "
                                "n > 0) and out (if cap > 0)");
    return detok_bytes(d, (const unsigned char *)bytes, n, out, cap, n_out);
}

cinfer_status cinfer_detok_flush(cinfer_detok *d, char *out, size_t cap,
                                 size_t *n_out)
{
    if (!d || !n_out || (!out && cap))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "detok: flush needs d, n_out and out (if "
                                "cap > 0)");
    if (d->n_pend == 0) {
        *n_out = 0;
        return CINFER_OK;
    }
    *n_out = 3;
    if (cap < 3)
        return cinfer_set_error(CINFER_E_RANGE,
                                "detok: 3 bytes of output do not fit in %zu",
                                cap);
    memcpy(out, "\xef\xbf\xbd", 3);
    d->n_pend = 0;
    return CINFER_OK;
}
