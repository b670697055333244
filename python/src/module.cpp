// flashlab._core: the C++ core of the Python package flashlab (python/flashlab/).
#include <nanobind/nanobind.h>

#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "FlashLab's C++ core: the problem description, the IO simulator and the schedules";
  m.attr("__version__") = FLASHLAB_VERSION;
  flashlab::python::bind_problem(m);
  flashlab::python::bind_sim(m);
  flashlab::python::bind_schedules(m);
  flashlab::python::bind_testing(m);
}
