// docs/reference_tests.md's example: an outside kernel developer checks their own kernel
// (outside_kernel_example.cu) with the reference-test library. The correct kernel passes every
// case it supports and is refused, by name, on the others (sliding windows); the copy with the
// planted causal off-by-one fails, and the report says where.
#include <cstdio>

#include "catch.hpp"
#include "outside_kernel_example.hpp"
#include "reference/device_attention.hpp"

using namespace flashlab;
using example::naive_attention;

namespace {

bool has_window(const Problem& p) { return p.mask.window_left >= 0 || p.mask.window_right >= 0; }

}  // namespace

TEST_CASE("reference example: a small correct outside kernel passes the default grid", "[reference_example]") {
  const auto kernel = reference::on_device([](const Problem& p, const kernels::ForwardArgs& a) { naive_attention(p, a, 0); });
  const auto result = reference::check_forward_grid(kernel, reference::default_forward_grid(DType::bf16));
  INFO(result.summary());
  for (const auto& c : result.cases) {
    INFO(c.report);
    CHECK(c.status == (has_window(c.problem) ? reference::CaseResult::Status::refused
                                             : reference::CaseResult::Status::passed));
  }
}

TEST_CASE("reference example: an off-by-one in the causal mask fails with a readable report", "[reference_example]") {
  const auto kernel = reference::on_device([](const Problem& p, const kernels::ForwardArgs& a) { naive_attention(p, a, 1); });
  const auto result = reference::check_forward_grid(kernel, reference::default_forward_grid(DType::bf16));
  std::printf("%s\n", result.summary().c_str());  // the report the docs show
  for (const auto& c : result.cases) {
    INFO(c.report);
    if (has_window(c.problem)) {
      CHECK(c.status == reference::CaseResult::Status::refused);
      continue;
    }
    // Where the extra key exists, the causal cases must fail; non-causal cases are unaffected.
    const bool extra_key_exists = c.problem.mask.causal && c.problem.seqlen_k > 1;
    if (extra_key_exists && !c.problem.varlen()) CHECK(c.status == reference::CaseResult::Status::failed);
    if (!c.problem.mask.causal) CHECK(c.status == reference::CaseResult::Status::passed);
  }
  CHECK(result.failed > 0);
}
