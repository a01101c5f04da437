#pragma once
// Command lines with CLI11 (Debian's libcli11-dev; this header is not part of cohort.hpp): the way every
// cohort program answers its arguments. Validators read the text themselves, so that a bad value gets
// one line saying what was expected ("--epochs: needs a whole number from 1 to 1099511627776, got '3x'")
// rather than a range check's verdict on text that is not a number at all; parse_or_exit prints --help
// to stdout (status 0) and a mistake as one line (status 2).
//
//   CLI::App cli{"Serves a model."};
//   cli.add_option("--batch-size", batch_size)->check(app::whole_number(1, 1 << 20));
//   app::parse_or_exit(cli, argc, argv);

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace cohort::app {

inline CLI::Validator whole_number(std::int64_t low, std::int64_t high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        std::int64_t value = 0;
        const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (error == std::errc() && end == text.data() + text.size() && value >= low && value <= high) return {};
        return fmt::format("needs a whole number from {} to {}, got '{}'", low, high, text);
      },
      fmt::format("INT in [{}, {}]", low, high));
}

inline CLI::Validator positive_finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (!text.empty() && *end == '\0' && std::isfinite(value) && value > 0) return {};
        return fmt::format("needs a positive finite number, got '{}'", text);
      },
      "POSITIVE");
}

inline void parse_or_exit(CLI::App& cli, int argc, const char* const* argv) {
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& help) {
    std::exit(cli.exit(help));
  } catch (const CLI::ParseError& error) {
    const std::string program = argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "program";
    std::fprintf(stderr, "%s: %s (run with --help for the options)\n", program.c_str(), error.what());
    std::exit(2);
  }
}

}  // namespace cohort::app
