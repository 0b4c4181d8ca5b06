#include <lather/comm/device_collectives.hpp>

#include <lather/core/error.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>

namespace lather::comm {

std::string device_collectives_name(DeviceCollectives mode) {
  switch (mode) {
    case DeviceCollectives::automatic:
      return "auto";
    case DeviceCollectives::nccl:
      return "nccl";
    case DeviceCollectives::mpi:
      return "mpi";
  }
  return "unknown";
}

DeviceCollectives parse_device_collectives(const std::string& text, const std::string& source) {
  if (text == "auto") return DeviceCollectives::automatic;
  if (text == "nccl") return DeviceCollectives::nccl;
  if (text == "mpi") return DeviceCollectives::mpi;
  LATHER_FAIL(source, " = '", text, "': expected auto, nccl or mpi");
}

bool resolve_device_collectives(DeviceCollectives mode, bool built_with_nccl, bool cuda_memory) {
  // Asked for by name, NCCL that is not there is an error on every build, not a silent MPI.
  LATHER_REQUIRE(mode != DeviceCollectives::nccl || built_with_nccl,
                 "LATHER_DEVICE_COLLECTIVES = 'nccl' (or set_device_collectives(DeviceCollectives::nccl)): this "
                 "build of Lather has no NCCL; configure it with -DLATHER_ENABLE_NCCL=ON (CUDA builds), or ask for "
                 "auto or mpi");
  if (mode == DeviceCollectives::mpi) return false;
  return built_with_nccl && cuda_memory;
}

namespace {

std::mutex mode_mutex;
DeviceCollectives set_mode = DeviceCollectives::automatic;
/// -1: not read yet; else the DeviceCollectives in force.
std::atomic<int> mode_in_force{-1};

}  // namespace

void set_device_collectives(DeviceCollectives mode) {
  const std::lock_guard<std::mutex> lock(mode_mutex);
  set_mode = mode;
  mode_in_force = -1;
}

DeviceCollectives device_collectives() {
  const int known = mode_in_force.load();
  if (known >= 0) return DeviceCollectives(known);
  const std::lock_guard<std::mutex> lock(mode_mutex);
  DeviceCollectives mode = set_mode;
  if (mode == DeviceCollectives::automatic) {
    if (const char* text = std::getenv("LATHER_DEVICE_COLLECTIVES"))
      mode = parse_device_collectives(text, "LATHER_DEVICE_COLLECTIVES");
  }
  mode_in_force = int(mode);
  return mode;
}

}  // namespace lather::comm
