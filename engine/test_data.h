#ifndef RECFLEET_ENGINE_TEST_DATA_H_
#define RECFLEET_ENGINE_TEST_DATA_H_

// Tests that read the real datasets find them here: $RECFLEET_DATA_DIR when
// set (pass it with --test_env), else the `shared/data` folder beside the
// source tree's parent, located through the real path of `anchor`, a source
// file listed in the test's `data`. Returns "" when neither exists, so the
// caller can GTEST_SKIP.

#include <string>

namespace recfleet::engine {

std::string SharedDataDir(const std::string& anchor);

}  // namespace recfleet::engine

#endif  // RECFLEET_ENGINE_TEST_DATA_H_
