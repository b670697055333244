// FA3 backward, padded head dim 64, fp16 and bf16 (sm_90a only).
#include "kernels/03_fa3_sm90/backward_launch.cuh"

FLASHLAB_FA3_BACKWARD_INSTANCE(64, false)
