// Problem::validate at the edges a caller of the kernels' host API or C ABI reaches: the softmax
// scale every consumer holds in float, and varlen offsets (their order, their lengths against
// seqlen_q / seqlen_k, values that overflow a subtraction).
#include <climits>
#include <limits>
#include <stdexcept>
#include <string>

#include "algorithms/problem.hpp"
#include "catch.hpp"

using namespace flashlab;
using flashlab::testing::contains_text;

namespace {

Problem small_varlen() {
  Problem p;
  p.heads_q = p.heads_kv = 2, p.head_dim = 64;
  set_varlen(p, {5, 7, 3}, {9, 4, 9});  // seqlen_q = 7, seqlen_k = 9
  return p;
}

void require_refused(const Problem& p, const std::string& input) {
  INFO("expecting a refusal naming " << input);
  CHECK_THROWS_AS(p.validate(), std::invalid_argument);
  CHECK_THROWS_WITH(p.validate(), contains_text(input) && contains_text("allowed"));
}

}  // namespace

TEST_CASE("Problem::validate: softmax_scale must be a positive float (0 = 1/sqrt(head_dim))", "[problem]") {
  Problem p;
  for (double scale : {0.0, 0.125, 1e-30, 1e30}) {
    p.softmax_scale = scale;
    INFO("softmax_scale " << scale);
    CHECK_NOTHROW(p.validate());
  }
  // Finite as a double, infinite as a float: every consumer (the schedules, the kernels' base-2
  // scale) would compute with inf.
  for (double scale : {1e300, 1e39, static_cast<double>(std::numeric_limits<float>::max()) * 2}) {
    p.softmax_scale = scale;
    require_refused(p, "softmax_scale");
  }
  for (double scale : {-0.5, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
    p.softmax_scale = scale;
    require_refused(p, "softmax_scale");
  }
}

TEST_CASE("Problem::validate: varlen sequences no longer than seqlen_q / seqlen_k", "[problem]") {
  Problem p = small_varlen();
  REQUIRE_NOTHROW(p.validate());
  p.seqlen_q = 100, p.seqlen_k = 100;  // an upper bound (flash-attention's max_seqlen) is fine
  CHECK_NOTHROW(p.validate());

  // The kernels size their grids from seqlen_q / seqlen_k: a longer sequence would keep rows
  // uncomputed.
  p = small_varlen(), p.seqlen_q = 6;
  require_refused(p, "cu_seqlens_q: sequence 1 has length 7");
  p = small_varlen(), p.seqlen_k = 8;
  require_refused(p, "cu_seqlens_k: sequence 0 has length 9");
}

TEST_CASE("Problem::validate: varlen offsets that would overflow a subtraction are refused", "[problem]") {
  Problem p = small_varlen();
  p.cu_seqlens_q = {0, 5, INT_MIN, 15};  // INT_MIN - 5 overflows int
  require_refused(p, "cu_seqlens_q");
  p = small_varlen();
  p.cu_seqlens_k = {0, 9, 13, INT_MAX};
  require_refused(p, "cu_seqlens_k: sequence 2 has length 2147483634");
  p = small_varlen();
  p.cu_seqlens_k = {0, 9, 13, 5};  // decreasing
  require_refused(p, "cu_seqlens_k: sequence 2 has length -8");
}
