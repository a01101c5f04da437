// The run report: its content after a run, one process and a parameter-server job, and its path refused
// before training when it cannot be written.
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>
#include <sstream>

#include "cohort/comm/inproc.hpp"
#include "cohort/core/error.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/train/parameter_server.hpp"
#include "cohort/train/run_report.hpp"
#include "cohort/train/trainer.hpp"
#include "ps/ps_test_util.hpp"
#include "test_util.hpp"
#include "train/tiny_cnn.hpp"

using namespace cohort;
using test_util::ScratchDirectory;

namespace {

std::string read(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// data-points of the polyline of `series` in the chart titled `title`.
int points_of(const std::string& page, const std::string& title, const std::string& series) {
  const auto chart = page.find(">" + title + "</text>");
  if (chart == std::string::npos) return -1;
  const auto end = page.find("</svg>", chart);
  const std::regex polyline("data-series=\"" + series + "\" data-points=\"([0-9]+)\"");
  std::smatch match;
  const std::string svg = page.substr(chart, end - chart);
  return std::regex_search(svg, match, polyline) ? std::stoi(match[1]) : -1;
}

}  // namespace

TEST_CASE("the run report draws every epoch's logs and says where the time went", "[train][report]") {
  ScratchDirectory dir("run_report");
  const auto path = dir.path() / "run.html";
  nn::Sequential model = train_test::tiny_cnn();
  Trainer trainer(model, optim::SGD());
  train::FitOptions fit{.epochs = 3, .batch_size = 32, .validation = &train_test::synthetic_set(),
                        .verbosity = train::Verbosity::Silent};
  fit.callbacks.push_back(std::make_shared<train::RunReport>(train::RunReportOptions{.path = path, .title = "tiny <cnn>"}));
  trainer.fit(train_test::synthetic_set(), fit);
  const std::string page = read(path);
  CHECK(page.starts_with("<!DOCTYPE html>"));
  CHECK_THAT(page, Catch::Contains("<title>tiny &lt;cnn&gt;</title>"));
  CHECK(points_of(page, "loss", "training") == 3);
  CHECK(points_of(page, "loss", "validation") == 3);
  CHECK(points_of(page, "accuracy", "validation") == 3);
  CHECK(points_of(page, "learning rate", "learning rate") == 3);
  CHECK_THAT(page, Catch::Contains("3 epochs trained"));
  // 600 samples at batch 32: 19 steps an epoch.
  CHECK_THAT(page, Catch::Contains("Effective global batch: 32 samples per step on average (600 samples in 19 steps"));
  CHECK_THAT(page, Catch::Contains("<td>3</td>") && Catch::Contains("<td>19</td>"));
  CHECK_THAT(page, Catch::Contains("<th>computing</th><th>waiting for data</th><th>validation</th>"));
  CHECK_THAT(page, Catch::Contains("conv2d"));  // the model summary
  CHECK_FALSE(std::filesystem::exists(dir.path() / "run.html.partial"));
}

TEST_CASE("a parameter-server job's report holds the placement and the traffic", "[train][report]") {
  ScratchDirectory dir("run_report_ps");
  const auto path = dir.path() / "ps.html";
  comm::InProcessGroup group(3, std::chrono::seconds(30), ps_test::process_names(2, 1));
  ps_test::run_cluster(group, 2, 1, {}, [&](int, auto strategy) {
    nn::Sequential model = train_test::tiny_cnn();
    Trainer trainer(model, optim::SGD(), strategy);
    train::FitOptions fit{.epochs = 2, .batch_size = 16, .verbosity = train::Verbosity::Silent};
    fit.callbacks.push_back(std::make_shared<train::RunReport>(train::RunReportOptions{.path = path}));
    trainer.fit(train_test::synthetic_set(), fit);
  });
  const std::string page = read(path);
  CHECK_THAT(page, Catch::Contains("<h2>Placement</h2>") && Catch::Contains("imbalance (max / mean load)"));
  CHECK_THAT(page, Catch::Contains("<h2>Traffic</h2>") && Catch::Contains("ps 0"));
  CHECK_THAT(page, Catch::Contains("2 training processes (chief 0, worker 1)"));
  CHECK_THAT(page, Catch::Contains("<th>waiting for communication</th>"));
  CHECK(points_of(page, "loss", "training") == 2);
  CHECK(points_of(page, "megabytes in and out", "ps 0") == 2);
  CHECK(points_of(page, "mean request latency (ms)", "ps 0") == 2);
  CHECK(points_of(page, "ps0_megabytes", "training") == -1);  // not among the curves
}

TEST_CASE("a report path that cannot be written fails before training, naming it", "[train][report]") {
  ScratchDirectory dir("run_report_unwritable");
  for (const auto& path : {dir.path(), dir.path() / "missing" / "run.html"}) {
    INFO(path);
    nn::Sequential model = train_test::tiny_cnn();
    Trainer trainer(model, optim::SGD());
    train::FitOptions fit{.epochs = 1, .verbosity = train::Verbosity::Silent};
    fit.callbacks.push_back(std::make_shared<train::RunReport>(train::RunReportOptions{.path = path}));
    CHECK_THROWS_AS(trainer.fit(train_test::synthetic_set(), fit), IoError);
    CHECK_THROWS_WITH(trainer.fit(train_test::synthetic_set(), fit), Catch::Contains(path.string()));
    CHECK(trainer.optimizer().iterations() == 0);
  }
}
