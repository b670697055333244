// Output files (sim/output_file.hpp): refused by name before the work, written through to what
// is not a regular file, replaced whole otherwise, never a temporary left behind. The command
// line's side (devices, FIFOs, stdout, a read-only directory) is tests/sim/cli_output_files.sh.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "catch.hpp"
#include "sim/output_file.hpp"

using namespace flashlab;
using flashlab::testing::contains_text;
namespace fs = std::filesystem;

namespace {

// A fresh folder, removed afterwards.
struct Scratch {
  fs::path path = fs::temp_directory_path() / ("flashlab_output_test_" + std::to_string(::getpid()));
  Scratch() {
    fs::remove_all(path);
    fs::create_directory(path);
  }
  ~Scratch() { fs::remove_all(path); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::size_t entries() const { return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), {})); }
};

std::string read(const std::string& path) {
  std::ifstream file(path);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("bad output paths are refused by name before anything is written", "[sim][output]") {
  const Scratch scratch;
  fs::create_directory(scratch / "dir");
  std::ofstream(scratch / "plain") << "x";
  fs::create_symlink(scratch / "nowhere", scratch / "dangling");
  CHECK_THROWS_WITH(check_output_path(scratch / "dir"), contains_text("output file " + (scratch / "dir") + " is a directory"));
  CHECK_THROWS_WITH(check_output_path(scratch / "missing/out.json"),
                    contains_text("directory " + (scratch / "missing") + " does not exist"));
  CHECK_THROWS_WITH(check_output_path(scratch / "plain/out.json"), contains_text("cannot be written (Not a directory)"));
  CHECK_THROWS_WITH(check_output_path(scratch / "dangling"), contains_text("is a link to a missing file"));
  CHECK_THROWS_WITH(check_output_path(""), contains_text("the path is empty"));
  CHECK_THROWS_AS(check_output_path(scratch / "dir"), OutputFileError);
  CHECK_THROWS_AS(write_output_file(scratch / "dir", "text"), OutputFileError);
  // A good path: checking it probes the directory and leaves nothing.
  CHECK_NOTHROW(check_output_path(scratch / "new.json"));
  CHECK_NOTHROW(check_output_path(scratch / "plain"));
  CHECK_NOTHROW(check_output_path(kStandardOutputPath));
  CHECK(scratch.entries() == 3);  // dir, plain, dangling
  CHECK(read(scratch / "plain") == "x");
}

TEST_CASE("a regular file is replaced whole; through a link, the file it names", "[sim][output]") {
  const Scratch scratch;
  write_output_file(scratch / "new.json", "first\n");
  CHECK(read(scratch / "new.json") == "first\n");
  fs::permissions(scratch / "new.json", fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_output_file(scratch / "new.json", "second\n");
  CHECK(read(scratch / "new.json") == "second\n");
  CHECK(fs::status(scratch / "new.json").permissions() ==
        (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read));
  fs::create_symlink(scratch / "new.json", scratch / "link.json");
  write_output_file(scratch / "link.json", "third\n");
  CHECK(fs::is_symlink(scratch / "link.json"));
  CHECK(read(scratch / "new.json") == "third\n");
  CHECK(scratch.entries() == 2);  // no temporary beside them
}

TEST_CASE("a FIFO is written through to its reader, not replaced", "[sim][output]") {
  const Scratch scratch;
  const std::string fifo = scratch / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::string received;
  std::thread reader([&] { received = read(fifo); });
  write_output_file(fifo, "through the pipe\n");
  reader.join();
  CHECK(received == "through the pipe\n");
  CHECK(fs::is_fifo(fifo));
}

TEST_CASE("a write that fails midway leaves the old file and no temporary", "[sim][output]") {
  const Scratch scratch;
  const std::string path = scratch / "kept.json";
  std::ofstream(path) << "the previous content";
  // The file size limit makes the write fail with EFBIG (SIGXFSZ ignored meanwhile).
  rlimit saved{};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  rlimit small = saved;
  small.rlim_cur = 64;
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string message = "(written)";
  try {
    write_output_file(path, std::string(4096, 'x'));
  } catch (const OutputFileError& error) {
    message = error.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous_handler);
  INFO(message);
  CHECK(message.find("output file " + path + " cannot be written (File too large)") != std::string::npos);
  CHECK(read(path) == "the previous content");
  CHECK(scratch.entries() == 1);
}

TEST_CASE("a read-only directory is refused up front (not as root: root may write anywhere)", "[sim][output]") {
  if (::geteuid() == 0) {
    WARN("running as root: the read-only directory case runs in tests/sim/cli_output_files.sh as an unprivileged user");
    return;
  }
  const Scratch scratch;
  fs::create_directory(scratch / "read_only");
  fs::permissions(scratch / "read_only", fs::perms::owner_read | fs::perms::owner_exec);
  CHECK_THROWS_WITH(check_output_path(scratch / "read_only/out.json"), contains_text("cannot be written (Permission denied)"));
  fs::permissions(scratch / "read_only", fs::perms::owner_all);
}
