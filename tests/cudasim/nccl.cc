/*
 * nccl.cc - cudasim's NCCL (placeholder until the collectives land).
 */
#include "tests/cudasim/cudasim_impl.h"

namespace cudasim {
void nccl_reset(void) {}
} // namespace cudasim
