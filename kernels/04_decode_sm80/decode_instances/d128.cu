// Decode, padded head dim 128, fp16 and bf16.
#include "kernels/04_decode_sm80/decode_launch.cuh"

FLASHLAB_DECODE_INSTANCE(128)
