// checkpoint_files.cpp: see checkpoint_files.h.
#include "io/checkpoint_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/checksum.h"
#include "io/h5.h"
#include "src/base/check.h"

namespace sparta {
namespace ckpt {
namespace fs = std::filesystem;

std::string join(const std::string& dir, const std::string& name) { return (fs::path(dir) / name).string(); }

std::string shard_name(int rank, int world) { return strprintf("shard-%d-of-%d.h5", rank, world); }

std::string step_name(int64_t step) { return strprintf("step-%lld", static_cast<long long>(step)); }

int64_t parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step-") != 0 || name.size() > 5 + 18) return -1;
  for (size_t i = 5; i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoll(name.substr(5));
}

bool valid_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != ".." &&
         name.find('\n') == std::string::npos;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  SPARTA_REQUIRE(fd >= 0, "%s: cannot open to fsync: %s", path.c_str(), std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  SPARTA_REQUIRE(rc == 0, "%s: fsync failed: %s", path.c_str(), std::strerror(err));
}

void rename_path(const std::string& from, const std::string& to) {
  SPARTA_REQUIRE(::rename(from.c_str(), to.c_str()) == 0, "%s: cannot rename to %s: %s", from.c_str(), to.c_str(),
                 std::strerror(errno));
}

CheckpointFile seal_file(const std::string& dir, const std::string& name) {
  std::string path = join(dir, name);
  fsync_path(path, false);
  CheckpointFile f;
  f.name = name;
  f.checksum = checksum_file(path, &f.bytes);
  return f;
}

namespace {
// Writes all of text to fd; "" or the reason it could not.
std::string write_all(int fd, const std::string& text) {
  size_t allowed = h5::take_write_budget(text.size()), at = 0;
  while (at < allowed) {
    ssize_t n = ::write(fd, text.data() + at, allowed - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? std::strerror(errno) : "nothing written";
    at += static_cast<size_t>(n);
  }
  if (allowed < text.size()) return std::string(std::strerror(ENOSPC)) + " (the test write budget ran out)";
  return "";
}
}  // namespace

void write_file_atomic(const std::string& dir, const std::string& name, const std::string& text, bool* renamed) {
  std::string path = join(dir, name), tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  SPARTA_REQUIRE(fd >= 0, "%s: cannot create: %s", tmp.c_str(), std::strerror(errno));
  std::string error = write_all(fd, text);
  if (error.empty() && ::fsync(fd) != 0) error = std::string("fsync failed: ") + std::strerror(errno);
  if (::close(fd) != 0 && error.empty()) error = std::string("close failed: ") + std::strerror(errno);
  if (error.empty() && ::rename(tmp.c_str(), path.c_str()) != 0)
    error = "cannot rename to " + path + ": " + std::strerror(errno);
  if (!error.empty()) {
    ::unlink(tmp.c_str());
    throw Error(tmp + ": " + error);
  }
  if (renamed) *renamed = true;
  fsync_path(dir, true);
}

std::string read_pointer(const std::string& root, const std::string& pointer) {
  std::string path = join(root, pointer);
  std::error_code ec;
  if (!fs::exists(path, ec)) return "";
  std::ifstream in(path);
  SPARTA_REQUIRE(in.good(), "%s: cannot read", path.c_str());
  std::string name;
  std::getline(in, name);
  SPARTA_REQUIRE(parse_step_name(name) >= 0, "%s: expected one line 'step-<n>', found '%s'", path.c_str(),
                 name.c_str());
  return name;
}

}  // namespace ckpt

void point_checkpoint(const std::string& root, const std::string& pointer, int64_t step) {
  const std::string name = ckpt::step_name(step), dir = ckpt::join(root, name);
  std::error_code ec;
  SPARTA_REQUIRE(std::filesystem::is_directory(dir, ec), "%s: cannot point '%s' at it: no such checkpoint", dir.c_str(),
                 pointer.c_str());
  ckpt::write_file_atomic(root, pointer, name + "\n", nullptr);
}

}  // namespace sparta
