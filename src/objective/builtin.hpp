// The five objectives built into the table (objective_spec.cpp), one file each.
#pragma once

#include <memory>

#include "objective/objective_spec.hpp"

namespace wd::objective {

std::unique_ptr<ObjectiveSpec> make_velocity();
std::unique_ptr<ObjectiveSpec> make_guided();
std::unique_ptr<ObjectiveSpec> make_flow();
std::unique_ptr<ObjectiveSpec> make_trajectory();
std::unique_ptr<ObjectiveSpec> make_dmd();

}  // namespace wd::objective
