// The cluster configuration parsers on any text: TF_CONFIG, SageMaker's host list, the environments of
// mpirun, Slurm and torchrun, the deadline variables, and endpoints. Each input must give a valid
// configuration or InvalidArgument; any other exception or a crash is a finding.
#include <map>
#include <string>

#include "cohort/cluster/cluster.hpp"
#include "cohort/cluster/discovery.hpp"
#include "cohort/cluster/spec.hpp"
#include "cohort/core/error.hpp"
#include "fuzz_util.hpp"

using namespace cohort;

namespace {

// "NAME=value" lines.
cluster::Environment environment_of(std::string_view text) {
  std::map<std::string, std::string> variables;
  for (std::size_t start = 0; start <= text.size();) {
    const std::size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    if (const std::size_t equals = line.find('='); equals != std::string_view::npos)
      variables[std::string(line.substr(0, equals))] = std::string(line.substr(equals + 1));
    start = end + 1;
  }
  return [variables](const std::string& name) -> std::optional<std::string> {
    const auto it = variables.find(name);
    return it == variables.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::write_seeds({
      fuzz::mode(0, R"({"cluster": {"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2223"], "ps": ["127.0.0.1:2224"]},)"
                    R"( "task": {"type": "worker", "index": 0}})"),
      fuzz::mode(1, "[\"algo-1\",\"algo-2\"]\nalgo-2\nCOHORT_ROLE=ps\nCOHORT_PS_PORT=3000"),
      fuzz::mode(2, "RANK=1\nWORLD_SIZE=4\nMASTER_ADDR=127.0.0.1\nMASTER_PORT=29500\nCOHORT_NUM_PS=1"),
      fuzz::mode(2, "OMPI_COMM_WORLD_RANK=0\nOMPI_COMM_WORLD_SIZE=2\nMASTER_ADDR=10.0.0.1\nMASTER_PORT=1\nCOHORT_HOST=10.0.0.2"),
      fuzz::mode(2, "SLURM_PROCID=3\nSLURM_NTASKS=4\nMASTER_ADDR=node1\nMASTER_PORT=29500"),
      fuzz::mode(3, "COHORT_PEER_TIMEOUT=1.5s\nCOHORT_HEARTBEAT_INTERVAL=250ms\nCOHORT_CONNECT_TIMEOUT=2m\nCOHORT_TIMEOUT=90"),
      fuzz::mode(4, "[::1]:8080"),
      fuzz::mode(4, "worker-0.example:2222"),
  });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string_view text = fuzz::rest(data, size);
  try {
    switch (data[0] % 5) {
      case 0:
        cluster::parse_tf_config(std::string(text)).validate();
        break;
      case 1: {  // hosts JSON, a newline, the current host, a newline, then variables
        const std::size_t first = std::min(text.find('\n'), text.size());
        const std::string_view after = text.substr(std::min(first + 1, text.size()));
        const std::size_t second = std::min(after.find('\n'), after.size());
        cluster::parse_sagemaker(std::string(text.substr(0, first)), std::string(after.substr(0, second)),
                                 environment_of(after.substr(std::min(second + 1, after.size()))))
            .validate();
        break;
      }
      case 2:
        cluster::discover(environment_of(text));
        break;
      case 3:
        cluster::with_environment_settings({}, environment_of(text));
        break;
      case 4:
        cluster::parse_endpoint(std::string(text), "fuzzed endpoint");
        break;
    }
  } catch (const InvalidArgument&) {
  }
  return 0;
}
