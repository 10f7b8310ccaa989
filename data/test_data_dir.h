#ifndef RECFLEET_DATA_TEST_DATA_DIR_H_
#define RECFLEET_DATA_TEST_DATA_DIR_H_

// Where tests find the optional real datasets (ml-100k, amazon-beauty):
// $RECFLEET_DATA_DIR if set, else shared/data beside the checkout
// (found through the test's runfiles, which link back into the source
// tree). Empty if neither exists; tests then GTEST_SKIP.

#include <string>

namespace recfleet::data {

std::string RealDataDir();

}  // namespace recfleet::data

#endif  // RECFLEET_DATA_TEST_DATA_DIR_H_
