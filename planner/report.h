#ifndef RECFLEET_PLANNER_REPORT_H_
#define RECFLEET_PLANNER_REPORT_H_

// Renders a Plan for people and programs: readable tables for a terminal,
// JSON with every field, and a self-contained one-page HTML report with SVG
// charts (per-GPU memory bars, traffic and exposed time per link level).
// Pure functions of the plan; thread-safe.

#include <string>

#include "planner/plan.h"

namespace recfleet::planner {

struct TextOptions {
  // Tables and ranks listed one per row up to this many; beyond it the
  // report lists the largest and says how many it left out.
  int max_rows = 40;
};

std::string FormatText(const Plan& plan, const TextOptions& options = {});
std::string FormatJson(const Plan& plan);
std::string FormatHtml(const Plan& plan);

}  // namespace recfleet::planner

#endif  // RECFLEET_PLANNER_REPORT_H_
