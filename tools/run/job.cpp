#include "job.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "output.hpp"

extern char** environ;

namespace tutti::launcher {

namespace fs = std::filesystem;

std::string random_hex(std::size_t bytes) {
  std::vector<unsigned char> raw(bytes);
  std::size_t have = 0;
  while (have < bytes) {
    const ssize_t n = ::getrandom(raw.data() + have, bytes - have, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "getrandom");
    have += static_cast<std::size_t>(n);
  }
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * bytes);
  for (unsigned char b : raw) {
    hex.push_back(digits[b >> 4]);
    hex.push_back(digits[b & 15]);
  }
  return hex;
}

namespace {

// Why `path` cannot be executed, or "" if it can (the checks execve would make, in advance, so
// that a typo fails before any rank starts).
std::string cannot_execute(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return std::strerror(EISDIR);
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0) return std::strerror(EACCES);
  return "";
}

std::string temp_base() {
  const char* tmpdir = std::getenv("TMPDIR");
  std::string base = (tmpdir != nullptr && tmpdir[0] == '/') ? tmpdir : "/tmp";
  std::error_code ec;
  if (!fs::is_directory(base, ec)) base = "/tmp";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base == "/" ? "" : base;
}

constexpr const char* names_set_by_us[] = {"TUTTI_RANK",   "TUTTI_SIZE",  "TUTTI_LOCAL_RANK", "TUTTI_LOCAL_SIZE",
                                           "TUTTI_JOB_ID", "TUTTI_TOKEN", "TUTTI_STORE",      "TUTTI_ELASTIC_JOIN"};

// Whether the environment entry "NAME=value" is one whose NAME is `name`.
bool entry_names(const char* entry, const std::string& name) {
  return std::strncmp(entry, name.c_str(), name.size()) == 0 && entry[name.size()] == '=';
}

bool is_set_by_us(const char* entry) {
  for (const char* name : names_set_by_us)
    if (entry_names(entry, name)) return true;
  return false;
}

}  // namespace

bool sets_itself(const std::string& name) {
  return std::find(std::begin(names_set_by_us), std::end(names_set_by_us), name) != std::end(names_set_by_us);
}

ProgramLookup find_program(const std::string& program) {
  if (program.empty()) return {"", "empty program name"};
  if (program.find('/') != std::string::npos) {
    std::string why = cannot_execute(program);
    return why.empty() ? ProgramLookup{program, ""} : ProgramLookup{"", why};
  }
  const char* env_path = std::getenv("PATH");
  const std::string search = env_path != nullptr ? env_path : "/bin:/usr/bin";  // execvp's default
  std::string first_error;
  std::size_t start = 0;
  for (;;) {
    const std::size_t colon = search.find(':', start);
    std::string dir = search.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";  // an empty PATH entry means the current directory
    const std::string candidate = dir + "/" + program;
    std::string why = cannot_execute(candidate);
    if (why.empty()) return {candidate, ""};
    // Report "Permission denied" over "not found" when a non-executable file was seen.
    if (first_error.empty() && why != std::strerror(ENOENT) && why != std::strerror(ENOTDIR)) first_error = why;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return {"", first_error.empty() ? "command not found in PATH" : first_error};
}

Job::Job() : id_(random_hex(8)), token_(random_hex(32)) {
  store_dir_ = temp_base() + "/tutti-" + id_;
  if (::mkdir(store_dir_.c_str(), 0700) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot create store directory " + store_dir_);
  }
  // The umask may have taken bits away; the ranks need all three of the owner's.
  ::chmod(store_dir_.c_str(), 0700);
}

Job::~Job() { remove_job_files(id_, store_dir_); }

void remove_job_files(const std::string& job_id, const std::string& store_dir) {
  std::error_code ec;
  fs::remove_all(store_dir, ec);
  if (ec) report("cannot remove store directory " + store_dir + ": " + ec.message());
  const std::string prefix = "tutti-" + job_id;
  fs::directory_iterator it("/dev/shm", ec);
  if (ec) return;  // no /dev/shm: the ranks could not have made segments there either
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    std::error_code remove_ec;
    fs::remove_all(entry.path(), remove_ec);
    if (remove_ec) report("cannot remove " + entry.path().string() + ": " + remove_ec.message());
  }
}

namespace {

// What every rank of the job shares: tutti-run's environment, minus what it sets, plus the job's
// identity and the settings given; no rank and size.
std::vector<std::string> job_variables(const Job& job, const JobSettings& settings) {
  std::vector<std::string> common;
  std::vector<std::string> ours;
  ours.push_back("TUTTI_JOB_ID=" + job.id());
  ours.push_back("TUTTI_TOKEN=" + job.token());
  ours.push_back("TUTTI_STORE=" + job.store_url());
  if (!settings.transport.empty()) ours.push_back("TUTTI_TRANSPORT=" + settings.transport);
  if (settings.timeout_ms) ours.push_back("TUTTI_TIMEOUT_MS=" + std::to_string(*settings.timeout_ms));
  if (settings.elastic) ours.push_back("TUTTI_ELASTIC=1");
  if (settings.min_ranks > 0) ours.push_back("TUTTI_ELASTIC_MIN_RANKS=" + std::to_string(settings.min_ranks));
  if (settings.max_ranks > 0) ours.push_back("TUTTI_ELASTIC_MAX_RANKS=" + std::to_string(settings.max_ranks));
  for (char** e = environ; *e != nullptr; ++e) {
    const bool exported = std::any_of(settings.exported.begin(), settings.exported.end(), [&](const std::string& x) {
      return x.find('=') != std::string::npos && entry_names(*e, x.substr(0, x.find('=')));
    });
    const bool replaced = is_set_by_us(*e) || exported ||
                          std::any_of(ours.begin(), ours.end(),
                                      [&](const std::string& x) { return entry_names(*e, x.substr(0, x.find('='))); });
    if (!replaced) common.emplace_back(*e);
  }
  for (const std::string& x : settings.exported)
    if (x.find('=') != std::string::npos) common.push_back(x);
  common.insert(common.end(), ours.begin(), ours.end());
  return common;
}

}  // namespace

std::vector<std::vector<std::string>> rank_environments(const Job& job, const JobSettings& settings) {
  std::vector<std::string> common = job_variables(job, settings);
  const std::string size = std::to_string(settings.ranks);
  common.push_back("TUTTI_SIZE=" + size);
  common.push_back("TUTTI_LOCAL_SIZE=" + size);
  std::vector<std::vector<std::string>> all(static_cast<std::size_t>(settings.ranks), common);
  for (int r = 0; r < settings.ranks; ++r) {
    all[r].push_back("TUTTI_RANK=" + std::to_string(r));
    all[r].push_back("TUTTI_LOCAL_RANK=" + std::to_string(r));
  }
  return all;
}

std::vector<std::string> joiner_environment(const Job& job, const JobSettings& settings) {
  std::vector<std::string> variables = job_variables(job, settings);
  variables.push_back("TUTTI_ELASTIC_JOIN=1");
  return variables;
}

std::string write_join_file(const Job& job, const JobSettings& settings) {
  std::string text;
  for (const std::string& entry : joiner_environment(job, settings))
    if (entry.starts_with("TUTTI_")) text += entry + "\n";
  const std::string path = job.store_dir() + "/join.env";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "cannot write " + path);
  const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!written) throw std::system_error(EIO, std::generic_category(), "cannot write " + path);
  return path;
}

}  // namespace tutti::launcher
