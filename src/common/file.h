// Durable, atomic replacement of a file: checkpoints and other outputs that a crash, a
// full disk or a second writer must never leave half-written under their real name.
#pragma once
#include <cstddef>
#include <functional>
#include <span>
#include <string>

namespace seam {

// Hands a piece of the file's contents to the writer; may be called any number of times.
using WriteBytes = std::function<void(std::span<const std::byte>)>;

// Writes `path` so that readers see either its old contents or all of the new: the bytes
// go to a temporary file of a unique name in the same directory, which is synced, renamed
// over `path`, and the directory synced so the rename survives a power loss. `produce`
// streams the contents through the WriteBytes it is given. Every system call is checked;
// on any failure (or an exception from `produce`) the temporary file is removed, `path` is
// left as it was, and a seam::Error names the path, the failing step and the reason.
void write_file_atomically(const std::string& path, const std::function<void(const WriteBytes&)>& produce);
void write_file_atomically(const std::string& path, std::span<const std::byte> contents);

}  // namespace seam
