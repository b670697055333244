#include "reference/device_layouts.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

namespace flashlab::reference {

const char* to_string(Operand operand) {
  switch (operand) {
    case Operand::q:
      return "q";
    case Operand::k:
      return "k";
    case Operand::v:
      return "v";
    case Operand::o:
      return "o";
    case Operand::lse:
      return "lse";
    case Operand::d_o:
      return "d_o";
    case Operand::dq:
      return "dq";
    case Operand::dk:
      return "dk";
    case Operand::dv:
      return "dv";
  }
  return "?";
}

bool is_output(Operand operand, bool backward) {
  if (backward) return operand == Operand::dq || operand == Operand::dk || operand == Operand::dv;
  return operand == Operand::o || operand == Operand::lse;
}

const char* to_string(TensorLayoutKind kind) {
  switch (kind) {
    case TensorLayoutKind::flash:
      return "flash";
    case TensorLayoutKind::head_major:
      return "head-major";
    case TensorLayoutKind::padded:
      return "padded";
    case TensorLayoutKind::padded_odd:
      return "padded-odd";
    case TensorLayoutKind::heads_overlapping:
      return "heads-overlapping";
  }
  return "?";
}

namespace {

constexpr Operand kAllOperands[] = {Operand::q,  Operand::k,   Operand::v,
                                    Operand::o,  Operand::lse, Operand::d_o,
                                    Operand::dq, Operand::dk,  Operand::dv};

// The extents a kernel call addresses in one operand: varlen problems are one batch of packed rows.
struct Geometry {
  std::int64_t batches, rows, heads, dim;
  int element_bytes;
};

Geometry geometry(const Problem& problem, Operand operand) {
  const bool query_side = operand == Operand::q || operand == Operand::o ||
                          operand == Operand::lse || operand == Operand::d_o ||
                          operand == Operand::dq;
  const bool value_side = operand == Operand::v || operand == Operand::dv ||
                          operand == Operand::o || operand == Operand::d_o;
  Geometry g;
  g.batches = problem.varlen() ? 1 : problem.batch;
  g.rows = problem.varlen() ? (query_side ? problem.total_rows_q() : problem.total_rows_k())
                            : (query_side ? problem.seqlen_q : problem.seqlen_k);
  g.heads = query_side ? problem.heads_q : problem.heads_kv;
  g.dim = operand == Operand::lse ? 1 : (value_side ? problem.value_dim() : problem.head_dim);
  g.element_bytes = operand == Operand::lse ? 4 : 2;
  return g;
}

// One past the highest element a placement addresses.
std::int64_t span(const Placement& placement, const Geometry& g) {
  return placement.offset + (g.batches - 1) * placement.batch_stride +
         (g.rows - 1) * placement.row_stride + (g.heads - 1) * placement.head_stride + g.dim;
}

// Appends a buffer for one operand laid out as `kind`, with poison after its last element (a
// write past the end of the last row lands there).
void place(DeviceLayout& layout, const Problem& problem, Operand operand, TensorLayoutKind kind) {
  const Geometry g = geometry(problem, operand);
  const bool varlen = problem.varlen();
  const bool lse = operand == Operand::lse;
  Placement p;
  switch (kind) {
    case TensorLayoutKind::flash:
      p.head_stride = g.dim, p.row_stride = g.heads * g.dim,
      p.batch_stride = g.rows * g.heads * g.dim;
      break;
    case TensorLayoutKind::head_major:
      p.row_stride = g.dim, p.head_stride = g.rows * g.dim,
      p.batch_stride = g.heads * g.rows * g.dim;
      break;
    case TensorLayoutKind::padded:
    case TensorLayoutKind::padded_odd: {
      // Gaps after a head's columns, after a row, after a batch, and before the first element.
      struct Gaps {
        std::int64_t columns, row, batch, leading;
      };
      const Gaps gaps =
          lse ? (kind == TensorLayoutKind::padded ? Gaps{1, 3, 5, 3} : Gaps{1, 3, 5, 1})
              : (kind == TensorLayoutKind::padded ? Gaps{8, 8, 16, 8} : Gaps{3, 5, 7, 1});
      p.head_stride = g.dim + gaps.columns;
      p.row_stride = g.heads * p.head_stride + gaps.row;
      p.batch_stride = g.rows * p.row_stride + gaps.batch;
      p.offset = gaps.leading;
      break;
    }
    case TensorLayoutKind::heads_overlapping:
      p.head_stride = g.dim / 2, p.row_stride = g.heads * g.dim,
      p.batch_stride = g.rows * g.heads * g.dim;
      break;
  }
  if (varlen) p.batch_stride = 0;
  p.buffer = static_cast<int>(layout.buffers.size());
  layout.buffers.push_back({span(p, g) + p.row_stride + 8, g.element_bytes});
  layout[operand] = p;
}

template <class Visit>
void for_each_element(const Placement& p, const Geometry& g, Visit visit) {
  std::size_t host = 0;  // [rows, heads, dim] order, the host tensor's
  for (std::int64_t b = 0; b < g.batches; ++b)
    for (std::int64_t row = 0; row < g.rows; ++row)
      for (std::int64_t h = 0; h < g.heads; ++h) {
        const std::int64_t first =
            p.offset + b * p.batch_stride + row * p.row_stride + h * p.head_stride;
        for (std::int64_t c = 0; c < g.dim; ++c) visit(host++, first + c);
      }
}

const Placement& placement_of(const DeviceLayout& layout, Operand operand,
                              const std::vector<BufferImage>& images) {
  const Placement& p = layout[operand];
  if (p.buffer < 0 || p.buffer >= static_cast<int>(images.size())) {
    throw std::logic_error("layout " + layout.name + " does not place " + to_string(operand));
  }
  return p;
}

void check_shape(const HostTensor& tensor, const Geometry& g, Operand operand) {
  if (tensor.rows != g.batches * g.rows || tensor.heads != g.heads || tensor.dim != g.dim) {
    throw std::logic_error(std::string("scatter/gather: host tensor for ") + to_string(operand) +
                           " does not have the problem's shape");
  }
}

}  // namespace

LayoutRule per_operand_layout(const std::string& name,
                              const std::array<TensorLayoutKind, kOperandCount>& kinds) {
  return [name, kinds](const Problem& problem) {
    DeviceLayout layout;
    layout.name = name;
    for (int i = 0; i < kOperandCount; ++i) place(layout, problem, kAllOperands[i], kinds[i]);
    return layout;
  };
}

LayoutRule uniform_layout(TensorLayoutKind kind) {
  std::array<TensorLayoutKind, kOperandCount> kinds;
  kinds.fill(kind);
  return per_operand_layout(to_string(kind), kinds);
}

LayoutRule with_operand_layout(LayoutRule base, Operand operand, TensorLayoutKind kind) {
  return [base = std::move(base), operand, kind](const Problem& problem) {
    DeviceLayout layout = base(problem);
    layout.name += std::string(", ") + to_string(operand) + " " + to_string(kind);
    place(layout, problem, operand,
          kind);  // the operand's old buffer stays, unaddressed and poisoned
    return layout;
  };
}

LayoutRule packed_qkv_layout() {
  return [](const Problem& problem) {
    const bool same_rows = problem.varlen() ? problem.cu_seqlens_q == problem.cu_seqlens_k
                                            : problem.seqlen_q == problem.seqlen_k;
    if (!same_rows || problem.value_dim() != problem.head_dim) {
      throw std::logic_error(
          "packed_qkv_layout: needs the same rows for queries and keys and head_dim_v == head_dim");
    }
    DeviceLayout layout = uniform_layout(TensorLayoutKind::flash)(problem);
    layout.name = "packed qkv";
    const Geometry g = geometry(problem, Operand::q);
    const std::int64_t heads = problem.heads_q + 2LL * problem.heads_kv, d = problem.head_dim;
    const Operand groups[2][3] = {{Operand::q, Operand::k, Operand::v},
                                  {Operand::dq, Operand::dk, Operand::dv}};
    for (const auto& group : groups) {
      const int buffer = static_cast<int>(layout.buffers.size());
      const std::int64_t row_stride = heads * d;
      layout.buffers.push_back({g.batches * g.rows * row_stride + row_stride + 8, 2});
      const std::int64_t head_offsets[3] = {0, problem.heads_q * d,
                                            (problem.heads_q + problem.heads_kv) * d};
      for (int i = 0; i < 3; ++i) {
        Placement& p = layout[group[i]];
        p.buffer = buffer, p.offset = head_offsets[i], p.head_stride = d, p.row_stride = row_stride;
        p.batch_stride = problem.varlen() ? 0 : g.rows * row_stride;
      }
    }
    return layout;
  };
}

std::vector<BufferImage> poisoned_images(const DeviceLayout& layout) {
  std::vector<BufferImage> images;
  for (const LayoutBuffer& buffer : layout.buffers) {
    images.emplace_back(static_cast<std::size_t>(buffer.elements) * buffer.element_bytes,
                        std::uint8_t{0xFF});
  }
  return images;
}

std::uint16_t encode_16bit(DType dtype, float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (dtype == DType::bf16)
    return static_cast<std::uint16_t>(bits >> 16);  // bf16 is fp32's top half
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return 0x7e00;
  if (magnitude == 0.0f) return sign;
  if (std::isinf(value) || magnitude >= 65520.0f) return sign | 0x7c00u;
  int exponent = 0;
  const float mantissa =
      std::frexp(magnitude, &exponent);  // magnitude = mantissa * 2^exponent, mantissa in [0.5, 1)
  if (exponent - 1 >= -14) {
    const auto fraction =
        static_cast<std::uint16_t>(std::lround((mantissa * 2.0f - 1.0f) * 1024.0f));
    return sign | static_cast<std::uint16_t>(((exponent - 1 + 15) << 10) + fraction);
  }
  return sign | static_cast<std::uint16_t>(
                    std::lround(magnitude * 16777216.0f));  // subnormal: units of 2^-24
}

float decode_16bit(DType dtype, std::uint16_t bits) {
  if (dtype == DType::bf16) {
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &wide, 4);
    return value;
  }
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1f;
  const int fraction = bits & 0x3ff;
  if (exponent == 0x1f) return fraction ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(fraction), -24);
  return sign * std::ldexp(1.0f + fraction / 1024.0f, exponent - 15);
}

