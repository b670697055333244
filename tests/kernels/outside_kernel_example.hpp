// An outside developer's attention kernel with the host API's signature (see
// docs/reference_tests.md): naive, one thread per (query row, head). planted_off_by_one = 1 lets
// every query see one key past the causal diagonal: the bug the reference tests must catch.
#pragma once

#include "algorithms/problem.hpp"
#include "kernels/attention_api.hpp"

namespace flashlab::example {

void naive_attention(const Problem& problem, const kernels::ForwardArgs& args, int planted_off_by_one);

}  // namespace flashlab::example
