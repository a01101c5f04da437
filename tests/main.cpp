#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <map>
#include <string>

#include "helper_process.hpp"

namespace {

std::map<std::string, cohort_test::Helper>& helpers() {
  static std::map<std::string, cohort_test::Helper> registered;
  return registered;
}

}  // namespace

bool cohort_test::register_helper(const std::string& name, Helper helper) {
  return helpers().emplace(name, helper).second;
}

int main(int argc, char* argv[]) {
  if (argc == 4 && std::string(argv[1]) == "--helper") {
    const auto found = helpers().find(argv[2]);
    if (found == helpers().end()) {
      std::fprintf(stderr, "no helper process named %s\n", argv[2]);
      return 2;
    }
    return found->second(argv[3]);
  }
  return Catch::Session().run(argc, argv);
}
