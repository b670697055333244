// Device layouts for the reference tests: where each tensor of a kernel call lives in device
// memory. The host API promises arbitrary strides per tensor (kernels/attention_api.hpp); a layout
// says, for one problem, which buffer each tensor is in, at what offset and with which strides,
// so the same check runs on the flash layout, on views into one packed QKV buffer, on PyTorch's
// head-major [batch, heads, seqlen, dim], or on rows padded with unused elements.
//
// Everything here is plain host code (no CUDA): a buffer is built on the host as an image of its
// bytes, every byte 0xFF first (NaN in fp16, bf16 and fp32), then the inputs are written into
// their elements. Elements no tensor addresses keep the poison, so a kernel that reads them
// computes NaN and one that writes them is caught by untouched_padding(). device_attention.hpp
// copies the images to and from the device.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"

namespace flashlab::reference {

// The tensors of a kernel call: the forward's five, then the backward's.
enum class Operand { q, k, v, o, lse, d_o, dq, dk, dv };
constexpr int kOperandCount = 9;
const char* to_string(Operand operand);
bool is_output(Operand operand, bool backward);  // o, lse (forward); dq, dk, dv (backward)

// One tensor's place: element (b, position, head, col) is element
//   offset + b * batch_stride + position * row_stride + head * head_stride + col
// of buffer `buffer`, the addressing of kernels::DeviceTensor (batch_stride 0 for varlen).
struct Placement {
  int buffer = -1;  // index into DeviceLayout::buffers; -1 when the layout does not place it
  std::int64_t offset = 0;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

struct LayoutBuffer {
  std::int64_t elements = 0;
  int element_bytes = 2;  // 2: the problem's dtype; 4: fp32 (LSE)
};

struct DeviceLayout {
  std::string name;  // for reports: "head-major", "packed qkv", ...
  std::vector<LayoutBuffer> buffers;
  std::array<Placement, kOperandCount> placements;
  Placement& operator[](Operand operand) { return placements[static_cast<int>(operand)]; }
  const Placement& operator[](Operand operand) const {
    return placements[static_cast<int>(operand)];
  }
};

// A layout for each problem (a packed buffer's strides depend on the heads, head-major strides
// on the sequence length). A rule that cannot lay out a problem throws std::logic_error.
using LayoutRule = std::function<DeviceLayout(const Problem&)>;

// How one tensor is laid out in its own buffer.
enum class TensorLayoutKind {
  flash,       // [rows, heads, dim], dense (kernels::flash_layout)
  head_major,  // [batch, heads, seqlen, dim] (varlen: [heads, packed rows, dim]), dense
  padded,      // [rows, heads, dim] with poisoned gaps of 8 elements (16 bytes) after each head's
               // columns, each row, each batch and before the first element: strides that stay
               // multiples of 8 elements and 16-byte aligned views, as TMA and cp.async need
  padded_odd,  // the same with gaps of 3, 5 and 7 elements and the first element at offset 1:
               // strides that are no multiple of 8 and views only 2-byte aligned (FA1 takes them;
               // FA2 and FA3 refuse them)
  heads_overlapping,  // [rows, heads, dim] with head_stride = dim / 2: each head's columns run into
                      // the next head's, so an output's elements would share memory (refused)
};
const char* to_string(TensorLayoutKind kind);

// Every tensor laid out the same way, each in its own buffer. The LSE (one column) gets the same
// kind; padded LSE has gaps of 1, 3 and 5 floats.
LayoutRule uniform_layout(TensorLayoutKind kind);
// One layout per operand (in Operand order), each tensor in its own buffer.
LayoutRule per_operand_layout(const std::string& name,
                              const std::array<TensorLayoutKind, kOperandCount>& kinds);
// `base`, with one operand laid out as `kind` instead.
LayoutRule with_operand_layout(LayoutRule base, Operand operand, TensorLayoutKind kind);
// Q, K and V as views into one buffer [rows, heads_q + 2 heads_kv, dim] (row stride (heads_q + 2
// heads_kv) dim, as a fused QKV projection writes them), and dQ, dK, dV likewise in one dQKV
// buffer; O, LSE and dO in the flash layout. Needs the same rows on both sides (seqlen_q ==
// seqlen_k, or equal varlen offsets).
LayoutRule packed_qkv_layout();

// A buffer image: the bytes of one device buffer.
using BufferImage = std::vector<std::uint8_t>;
// Every buffer of the layout, every byte 0xFF.
std::vector<BufferImage> poisoned_images(const DeviceLayout& layout);
// Writes a host tensor's values (already rounded to its dtype) into its place: encoded as 16-bit
// fp16 / bf16, or as fp32 for the LSE. Throws std::logic_error if the operand has no place.
void scatter(const Problem& problem, const DeviceLayout& layout, Operand operand,
             const HostTensor& tensor, std::vector<BufferImage>& images);
// Reads a tensor's values from its place (decoded to float; a NaN stays NaN).
void gather(const Problem& problem, const DeviceLayout& layout, Operand operand,
            const std::vector<BufferImage>& images, HostTensor& tensor);

// Elements of the buffers that no operand of the call addresses and whose bytes are no longer all
// 0xFF: a kernel wrote where it must not. `backward` says which operands the call has.
struct PaddingReport {
  long long overwritten = 0;
  std::string first;  // "buffer 2 (o), element 4711" for the first one found
};
PaddingReport untouched_padding(const Problem& problem, const DeviceLayout& layout, bool backward,
                                const std::vector<BufferImage>& images);

// The 16-bit encoding of a value already rounded to fp16 or bf16 (exact), and back.
std::uint16_t encode_16bit(DType dtype, float value);
float decode_16bit(DType dtype, std::uint16_t bits);

}  // namespace flashlab::reference
