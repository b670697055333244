// FA2 forward, padded head dim 256, fp16 and bf16.
#include "kernels/02_fa2_sm80/forward_launch.cuh"

FLASHLAB_FA2_FORWARD_INSTANCE(256)
