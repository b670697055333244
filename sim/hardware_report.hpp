// Printers of the three-level model and its time model (hierarchy.hpp, time_model.hpp): JSON
// (`flashlab hardware --json`, docs/schemas/hardware.schema.json; flashlab.sim.hardware) and a
// text table.
#pragma once

#include <optional>
#include <ostream>

#include <nlohmann/json.hpp>

#include "sim/hierarchy.hpp"
#include "sim/time_model.hpp"

namespace flashlab::sim {

nlohmann::json to_json(const L2Counters& counters);
nlohmann::json to_json(const TimePrediction& time);
// The run: kernel, occupancy, traffic (two-level and through the L2) and the work summary; with a
// time prediction when given. The per-block steps are summarised (min, max), not listed.
nlohmann::json hierarchy_to_json(const HierarchyResult& run, const std::optional<TimePrediction>& time);
void print_hierarchy(std::ostream& out, const HierarchyResult& run, const std::optional<TimePrediction>& time);

}  // namespace flashlab::sim
