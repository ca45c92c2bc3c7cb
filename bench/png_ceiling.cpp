// The decode ceiling of PNG on one core (BENCHMARKS.md, "PNG and WebP photos ... on a quiet
// machine"): libspng row by row to RGBA8, whole and down to the last row of a random 30-100% box,
// 3 rounds. Built by hand:
//   g++ -O2 -std=c++20 bench/png_ceiling.cpp -o /tmp/png_ceiling -lspng
#include <spng.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>
int main(int argc, char** argv) {
  std::vector<std::vector<uint8_t>> files;
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  std::vector<uint8_t> row(1 << 20);
  for (int round = 0; round < 3; ++round)
    for (int crop = 0; crop < 2; ++crop) {
      std::mt19937 rng(1);
      auto t0 = std::chrono::steady_clock::now();
      for (auto& d : files) {
        spng_ctx* c = spng_ctx_new(0);
        spng_set_png_buffer(c, d.data(), d.size());
        spng_ihdr ih;
        spng_get_ihdr(c, &ih);
        int h = ih.height;
        int last = h;
        if (crop) {
          int ch = h * (30 + rng() % 70) / 100;
          int top = rng() % (h - ch + 1);
          last = top + ch;
        }
        spng_decode_image(c, nullptr, 0, SPNG_FMT_RGBA8, SPNG_DECODE_PROGRESSIVE);
        for (int r = 0; r < last; ++r) spng_decode_row(c, row.data(), ih.width * 4);
        spng_ctx_free(c);
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("round %d crop %d: %.1f img/s\n", round, crop, files.size() / s);
    }
}
