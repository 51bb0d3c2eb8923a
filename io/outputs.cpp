// outputs.cpp: see outputs.h.
#include "io/outputs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "src/base/check.h"

namespace sparta {
namespace fs = std::filesystem;

namespace {

bool same_file(const struct stat& a, const std::string& path) {
  struct stat b;
  return ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

std::string folder_of(const std::string& path) {
  const fs::path p = fs::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

}  // namespace

void require_output_not_input(const NamedPath& out, const std::vector<NamedPath>& inputs) {
  struct stat o;
  if (::stat(out.path.c_str(), &o) != 0) return;  // a new file: it cannot be an existing input
  SPARTA_REQUIRE(!S_ISDIR(o.st_mode), "%s '%s': is a directory; expected a file name", out.option.c_str(),
                 out.path.c_str());
  for (const NamedPath& in : inputs) {
    if (in.path.empty() || in.path == "-") continue;
    std::error_code ec;
    if (fs::is_directory(in.path, ec)) {
      for (const fs::directory_entry& e : fs::recursive_directory_iterator(in.path, ec))
        SPARTA_REQUIRE(!same_file(o, e.path().string()),
                       "%s '%s': is the file '%s' of %s '%s'; refusing to overwrite an input (choose another output)",
                       out.option.c_str(), out.path.c_str(), e.path().c_str(), in.option.c_str(), in.path.c_str());
      continue;
    }
    SPARTA_REQUIRE(!same_file(o, in.path),
                   "%s '%s': is the same file as %s '%s'; refusing to overwrite an input (choose another output)",
                   out.option.c_str(), out.path.c_str(), in.option.c_str(), in.path.c_str());
  }
}

uint64_t free_bytes(const std::string& path) {
  const std::string dir = folder_of(path);
  struct statvfs v;
  SPARTA_REQUIRE(::statvfs(dir.c_str(), &v) == 0, "%s: cannot read the free space of its file system: %s",
                 dir.c_str(), std::strerror(errno));
  return uint64_t(v.f_bavail) * uint64_t(v.f_frsize);
}

void require_free_space(const NamedPath& out, uint64_t need, const std::string& what) {
  struct statvfs v;
  if (::statvfs(folder_of(out.path).c_str(), &v) != 0) return;  // no such folder: creating the file says so
  const uint64_t have = uint64_t(v.f_bavail) * uint64_t(v.f_frsize);
  SPARTA_REQUIRE(have >= need,
                 "%s '%s': not enough free space: %s needs about %.3g GB, the file system of '%s' has %.3g GB free",
                 out.option.c_str(), out.path.c_str(), what.c_str(), double(need) / 1e9, folder_of(out.path).c_str(),
                 double(have) / 1e9);
}

StagedOutput::StagedOutput(std::string out) : out_(std::move(out)) {
  tmp_ = out_ + ".tmp-" + std::to_string(::getpid());
}

StagedOutput::~StagedOutput() {
  if (!done_) ::unlink(tmp_.c_str());
}

void StagedOutput::commit() {
  int fd = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
  SPARTA_REQUIRE(fd >= 0, "%s: cannot open to fsync: %s", tmp_.c_str(), std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  SPARTA_REQUIRE(rc == 0, "%s: fsync failed: %s", tmp_.c_str(), std::strerror(err));
  SPARTA_REQUIRE(::rename(tmp_.c_str(), out_.c_str()) == 0, "%s: cannot rename to %s: %s", tmp_.c_str(),
                 out_.c_str(), std::strerror(errno));
  done_ = true;
}

}  // namespace sparta
