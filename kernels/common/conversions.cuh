// Conversions between fp32 and the 16-bit element types (fp16, bf16): one value, or two packed in
// one 32-bit register, the form the mma operands take (low half first).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashlab::kernels::device {

// Two floats rounded to the 16-bit type T and packed in one 32-bit register (low half first).
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float low, float high);
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float low, float high) {
  __half2 pair = __floats2half2_rn(low, high);
  return *reinterpret_cast<std::uint32_t*>(&pair);
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float low, float high) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<std::uint32_t*>(&pair);
}

// The two 16-bit values of a packed register, as floats (low half first).
template <typename T>
__device__ __forceinline__ float2 unpack2(std::uint32_t pair);
template <>
__device__ __forceinline__ float2 unpack2<__half>(std::uint32_t pair) {
  return __half22float2(*reinterpret_cast<const __half2*>(&pair));
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(std::uint32_t pair) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
}

template <typename T>
__device__ __forceinline__ float to_float(T value);
template <>
__device__ __forceinline__ float to_float<__half>(__half value) { return __half2float(value); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 value) { return __bfloat162float(value); }

template <typename T>
__device__ __forceinline__ T from_float(float value);
template <>
__device__ __forceinline__ __half from_float<__half>(float value) { return __float2half_rn(value); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float value) { return __float2bfloat16_rn(value); }

}  // namespace flashlab::kernels::device
