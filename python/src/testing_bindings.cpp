// flashlab._core.testing: the reference-test library (tests/reference/) itself, for
// implementations written in Python. The inputs, the oracle, the naive same-precision baseline,
// the rule (2x for outputs, 3x for gradients, rounding_slack) and the reports are the C++ code's;
// the bindings only move arrays across. flashlab/testing.py puts torch tensors on top.
//
// An implementation is a Python callable on numpy float32 arrays [rows, heads, dim] (values
// already rounded to the problem's dtype):
//   forward:  implementation(problem, q, k, v) -> (o, lse)   lse [rows, heads, 1], or None when
//             the check runs with check_lse=False
//   backward: implementation(problem, q, k, v, o, lse, d_o) -> (dq, dk, dv)
// A ValueError it raises is a refusal (the library's std::invalid_argument); an output of the
// wrong shape or type fails the case; any other exception propagates.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "algorithms/problem.hpp"
#include "algorithms/tensors.hpp"
#include "bindings.hpp"
#include "reference/attention_check.hpp"
#include "reference/backward_check.hpp"
#include "reference/reference_check.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace flashlab::python {

namespace {

using reference::CaseResult;
using FloatArray = nb::ndarray<nb::numpy, float>;

FloatArray to_numpy(const HostTensor& tensor) {
  auto* values = new std::vector<float>(tensor.values);
  nb::capsule owner(values, [](void* pointer) noexcept { delete static_cast<std::vector<float>*>(pointer); });
  return FloatArray(values->data(),
                    {static_cast<std::size_t>(tensor.rows), static_cast<std::size_t>(tensor.heads),
                     static_cast<std::size_t>(tensor.dim)},
                    owner);
}

// An implementation's output into `tensor`: float32, [rows, heads, dim] exactly, or the case fails.
void from_numpy(nb::handle value, HostTensor& tensor, const char* name) {
  nb::ndarray<const float, nb::c_contig, nb::device::cpu> array;
  if (!nb::try_cast(value, array, false)) {
    throw reference::ImplementationFailure(std::string(name) + " is " + nb::str(value.type()).c_str() +
                                           "; expected a C-contiguous float32 numpy array");
  }
  const bool same = array.ndim() == 3 && array.shape(0) == static_cast<std::size_t>(tensor.rows) &&
                    array.shape(1) == static_cast<std::size_t>(tensor.heads) &&
                    array.shape(2) == static_cast<std::size_t>(tensor.dim);
  if (!same) {
    std::string shape = "(";
    for (std::size_t i = 0; i < array.ndim(); ++i) shape += (i ? ", " : "") + std::to_string(array.shape(i));
    throw reference::ImplementationFailure(std::string(name) + " has shape " + shape + "); expected (" +
                                           std::to_string(tensor.rows) + ", " + std::to_string(tensor.heads) + ", " +
                                           std::to_string(tensor.dim) + ")");
  }
  tensor.values.assign(array.data(), array.data() + array.size());
}

// Calls a Python implementation: a ValueError is a refusal, with its message.
template <class Call>
nb::object call_implementation(Call&& call) {
  try {
    return call();
  } catch (nb::python_error& error) {
    if (error.matches(PyExc_ValueError)) throw std::invalid_argument(nb::str(error.value()).c_str());
    throw;
  }
}

nb::tuple as_tuple(const nb::object& result, std::size_t size, const char* what) {
  if (!nb::isinstance<nb::tuple>(result) || nb::len(result) != size) {
    throw reference::ImplementationFailure(std::string("the implementation returned ") +
                                           nb::str(result.type()).c_str() + "; expected a tuple " + what);
  }
  return nb::borrow<nb::tuple>(result);
}

reference::ForwardImplementation forward_implementation(nb::callable implementation, bool check_lse) {
  return [implementation = std::move(implementation), check_lse](const Problem& problem, AttentionTensors& t) {
    const nb::object result = call_implementation(
        [&] { return implementation(problem, to_numpy(t.Q), to_numpy(t.K), to_numpy(t.V)); });
    const nb::tuple outputs = as_tuple(result, 2, "(o, lse)");
    from_numpy(outputs[0], t.O, "o");
    if (outputs[1].is_none()) {
      if (check_lse) {
        throw reference::ImplementationFailure("the implementation gave no LSE; allowed: an LSE, or the check run "
                                               "with check_lse=False (O alone)");
      }
    } else {
      from_numpy(outputs[1], t.LSE, "lse");
    }
  };
}

reference::BackwardImplementation backward_implementation(nb::callable implementation) {
  return [implementation = std::move(implementation)](const Problem& problem, AttentionTensors& t) {
    const nb::object result = call_implementation([&] {
      return implementation(problem, to_numpy(t.Q), to_numpy(t.K), to_numpy(t.V), to_numpy(t.O), to_numpy(t.LSE),
                            to_numpy(t.dO));
    });
    const nb::tuple gradients = as_tuple(result, 3, "(dq, dk, dv)");
    from_numpy(gradients[0], t.dQ, "dq");
    from_numpy(gradients[1], t.dK, "dk");
    from_numpy(gradients[2], t.dV, "dv");
  };
}

const char* status_name(CaseResult::Status status) {
  switch (status) {
    case CaseResult::Status::passed: return "passed";
    case CaseResult::Status::failed: return "failed";
    case CaseResult::Status::refused: return "refused";
  }
  return "unknown";
}

// GridResult::summary over cases of either kind: one report per case that did not pass, then the counts.
template <class Result>
std::string grid_summary(const std::vector<Result>& results) {
  reference::GridResult grid;
  for (const Result& result : results) {
    CaseResult entry;
    entry.status = result.status;
    entry.report = result.report;
    grid.passed += result.status == CaseResult::Status::passed;
    grid.failed += result.status == CaseResult::Status::failed;
    grid.refused += result.status == CaseResult::Status::refused;
    grid.cases.push_back(std::move(entry));
  }
  return grid.summary();
}

}  // namespace

