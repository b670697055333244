// The reference-test library's device layouts on the CPU (runs in CI, no device needed): every
// kind and the packed QKV layout write each tensor where its strides say and read it back
// unchanged, leave everything else poison, catch a write into the padding, and the 16-bit
// encodings are exact.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "catch.hpp"
#include "reference/device_layouts.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;
using reference::Operand;
using reference::TensorLayoutKind;

namespace {

constexpr Operand kOperands[] = {Operand::q,   Operand::k,  Operand::v,  Operand::o, Operand::lse,
                                 Operand::d_o, Operand::dq, Operand::dk, Operand::dv};

HostTensor& tensor_of(AttentionTensors& t, Operand operand) {
  switch (operand) {
    case Operand::q:
      return t.Q;
    case Operand::k:
      return t.K;
    case Operand::v:
      return t.V;
    case Operand::o:
      return t.O;
    case Operand::lse:
      return t.LSE;
    case Operand::d_o:
      return t.dO;
    case Operand::dq:
      return t.dQ;
    case Operand::dk:
      return t.dK;
    case Operand::dv:
      return t.dV;
  }
  throw std::logic_error("operand");
}

std::vector<Problem> problems() {
  Problem dense;
  dense.dtype = DType::fp16, dense.batch = 2, dense.heads_q = 4, dense.heads_kv = 2;
  dense.seqlen_q = dense.seqlen_k = 37, dense.head_dim = 24;
  Problem varlen = dense;
  varlen.dtype = DType::bf16;
  set_varlen(varlen, {5, 1, 19}, {5, 1, 19});
  return {dense, varlen};
}

// Every operand filled with distinct values (all outputs too), written and read back.
void check_round_trip(const Problem& problem, const reference::LayoutRule& rule) {
  const reference::DeviceLayout layout = rule(problem);
  INFO(reference::describe(problem) << ", layout " << layout.name);
  AttentionTensors tensors = reference::random_inputs(problem, 7, true);
  float next = 1.0f;
  for (const Operand operand :
       kOperands) {  // small integers: exact in bf16 and fp16, a new run per tensor
    for (float& x : tensor_of(tensors, operand).values) x = next = next >= 200 ? 1.0f : next + 1.0f;
  }
  std::vector<reference::BufferImage> images = reference::poisoned_images(layout);
  for (const Operand operand : kOperands)
    reference::scatter(problem, layout, operand, tensor_of(tensors, operand), images);
  for (const Operand operand : kOperands) {
    AttentionTensors back = reference::random_inputs(problem, 8, true);
    reference::gather(problem, layout, operand, images, tensor_of(back, operand));
    INFO(to_string(operand));
    CHECK(tensor_of(back, operand).values == tensor_of(tensors, operand).values);
  }
  CHECK(reference::untouched_padding(problem, layout, true, images).overwritten == 0);
}

}  // namespace

TEST_CASE("device layouts: every kind writes and reads each tensor where its strides say",
          "[device_layouts]") {
  for (const Problem& problem : problems()) {
    for (const TensorLayoutKind kind : {TensorLayoutKind::flash, TensorLayoutKind::head_major,
                                        TensorLayoutKind::padded, TensorLayoutKind::padded_odd}) {
      check_round_trip(problem, reference::uniform_layout(kind));
    }
    check_round_trip(problem, reference::packed_qkv_layout());
    check_round_trip(problem, reference::with_operand_layout(
                                  reference::uniform_layout(TensorLayoutKind::head_major),
                                  Operand::v, TensorLayoutKind::padded_odd));
  }
}

