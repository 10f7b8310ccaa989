#ifndef RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_
#define RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_

// A small valid GEM-lite JobSpec (two tables, an id-list, a history
// sequence with block attention, PMA, DCN + MoE, CTR and CVR heads).

#include "recfleet/v1/job.pb.h"

namespace recfleet::coordinator {

// `workers` CPU workers (gpus_per_worker 0). Structurally valid (what the
// planner plans); GEM-lite does not build all of it (two table widths,
// low-rank DCN, top-2 routing), so CreateJob refuses it.
::recfleet::v1::JobSpec ValidSpec(int workers = 2);

// ValidSpec narrowed to what GEM-lite builds: one embedding width 32,
// full-rank DCN, every expert gated, two-layer experts, a one-step BBS
// window. CreateJob accepts it.
::recfleet::v1::JobSpec BuildableSpec(int workers = 2);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_