void scatter(const Problem& problem, const DeviceLayout& layout, Operand operand,
             const HostTensor& tensor, std::vector<BufferImage>& images) {
  const Placement& p = placement_of(layout, operand, images);
  const Geometry g = geometry(problem, operand);
  check_shape(tensor, g, operand);
  std::uint8_t* bytes = images[p.buffer].data();
  for_each_element(p, g, [&](std::size_t host, std::int64_t element) {
    if (g.element_bytes == 4) {
      std::memcpy(bytes + element * 4, &tensor.values[host], 4);
    } else {
      const std::uint16_t bits = encode_16bit(problem.dtype, tensor.values[host]);
      std::memcpy(bytes + element * 2, &bits, 2);
    }
  });
}

void gather(const Problem& problem, const DeviceLayout& layout, Operand operand,
            const std::vector<BufferImage>& images, HostTensor& tensor) {
  const Placement& p = placement_of(layout, operand, images);
  const Geometry g = geometry(problem, operand);
  check_shape(tensor, g, operand);
  const std::uint8_t* bytes = images[p.buffer].data();
  for_each_element(p, g, [&](std::size_t host, std::int64_t element) {
    if (g.element_bytes == 4) {
      std::memcpy(&tensor.values[host], bytes + element * 4, 4);
    } else {
      std::uint16_t bits;
      std::memcpy(&bits, bytes + element * 2, 2);
      tensor.values[host] = decode_16bit(problem.dtype, bits);
    }
  });
}

