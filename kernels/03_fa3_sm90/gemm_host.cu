// Host side of the rung's GEMM: checks, the two tensor maps, the launch.
#include <cstdint>
#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/03_fa3_sm90/gemm.hpp"
#include "kernels/03_fa3_sm90/gemm_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/constants.hpp"
#include "kernels/common/tma_host.hpp"

namespace flashlab::kernels {

void sm90_gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, cudaStream_t stream) {
  constexpr const char* kName = "sm90_gemm_bf16";
  auto refuse = [&](const std::string& message) { throw std::invalid_argument(std::string(kName) + ": " + message); };
  if (m < 1 || n < 1 || k < 1) refuse("m, n, k = " + std::to_string(m) + ", " + std::to_string(n) + ", " + std::to_string(k) + "; allowed: >= 1");
  if (n % 8 != 0 || k % 8 != 0) {
    refuse("n = " + std::to_string(n) + ", k = " + std::to_string(k) + "; allowed: multiples of 8 (rows of 16-byte multiples)");
  }
  for (const void* pointer : {a, b, static_cast<const void*>(c)}) {
    if (pointer == nullptr || reinterpret_cast<std::uintptr_t>(pointer) % 16 != 0) {
      refuse("a, b or c is null or not 16-byte aligned; allowed: non-null, 16-byte aligned pointers");
    }
  }
  // Row-major, contiguous: A [m, k], B [n, k] read, C [m, n] written, so C must not meet A or B.
  auto matrix = [](const char* name, const void* data, int rows, int columns, bool output) {
    DeviceTensor tensor;
    tensor.data = const_cast<void*>(data);
    tensor.row_stride = columns;
    return TensorArgument{name, tensor, 1, rows, 1, columns, kElementBytes, output};
  };
  const TensorArgument matrices[] = {matrix("a", a, m, k, false), matrix("b", b, n, k, false), matrix("c", c, m, n, true)};
  require_tensor_arguments(matrices, std::size(matrices), kName);
  using Tile = GemmTile;
  const long long tiles = static_cast<long long>((m + Tile::kBlockM - 1) / Tile::kBlockM) * ((n + Tile::kBlockN - 1) / Tile::kBlockN);
  require_grid(kName, {tiles, "output tiles"}, {1, "unused"}, {1, "unused"});
#ifdef FLASHLAB_HAVE_SM90A
  require_compute_capability_exactly(9, 0, kName);  // the device last: a refused argument makes no CUDA call
  GemmParams params{};
  TmaTensor tensor_a{a, k, m, 1, 1, k, 0, 0}, tensor_b{b, k, n, 1, 1, k, 0, 0};
  params.a_map = make_tma_map(tensor_a, DType::bf16, Tile::kBlockK, Tile::kBlockM, "sm90_gemm_bf16: a");
  params.b_map = make_tma_map(tensor_b, DType::bf16, Tile::kBlockK, Tile::kBlockN, "sm90_gemm_bf16: b");
  params.c = static_cast<__nv_bfloat16*>(c);
  params.m = m, params.n = n, params.k = k, params.c_row_stride = n;
  auto* kernel = &gemm_bf16_kernel<Tile>;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSharedBytes),
             "sm90_gemm_bf16: cudaFuncSetAttribute(shared memory)");
  kernel<<<static_cast<unsigned>(tiles), Tile::kThreads, Tile::kSharedBytes, stream>>>(params);
  check_cuda(cudaGetLastError(), "sm90_gemm_bf16 kernel launch");
#else
  (void)stream;
  refuse("this build has no sm_90a code; allowed: a build whose CMAKE_CUDA_ARCHITECTURES include 90a");
#endif
}

}  // namespace flashlab::kernels
