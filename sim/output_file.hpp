// The files a program writes (the flashlab CLI's --json, --csv, --out; the visualizer's
// --save-trace, --layout, --screenshot): checked before the work, written whole or not at all.
//
//   check_output_path(path);          // before the work: a bad path is refused by name
//   ... the work ...
//   write_output_file(path, text);
//
// How a path is written:
//   "-"                          standard output;
//   this process's stdout/stderr under another name (/dev/stdout, or the file stdout is
//                                redirected to): through that stream, in order with the rest;
//   a device, FIFO or socket     (/dev/null, a named pipe): written through, never replaced;
//   a regular file or a new name in an existing directory: written to a temporary beside it and
//                                renamed over it when complete (through a symbolic link: over
//                                the file it names), keeping an existing file's permissions.
// A temporary is removed on every failure, so a failed write leaves the old file as it was.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace flashlab {

// An output path that cannot be written, or a write that failed. Bad input for the CLI (exit
// status 2); the message names the path and why.
class OutputFileError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr const char* kStandardOutputPath = "-";

// Throws OutputFileError when `path` is empty, a directory, in a directory that does not exist
// (or is not a directory), a link to nothing, or a place where nothing can be created or written
// (a read-only directory or file system). A regular file's directory is probed by creating and
// removing a temporary in it. Changes nothing else.
void check_output_path(const std::string& path);

// Writes `content` to `path` as described above. Throws OutputFileError on any failure.
void write_output_file(const std::string& path, std::string_view content);

}  // namespace flashlab
