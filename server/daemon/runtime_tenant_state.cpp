#include "server/daemon/runtime_tenant_state.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace gpuproxy::server {
namespace {

using nlohmann::json;

constexpr int kFormatVersion = 1;

template <typename T>
void putOptional(json& out, const char* key, const std::optional<T>& value) {
  if (value) out[key] = *value;
}

template <typename T>
std::optional<T> getOptional(const json& in, const char* key) {
  if (!in.contains(key)) return std::nullopt;
  return in.at(key).get<T>();
}

json encodeTenant(const SavedTenant& saved) {
  const TenantDefinition& definition = saved.definition;
  const TenantLimits& limits = definition.limits;
  json out = {{"name", definition.name},
              {"socket_directory", definition.socketPath},
              {"weight", limits.weight},
              {"class", tenantClassName(limits.tenantClass)}};
  putOptional(out, "memory_limit", limits.memoryLimit);
  putOptional(out, "pinned_memory_limit", limits.pinnedMemoryLimit);
  putOptional(out, "devices", limits.devices);
  putOptional(out, "max_connections", limits.maxConnections);
  json objects = json::array();
  for (const auto& cap : limits.maxObjects) objects.push_back(cap ? json(*cap) : json(nullptr));
  out["max_objects"] = objects;
  if (!definition.allocation.empty()) {
    out["allocation"] = {{"resource", definition.allocation.resource},
                         {"device_ids", definition.allocation.deviceIds}};
  }
  putOptional(out, "bound_pod_uid", saved.boundPodUid);
  if (!saved.pod.empty()) {
    out["pod"] = {{"namespace", saved.pod.podNamespace},
                  {"name", saved.pod.podName},
                  {"containers", saved.pod.containers}};
  }
  return out;
}

SavedTenant decodeTenant(const json& in) {
  SavedTenant saved;
  TenantDefinition& definition = saved.definition;
  TenantLimits& limits = definition.limits;
  definition.name = in.at("name").get<std::string>();
  definition.socketPath = in.at("socket_directory").get<std::string>();
  definition.origin = TenantOrigin::kRuntime;
  limits.weight = in.at("weight").get<std::uint32_t>();
  const std::string className = in.at("class").get<std::string>();
  std::optional<TenantClass> tenantClass = parseTenantClass(className);
  if (!tenantClass) throw std::runtime_error("unknown class '" + className + "'");
  limits.tenantClass = *tenantClass;
  limits.memoryLimit = getOptional<std::uint64_t>(in, "memory_limit");
  limits.pinnedMemoryLimit = getOptional<std::uint64_t>(in, "pinned_memory_limit");
  limits.devices = getOptional<std::vector<std::uint32_t>>(in, "devices");
  limits.maxConnections = getOptional<std::uint32_t>(in, "max_connections");
  if (in.contains("max_objects")) {
    const json& objects = in.at("max_objects");
    if (!objects.is_array() || objects.size() != limits.maxObjects.size()) {
      throw std::runtime_error("max_objects is not a list of " +
                               std::to_string(limits.maxObjects.size()));
    }
    for (std::size_t kind = 0; kind < limits.maxObjects.size(); ++kind) {
      if (!objects[kind].is_null()) limits.maxObjects[kind] = objects[kind].get<std::uint32_t>();
    }
  }
  if (in.contains("allocation")) {
    const json& allocation = in.at("allocation");
    definition.allocation.resource = allocation.at("resource").get<std::string>();
    definition.allocation.deviceIds = allocation.at("device_ids").get<std::vector<std::string>>();
  }
  saved.boundPodUid = getOptional<std::string>(in, "bound_pod_uid");
  if (in.contains("pod")) {
    const json& pod = in.at("pod");
    saved.pod.podNamespace = pod.at("namespace").get<std::string>();
    saved.pod.podName = pod.at("name").get<std::string>();
    saved.pod.containers = pod.at("containers").get<std::vector<std::string>>();
  }
  return saved;
}

}  // namespace

std::string encodeRuntimeTenants(const std::vector<SavedTenant>& tenants) {
  json list = json::array();
  for (const SavedTenant& tenant : tenants) list.push_back(encodeTenant(tenant));
  return json{{"version", kFormatVersion}, {"tenants", list}}.dump(2) + "\n";
}

std::vector<SavedTenant> decodeRuntimeTenants(std::string_view text) {
  json document = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded() || !document.is_object()) {
    throw std::runtime_error("not a JSON object");
  }
  if (document.value("version", 0) != kFormatVersion) {
    throw std::runtime_error("version " + document.value("version", json(nullptr)).dump() +
                             ", expected " + std::to_string(kFormatVersion));
  }
  std::vector<SavedTenant> tenants;
  if (!document.contains("tenants") || !document.at("tenants").is_array()) {
    throw std::runtime_error("no list of tenants");
  }
  for (const json& entry : document.at("tenants")) {
    try {
      tenants.push_back(decodeTenant(entry));
    } catch (const json::exception& error) {
      throw std::runtime_error("tenant " + entry.value("name", std::string("?")) + ": " +
                               error.what());
    }
  }
  return tenants;
}

void replaceFile(const std::string& path, std::string_view text) {
  const std::string temporary = path + ".new";
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error(temporary + ": " + std::strerror(errno));
  std::size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(temporary.c_str());
      throw std::runtime_error(temporary + ": " + std::strerror(error));
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw std::runtime_error(temporary + ": " + std::strerror(error));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw std::runtime_error(path + ": " + std::strerror(error));
  }
}

}  // namespace gpuproxy::server
