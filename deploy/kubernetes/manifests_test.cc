// The Kubernetes manifests against the binaries they run: every flag a
// container passes is one its binary defines, every file it names lies on a
// mounted volume (Secret files among the keys secrets.sh writes), every
// mount has its volume, Services select pods, the workers' StatefulSet has
// its headless Service and GPU requests, and each container, started with
// its manifest's flags on scratch copies of its volumes, gets past flag
// validation (still running after a few seconds).

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "tests/e2e/local_cluster.h"
#include "yaml-cpp/yaml.h"

namespace recfleet {
namespace {

using e2e::RunfilesPath;

constexpr char kBinDir[] = "/opt/recfleet/bin/";

std::string Capture(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

// Words of a "/bin/sh -c" script: whitespace-separated, double quotes
// removed; a leading "exec" dropped.
std::vector<std::string> ShellWords(const std::string& script) {
  std::vector<std::string> words;
  std::string w;
  bool quoted = false, any = false;
  for (char ch : script) {
    if (ch == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && std::isspace(static_cast<unsigned char>(ch))) {
      if (any || !w.empty()) words.push_back(w);
      w.clear();
      any = false;
    } else {
      w += ch;
    }
  }
  if (any || !w.empty()) words.push_back(w);
  if (!words.empty() && words[0] == "exec") words.erase(words.begin());
  return words;
}

struct Container {
  std::string workload;  // "StatefulSet/recfleet-worker"
  YAML::Node pod_spec;
  YAML::Node spec;
  std::vector<std::string> argv;  // Binary path as in the image, then args.
  std::string binary;             // Runfiles path.
  std::vector<std::string> subcommand;
};

class ManifestsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    manifests_ = new std::vector<YAML::Node>();
    const std::string dir = RunfilesPath("deploy/kubernetes");
    DIR* d = opendir(dir.c_str());
    ASSERT_NE(d, nullptr) << dir;
    std::vector<std::string> files;
    while (dirent* e = readdir(d)) {
      if (absl::EndsWith(e->d_name, ".yaml")) files.push_back(dir + "/" + e->d_name);
    }
    closedir(d);
    ASSERT_GE(files.size(), 3u);
    for (const std::string& f : files) {
      for (const YAML::Node& doc : YAML::LoadAllFromFile(f)) {
        if (doc.IsMap()) manifests_->push_back(doc);
      }
    }
    // What secrets.sh makes, in a scratch directory.
    secrets_dir_ = new std::string(std::string(std::getenv("TEST_TMPDIR")) + "/secrets");
    const std::string yaml = Capture(absl::StrCat("OUTDIR=", *secrets_dir_, " ",
                                                  RunfilesPath("deploy/kubernetes/secrets.sh"),
                                                  " recfleet 2>/dev/null"));
    secret_keys_ = new std::map<std::string, std::set<std::string>>();
    for (const YAML::Node& doc : YAML::LoadAll(yaml)) {
      ASSERT_EQ(doc["kind"].as<std::string>(), "Secret");
      for (const auto& kv : doc["data"]) {
        (*secret_keys_)[doc["metadata"]["name"].as<std::string>()].insert(kv.first.as<std::string>());
      }
    }
    ASSERT_EQ(secret_keys_->size(), 4u) << yaml;
  }

