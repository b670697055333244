// The layout of a KV cache as a decoding schedule reads it (08_split_kv_decode.hpp): contiguous,
// or paged (fixed-size pages of tokens and a block table of page ids), and what a kernel reads of
// the pages a key block touches.
#pragma once

#include <stdexcept>
#include <string>

namespace flashlab {

enum class PageReads { valid_rows, whole_pages };
inline const char* to_string(PageReads reads) { return reads == PageReads::whole_pages ? "whole_pages" : "valid_rows"; }
inline PageReads page_reads_from_string(const std::string& name) {
  if (name == "valid_rows") return PageReads::valid_rows;
  if (name == "whole_pages") return PageReads::whole_pages;
  throw std::invalid_argument("page reads '" + name + "' are unknown; allowed: valid_rows, whole_pages");
}

// The KV cache's layout: contiguous (page_size 0) or paged.
struct PagedKvCache {
  static constexpr int kMaxPageSize = 1 << 16;
  int page_size = 0;  // tokens per page; 0: contiguous K and V, no block table
  PageReads reads = PageReads::valid_rows;

  bool paged() const { return page_size > 0; }
  void validate() const {
    if (page_size < 0 || page_size > kMaxPageSize) {
      throw std::invalid_argument("page_size = " + std::to_string(page_size) + "; allowed: 1.." +
                                  std::to_string(kMaxPageSize) + " tokens (0: contiguous KV cache)");
    }
  }
  int pages(int seqlen_k) const { return (seqlen_k + page_size - 1) / page_size; }
  bool operator==(const PagedKvCache&) const = default;
};

}  // namespace flashlab
