// The GPU side of the reference-test library: turns a kernel with the host API's signature
// (kernels/attention_api.hpp) into a ForwardImplementation that attention_check.hpp can check.
// Our kernels and an outside developer's kernel plug in the same way.
//
// Per run: Q, K, V uploaded in the problem's dtype in the flash-attention layout [rows, heads,
// dim]; O and LSE on the device poisoned (every byte 0xFF: NaN in fp16, bf16 and fp32) before
// the kernel runs, so an element it never writes comes back as NaN; varlen offsets uploaded;
// the kernel's launch and execution errors are checked; O and LSE downloaded.
//
// Any other layout the host API allows (device_layouts.hpp: head-major, views into one packed
// QKV buffer, rows padded with poison) runs the same way: inputs are written into buffers whose
// other elements are poison (a kernel that reads them computes NaN), the outputs' buffers are
// poison whole, and after the kernel every element outside the call's tensors must still be
// poison, or the case fails (ImplementationFailure) naming the buffer and the element.
#pragma once

#include <functional>

#include "kernels/attention_api.hpp"
#include "reference/attention_check.hpp"
#include "reference/backward_check.hpp"
#include "reference/device_layouts.hpp"

namespace flashlab::reference {

using DeviceForwardKernel = std::function<void(const Problem&, const kernels::ForwardArgs&)>;

// The flash layout [rows, heads, dim] for every tensor.
ForwardImplementation on_device(DeviceForwardKernel kernel);
// The tensors where `layout` puts them.
ForwardImplementation on_device(DeviceForwardKernel kernel, LayoutRule layout);

// A backward kernel (Q, K, V, O, LSE, dO in; dQ, dK, dV out) for backward_check.hpp, the tensors
// where `layout` puts them (dQ, dK and dV poisoned before the kernel runs).
using DeviceBackwardKernel = std::function<void(const Problem&, const kernels::BackwardArgs&)>;
BackwardImplementation on_device_backward(DeviceBackwardKernel kernel,
                                          LayoutRule layout = uniform_layout(TensorLayoutKind::flash));

// Whether a CUDA device is usable here (tests skip when not).
bool cuda_device_available();

}  // namespace flashlab::reference
