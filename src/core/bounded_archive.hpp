#pragma once
// BoundedInputArchive reads what cereal's PortableBinaryOutputArchive wrote, from bytes in memory, and
// refuses every length that the bytes left cannot hold before anything is allocated for it: a damaged or
// crafted record behind a valid checksum fails with cereal::Exception naming the offset, never a huge
// allocation. Types whose sizes are not cereal size tags (a tensor's shape) ask remaining() themselves.

#include <cereal/archives/portable_binary.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace cohort {

class BoundedInputArchive : public cereal::InputArchive<BoundedInputArchive, cereal::AllowEmptyClassElision> {
 public:
  explicit BoundedInputArchive(std::string_view bytes) : InputArchive(this), bytes_(bytes) {
    std::uint8_t little_endian = 0;
    (*this)(little_endian);
    swap_bytes_ = (little_endian != 0) != (std::endian::native == std::endian::little);
  }

  std::size_t remaining() const { return bytes_.size() - position_; }

  // `size` bytes of elements of `element_size` bytes each.
  void read(void* data, std::size_t size, std::size_t element_size) {
    if (size > remaining())
      throw cereal::Exception(fmt::format("{} bytes wanted at offset {}, only {} left", size, position_, remaining()));
    if (size == 0) return;  // an empty tensor's data may be null
    std::memcpy(data, bytes_.data() + position_, size);
    position_ += size;
    if (!swap_bytes_ || element_size < 2) return;
    auto* bytes = static_cast<std::uint8_t*>(data);
    for (std::size_t i = 0; i + element_size <= size; i += element_size) std::reverse(bytes + i, bytes + i + element_size);
  }

  // A container length: each element takes at least one byte.
  void check_length(std::uint64_t length) const {
    if (length > remaining())
      throw cereal::Exception(fmt::format("a length of {} before offset {} exceeds the {} bytes left", length, position_,
                                          remaining()));
  }

 private:
  std::string_view bytes_;
  std::size_t position_ = 0;
  bool swap_bytes_ = false;
};

template <class T>
std::enable_if_t<std::is_arithmetic_v<T>> CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& archive, T& value) {
  archive.read(std::addressof(value), sizeof value, sizeof value);
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(BoundedInputArchive& archive, cereal::NameValuePair<T>& pair) {
  archive(pair.value);
}

template <class T>
void CEREAL_SERIALIZE_FUNCTION_NAME(BoundedInputArchive& archive, cereal::SizeTag<T>& tag) {
  archive(tag.size);
  archive.check_length(static_cast<std::uint64_t>(tag.size));
}

template <class T>
void CEREAL_LOAD_FUNCTION_NAME(BoundedInputArchive& archive, cereal::BinaryData<T>& data) {
  archive.read(data.data, static_cast<std::size_t>(data.size), sizeof(std::remove_pointer_t<T>));
}

}  // namespace cohort

CEREAL_REGISTER_ARCHIVE(cohort::BoundedInputArchive)

namespace cereal::traits::detail {
template <>
struct get_output_from_input<cohort::BoundedInputArchive> {
  using type = cereal::PortableBinaryOutputArchive;
};
}  // namespace cereal::traits::detail
