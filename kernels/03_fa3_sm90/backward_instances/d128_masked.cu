// FA3 backward, padded head dim 128, the masked variant's 64-row query blocks (fa3::backward_masked_variant),
// fp16 and bf16 (sm_90a only).
#include "kernels/03_fa3_sm90/backward_launch.cuh"

FLASHLAB_FA3_BACKWARD_INSTANCE(128, true)