PaddingReport untouched_padding(const Problem& problem, const DeviceLayout& layout, bool backward,
                                const std::vector<BufferImage>& images) {
  std::vector<std::vector<bool>> addressed(images.size());
  std::vector<std::string> owners(images.size());
  for (std::size_t i = 0; i < images.size(); ++i)
    addressed[i].assign(layout.buffers[i].elements, false);
  for (const Operand operand : kAllOperands) {
    if (!backward && static_cast<int>(operand) > static_cast<int>(Operand::lse)) break;
    const Placement& p = layout[operand];
    if (p.buffer < 0) continue;
    owners[p.buffer] += (owners[p.buffer].empty() ? "" : ", ") + std::string(to_string(operand));
    for_each_element(p, geometry(problem, operand), [&](std::size_t, std::int64_t element) {
      addressed[p.buffer][element] = true;
    });
  }
  PaddingReport report;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const int bytes = layout.buffers[i].element_bytes;
    for (std::int64_t element = 0; element < layout.buffers[i].elements; ++element) {
      if (addressed[i][element]) continue;
      const std::uint8_t* first = images[i].data() + element * bytes;
      if (std::all_of(first, first + bytes, [](std::uint8_t byte) { return byte == 0xFF; }))
        continue;
      if (report.overwritten++ == 0) {
        report.first = "buffer " + std::to_string(i) + " (" +
                       (owners[i].empty() ? "unused" : owners[i]) + "), element " +
                       std::to_string(element);
      }
    }
  }
  return report;
}

}  // namespace flashlab::reference
