/*
 * tokenizer.h - text <-> token ids, read from GGUF metadata.
 * (Interface placeholder: the tokenizer module fills in the rest of this
 * header; the names below are fixed.)
 */
#ifndef CINFER_TOKENIZER_H
#define CINFER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "../common/status.h"
#include "gguf.h"

typedef struct cinfer_tokenizer cinfer_tokenizer;

typedef struct {
    const cinfer_gguf *gguf; /* borrowed; read only during create */
} cinfer_tokenizer_params;

cinfer_tokenizer_params cinfer_tokenizer_default_params(void);
cinfer_status cinfer_tokenizer_create(const cinfer_tokenizer_params *p,
                                      cinfer_tokenizer **out);
void cinfer_tokenizer_destroy(cinfer_tokenizer *t);
int32_t cinfer_tokenizer_n_vocab(const cinfer_tokenizer *t);

#endif
