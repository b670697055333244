// Decode, padded head dim 64, fp16 and bf16.
#include "kernels/04_decode_sm80/decode_launch.cuh"

FLASHLAB_DECODE_INSTANCE(64)
