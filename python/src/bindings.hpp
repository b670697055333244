// The parts of the extension flashlab._core, one per area, each in its own *_bindings.cpp and
// called in this order by module.cpp (later parts use the types the earlier ones bind). The
// bindings stay thin: they convert, check what C++ would not (indices, sizes past int) and call
// the C++ code; the Python modules (python/flashlab/*.py) add the conveniences.
#pragma once

#include <nanobind/nanobind.h>

namespace flashlab::python {

void bind_problem(nanobind::module_& m);    // Problem, HeadProblem, the limits (problem_bindings.cpp)
void bind_sim(nanobind::module_& m);        // the simulator: runs, sweeps, traces, machines, closed forms, bounds (sim_bindings.cpp)
void bind_schedules(nanobind::module_& m);  // schedules written in Python on the tile-memory interface (schedules_bindings.cpp)

}  // namespace flashlab::python
