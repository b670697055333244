#include "reference/device_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace flashlab::reference {

namespace {

void cuda_ok(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) throw std::runtime_error(what + ": " + cudaGetErrorString(status));
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) { cuda_ok(cudaMalloc(&data_, bytes == 0 ? 16 : bytes), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
};

// Host values are already rounded to the dtype, so these conversions are exact.
std::vector<std::uint16_t> encode(const HostTensor& tensor) {
  std::vector<std::uint16_t> bits(tensor.values.size());
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (tensor.dtype == DType::bf16) {
      const __nv_bfloat16 value = __float2bfloat16_rn(tensor.values[i]);
      std::memcpy(&bits[i], &value, 2);
    } else {
      const __half value = __float2half_rn(tensor.values[i]);
      std::memcpy(&bits[i], &value, 2);
    }
  }
  return bits;
}

void decode(const std::vector<std::uint16_t>& bits, HostTensor& tensor) {
  for (std::size_t i = 0; i < bits.size(); ++i) {
    if (tensor.dtype == DType::bf16) {
      const std::uint32_t wide = static_cast<std::uint32_t>(bits[i]) << 16;  // bf16 is fp32's top half
      std::memcpy(&tensor.values[i], &wide, 4);
    } else {
      __half_raw raw;
      raw.x = bits[i];
      tensor.values[i] = __half2float(__half(raw));
    }
  }
}

std::unique_ptr<DeviceBuffer> upload(const HostTensor& tensor) {
  const std::vector<std::uint16_t> bits = encode(tensor);
  auto buffer = std::make_unique<DeviceBuffer>(bits.size() * 2);
  cuda_ok(cudaMemcpy(buffer->get(), bits.data(), bits.size() * 2, cudaMemcpyHostToDevice), "upload");
  return buffer;
}

std::unique_ptr<DeviceBuffer> upload_ints(const std::vector<int>& values) {
  auto buffer = std::make_unique<DeviceBuffer>(values.size() * sizeof(int));
  cuda_ok(cudaMemcpy(buffer->get(), values.data(), values.size() * sizeof(int), cudaMemcpyHostToDevice), "upload");
  return buffer;
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

ForwardImplementation on_device(DeviceForwardKernel kernel) {
  return [kernel = std::move(kernel)](const Problem& problem, AttentionTensors& tensors) {
    if (problem.dtype != DType::fp16 && problem.dtype != DType::bf16) {
      throw std::invalid_argument("on_device: dtype " + std::string(to_string(problem.dtype)) +
                                  " is not supported; allowed: fp16, bf16");
    }
    const auto q = upload(tensors.Q), k = upload(tensors.K), v = upload(tensors.V);
    const std::size_t o_bytes = tensors.O.values.size() * 2, lse_bytes = tensors.LSE.values.size() * sizeof(float);
    DeviceBuffer o(o_bytes), lse(lse_bytes);
    cuda_ok(cudaMemset(o.get(), 0xFF, o_bytes), "poison O");
    cuda_ok(cudaMemset(lse.get(), 0xFF, lse_bytes), "poison LSE");
    std::unique_ptr<DeviceBuffer> cu_q, cu_k;
    kernels::ForwardArgs args;
    args.q = kernels::flash_layout(q->get(), problem, problem.heads_q, problem.head_dim, true);
    args.k = kernels::flash_layout(k->get(), problem, problem.heads_kv, problem.head_dim, false);
    args.v = kernels::flash_layout(v->get(), problem, problem.heads_kv, problem.value_dim(), false);
    args.o = kernels::flash_layout(o.get(), problem, problem.heads_q, problem.value_dim(), true);
    args.lse = kernels::flash_layout(lse.get(), problem, problem.heads_q, 1, true);
    if (problem.varlen()) {
      cu_q = upload_ints(problem.cu_seqlens_q);
      cu_k = upload_ints(problem.cu_seqlens_k);
      args.cu_seqlens_q = static_cast<const int*>(cu_q->get());
      args.cu_seqlens_k = static_cast<const int*>(cu_k->get());
    }
    kernel(problem, args);
    cuda_ok(cudaGetLastError(), "kernel launch");
    cuda_ok(cudaDeviceSynchronize(), "kernel execution");
    std::vector<std::uint16_t> bits(tensors.O.values.size());
    cuda_ok(cudaMemcpy(bits.data(), o.get(), o_bytes, cudaMemcpyDeviceToHost), "download O");
    decode(bits, tensors.O);
    cuda_ok(cudaMemcpy(tensors.LSE.values.data(), lse.get(), lse_bytes, cudaMemcpyDeviceToHost), "download LSE");
  };
}

}  // namespace flashlab::reference
