// FA3 forward, padded head dim 128, fp16 and bf16 (sm_90a only).
#include "kernels/03_fa3_sm90/forward_launch.cuh"

FLASHLAB_FA3_FORWARD_INSTANCE(128)
