#pragma once
// A process's name as part of a file or folder name: "chief 0" -> "chief-0", as the timeline's files
// and the TensorBoard folders of every_process name it.

#include <cctype>
#include <string>

namespace cohort::train {

inline std::string process_label(std::string process) {
  for (char& c : process)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '-';
  return process;
}

}  // namespace cohort::train