  static std::vector<Container> Containers() {
    std::vector<Container> out;
    for (const YAML::Node& m : *manifests_) {
      const std::string kind = m["kind"].as<std::string>();
      if (kind != "Deployment" && kind != "StatefulSet") continue;
      YAML::Node pod = m["spec"]["template"]["spec"];
      for (const YAML::Node& c : pod["containers"]) {
        Container x;
        x.workload = kind + "/" + m["metadata"]["name"].as<std::string>();
        x.pod_spec = pod;
        x.spec = c;
        std::vector<std::string> command = c["command"].as<std::vector<std::string>>();
        std::vector<std::string> args =
            c["args"] ? c["args"].as<std::vector<std::string>>() : std::vector<std::string>();
        if (command.size() == 2 && command[0] == "/bin/sh" && command[1] == "-c") {
          EXPECT_EQ(args.size(), 1u) << x.workload;
          x.argv = ShellWords(args.empty() ? "" : args[0]);
        } else {
          x.argv = command;
          x.argv.insert(x.argv.end(), args.begin(), args.end());
        }
        const std::string bin = x.argv.empty() ? "" : x.argv[0];
        EXPECT_TRUE(absl::StartsWith(bin, kBinDir)) << x.workload << " runs " << bin;
        const std::string name = bin.substr(std::min(bin.size(), sizeof(kBinDir) - 1));
        if (name == "recfleet-coordinator") {
          x.binary = RunfilesPath("services/coordinator/recfleet-coordinator");
        } else if (name == "recfleet-worker") {
          x.binary = RunfilesPath("worker/recfleet-worker");
        } else if (name == "recfleet") {
          x.binary = RunfilesPath("cli/recfleet");
          for (size_t i = 1; i < x.argv.size() && !absl::StartsWith(x.argv[i], "--"); ++i) {
            x.subcommand.push_back(x.argv[i]);
          }
        } else {
          ADD_FAILURE() << x.workload << ": unknown binary " << bin;
        }
        out.push_back(x);
      }
    }
    return out;
  }

  // The flags the binary defines: absl's --helpfull, or the usage text of a
  // `recfleet` subcommand.
  static std::set<std::string> KnownFlags(const Container& c) {
    std::set<std::string> names;
    std::string text;
    std::regex flag;
    if (c.subcommand.empty()) {
      text = Capture(c.binary + " --helpfull 2>&1");
      flag = std::regex(R"(--([a-z0-9_]+) \()");
    } else {
      text = Capture(absl::StrCat(c.binary, " help ", absl::StrJoin(c.subcommand, " "), " 2>&1"));
      flag = std::regex(R"(--([a-z0-9_-]+))");
    }
    for (std::sregex_iterator it(text.begin(), text.end(), flag), end; it != end; ++it) {
      names.insert((*it)[1]);
    }
    return names;
  }

  // (flag, value) pairs: "--name=value", or "--name value" for `recfleet`
  // subcommands.
  static std::vector<std::pair<std::string, std::string>> Flags(const Container& c) {
    std::vector<std::pair<std::string, std::string>> out;
    for (size_t i = 1 + c.subcommand.size(); i < c.argv.size(); ++i) {
      const std::string& a = c.argv[i];
      EXPECT_TRUE(absl::StartsWith(a, "--")) << c.workload << ": stray argument '" << a << "'";
      std::string name = a.substr(2), value;
      if (size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
      } else if (!c.subcommand.empty() && i + 1 < c.argv.size()) {
        value = c.argv[++i];
      }
      out.push_back({name, value});
    }
    return out;
  }

  static std::vector<YAML::Node> Find(const std::string& kind) {
    std::vector<YAML::Node> out;
    for (const YAML::Node& m : *manifests_) {
      if (m["kind"].as<std::string>() == kind) out.push_back(m);
    }
    return out;
  }

