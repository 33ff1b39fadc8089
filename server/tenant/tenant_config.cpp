#include "server/tenant/tenant_config.hpp"

#include "protocol/byte_size.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

namespace gpuproxy::server {

bool isValidTenantName(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& why) {
  throw TenantConfigError(where + ": " + why);
}

std::string describe(const std::string& tenant, const YAML::Node& node) {
  std::string where = tenant.empty() ? "tenants" : "tenant '" + tenant + "'";
  if (node.Mark().line >= 0) where += " (line " + std::to_string(node.Mark().line + 1) + ")";
  return where;
}

TenantDefinition parseTenant(const YAML::Node& node, const std::string& mainSocket,
                             std::uint32_t deviceCount) {
  if (!node.IsMap()) refuse(describe("", node), "each tenant must be a mapping");
  static const std::set<std::string> kKeys{
      "name",         "socket",      "memory_limit",        "weight",
      "class",        "devices",     "pinned_memory_limit", "max_connections",
      "max_contexts", "max_streams", "max_events",          "max_modules"};
  TenantDefinition tenant;
  if (!node["name"] || !node["name"].IsScalar()) {
    refuse(describe("", node), "a tenant needs a `name`");
  }
  tenant.name = node["name"].as<std::string>();
  const std::string where = describe(tenant.name, node);
  if (!isValidTenantName(tenant.name)) {
    refuse(where, "names use letters, digits, '-', '_' and '.' (at most 64)");
  }
  for (const auto& entry : node) {
    std::string key = entry.first.as<std::string>();
    if (kKeys.count(key) == 0) refuse(where, "unknown key `" + key + "`");
  }

  if (node["socket"]) {
    tenant.socketPath = node["socket"].as<std::string>();
    if (tenant.socketPath.empty() || tenant.socketPath.front() != '/') {
      refuse(where, "`socket` must be an absolute path");
    }
  } else if (tenant.name == kDefaultTenantName) {
    tenant.socketPath = mainSocket;
  } else {
    refuse(where, "`socket` is required (only `default` may omit it)");
  }

  if (const auto limit = node["memory_limit"]) {
    auto bytes = protocol::parseByteSize(limit.as<std::string>());
    if (!bytes) refuse(where, "`memory_limit` '" + limit.as<std::string>() + "' is not a size");
    tenant.limits.memoryLimit = *bytes;
  }
  if (const auto limit = node["pinned_memory_limit"]) {
    auto bytes = protocol::parseByteSize(limit.as<std::string>());
    if (!bytes) {
      refuse(where, "`pinned_memory_limit` '" + limit.as<std::string>() + "' is not a size");
    }
    tenant.limits.pinnedMemoryLimit = *bytes;
  }
  if (const auto weight = node["weight"]) {
    long value = 0;
    try {
      value = weight.as<long>();
    } catch (const YAML::Exception&) {
      refuse(where, "`weight` must be a whole number");
    }
    if (value < 1 || value > kMaxTenantWeight) {
      refuse(where, "`weight` must be between 1 and " + std::to_string(kMaxTenantWeight));
    }
    tenant.limits.weight = static_cast<std::uint32_t>(value);
  }
  if (const auto connections = node["max_connections"]) {
    long value = 0;
    try {
      value = connections.as<long>();
    } catch (const YAML::Exception&) {
      refuse(where, "`max_connections` must be a whole number");
    }
    if (value < 1 || value > kMaxTenantConnections) {
      refuse(where,
             "`max_connections` must be between 1 and " + std::to_string(kMaxTenantConnections));
    }
    tenant.limits.maxConnections = static_cast<std::uint32_t>(value);
  }
  for (std::size_t kind = 0; kind < kTenantObjectKinds; ++kind) {
    const std::string key = "max_" + std::string(tenantObjectName(static_cast<TenantObject>(kind)));
    const auto cap = node[key];
    if (!cap) continue;
    long value = 0;
    try {
      value = cap.as<long>();
    } catch (const YAML::Exception&) {
      refuse(where, "`" + key + "` must be a whole number");
    }
    if (value < 1 || value > kMaxObjectLimit) {
      refuse(where, "`" + key + "` must be between 1 and " + std::to_string(kMaxObjectLimit));
    }
    tenant.limits.maxObjects[kind] = static_cast<std::uint32_t>(value);
  }
  if (const auto tenantClass = node["class"]) {
    auto parsed = parseTenantClass(tenantClass.as<std::string>());
    if (!parsed) {
      refuse(where, "`class` '" + tenantClass.as<std::string>() +
                        "' is neither best-effort nor latency-critical");
    }
    tenant.limits.tenantClass = *parsed;
  }
  if (const auto devices = node["devices"]) {
    if (!devices.IsSequence()) refuse(where, "`devices` must be a list such as [0, 1]");
    std::vector<std::uint32_t> list;
    for (const auto& device : devices) {
      long index = -1;
      try {
        index = device.as<long>();
      } catch (const YAML::Exception&) {
        refuse(where, "`devices` must list device indices");
      }
      if (index < 0 || index >= static_cast<long>(deviceCount)) {
        refuse(where, "device " + std::to_string(index) + " does not exist (this node has " +
                          std::to_string(deviceCount) + ")");
      }
      if (std::find(list.begin(), list.end(), index) == list.end()) {
        list.push_back(static_cast<std::uint32_t>(index));
      }
    }
    tenant.limits.devices = std::move(list);
  }
  return tenant;
}

}  // namespace

