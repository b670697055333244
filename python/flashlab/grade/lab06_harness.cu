// The harness of lab 06 (lab06_gpu_kernel.py): compiled together with the student's attention.cu,
// which it includes, into a shared library that the grader's worker loads with ctypes.
//
// One call runs the student's attention_forward once, as the reference-test library's on_device
// does (tests/reference/device_attention.cpp): Q, K, V uploaded in the flash layout, O and LSE
// poisoned (every byte 0xFF: NaN in fp16, bf16 and fp32) so that an element never written comes
// back NaN, the launch and the execution checked, O and LSE downloaded. Every tensor lies between
// two guard zones: the inputs' are filled with `guard_byte` (0xFF, NaN, or another value, so the
// grader can tell whether the kernel reads past the end of K or V), the outputs' with poison,
// which must still be there afterwards (nothing written outside O and LSE).
#include "attention.cu"

#include <cstdio>
#include <cstring>
#include <utility>

namespace {

constexpr std::size_t kGuardBytes = std::size_t(1) << 20;  // each side of every tensor
constexpr unsigned char kPoison = 0xFF;

enum Status { kOk = 0, kRefused = 1, kCudaError = 2, kWroteOutside = 3 };

struct Message {
  char* text;
  int size;
  int set(const char* what, int status) {
    if (size > 0) std::snprintf(text, static_cast<std::size_t>(size), "%s", what);
    return status;
  }
};

// A device buffer of `bytes` between two guard zones of `guard` bytes each.
class GuardedBuffer {
 public:
  GuardedBuffer(std::size_t bytes, unsigned char guard) : bytes_(bytes) {
    status_ = cudaMalloc(&base_, bytes + 2 * kGuardBytes);
    if (status_ == cudaSuccess) status_ = cudaMemset(base_, guard, bytes + 2 * kGuardBytes);
  }
  ~GuardedBuffer() {
    if (base_ != nullptr) cudaFree(base_);
  }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  cudaError_t status() const { return status_; }
  void* data() const { return static_cast<char*>(base_) + kGuardBytes; }
  std::size_t bytes() const { return bytes_; }
  // The number of guard bytes that no longer hold `guard`.
  std::size_t overwritten_guard_bytes(unsigned char guard, cudaError_t* status) const {
    std::size_t changed = 0;
    unsigned char* host = new unsigned char[kGuardBytes];
    for (int side = 0; side < 2; ++side) {
      const char* zone = static_cast<const char*>(base_) + (side == 0 ? 0 : kGuardBytes + bytes_);
      *status = cudaMemcpy(host, zone, kGuardBytes, cudaMemcpyDeviceToHost);
      if (*status != cudaSuccess) break;
      for (std::size_t i = 0; i < kGuardBytes; ++i) changed += host[i] != guard;
    }
    delete[] host;
    return changed;
  }

 private:
  void* base_ = nullptr;
  std::size_t bytes_;
  cudaError_t status_ = cudaSuccess;
};

int cuda_failure(Message& message, const char* what, cudaError_t status) {
  char text[512];
  std::snprintf(text, sizeof text, "%s: %s (%s)", what, cudaGetErrorString(status), cudaGetErrorName(status));
  return message.set(text, kCudaError);
}

}  // namespace

extern "C" {

// The number of CUDA devices this process sees (0 with no device or no driver; the message says why).
__attribute__((visibility("default"))) int lab06_device_count(char* message_text, int message_size) {
  Message message{message_text, message_size};
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cuda_failure(message, "cudaGetDeviceCount", status);
    return 0;
  }
  message.set("", kOk);
  return count;
}

// One forward pass of the student's kernel. q, k, v: host arrays of 16-bit elements in the flash
// layout; o (16-bit) and lse (fp32) receive the downloaded outputs. Returns a Status; the message
// says what went wrong.
__attribute__((visibility("default"))) int lab06_forward(int bf16, int batch, int heads_q, int heads_kv, int seqlen_q,
                                                         int seqlen_k, int head_dim, double softmax_scale, int causal,
                                                         int bottom_right, const void* q, const void* k,
                                                         const void* v, void* o, float* lse, int guard_byte,
                                                         char* message_text, int message_size) {
  Message message{message_text, message_size};
  message.set("", kOk);
  const std::size_t element = 2;
  const std::size_t q_bytes = std::size_t(batch) * seqlen_q * heads_q * head_dim * element;
  const std::size_t kv_bytes = std::size_t(batch) * seqlen_k * heads_kv * head_dim * element;
  const std::size_t lse_bytes = std::size_t(batch) * seqlen_q * heads_q * sizeof(float);
  const unsigned char guard = static_cast<unsigned char>(guard_byte);

  GuardedBuffer q_device(q_bytes, guard), k_device(kv_bytes, guard), v_device(kv_bytes, guard);
  GuardedBuffer o_device(q_bytes, kPoison), lse_device(lse_bytes, kPoison);
  for (const GuardedBuffer* buffer : {&q_device, &k_device, &v_device, &o_device, &lse_device}) {
    if (buffer->status() != cudaSuccess) return cuda_failure(message, "allocating the tensors", buffer->status());
  }
  const std::pair<const GuardedBuffer*, const void*> uploads[] = {{&q_device, q}, {&k_device, k}, {&v_device, v}};
  for (const auto& [buffer, host] : uploads) {
    const cudaError_t status = cudaMemcpy(buffer->data(), host, buffer->bytes(), cudaMemcpyHostToDevice);
    if (status != cudaSuccess) return cuda_failure(message, "uploading Q, K, V", status);
  }

  ForwardArgs args{};
  args.problem.bf16 = bf16 != 0;
  args.problem.batch = batch, args.problem.heads_q = heads_q, args.problem.heads_kv = heads_kv;
  args.problem.seqlen_q = seqlen_q, args.problem.seqlen_k = seqlen_k, args.problem.head_dim = head_dim;
  args.problem.softmax_scale = static_cast<float>(softmax_scale);
  args.problem.causal = causal != 0, args.problem.bottom_right = bottom_right != 0;
  args.q = q_device.data(), args.k = k_device.data(), args.v = v_device.data();
  args.o = o_device.data(), args.lse = static_cast<float*>(lse_device.data());

  const char* refusal = nullptr;
  try {
    refusal = attention_forward(args, nullptr);
  } catch (...) {
    return message.set("attention_forward threw a C++ exception", kCudaError);
  }
  if (refusal != nullptr) return message.set(refusal, kRefused);
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) return cuda_failure(message, "the kernel's launch", status);
  status = cudaDeviceSynchronize();
  if (status != cudaSuccess) return cuda_failure(message, "the kernel's execution", status);

  status = cudaMemcpy(o, o_device.data(), q_bytes, cudaMemcpyDeviceToHost);
  if (status == cudaSuccess) status = cudaMemcpy(lse, lse_device.data(), lse_bytes, cudaMemcpyDeviceToHost);
  if (status != cudaSuccess) return cuda_failure(message, "downloading O and LSE", status);
  const std::size_t outside_o = o_device.overwritten_guard_bytes(kPoison, &status);
  const std::size_t outside_lse = status == cudaSuccess ? lse_device.overwritten_guard_bytes(kPoison, &status) : 0;
  if (status != cudaSuccess) return cuda_failure(message, "reading the guard zones", status);
  if (outside_o + outside_lse > 0) {
    char text[256];
    std::snprintf(text, sizeof text, "the kernel wrote outside its outputs: %zu bytes before or after O, %zu bytes "
                  "before or after LSE", outside_o, outside_lse);
    return message.set(text, kWroteOutside);
  }
  return kOk;
}

}  // extern "C"