TEST_CASE("device layouts: the strides of each kind", "[device_layouts]") {
  const Problem problem = problems().front();  // batch 2, heads 4/2, seqlen 37, d 24
  const auto flash = reference::uniform_layout(TensorLayoutKind::flash)(problem);
  CHECK(flash[Operand::q].row_stride == 4 * 24);
  CHECK(flash[Operand::q].head_stride == 24);
  CHECK(flash[Operand::q].batch_stride == 37 * 4 * 24);
  CHECK(flash[Operand::k].row_stride == 2 * 24);
  CHECK(flash[Operand::lse].row_stride == 4);
  const auto head_major = reference::uniform_layout(TensorLayoutKind::head_major)(problem);
  CHECK(head_major[Operand::q].row_stride == 24);
  CHECK(head_major[Operand::q].head_stride == 37 * 24);
  CHECK(head_major[Operand::q].batch_stride == 4 * 37 * 24);
  const auto padded = reference::uniform_layout(TensorLayoutKind::padded)(problem);
  CHECK(padded[Operand::q].head_stride == 32);
  CHECK(padded[Operand::q].row_stride == 4 * 32 + 8);
  CHECK(padded[Operand::q].offset == 8);
  for (const Operand operand : kOperands) {
    if (operand == Operand::lse) continue;
    INFO(to_string(operand));
    CHECK(padded[operand].row_stride % 8 == 0);
    CHECK(padded[operand].head_stride % 8 == 0);
    CHECK(padded[operand].batch_stride % 8 == 0);
    CHECK(padded[operand].offset % 8 == 0);
  }
  const auto packed = reference::packed_qkv_layout()(problem);
  CHECK(packed[Operand::q].buffer == packed[Operand::k].buffer);
  CHECK(packed[Operand::k].buffer == packed[Operand::v].buffer);
  CHECK(packed[Operand::dq].buffer == packed[Operand::dv].buffer);
  CHECK(packed[Operand::q].row_stride == (4 + 2 * 2) * 24);
  CHECK(packed[Operand::k].offset == 4 * 24);
  CHECK(packed[Operand::v].offset == (4 + 2) * 24);
  CHECK(packed[Operand::o].buffer != packed[Operand::q].buffer);
  Problem unequal = problem;
  unequal.seqlen_k = 38;
  CHECK_THROWS_AS(reference::packed_qkv_layout()(unequal), std::logic_error);
}

TEST_CASE("device layouts: a write into the padding is found and named", "[device_layouts]") {
  const Problem problem = problems().front();
  const auto layout = reference::uniform_layout(TensorLayoutKind::padded)(problem);
  std::vector<reference::BufferImage> images = reference::poisoned_images(layout);
  CHECK(reference::untouched_padding(problem, layout, false, images).overwritten == 0);
  // The first element after o's first head (in the gap of 8 before its second head).
  const auto& o = layout[Operand::o];
  const std::int64_t gap = o.offset + problem.head_dim;
  std::memset(images[o.buffer].data() + gap * 2, 0, 2);
  const auto report = reference::untouched_padding(problem, layout, false, images);
  CHECK(report.overwritten == 1);
  CHECK(report.first ==
        "buffer " + std::to_string(o.buffer) + " (o), element " + std::to_string(gap));
  // Writing an addressed element is not a padding write.
  std::memset(images[o.buffer].data() + o.offset * 2, 0, 2);
  CHECK(reference::untouched_padding(problem, layout, false, images).overwritten == 1);
}

TEST_CASE("device layouts: the 16-bit encodings are exact for rounded values", "[device_layouts]") {
  for (const DType dtype : {DType::fp16, DType::bf16}) {
    for (const float value :
         {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 6.0e-8f, 3.0e-5f, 0.1f, -1234.5f, 1.0e30f}) {
      const float rounded = round_to(dtype, value);
      if (std::isinf(rounded)) continue;
      INFO(to_string(dtype) << " " << value);
      const float back = reference::decode_16bit(dtype, reference::encode_16bit(dtype, rounded));
      CHECK(back == rounded);
      CHECK(std::signbit(back) == std::signbit(rounded));
    }
    CHECK(std::isnan(reference::decode_16bit(dtype, 0xFFFF)));  // the poison
  }
}
