// The decode rung, host side: checks what the kernel can do (every refusal before any launch),
// picks the split of the keys into chunks for the device, lays out the workspace and dispatches
// to the instance for the padded head dim and the dtype (decode_instances/).
#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "kernels/04_decode_sm80/decode_kernel.cuh"
#include "kernels/attention_api.hpp"
#include "kernels/common/dispatch.hpp"

namespace flashlab::kernels {

namespace {

constexpr const char* kName = "decode_attention";
constexpr int kMaxSplits = 256;

[[noreturn]] void refuse(const std::string& message) { throw std::invalid_argument(std::string(kName) + ": " + message); }

int padded_head_dim(const Problem& problem) { return decode::decode_padded_head_dim(problem.head_dim); }
int row_tiles(const Problem& problem) {
  const int rows = problem.heads_q / problem.heads_kv * problem.seqlen_q;
  return (rows + decode::DecodeTiling<64>::kBlockRows - 1) / decode::DecodeTiling<64>::kBlockRows;
}
// (sequence, KV head, row tile) units: one finished-chunk counter each, at the workspace's start
// in a region padded to 256 bytes.
std::int64_t units(const Problem& problem) {
  return static_cast<std::int64_t>(problem.batch) * problem.heads_kv * row_tiles(problem);
}
std::size_t counter_bytes(const Problem& problem) { return (units(problem) * sizeof(int) + 255) / 256 * 256; }

// The host copies: lengths within the cache, page ids within the pages.
void check_host_copies(const Problem& problem, const DecodeArgs& args) {
  const bool paged = args.block_table != nullptr;
  if (paged && (args.host_block_table == nullptr) != (args.host_cache_seqlens == nullptr)) {
    refuse("host_block_table and host_cache_seqlens: one is given; allowed: both (checked) or neither (unchecked)");
  }
  if (args.host_cache_seqlens == nullptr) return;
  for (int b = 0; b < problem.batch; ++b) {
    const int length = args.host_cache_seqlens[b];
    if (length < 0 || static_cast<std::int64_t>(length) + args.seqlen_new > problem.seqlen_k) {
      refuse("cache_seqlens[" + std::to_string(b) + "] = " + std::to_string(length) + " with seqlen_new = " +
             std::to_string(args.seqlen_new) + "; allowed: 0..seqlen_k - seqlen_new = " +
             std::to_string(problem.seqlen_k - args.seqlen_new) + " (the cache holds " + std::to_string(problem.seqlen_k) +
             " keys per sequence)");
    }
    if (!paged || args.host_block_table == nullptr) continue;
    const int pages_used = (length + args.seqlen_new + args.page_size - 1) / args.page_size;
    for (int page = 0; page < pages_used; ++page) {
      const int id = args.host_block_table[static_cast<std::int64_t>(b) * args.max_pages_per_sequence + page];
      if (id < 0 || id >= args.num_pages) {
        refuse("block_table[" + std::to_string(b) + "][" + std::to_string(page) + "] = " + std::to_string(id) +
               "; allowed: a page id in 0.." + std::to_string(args.num_pages - 1));
      }
    }
  }
}

// What the split and the workspace depend on, and needs no device: the problem, the cache's
// shape and the host copies of its lengths and block table.
void check_problem_and_cache(const Problem& problem, const DecodeArgs& args) {
  require_kernel_supported(problem, kName);
  if (problem.varlen()) refuse("cu_seqlens_q / cu_seqlens_k are given; allowed: none (the keys per sequence are cache_seqlens)");
  if (problem.seqlen_q > decode::kMaxQueryTokens) {
    refuse("seqlen_q = " + std::to_string(problem.seqlen_q) + " query tokens; allowed: 1.." +
           std::to_string(decode::kMaxQueryTokens) + " (longer queries are a prefill: fa2_forward, fa3_forward)");
  }
  if (problem.head_dim % kChunkElements != 0 || padded_head_dim(problem) == 0) {
    refuse("head_dim = " + std::to_string(problem.head_dim) + "; allowed: multiples of " + std::to_string(kChunkElements) +
           " up to 256");
  }
  if (problem.mask.window_left >= 0 || problem.mask.window_right >= 0) {
    refuse("window_left = " + std::to_string(problem.mask.window_left) + ", window_right = " +
           std::to_string(problem.mask.window_right) + "; allowed: -1 (no window)");
  }
  if (problem.mask.causal && problem.mask.alignment != CausalAlignment::bottom_right) {
    refuse("causal alignment top_left; allowed: bottom_right (the query tokens are the sequence's last)");
  }
  const bool paged = args.block_table != nullptr;
  if (paged) {
    if (!decode::decode_page_size_allowed(args.page_size)) {
      refuse("page_size = " + std::to_string(args.page_size) +
             "; allowed: 16, 32, 64, 128, 192 or 256 (a multiple of 16 that divides the 64-key block or that it divides)");
    }
    if (args.num_pages < 1) refuse("num_pages = " + std::to_string(args.num_pages) + "; allowed: >= 1");
    if (args.max_pages_per_sequence < 1) {
      refuse("max_pages_per_sequence = " + std::to_string(args.max_pages_per_sequence) + "; allowed: >= 1");
    }
    if (static_cast<std::int64_t>(args.max_pages_per_sequence) * args.page_size != problem.seqlen_k) {
      refuse("seqlen_k = " + std::to_string(problem.seqlen_k) + " with " + std::to_string(args.max_pages_per_sequence) +
             " pages of " + std::to_string(args.page_size) + " per sequence; allowed: seqlen_k = max_pages_per_sequence * page_size");
    }
  } else if (args.page_size != 0 || args.num_pages != 0 || args.max_pages_per_sequence != 0) {
    refuse("page_size, num_pages or max_pages_per_sequence given without a block_table; allowed: all 0 for a contiguous cache");
  }
  if (args.cache_seqlens == nullptr) refuse("cache_seqlens is null; allowed: a device array of batch ints");
  if (args.seqlen_new < 0 || args.seqlen_new > problem.seqlen_k) {
    refuse("seqlen_new = " + std::to_string(args.seqlen_new) + "; allowed: 0..seqlen_k = " + std::to_string(problem.seqlen_k));
  }
  if (args.num_splits < 0 || args.num_splits > kMaxSplits) {
    refuse("num_splits = " + std::to_string(args.num_splits) + "; allowed: 0 (chosen for the device) or 1.." +
           std::to_string(kMaxSplits));
  }
  check_host_copies(problem, args);
}

// The tensors: 16-byte chunks for Q, O, K, V (cp.async); LSE 4 bytes; outputs in memory of their own.
void check_tensors(const Problem& problem, const DecodeArgs& args) {
  const bool paged = args.block_table != nullptr;
  const std::int64_t cache_batches = paged ? args.num_pages : problem.batch;
  const std::int64_t cache_rows = paged ? args.page_size : problem.seqlen_k;
  const bool appending = args.seqlen_new > 0;
  struct Tensor {
    const char* name;
    const DeviceTensor& tensor;
    std::int64_t batches, rows, heads, columns;
    int element_bytes;
    bool output;
  };
  std::vector<Tensor> tensors = {
      {"q", args.q, problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim, kElementBytes, false},
      {"o", args.o, problem.batch, problem.seqlen_q, problem.heads_q, problem.head_dim, kElementBytes, true},
      {"lse", args.lse, problem.batch, problem.seqlen_q, problem.heads_q, 1, 4, true},
      {"k_cache", args.k_cache, cache_batches, cache_rows, problem.heads_kv, problem.head_dim, kElementBytes, appending},
      {"v_cache", args.v_cache, cache_batches, cache_rows, problem.heads_kv, problem.head_dim, kElementBytes, appending}};
  if (appending) {
    tensors.push_back({"k_new", args.k_new, problem.batch, args.seqlen_new, problem.heads_kv, problem.head_dim, kElementBytes, false});
    tensors.push_back({"v_new", args.v_new, problem.batch, args.seqlen_new, problem.heads_kv, problem.head_dim, kElementBytes, false});
  }
  std::vector<TensorArgument> arguments;
  for (const Tensor& t : tensors) {
    if (t.element_bytes == 4) {
      require_tensor(t.tensor, t.name, kName, 4, 1);
    } else {
      require_tensor(t.tensor, t.name, kName, 16, kChunkElements);
    }
    arguments.push_back({t.name, t.tensor, t.batches, t.rows, t.heads, t.columns, t.element_bytes, t.output});
  }
  require_tensor_arguments(arguments.data(), arguments.size(), kName);
}

struct Split {
  int splits, chunk_blocks;
};

// The split of each sequence's keys into chunks of whole 64-key blocks, chunks equal in bytes and
// sized by the longest sequence. No split where the (sequence, KV head, row tile) units already
// fill 80 % of the device's resident blocks; otherwise the fewest chunks whose blocks use at least
// 95 % of the last wave as well as the best count does (use: the fraction of the last wave's
// resident slots that hold a block). More chunks than that add partial results and their combine
// for little: with 512 units on 264 slots, one chunk uses 97 % and 33 would use 100 %.
Split choose_split(const Problem& problem, const DecodeArgs& args, int blocks_per_sm, int multiprocessors) {
  constexpr int kBlockN = decode::DecodeTiling<64>::kBlockN;
  int longest = problem.seqlen_k;
  if (args.host_cache_seqlens != nullptr) {
    longest = args.seqlen_new + *std::max_element(args.host_cache_seqlens, args.host_cache_seqlens + problem.batch);
  }
  const int key_blocks = std::max(1, (longest + kBlockN - 1) / kBlockN);
  if (args.num_splits > 0) {
    const int chunk = (key_blocks + args.num_splits - 1) / args.num_splits;
    return {(key_blocks + chunk - 1) / chunk, chunk};
  }
  const std::int64_t slots = static_cast<std::int64_t>(std::max(1, blocks_per_sm)) * multiprocessors;
  if (units(problem) * 5 >= slots * 4) return {1, key_blocks};
  auto use = [&](int splits) {
    const std::int64_t blocks = units(problem) * splits, waves = (blocks + slots - 1) / slots;
    return static_cast<double>(blocks) / static_cast<double>(waves * slots);
  };
  std::vector<Split> candidates;  // by increasing splits
  for (int chunk = key_blocks; chunk >= 1; --chunk) {
    const int splits = (key_blocks + chunk - 1) / chunk;
    if (splits > kMaxSplits) break;
    if (!candidates.empty() && candidates.back().splits == splits) {
      candidates.back().chunk_blocks = chunk;  // the shortest chunk for this count: the most even split
    } else {
      candidates.push_back({splits, chunk});
    }
  }
  double best_use = 0;
  for (const Split& candidate : candidates) best_use = std::max(best_use, use(candidate.splits));
  for (const Split& candidate : candidates) {
    if (use(candidate.splits) >= 0.95 * best_use) return candidate;
  }
  return candidates.back();
}

template <typename Visit>
void dispatch(const Problem& problem, Visit&& visit) {
  const bool launched = dispatch_head_dim<decode::kDecodeHeadDims>(padded_head_dim(problem), [&]<int kHeadDim>() {
    if (problem.dtype == DType::bf16) {
      visit.template operator()<__nv_bfloat16, kHeadDim>();
    } else {
      visit.template operator()<__half, kHeadDim>();
    }
  });
  if (!launched) throw std::logic_error(std::string(kName) + ": no instance for head_dim " + std::to_string(problem.head_dim));
}

// The checks (the tensors' too for a launch, not for the workspace's size), then the device: the
// split for it.
Split plan(const Problem& problem, const DecodeArgs& args, bool launching) {
  check_problem_and_cache(problem, args);
  if (launching) check_tensors(problem, args);
  require_grid(kName, {std::max(1, args.num_splits), "num_splits"},
               {static_cast<std::int64_t>(problem.heads_kv) * row_tiles(problem), "heads_kv x row tiles of 16 query rows"},
               {problem.batch, "batch"});
  require_compute_capability(8, 0, kName);  // the device last: a refused argument makes no CUDA call
  const int multiprocessors = current_device_sm_count();
  int blocks_per_sm = 0;
  dispatch(problem, [&]<typename T, int kHeadDim>() { blocks_per_sm = decode::decode_blocks_per_sm<T, kHeadDim>(); });
  if (blocks_per_sm < 1) {
    refuse("head_dim = " + std::to_string(problem.head_dim) + " needs " +
           std::to_string(decode::DecodeTiling<256>::kSharedBytes) + " bytes of shared memory per block, more than this device allows");
  }
  return choose_split(problem, args, blocks_per_sm, multiprocessors);
}

std::size_t workspace_bytes_for(const Problem& problem, const Split& split) {
  if (split.splits == 1) return 0;
  const std::size_t parts = static_cast<std::size_t>(units(problem)) * split.splits * decode::DecodeTiling<64>::kBlockRows;
  return counter_bytes(problem) + parts * sizeof(float) * (1 + padded_head_dim(problem));
}

void run(const Problem& problem, const DecodeArgs& args, bool stream_only) {
  const Split split = plan(problem, args, true);
  const std::size_t needed = workspace_bytes_for(problem, split);
  if (args.workspace != nullptr && args.workspace_bytes < needed) {
    refuse("workspace_bytes = " + std::to_string(args.workspace_bytes) + "; allowed: at least decode_workspace_bytes() = " +
           std::to_string(needed));
  }
  decode::DecodeParams p{};
  p.q = args.q, p.o = args.o, p.lse = args.lse, p.k_cache = args.k_cache, p.v_cache = args.v_cache;
  p.block_table = args.block_table, p.block_table_stride = args.max_pages_per_sequence, p.page_size = args.page_size;
  p.page_shift = std::has_single_bit(static_cast<unsigned>(args.page_size)) ? std::countr_zero(static_cast<unsigned>(args.page_size)) : -1;
  p.cache_seqlens = args.cache_seqlens, p.seqlen_new = args.seqlen_new, p.k_new = args.k_new, p.v_new = args.v_new;
  p.batch = problem.batch, p.heads_q = problem.heads_q, p.heads_kv = problem.heads_kv;
  p.group = problem.heads_q / problem.heads_kv, p.seqlen_q = problem.seqlen_q, p.head_dim = problem.head_dim;
  p.rows = p.group * p.seqlen_q, p.row_tiles = row_tiles(problem);
  p.scale_log2 = static_cast<float>(problem.scale() * kLog2e);
  p.causal = problem.mask.causal ? 1 : 0;
  p.splits = split.splits, p.chunk_blocks = split.chunk_blocks;

  void* workspace = args.workspace;
  const bool own_workspace = workspace == nullptr && needed > 0;
  if (own_workspace) {
    check_cuda(cudaMallocAsync(&workspace, needed, args.stream), "decode workspace cudaMallocAsync");
    check_cuda(cudaMemsetAsync(workspace, 0, counter_bytes(problem), args.stream), "decode workspace memset");
  }
  if (needed > 0) {
    auto* bytes = static_cast<unsigned char*>(workspace);
    const std::size_t parts = (needed - counter_bytes(problem)) / sizeof(float) / (1 + padded_head_dim(problem));
    p.finished = reinterpret_cast<int*>(bytes);
    p.partial_lse = reinterpret_cast<float*>(bytes + counter_bytes(problem));
    p.partial_o = p.partial_lse + parts;
  }
  dispatch(problem, [&]<typename T, int kHeadDim>() { decode::launch_decode<T, kHeadDim>(p, stream_only, args.stream); });
  if (own_workspace) check_cuda(cudaFreeAsync(workspace, args.stream), "decode workspace cudaFreeAsync");
}

}  // namespace

void decode_attention(const Problem& problem, const DecodeArgs& args) { run(problem, args, false); }
void decode_stream_read(const Problem& problem, const DecodeArgs& args) { run(problem, args, true); }
int decode_splits(const Problem& problem, const DecodeArgs& args) { return plan(problem, args, false).splits; }
std::size_t decode_workspace_bytes(const Problem& problem, const DecodeArgs& args) {
  return workspace_bytes_for(problem, plan(problem, args, false));
}

}  // namespace flashlab::kernels
