// A test that needs a second process runs this binary again as `cohort_tests --helper NAME ARGUMENT`
// (exec rather than a bare fork: the test binary has threads). main() runs the helper instead of Catch.
#pragma once

#include <string>

namespace cohort_test {

using Helper = int (*)(const std::string& argument);

// At namespace scope in the test file: `const bool registered = cohort_test::register_helper("name", fn);`
bool register_helper(const std::string& name, Helper helper);

}  // namespace cohort_test
