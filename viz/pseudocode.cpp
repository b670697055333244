#include "pseudocode.hpp"

#include "sim/schedules.hpp"

namespace flashlab::viz {

const Pseudocode* find_pseudocode(std::string_view schedule) {
  for (const sim::ScheduleInfo& info : sim::schedules())
    if (info.name == schedule) return &info.pseudocode();
  return nullptr;
}

}  // namespace flashlab::viz