  static std::vector<YAML::Node>* manifests_;
  static std::string* secrets_dir_;
  static std::map<std::string, std::set<std::string>>* secret_keys_;
};

std::vector<YAML::Node>* ManifestsTest::manifests_ = nullptr;
std::string* ManifestsTest::secrets_dir_ = nullptr;
std::map<std::string, std::set<std::string>>* ManifestsTest::secret_keys_ = nullptr;

TEST_F(ManifestsTest, EveryFlagIsOneTheBinaryDefines) {
  std::vector<Container> containers = Containers();
  ASSERT_EQ(containers.size(), 3u);
  for (const Container& c : containers) {
    std::set<std::string> known = KnownFlags(c);
    ASSERT_GT(known.size(), 3u) << c.workload << ": no flags read from " << c.binary;
    for (const auto& [name, value] : Flags(c)) {
      EXPECT_TRUE(known.count(name)) << c.workload << " passes --" << name << ", which "
                                     << c.binary << " does not define";
    }
  }
}

TEST_F(ManifestsTest, EveryFileIsOnAMountAndEveryMountHasItsVolume) {
  for (const Container& c : Containers()) {
    std::map<std::string, YAML::Node> volumes;
    for (const YAML::Node& v : c.pod_spec["volumes"]) volumes[v["name"].as<std::string>()] = v;
    std::set<std::string> claim_templates;
    for (const YAML::Node& m : *manifests_) {
      if (m["kind"].as<std::string>() != "StatefulSet") continue;
      if (m["spec"]["template"]["spec"]["containers"][0]["name"].as<std::string>() !=
          c.spec["name"].as<std::string>()) {
        continue;
      }
      for (const YAML::Node& t : m["spec"]["volumeClaimTemplates"]) {
        claim_templates.insert(t["metadata"]["name"].as<std::string>());
      }
    }
    std::map<std::string, std::string> mounts;  // mountPath -> volume name
    for (const YAML::Node& m : c.spec["volumeMounts"]) {
      const std::string name = m["name"].as<std::string>();
      EXPECT_TRUE(volumes.count(name) || claim_templates.count(name))
          << c.workload << " mounts volume " << name << ", which it does not declare";
      mounts[m["mountPath"].as<std::string>()] = name;
    }
    for (const auto& [flag, value] : Flags(c)) {
      if (!absl::StartsWith(value, "/")) continue;
      bool found = false;
      for (const auto& [path, volume] : mounts) {
        if (!absl::StartsWith(value, path + "/") && value != path) continue;
        found = true;
        if (!volumes.count(volume) || !volumes[volume]["secret"]) continue;
        const std::string secret = volumes[volume]["secret"]["secretName"].as<std::string>();
        const std::string key = value.substr(path.size() + 1);
        EXPECT_TRUE((*secret_keys_)[secret].count(key))
            << c.workload << " --" << flag << "=" << value << ": Secret " << secret
            << " (secrets.sh) has no key " << key;
      }
      EXPECT_TRUE(found) << c.workload << " --" << flag << "=" << value << " is on no volume";
    }
  }
}

// Users and workers hold different credentials: the users' token is the
// coordinator's alone (the CLI brings its own copy), and the key that signs
// data grants stays with the coordinator and the loader.
TEST_F(ManifestsTest, WorkersHoldNeitherTheUsersTokenNorTheGrantKey) {
  std::map<std::string, std::set<std::string>> secrets_of;  // container -> Secrets
  for (const Container& c : Containers()) {
    for (const YAML::Node& v : c.pod_spec["volumes"]) {
      if (v["secret"]) secrets_of[c.spec["name"].as<std::string>()].insert(v["secret"]["secretName"].as<std::string>());
    }
  }
  ASSERT_TRUE(secrets_of.count("worker") && secrets_of.count("dataloader") && secrets_of.count("coordinator"));
  EXPECT_EQ(secrets_of["worker"], (std::set<std::string>{"recfleet-tls", "recfleet-worker-token"}));
  EXPECT_EQ(secrets_of["dataloader"].count("recfleet-token"), 0u);
  EXPECT_EQ(secrets_of["dataloader"].count("recfleet-data-grant-key"), 1u);
  EXPECT_EQ(secrets_of["coordinator"].count("recfleet-data-grant-key"), 1u);
}

TEST_F(ManifestsTest, ServicesSelectPodsAndWorkersHaveAHeadlessServiceAndGpus) {
  std::map<std::string, YAML::Node> services;
  for (const YAML::Node& s : Find("Service")) services[s["metadata"]["name"].as<std::string>()] = s;
  std::vector<std::map<std::string, std::string>> pod_labels;
  for (const Container& c : Containers()) {
    (void)c;
  }
  for (const char* kind : {"Deployment", "StatefulSet"}) {
    for (const YAML::Node& w : Find(kind)) {
      pod_labels.push_back(
          w["spec"]["template"]["metadata"]["labels"].as<std::map<std::string, std::string>>());
    }
  }
  for (const auto& [name, s] : services) {
    auto selector = s["spec"]["selector"].as<std::map<std::string, std::string>>();
    bool selects = false;
    for (const auto& labels : pod_labels) {
      bool all = true;
      for (const auto& [k, v] : selector) all &= labels.count(k) && labels.at(k) == v;
      selects |= all;
    }
    EXPECT_TRUE(selects) << "Service " << name << " selects no pod";
  }
  bool saw_workers = false;
  for (const YAML::Node& w : Find("StatefulSet")) {
    if (w["metadata"]["name"].as<std::string>() != "recfleet-worker") continue;
    saw_workers = true;
    const std::string service = w["spec"]["serviceName"].as<std::string>();
    ASSERT_TRUE(services.count(service)) << "no Service " << service;
    EXPECT_EQ(services[service]["spec"]["clusterIP"].as<std::string>(""), "None")
        << "the workers' Service must be headless";
    YAML::Node c = w["spec"]["template"]["spec"]["containers"][0];
    EXPECT_GE(c["resources"]["limits"]["nvidia.com/gpu"].as<int>(0), 1);
  }
  EXPECT_TRUE(saw_workers);
}

// Starts each container's binary with its manifest's flags: volume paths
// point at scratch copies (Secrets from secrets.sh, a small dataset), port
// numbers become 0, the downward-API variables get local values. A flag
// the binary rejects ends it at once; a good set leaves it serving (or, for
// a worker, trying to reach its coordinator).
TEST_F(ManifestsTest, EachContainerStartsWithItsFlags) {
  const std::string root = std::string(std::getenv("TEST_TMPDIR")) + "/mounts";
  const std::string data = root + "/data";
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", data, " && ", RunfilesPath("cli/recfleet"),
                                     " data synth --out ", data, "/train --samples 5000 "
                                     "--lengths lognormal:mean=20,sigma=1,max=100 >/dev/null")
                            .c_str()),
            0);
  for (const Container& c : Containers()) {
    // Mount path -> scratch directory.
    std::map<std::string, std::string> remap;
    std::map<std::string, YAML::Node> volumes;
    for (const YAML::Node& v : c.pod_spec["volumes"]) volumes[v["name"].as<std::string>()] = v;
    for (const YAML::Node& m : c.spec["volumeMounts"]) {
      const std::string path = m["mountPath"].as<std::string>();
      const std::string name = m["name"].as<std::string>();
      std::string local = root + "/" + c.spec["name"].as<std::string>() + path;
      if (volumes.count(name) && volumes[name]["secret"]) {
        local = *secrets_dir_;  // Holds every key secrets.sh writes.
      } else if (volumes.count(name) && volumes[name]["persistentVolumeClaim"]) {
        local = data;
      }
      ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", local).c_str()), 0);
      remap[path] = local;
    }
    std::map<std::string, std::string> env = {{"$POD_IP", "127.0.0.1"}};
    for (const YAML::Node& e : c.spec["env"]) {
      env["$" + e["name"].as<std::string>()] =
          e["value"] ? e["value"].as<std::string>() : "node-0";
    }
    std::vector<std::string> argv = {c.binary};
    argv.insert(argv.end(), c.subcommand.begin(), c.subcommand.end());
    bool next_is_port = false;
    for (size_t i = 1 + c.subcommand.size(); i < c.argv.size(); ++i) {
      std::string a = absl::StrReplaceAll(c.argv[i], env);
      if (next_is_port) a = "0";
      next_is_port = !c.subcommand.empty() && absl::EndsWith(a, "port");
      a = std::regex_replace(a, std::regex(R"(^(--[a-z_]+=[0-9.]+):[0-9]+$)"), "$1:0");
      for (const auto& [path, local] : remap) {
        const size_t at = a.find("=" + path);
        if (at != std::string::npos) a.replace(at + 1, path.size(), local);
        if (absl::StartsWith(a, path)) a.replace(0, path.size(), local);
      }
      argv.push_back(a);
    }
    const std::string log = root + "/" + c.spec["name"].as<std::string>() + ".log";
    absl::StatusOr<std::unique_ptr<e2e::Process>> p = e2e::Process::Start(argv, log);
    ASSERT_TRUE(p.ok()) << p.status();
    std::this_thread::sleep_for(std::chrono::seconds(3));
    const bool running = (*p)->running();
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_TRUE(running) << c.workload << " exited at start with its manifest's flags:\n  "
                         << absl::StrJoin(argv, " ") << "\n" << text.str();
    (*p)->Signal(SIGTERM);
    (*p)->Wait();
  }
}

}  // namespace
}  // namespace recfleet
