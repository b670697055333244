#include "reference/device_attention.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
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

std::unique_ptr<DeviceBuffer> upload_ints(const std::vector<int>& values) {
  auto buffer = std::make_unique<DeviceBuffer>(values.size() * sizeof(int));
  cuda_ok(cudaMemcpy(buffer->get(), values.data(), values.size() * sizeof(int), cudaMemcpyHostToDevice), "upload");
  return buffer;
}

// The buffers of a layout on the device: those the call's operands use, copied from their images.
struct DeviceImages {
  const Problem& problem;
  const DeviceLayout& layout;
  bool backward;
  std::vector<BufferImage> images;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;  // null where no operand of the call lives
  std::unique_ptr<DeviceBuffer> cu_q, cu_k;

  DeviceImages(const Problem& problem, const DeviceLayout& layout, bool backward, std::vector<BufferImage> host_images)
      : problem(problem), layout(layout), backward(backward), images(std::move(host_images)), buffers(images.size()) {
    for (int i = 0; i < (backward ? kOperandCount : static_cast<int>(Operand::lse) + 1); ++i) {
      const int index = layout.placements[i].buffer;
      if (index < 0 || buffers[index]) continue;
      buffers[index] = std::make_unique<DeviceBuffer>(images[index].size());
      cuda_ok(cudaMemcpy(buffers[index]->get(), images[index].data(), images[index].size(), cudaMemcpyHostToDevice),
              "upload");
    }
    if (problem.varlen()) {
      cu_q = upload_ints(problem.cu_seqlens_q);
      cu_k = upload_ints(problem.cu_seqlens_k);
    }
  }

  kernels::DeviceTensor tensor(Operand operand) const {
    const Placement& p = layout[operand];
    if (p.buffer < 0 || !buffers[p.buffer]) throw std::logic_error("layout " + layout.name + " does not place " + to_string(operand));
    kernels::DeviceTensor t;
    t.data = static_cast<char*>(buffers[p.buffer]->get()) + p.offset * layout.buffers[p.buffer].element_bytes;
    t.batch_stride = p.batch_stride, t.row_stride = p.row_stride, t.head_stride = p.head_stride;
    return t;
  }
  const int* offsets_q() const { return cu_q ? static_cast<const int*>(cu_q->get()) : nullptr; }
  const int* offsets_k() const { return cu_k ? static_cast<const int*>(cu_k->get()) : nullptr; }

  // After the kernel: every buffer back into its image.
  void download() {
    cuda_ok(cudaGetLastError(), "kernel launch");
    cuda_ok(cudaDeviceSynchronize(), "kernel execution");
    for (std::size_t i = 0; i < buffers.size(); ++i) {
      if (!buffers[i]) continue;
      cuda_ok(cudaMemcpy(images[i].data(), buffers[i]->get(), images[i].size(), cudaMemcpyDeviceToHost), "download");
    }
  }
  // Every element outside the call's tensors must still be poison.
  void require_padding_untouched() const {
    const PaddingReport padding = untouched_padding(problem, layout, backward, images);
    if (padding.overwritten > 0) {
      throw ImplementationFailure("layout " + layout.name + ": " + std::to_string(padding.overwritten) +
                                  " elements outside the call's tensors were written (they held poison), first at " +
                                  padding.first);
    }
  }
};

void require_16bit(const Problem& problem, const char* what) {
  if (problem.dtype != DType::fp16 && problem.dtype != DType::bf16) {
    throw std::invalid_argument(std::string(what) + ": dtype " + to_string(problem.dtype) +
                                " is not supported; allowed: fp16, bf16");
  }
}

}  // namespace

bool cuda_device_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

ForwardImplementation on_device(DeviceForwardKernel kernel) {
  return on_device(std::move(kernel), uniform_layout(TensorLayoutKind::flash));
}

ForwardImplementation on_device(DeviceForwardKernel kernel, LayoutRule layout_rule) {
  return [kernel = std::move(kernel), layout_rule = std::move(layout_rule)](const Problem& problem,
                                                                            AttentionTensors& tensors) {
    require_16bit(problem, "on_device");
    const DeviceLayout layout = layout_rule(problem);
    std::vector<BufferImage> images = poisoned_images(layout);
    scatter(problem, layout, Operand::q, tensors.Q, images);
    scatter(problem, layout, Operand::k, tensors.K, images);
    scatter(problem, layout, Operand::v, tensors.V, images);
    DeviceImages device(problem, layout, false, std::move(images));
    kernels::ForwardArgs args;
    args.q = device.tensor(Operand::q), args.k = device.tensor(Operand::k), args.v = device.tensor(Operand::v);
    args.o = device.tensor(Operand::o), args.lse = device.tensor(Operand::lse);
    args.cu_seqlens_q = device.offsets_q(), args.cu_seqlens_k = device.offsets_k();
    kernel(problem, args);
    device.download();
    gather(problem, layout, Operand::o, device.images, tensors.O);
    gather(problem, layout, Operand::lse, device.images, tensors.LSE);
    device.require_padding_untouched();
  };
}

BackwardImplementation on_device_backward(DeviceBackwardKernel kernel, LayoutRule layout_rule) {
  return [kernel = std::move(kernel), layout_rule = std::move(layout_rule)](const Problem& problem,
                                                                            AttentionTensors& tensors) {
    require_16bit(problem, "on_device_backward");
    const DeviceLayout layout = layout_rule(problem);
    std::vector<BufferImage> images = poisoned_images(layout);
    const std::pair<Operand, const HostTensor*> inputs[] = {{Operand::q, &tensors.Q},   {Operand::k, &tensors.K},
                                                           {Operand::v, &tensors.V},   {Operand::o, &tensors.O},
                                                           {Operand::lse, &tensors.LSE}, {Operand::d_o, &tensors.dO}};
    for (const auto& [operand, tensor] : inputs) scatter(problem, layout, operand, *tensor, images);
    DeviceImages device(problem, layout, true, std::move(images));
    kernels::BackwardArgs args;
    args.q = device.tensor(Operand::q), args.k = device.tensor(Operand::k), args.v = device.tensor(Operand::v);
    args.o = device.tensor(Operand::o), args.lse = device.tensor(Operand::lse), args.d_o = device.tensor(Operand::d_o);
    args.dq = device.tensor(Operand::dq), args.dk = device.tensor(Operand::dk), args.dv = device.tensor(Operand::dv);
    args.cu_seqlens_q = device.offsets_q(), args.cu_seqlens_k = device.offsets_k();
    kernel(problem, args);
    device.download();
    gather(problem, layout, Operand::dq, device.images, tensors.dQ);
    gather(problem, layout, Operand::dk, device.images, tensors.dK);
    gather(problem, layout, Operand::dv, device.images, tensors.dV);
    device.require_padding_untouched();
  };
}

}  // namespace flashlab::reference
