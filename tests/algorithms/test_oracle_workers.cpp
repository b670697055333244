// The oracle spread over threads (OracleOptions::workers): each (sequence, KV head) unit adds its
// query heads into dK and dV in the serial order, so any worker count gives the serial result bit
// for bit; a count below 1 is refused by name; oracle_bytes counts each worker's score matrices.
#include <cstring>
#include <stdexcept>
#include <string>

#include "algorithms/00_oracle.hpp"
#include "catch.hpp"
#include "reference/reference_check.hpp"

using namespace flashlab;

namespace {

Problem grouped_problem(bool varlen) {
  Problem p;
  p.dtype = DType::bf16, p.batch = 3, p.heads_q = 6, p.heads_kv = 2, p.head_dim = 24;
  p.seqlen_q = 37, p.seqlen_k = 29;
  p.mask.causal = true;
  p.softcap = 20.0f;
  p.dropout.probability = 0.25f, p.dropout.seed = 11;
  if (varlen) p.cu_seqlens_q = {0, 5, 6, 40}, p.cu_seqlens_k = {0, 29, 31, 60};
  return p;
}

void require_same(const OracleTensor& a, const OracleTensor& b) {
  REQUIRE(a.values.size() == b.values.size());
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    INFO("element " << i);
    // Bit for bit: -inf (a fully masked row's LSE) equals itself, and no value may differ.
    REQUIRE(std::memcmp(&a.values[i], &b.values[i], sizeof(double)) == 0);
  }
}

}  // namespace

TEST_CASE("oracle: any worker count gives the serial result bit for bit", "[oracle]") {
  for (const bool varlen : {false, true}) {
    const Problem problem = grouped_problem(varlen);
    const auto seed = reference::fresh_seed();
    INFO("varlen " << varlen << ", seed " << seed);
    const AttentionTensors x = reference::random_inputs(problem, seed, true);
    const OracleResult serial = oracle_attention(problem, x, &x.dO, OracleOptions{.keep_probabilities = true});
    for (const int workers : {2, 3, 6, 64}) {
      INFO("workers " << workers);
      const OracleResult spread =
          oracle_attention(problem, x, &x.dO, OracleOptions{.keep_probabilities = true, .workers = workers});
      require_same(serial.O, spread.O), require_same(serial.LSE, spread.LSE);
      require_same(serial.dQ, spread.dQ), require_same(serial.dK, spread.dK), require_same(serial.dV, spread.dV);
      REQUIRE(serial.P.size() == static_cast<std::size_t>(problem.batch * problem.heads_q));
      CHECK(serial.P == spread.P);
    }
  }
}

TEST_CASE("oracle: a worker count below 1 is refused by name", "[oracle]") {
  const Problem problem = grouped_problem(false);
  const AttentionTensors x = reference::random_inputs(problem, 5, false);
  for (const int workers : {0, -3}) {
    try {
      (void)oracle_attention(problem, x, nullptr, OracleOptions{.workers = workers});
      FAIL("workers = " << workers << " was accepted");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find("workers = " + std::to_string(workers)) != std::string::npos);
      CHECK(std::string(e.what()).find("at least 1") != std::string::npos);
    }
  }
}

TEST_CASE("oracle_bytes: each worker holds one head's score matrices, at most one per unit", "[oracle]") {
  Problem p;
  p.batch = 2, p.heads_q = 4, p.heads_kv = 1, p.head_dim = 16, p.seqlen_q = 64, p.seqlen_k = 32;  // two units
  const std::int64_t scores = 64 * 32 * 8;  // one score-sized matrix of doubles
  const std::int64_t one = oracle_bytes(p, true), two = oracle_bytes(p, true, OracleOptions{.workers = 2});
  CHECK(two - one == 10 * scores);  // the gradients' ten score-sized matrices, once more
  CHECK(oracle_bytes(p, true, OracleOptions{.workers = 9}) == two);
  CHECK(oracle_bytes(p, false, OracleOptions{.workers = 2}) - oracle_bytes(p, false) == 6 * scores);
}
