// Atomic file replacement with POSIX calls: each one checked, because a checkpoint that
// only seems written is worse than an error.
#include "common/file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <random>
#include <system_error>

#include "seam/error.h"

namespace seam {

namespace {

std::string reason(int err) { return std::error_code(err, std::generic_category()).message(); }

[[noreturn]] void fail_write(const std::string& path, const std::string& step, int err) {
  fail("cannot write ", path, ": ", step, ": ", reason(err), "; the file was left as it was");
}

std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Owns the temporary file until it is renamed into place; removes it on every other exit.
struct TempFile {
  int fd = -1;
  std::string name;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!name.empty()) ::unlink(name.c_str());
  }
};

// O_EXCL makes the name this writer's alone, even against other threads and processes
// writing the same path; the mode leaves the permissions to the umask, as for any new file.
void create_temp(const std::string& path, TempFile& t) {
  static const char kChars[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    // The pid keeps forked children, which inherit the generator's state, apart.
    uint64_t r = rng() ^ (static_cast<uint64_t>(::getpid()) * 0x9E3779B97F4A7C15ull);
    std::string name = path + ".tmp.";
    for (int i = 0; i < 6; ++i, r /= 62) name += kChars[r % 62];
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      t.fd = fd;
      t.name = std::move(name);
      return;
    }
    const int err = errno;
    if (err != EEXIST) fail_write(path, "cannot create the temporary file " + name, err);
  }
  fail_write(path, "no unused temporary name next to it", EEXIST);
}

void sync_dir(const std::string& path) {
  const std::string dir = parent_dir(path);
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int err = fd < 0 ? errno : ::fsync(fd) != 0 ? errno : 0;
  if (fd >= 0 && ::close(fd) != 0 && err == 0) err = errno;
  // The new contents are in place by now; only their surviving a power loss is in doubt.
  if (err != 0) fail(path, ": written, but syncing its directory ", dir, " failed: ", reason(err), "; the new contents may not survive a crash");
}

}  // namespace

void write_file_atomically(const std::string& path, const std::function<void(const WriteBytes&)>& produce) {
  TempFile t;
  create_temp(path, t);
  produce([&](std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::write(t.fd, bytes.data(), std::min<size_t>(bytes.size(), size_t{1} << 30));
      if (n < 0) {
        const int err = errno;
        if (err == EINTR) continue;
        fail_write(path, "writing " + t.name + " failed", err);
      }
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  });
  // The data must be on disk before the rename makes it visible under the real name.
  // (errno is read first: building the message may change it.)
  if (::fsync(t.fd) != 0) {
    const int err = errno;
    fail_write(path, "syncing " + t.name + " failed", err);
  }
  const int fd = t.fd;
  t.fd = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    fail_write(path, "closing " + t.name + " failed", err);
  }
  if (::rename(t.name.c_str(), path.c_str()) != 0) {
    const int err = errno;
    fail_write(path, "renaming " + t.name + " to it failed", err);
  }
  t.name.clear();
  sync_dir(path);
}

void write_file_atomically(const std::string& path, std::span<const std::byte> contents) {
  write_file_atomically(path, [&](const WriteBytes& put) { put(contents); });
}

}  // namespace seam
