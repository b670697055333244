#include "output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

namespace flashlab {

namespace {

[[noreturn]] void refuse(const std::string& path, const std::string& why) {
  throw OutputFileError("output file " + path + why);
}

[[noreturn]] void cannot_write(const std::string& path, int error) {
  refuse(path, std::string(" cannot be written (") + std::strerror(error) + ")");
}

// How a path is written (see the header).
enum class Way { standard_output, standard_error, write_through, replace };

struct Target {
  explicit Target(Way way, std::filesystem::path file = {}, bool exists = false, mode_t mode = 0)
      : way(way), file(std::move(file)), exists(exists), mode(mode) {}
  Way way;
  std::filesystem::path file;  // write_through, replace: the file (for replace: links resolved)
  bool exists;                 // replace: a file is there now
  mode_t mode;                 // replace: its permissions, kept
};

bool same_file(const struct stat& file, int descriptor) {
  struct stat other;
  return ::fstat(descriptor, &other) == 0 && other.st_dev == file.st_dev && other.st_ino == file.st_ino;
}

Target resolve(const std::string& path) {
  if (path.empty()) throw OutputFileError("output file '': the path is empty; allowed: a file name, or - for stdout");
  if (path == kStandardOutputPath) return Target(Way::standard_output);
  struct stat status;
  if (::stat(path.c_str(), &status) == 0) {
    if (S_ISDIR(status.st_mode)) refuse(path, " is a directory");
    if (same_file(status, STDOUT_FILENO)) return Target(Way::standard_output);
    if (same_file(status, STDERR_FILENO)) return Target(Way::standard_error);
    if (!S_ISREG(status.st_mode)) return Target(Way::write_through, path);
    std::error_code error;
    std::filesystem::path file = std::filesystem::canonical(path, error);
    if (error) cannot_write(path, error.value());
    return Target(Way::replace, std::move(file), true, status.st_mode & 07777);
  }
  if (errno != ENOENT) cannot_write(path, errno);  // a path through a regular file, no permission, a link loop
  struct stat link;
  if (::lstat(path.c_str(), &link) == 0) refuse(path, " is a link to a missing file");
  std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (directory.empty()) directory = ".";
  struct stat directory_status;
  if (::stat(directory.c_str(), &directory_status) != 0 || !S_ISDIR(directory_status.st_mode))
    refuse(path, ": directory " + directory.string() + " does not exist");
  return Target(Way::replace, path);
}

// A new file beside `file`, removed when it goes out of scope unless kept.
class Temporary {
 public:
  explicit Temporary(const std::filesystem::path& file) {
    static std::atomic<unsigned> counter{0};
    constexpr int kAttempts = 100;  // names taken by other writers are skipped
    for (int attempt = 0; attempt < kAttempts && descriptor_ < 0; ++attempt) {
      std::string name = ".";  // hidden, beside the file: the rename stays on one file system
      name += file.filename().string();
      name += ".partial-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
      path_ = file.parent_path() / name;
      descriptor_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);  // the umask applies
      error_ = descriptor_ < 0 ? errno : 0;
      if (error_ != EEXIST) break;
    }
  }
  Temporary(const Temporary&) = delete;
  Temporary& operator=(const Temporary&) = delete;
  ~Temporary() {
    if (descriptor_ >= 0) ::close(descriptor_);
    if (error_ == 0 && !kept_) ::unlink(path_.c_str());
  }
  int error() const { return error_; }  // of creating it
  int descriptor() const { return descriptor_; }
  const std::filesystem::path& path() const { return path_; }
  int close() {
    const int result = ::close(descriptor_);
    descriptor_ = -1;
    return result == 0 ? 0 : errno;
  }
  void keep() { kept_ = true; }

 private:
  std::filesystem::path path_;
  int descriptor_ = -1;
  int error_ = 0;
  bool kept_ = false;
};

int write_all(int descriptor, std::string_view content) {
  while (!content.empty()) {
    const ssize_t written = ::write(descriptor, content.data(), content.size());
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    content.remove_prefix(static_cast<std::size_t>(written));
  }
  return 0;
}

void write_stream(std::ostream& stream, const std::string& path, std::string_view content) {
  stream.write(content.data(), static_cast<std::streamsize>(content.size()));
  stream.flush();
  if (!stream) refuse(path, " cannot be written (the stream failed)");
}

void write_through(const std::string& path, std::string_view content) {
  const int descriptor = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY);  // never creates a file
  if (descriptor < 0) cannot_write(path, errno);
  int error = write_all(descriptor, content);
  if (::close(descriptor) != 0 && error == 0) error = errno;
  if (error != 0) cannot_write(path, error);
}

void replace(const std::string& path, const Target& target, std::string_view content) {
  Temporary temporary(target.file);
  int error = temporary.error();
  if (error == 0) error = write_all(temporary.descriptor(), content);
  if (error == 0 && target.exists && ::fchmod(temporary.descriptor(), target.mode) != 0) error = errno;
  // On disk before it takes the name, so that a crash leaves the old file or the whole new one.
  if (error == 0 && ::fsync(temporary.descriptor()) != 0 && errno != EINVAL) error = errno;
  if (error == 0) error = temporary.close();
  if (error == 0 && ::rename(temporary.path().c_str(), target.file.c_str()) != 0) error = errno;
  if (error != 0) cannot_write(path, error);
  temporary.keep();
}

}  // namespace

void check_output_path(const std::string& path) {
  const Target target = resolve(path);
  if (target.way == Way::write_through && ::faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0)
    cannot_write(path, errno);
  if (target.way != Way::replace) return;
  if (target.exists && ::faccessat(AT_FDCWD, target.file.c_str(), W_OK, AT_EACCESS) != 0) cannot_write(path, errno);
  // The directory must take a new file: only trying says so (read-only mounts, /proc, ACLs).
  const Temporary probe(target.file);
  if (probe.error() != 0) cannot_write(path, probe.error());
}

void write_output_file(const std::string& path, std::string_view content) {
  const Target target = resolve(path);
  switch (target.way) {
    case Way::standard_output: return write_stream(std::cout, path, content);
    case Way::standard_error: return write_stream(std::cerr, path, content);
    case Way::write_through: return write_through(path, content);
    case Way::replace: return replace(path, target, content);
  }
}

}  // namespace flashlab
