#ifndef RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_
#define RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_

// A small valid GEM-lite JobSpec (two tables, an id-list, a history
// sequence with block attention, PMA, DCN + MoE, CTR and CVR heads).

#include "recfleet/v1/job.pb.h"

namespace recfleet::coordinator {

// `workers` CPU workers (gpus_per_worker 0).
::recfleet::v1::JobSpec ValidSpec(int workers = 2);

}  // namespace recfleet::coordinator

#endif  // RECFLEET_SERVICES_COORDINATOR_TEST_SPECS_H_