TenantConfig defaultTenantConfig(const std::string& mainSocket) {
  TenantConfig config;
  config.tenants.push_back(TenantDefinition{kDefaultTenantName, mainSocket, {}});
  return config;
}

TenantConfig parseTenantConfig(const std::string& yaml, const std::string& mainSocket,
                               std::uint32_t deviceCount) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& error) {
    throw TenantConfigError("not valid YAML: " + std::string(error.what()));
  }
  if (!root.IsMap() || !root["tenants"]) throw TenantConfigError("expected a top-level `tenants:`");
  for (const auto& entry : root) {
    // `device_plugin:` is gpuproxy-device-plugin's (its slot profiles), in the same file so that
    // one ConfigMap configures both; the daemon leaves it alone.
    const auto key = entry.first.as<std::string>();
    if (key != "tenants" && key != "device_plugin") {
      throw TenantConfigError("unknown top-level key `" + key + "`");
    }
  }
  const YAML::Node tenants = root["tenants"];
  if (!tenants.IsSequence() && !tenants.IsNull()) {
    throw TenantConfigError("`tenants` must be a list");
  }

  TenantConfig config;
  std::set<std::string> names;
  std::set<std::string> sockets;
  try {
    for (const auto& node : tenants) {
      TenantDefinition tenant = parseTenant(node, mainSocket, deviceCount);
      if (!names.insert(tenant.name).second) {
        throw TenantConfigError("tenant '" + tenant.name + "' is defined twice");
      }
      if (!sockets.insert(tenant.socketPath).second) {
        throw TenantConfigError("socket " + tenant.socketPath + " is given to two tenants");
      }
      config.tenants.push_back(std::move(tenant));
    }
  } catch (const YAML::Exception& error) {
    throw TenantConfigError(std::string("malformed tenant entry: ") + error.what());
  }
  if (names.count(kDefaultTenantName) == 0) {
    if (sockets.count(mainSocket) != 0) {
      // The main socket belongs to a named tenant; no implicit default then.
      return config;
    }
    config.tenants.push_back(TenantDefinition{kDefaultTenantName, mainSocket, {}});
  }
  return config;
}

TenantConfig loadTenantConfig(const std::string& path, const std::string& mainSocket,
                              std::uint32_t deviceCount) {
  std::ifstream in(path);
  if (!in) throw TenantConfigError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  try {
    return parseTenantConfig(text.str(), mainSocket, deviceCount);
  } catch (const TenantConfigError& error) {
    throw TenantConfigError(path + ": " + error.what());
  }
}

}  // namespace gpuproxy::server
