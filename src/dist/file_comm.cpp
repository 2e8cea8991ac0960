// Ranks that meet through files in one folder (SEAM_RENDEZVOUS), for hosts without an MPI
// launcher: `seam train --nproc N` starts the ranks itself there. Every collective is one
// round: each rank writes its bytes as "<round>.<rank>" (a temporary file, renamed), waits
// until every rank's file of the round is there, and reads what it needs. The sums add
// the ranks' parts in rank order, as the MPI communicator does, so both give the same
// bits. Meant for what travels on the host (the GPUs' gradients go through NCCL): start-up,
// metrics, evaluation sums.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "dist/comm.h"
#include "seam/error.h"

namespace seam::dist {

namespace {

namespace fs = std::filesystem;

class FileComm final : public Comm {
 public:
  FileComm(std::string dir, int rank, int size, double timeout_s)
      : dir_(std::move(dir)), rank_(rank), size_(size), timeout_s_(timeout_s) {
    if (size < 1 || rank < 0 || rank >= size) fail("rendezvous: rank ", rank, " of ", size);
    if (!fs::is_directory(dir_)) fail("rendezvous folder ", dir_, " does not exist");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(float* data, size_t n) override { sum(data, n); }
  void all_reduce_sum(double* data, size_t n) override { sum(data, n); }
  void reduce_scatter_sum(float* data, const std::vector<size_t>& split) override { scatter(data, split); }
  void reduce_scatter_sum(double* data, const std::vector<size_t>& split) override { scatter(data, split); }
  void all_gather(void* data, const std::vector<size_t>& split) override {
    check_split(split, size_);
    auto* bytes = static_cast<std::byte*>(data);
    const auto me = static_cast<size_t>(rank_);
    const auto parts = exchange(bytes + split[me], split[me + 1] - split[me]);
    for (size_t r = 0; r < parts.size(); ++r)
      if (r != me && split[r + 1] > split[r]) std::memcpy(bytes + split[r], parts[r].data(), split[r + 1] - split[r]);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) fail("broadcast: root ", root, " in a group of ", size_);
    const auto parts = exchange(rank_ == root ? data : nullptr, rank_ == root ? bytes : 0);
    const std::vector<std::byte>& got = parts[static_cast<size_t>(root)];
    if (got.size() != bytes) fail("broadcast: rank ", root, " sent ", got.size(), " bytes, ", bytes, " expected");
    if (bytes) std::memcpy(data, got.data(), bytes);
  }
  void barrier() override { exchange(nullptr, 0); }
  [[noreturn]] void abort(int code) override {
    std::ofstream(dir_ + "/abort") << rank_;  // the others stop waiting and fail
    std::_Exit(code);
  }

 private:
  std::string file(uint64_t round, int rank) const { return dir_ + "/" + std::to_string(round) + "." + std::to_string(rank); }

  // Writes this rank's bytes for the next round and returns every rank's.
  std::vector<std::vector<std::byte>> exchange(const void* data, size_t bytes) {
    const uint64_t round = round_++;
    {
      const std::string tmp = file(round, rank_) + ".tmp";
      std::ofstream out(tmp, std::ios::binary);
      out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
      out.close();
      if (!out) fail("rendezvous: cannot write ", tmp);
      fs::rename(tmp, file(round, rank_));
    }
    std::vector<std::vector<std::byte>> parts(static_cast<size_t>(size_));
    const auto start = std::chrono::steady_clock::now();
    auto pause = std::chrono::microseconds(20);
    for (int r = 0; r < size_; ++r) {
      const std::string path = file(round, r);
      while (!fs::exists(path)) {
        if (fs::exists(dir_ + "/abort")) fail("waiting for rank ", r, " of ", size_, ": a rank stopped (see the messages before this one)");
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s_)
          fail("rank ", r, " of ", size_, " did not reach collective ", round, " within ", timeout_s_,
               " s (SEAM_RENDEZVOUS_TIMEOUT); it may have died");
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(2000));
      }
      std::ifstream in(path, std::ios::binary);
      std::vector<std::byte>& part = parts[static_cast<size_t>(r)];
      part.resize(static_cast<size_t>(fs::file_size(path)));
      in.read(reinterpret_cast<char*>(part.data()), static_cast<std::streamsize>(part.size()));
      if (!in) fail("rendezvous: cannot read ", path);
    }
    // Every rank has written this round, so every rank is done reading the last one.
    if (round > 0) fs::remove(file(round - 1, rank_));
    return parts;
  }

  template <class T>
  void sum(T* data, size_t n) {
    const auto parts = exchange(data, n * sizeof(T));
    add_in_rank_order(data, parts, 0, n);
  }
  template <class T>
  void scatter(T* data, const std::vector<size_t>& split) {
    check_split(split, size_);
    const auto me = static_cast<size_t>(rank_);
    const auto parts = exchange(data, split.back() * sizeof(T));
    add_in_rank_order(data, parts, split[me], split[me + 1]);
  }
  template <class T>
  void add_in_rank_order(T* data, const std::vector<std::vector<std::byte>>& parts, size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      T s{}, v{};
      for (size_t r = 0; r < parts.size(); ++r) {
        if (parts[r].size() < end * sizeof(T)) fail("collective: rank ", r, " sent ", parts[r].size(), " bytes");
        std::memcpy(&v, parts[r].data() + i * sizeof(T), sizeof(T));
        s = r == 0 ? v : s + v;
      }
      data[i] = s;
    }
  }

  std::string dir_;
  int rank_, size_;
  double timeout_s_;
  uint64_t round_ = 0;
};

int env_int(const char* name) {
  const char* s = std::getenv(name);
  if (!s || !*s) fail(name, " is not set");
  return std::atoi(s);
}

}  // namespace

std::unique_ptr<Comm> file_world() {
  const char* dir = std::getenv("SEAM_RENDEZVOUS");
  if (!dir || !*dir) fail("SEAM_RENDEZVOUS is not set: no folder to meet the other ranks in");
  const char* t = std::getenv("SEAM_RENDEZVOUS_TIMEOUT");
  return std::make_unique<FileComm>(dir, env_int("SEAM_RANK"), env_int("SEAM_WORLD_SIZE"), t && *t ? std::atof(t) : 600.0);
}

}  // namespace seam::dist