void bind_testing(nb::module_& m) {
  nb::module_ t = m.def_submodule("testing", "The reference-test library (tests/reference/): the oracle, the "
                                             "same-precision rule and its reports");

  nb::class_<CaseResult>(t, "ForwardCase", "One forward case checked: status, errors, the report")
      .def_prop_ro("status", [](const CaseResult& c) { return status_name(c.status); })
      .def_ro("problem", &CaseResult::problem)
      .def_ro("seed", &CaseResult::seed)
      .def_ro("o_error", &CaseResult::o_error)
      .def_ro("o_naive_error", &CaseResult::o_naive_error)
      .def_ro("lse_error", &CaseResult::lse_error)
      .def_ro("lse_naive_error", &CaseResult::lse_naive_error)
      .def_ro("fully_masked_rows", &CaseResult::fully_masked_rows)
      .def_ro("report", &CaseResult::report)
      .def("__repr__", [](const CaseResult& c) { return c.report; });

  nb::class_<reference::BackwardCaseResult>(t, "BackwardCase", "One backward case checked: status, errors, the report")
      .def_prop_ro("status", [](const reference::BackwardCaseResult& c) { return status_name(c.status); })
      .def_ro("problem", &reference::BackwardCaseResult::problem)
      .def_ro("seed", &reference::BackwardCaseResult::seed)
      .def_prop_ro("errors",  // dQ, dK, dV
                   [](const reference::BackwardCaseResult& c) {
                     return std::vector<double>{c.errors[0].max_error, c.errors[1].max_error, c.errors[2].max_error};
                   })
      .def_prop_ro("naive_errors",
                   [](const reference::BackwardCaseResult& c) {
                     return std::vector<double>(c.naive_errors.begin(), c.naive_errors.end());
                   })
      .def_ro("report", &reference::BackwardCaseResult::report)
      .def("__repr__", [](const reference::BackwardCaseResult& c) { return c.report; });

  t.def(
      "check_forward_case",
      [](nb::callable implementation, const Problem& problem, double output_factor, double output_slack,
         double lse_factor, double lse_slack, bool check_determinism, double key_growth, double input_scale,
         bool check_lse) {
        reference::ForwardCheckOptions options;
        options.output = {output_factor, output_slack};
        options.lse = {lse_factor, lse_slack};
        options.check_determinism = check_determinism;
        options.key_growth = key_growth;
        options.input_scale = input_scale;
        options.check_lse = check_lse;
        return reference::check_forward_case(forward_implementation(std::move(implementation), check_lse), problem,
                                             options);
      },
      "implementation"_a, "problem"_a, "output_factor"_a = 2.0, "output_slack"_a = 1e-5, "lse_factor"_a = 2.0,
      "lse_slack"_a = 1e-5, "check_determinism"_a = true, "key_growth"_a = 0.0, "input_scale"_a = 1.0,
      "check_lse"_a = true,
      "Fresh inputs, the implementation run (twice for determinism), O and LSE held to factor x the naive "
      "same-precision error + slack (O's slack at least rounding_slack), fully masked rows exactly O = 0, LSE = -inf.");

  t.def(
      "check_backward_case",
      [](nb::callable implementation, const Problem& problem, double factor, double slack, double input_scale) {
        reference::BackwardCheckOptions options;
        options.gradients = {factor, slack};
        options.input_scale = input_scale;
        return reference::check_backward_case(backward_implementation(std::move(implementation)), problem, options);
      },
      "implementation"_a, "problem"_a, "factor"_a = 3.0, "slack"_a = 1e-4, "input_scale"_a = 1.0,
      "Fresh Q, K, V, dO (O and LSE from the oracle), dQ, dK, dV held to factor x the naive same-precision "
      "backward's error + slack.");

  t.def("forward_summary", &grid_summary<CaseResult>, "cases"_a,
        "The report of every case that did not pass, then the counts (GridResult::summary).");
  t.def("backward_summary", &grid_summary<reference::BackwardCaseResult>, "cases"_a);

  t.def(
      "default_forward_grid",
      [](const std::string& dtype, const std::vector<int>& head_dims) {
        return reference::default_forward_grid(dtype_from_string(dtype), head_dims);
      },
      "dtype"_a = "bf16", "head_dims"_a = std::vector<int>{40, 59, 64, 96, 111, 128, 256},
      "The official odd shapes x {no mask, causal bottom-right, causal top-left}, MHA/GQA/MQA, sliding windows, "
      "varlen batches (40 cases).");
  t.def("official_odd_shapes", &reference::official_odd_shapes);
  t.def("describe", &reference::describe, "problem"_a);

  // The problem as the checks see it, in plain values (the scale resolved, lengths per sequence).
  t.def("problem_fields", [](const Problem& p) {
    nb::dict fields;
    fields["dtype"] = to_string(p.dtype);
    fields["batch"] = p.batch, fields["heads_q"] = p.heads_q, fields["heads_kv"] = p.heads_kv;
    fields["seqlen_q"] = p.seqlen_q, fields["seqlen_k"] = p.seqlen_k, fields["head_dim"] = p.head_dim;
    fields["softmax_scale"] = p.scale();
    fields["causal"] = p.mask.causal;
    fields["bottom_right"] = p.mask.alignment == CausalAlignment::bottom_right;
    fields["window_left"] = p.mask.window_left, fields["window_right"] = p.mask.window_right;
    fields["varlen"] = p.varlen();
    fields["cu_seqlens_q"] = p.cu_seqlens_q, fields["cu_seqlens_k"] = p.cu_seqlens_k;
    std::vector<std::pair<int, int>> lengths;
    for (int b = 0; b < p.batch; ++b) lengths.emplace_back(p.seqlen_q_of(b), p.seqlen_k_of(b));
    fields["sequence_lengths"] = lengths;
    fields["total_rows_q"] = p.total_rows_q(), fields["total_rows_k"] = p.total_rows_k();
    return fields;
  });
  // Which keys each query of sequence `batch_index` sees (HeadProblem::key_visible, the mask rule
  // of the schedules and kernels), as a bool array [seqlen_q_of(b), seqlen_k_of(b)].
  t.def(
      "visible_keys",
      [](const Problem& p, int batch_index) {
        if (batch_index < 0 || batch_index >= p.batch) {
          throw nb::value_error(("batch_index = " + std::to_string(batch_index) + "; allowed: [0, " +
                                 std::to_string(p.batch - 1) + "]")
                                    .c_str());
        }
        const HeadProblem head = head_problem(p, batch_index, 0);
        auto* bytes = new std::vector<std::uint8_t>(static_cast<std::size_t>(head.seqlen_q) * head.seqlen_k);
        for (int i = 0; i < head.seqlen_q; ++i)
          for (int j = 0; j < head.seqlen_k; ++j)
            (*bytes)[static_cast<std::size_t>(i) * head.seqlen_k + j] = head.key_visible(i, j) ? 1 : 0;
        nb::capsule owner(bytes, [](void* pointer) noexcept { delete static_cast<std::vector<std::uint8_t>*>(pointer); });
        return nb::ndarray<nb::numpy, bool>(reinterpret_cast<bool*>(bytes->data()),
                                            {static_cast<std::size_t>(head.seqlen_q),
                                             static_cast<std::size_t>(head.seqlen_k)},
                                            owner);
      },
      "problem"_a, "batch_index"_a);

  // The rule's pieces, for checks on hand-made numbers.
  t.def(
      "within_rule",
      [](double max_error, double naive_error, double factor, double slack, long long nan_count) {
        reference::ErrorReport error;
        error.max_error = max_error;
        error.nan_count = nan_count;
        return reference::within_rule(error, naive_error, {factor, slack});
      },
      "max_error"_a, "naive_error"_a, "factor"_a, "slack"_a, "nan_count"_a = 0,
      "max_error <= factor * naive_error + slack, and no NaN.");
  t.def(
      "rounding_slack",
      [](const std::string& dtype, const std::vector<double>& reference_values) {
        OracleTensor reference(static_cast<int>(reference_values.size()), 1, 1);
        reference.values = reference_values;
        return reference::rounding_slack(dtype_from_string(dtype), reference);
      },
      "dtype"_a, "reference"_a,
      "Twice the largest |fl(fl(ref + 0.3) - 0.3) - fl(ref)| in the dtype over the reference's finite values.");
  t.def(
      "compare",
      [](nb::ndarray<const float, nb::c_contig, nb::device::cpu, nb::ndim<3>> got,
         nb::ndarray<const double, nb::c_contig, nb::device::cpu, nb::ndim<3>> expected) {
        HostTensor got_tensor(TensorId::O, DType::fp32, static_cast<int>(got.shape(0)), static_cast<int>(got.shape(1)),
                              static_cast<int>(got.shape(2)));
        got_tensor.values.assign(got.data(), got.data() + got.size());
        OracleTensor expected_tensor(static_cast<int>(expected.shape(0)), static_cast<int>(expected.shape(1)),
                                     static_cast<int>(expected.shape(2)));
        expected_tensor.values.assign(expected.data(), expected.data() + expected.size());
        const reference::ErrorReport error = reference::compare(got_tensor, expected_tensor);
        nb::dict report;
        report["max_error"] = error.max_error, report["row"] = error.row, report["head"] = error.head;
        report["col"] = error.col, report["got"] = error.got, report["expected"] = error.expected;
        report["nan_count"] = error.nan_count;
        return report;
      },
      "got"_a, "expected"_a,
      "The largest |got - expected| (float32 vs float64 [rows, heads, dim]) and where; NaN is an infinite error, "
      "-inf matches -inf.");
}

}  // namespace flashlab::python
