// The GPU side of the reference-test library: turns a kernel with the host API's signature
// (kernels/attention_api.hpp) into a ForwardImplementation that attention_check.hpp can check.
// Our kernels and an outside developer's kernel plug in the same way.
//
// Per run: Q, K, V uploaded in the problem's dtype in the flash-attention layout [rows, heads,
// dim]; O and LSE on the device poisoned (every byte 0xFF: NaN in fp16, bf16 and fp32) before
// the kernel runs, so an element it never writes comes back as NaN; varlen offsets uploaded;
// the kernel's launch and execution errors are checked; O and LSE downloaded.
#pragma once

#include <functional>

#include "kernels/attention_api.hpp"
#include "reference/attention_check.hpp"

namespace flashlab::reference {

using DeviceForwardKernel = std::function<void(const Problem&, const kernels::ForwardArgs&)>;

ForwardImplementation on_device(DeviceForwardKernel kernel);

// Whether a CUDA device is usable here (tests skip when not).
bool cuda_device_available();

}  // namespace flashlab::reference
