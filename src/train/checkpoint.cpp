#include "cohort/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cereal/types/map.hpp>
#include <cereal/types/utility.hpp>
#include <cstring>
#include <fstream>
#include <sstream>

#include "cohort/tensor/ops.hpp"
#include "core/tensor_archive.hpp"

namespace cohort::train {
namespace {

constexpr char kMagic[8] = {'C', 'O', 'H', 'O', 'R', 'T', 'C', 'K'};
// magic, version (u32), payload bytes (u64), payload CRC-32 (u32), all little-endian
constexpr std::size_t kHeaderBytes = 8 + 4 + 8 + 4;

struct Payload {
  std::vector<std::pair<std::string, Tensor>> variables;
  std::string optimizer_state;
  std::uint64_t model_step = 0;
  std::int64_t epoch = 0, batch_in_epoch = 0, global_step = 0;
  std::uint64_t data_seed = 0;
  std::vector<Logs> history;

  template <class Archive>
  void serialize(Archive& archive) {
    archive(variables, optimizer_state, model_step, epoch, batch_in_epoch, global_step, data_seed, history);
  }
};

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  for (std::size_t i = 0; i < sizeof(T); ++i) bytes[i] = static_cast<char>((static_cast<std::uint64_t>(value) >> (8 * i)) & 0xff);
  out.append(bytes, sizeof(T));
}

template <typename T>
T get(const std::string& in, std::size_t offset) {
  std::uint64_t value = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) value |= static_cast<std::uint64_t>(static_cast<unsigned char>(in[offset + i])) << (8 * i);
  return static_cast<T>(value);
}

std::uint32_t crc32_of(const char* data, std::size_t size) {
  uLong crc = crc32(0L, Z_NULL, 0);
  while (size > 0) {
    const auto chunk = static_cast<uInt>(std::min<std::size_t>(size, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data), chunk);
    data += chunk;
    size -= chunk;
  }
  return static_cast<std::uint32_t>(crc);
}

std::string read_whole_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("checkpoint {}: cannot open it", path.string()));
  std::ostringstream content;
  content << in.rdbuf();
  return content.str();
}

void fsync_path(const std::filesystem::path& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void write_file_atomically(const std::filesystem::path& path, const std::string& bytes) {
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::filesystem::create_directories(directory);
  const std::filesystem::path temporary = path.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) throw IoError(fmt::format("cannot write {}: {}", temporary.string(), std::strerror(errno)));
  }
  fsync_path(temporary, O_RDONLY);
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  if (error) {
    std::filesystem::remove(temporary, error);
    throw IoError(fmt::format("cannot rename {} to {}: {}", temporary.string(), path.string(), error.message()));
  }
  fsync_path(directory, O_RDONLY | O_DIRECTORY);
}

void save_checkpoint(const std::filesystem::path& path, const nn::Sequential& model, const optim::Optimizer& optimizer,
                     const TrainingPosition& position) {
  Payload payload;
  for (const auto& v : model.variables()) payload.variables.emplace_back(v->name, v->value);
  std::ostringstream optimizer_state;
  optimizer.save_state(optimizer_state);
  payload.optimizer_state = optimizer_state.str();
  payload.model_step = model.step();
  payload.epoch = position.epoch;
  payload.batch_in_epoch = position.batch_in_epoch;
  payload.global_step = position.global_step;
  payload.data_seed = position.data_seed;
  payload.history = position.history.epochs;

  std::ostringstream body;
  {
    cereal::PortableBinaryOutputArchive archive(body);
    archive(payload);
  }
  const std::string content = body.str();
  std::string file(kMagic, sizeof kMagic);
  put<std::uint32_t>(file, kCheckpointFormatVersion);
  put<std::uint64_t>(file, content.size());
  put<std::uint32_t>(file, crc32_of(content.data(), content.size()));
  file += content;
  write_file_atomically(path, file);
}

TrainingPosition load_checkpoint(const std::filesystem::path& path, nn::Sequential& model, optim::Optimizer& optimizer) {
  const std::string file = read_whole_file(path);
  const std::string name = path.string();
  if (file.size() < kHeaderBytes)
    throw DataError(fmt::format("checkpoint {}: truncated, {} bytes is shorter than the {}-byte header", name,
                                file.size(), kHeaderBytes));
  if (std::memcmp(file.data(), kMagic, sizeof kMagic) != 0)
    throw DataError(fmt::format("checkpoint {}: byte offset 0 lacks the COHORTCK magic; not a cohort checkpoint", name));
  const auto version = get<std::uint32_t>(file, 8);
  if (version != kCheckpointFormatVersion)
    throw DataError(fmt::format("checkpoint {}: format version {}, this build reads version {}", name, version,
                                kCheckpointFormatVersion));
  const auto size = get<std::uint64_t>(file, 12);
  if (size != file.size() - kHeaderBytes)
    throw DataError(fmt::format("checkpoint {}: header announces {} payload bytes, the file holds {} (truncated or "
                                "appended to)",
                                name, size, file.size() - kHeaderBytes));
  const auto expected_crc = get<std::uint32_t>(file, 20);
  const std::uint32_t actual_crc = crc32_of(file.data() + kHeaderBytes, size);
  if (expected_crc != actual_crc)
    throw DataError(fmt::format("checkpoint {}: payload checksum {:08x} does not match the recorded {:08x}; the file "
                                "is damaged",
                                name, actual_crc, expected_crc));
  Payload payload;
  try {
    std::istringstream body(file.substr(kHeaderBytes));
    cereal::PortableBinaryInputArchive archive(body);
    archive(payload);
  } catch (const cereal::Exception& e) {
    throw DataError(fmt::format("checkpoint {}: payload cannot be decoded: {}", name, e.what()));
  }

  // Check everything before changing anything.
  std::map<std::string, const Tensor*> saved;
  for (const auto& [variable_name, tensor] : payload.variables) saved[variable_name] = &tensor;
  const auto variables = model.variables();
  for (const auto& v : variables) {
    const auto it = saved.find(v->name);
    if (it == saved.end()) throw DataError(fmt::format("checkpoint {}: has no variable '{}' of this model", name, v->name));
    if (it->second->shape() != v->value.shape())
      throw DataError(fmt::format("checkpoint {}: variable '{}' has shape {}, the model {}", name, v->name,
                                  it->second->shape(), v->value.shape()));
  }
  if (saved.size() != variables.size())
    throw DataError(fmt::format("checkpoint {}: holds {} variables, the model {}", name, saved.size(), variables.size()));
  std::istringstream optimizer_state(payload.optimizer_state);
  optimizer.load_state(optimizer_state);
  for (const auto& v : variables) ops::copy(*saved[v->name], v->value);
  model.set_step(payload.model_step);
  return {payload.epoch, payload.batch_in_epoch, payload.global_step, payload.data_seed, History{payload.history}};
}

}  // namespace cohort::train
