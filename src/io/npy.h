// NumPy's .npy files (format versions 1 to 3, little-endian, C order): what `seam run`
// reads its inputs from and writes its outputs to. Element types: float32, float64,
// float16, int32, int64 (read into i32, each value checked), uint8 and bool (u8). A file
// that is not .npy, is Fortran-ordered, big-endian, of another type, or shorter than its
// header says is refused naming the file and the reason.
#pragma once
#include <string>

#include "seam/model.h"

namespace seam::io {

HostTensor read_npy(const std::string& path);
// Written to a temporary file, synced and renamed (common/file.h).
void write_npy(const std::string& path, const HostTensor& t);

}  // namespace seam::io
