// nlohmann::json to Python objects (dict, list, str, int, float, bool, None), so that a binding
// hands Python the same records the C++ printers write (sim/report.hpp, sim/sweep.hpp) without a
// second copy of their field lists.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace flashlab::python {

inline nanobind::object to_python(const nlohmann::json& value) {
  namespace nb = nanobind;
  switch (value.type()) {
    case nlohmann::json::value_t::null: return nb::none();
    case nlohmann::json::value_t::boolean: return nb::bool_(value.get<bool>());
    case nlohmann::json::value_t::number_integer: return nb::int_(value.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return nb::int_(value.get<std::uint64_t>());
    case nlohmann::json::value_t::number_float: return nb::float_(value.get<double>());
    case nlohmann::json::value_t::string: return nb::str(value.get_ref<const std::string&>().c_str());
    case nlohmann::json::value_t::array: {
      nb::list list;
      for (const nlohmann::json& item : value) list.append(to_python(item));
      return list;
    }
    case nlohmann::json::value_t::object: {
      nb::dict dict;
      for (const auto& [key, item] : value.items()) dict[key.c_str()] = to_python(item);
      return dict;
    }
    default: return nb::none();  // binary and discarded values: never written by the printers
  }
}

}  // namespace flashlab::python
