# Writes the C++ blocks of a Markdown file as one translation unit, so that the build compiles them as they
# stand: a block with main() becomes a function of its own, any other block the body of one. A name a block
# uses without defining it fails the build, at its line of the Markdown file.
#   awk -f snippets.awk README.md > readme_snippets.cpp
BEGIN { print "#include <cohort/cohort.hpp>"; print "using namespace cohort;"; blocks = 0 }
/^```cpp/ { inside = 1; blocks++; body = ""; has_main = 0; first = NR + 1; next }
inside && /^```/ {
  inside = 0
  if (has_main) printf "#line %d \"%s\"\n%s", first, FILENAME, body
  else printf "[[maybe_unused]] static void readme_block_%d() {\n#line %d \"%s\"\n%s}\n", blocks, first, FILENAME, body
  next
}
inside {
  line = $0
  if (line ~ /^#include <cohort\/cohort.hpp>/ || line ~ /^using namespace cohort;/) { body = body "\n"; next }
  if (line ~ /^int main\(\)/) { has_main = 1; sub(/^int main\(\)/, "[[maybe_unused]] static int readme_block_" blocks "()", line) }
  body = body line "\n"
}
