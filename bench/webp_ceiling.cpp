// The decode ceiling of lossy WebP on one core (BENCHMARKS.md, "PNG and WebP photos ... on a
// quiet machine"): WebPDecode of every file given, whole and with use_cropping on a random 30-100%
// box, with and without no_fancy_upsampling, 3 rounds. Built by hand:
//   g++ -O2 -std=c++20 bench/webp_ceiling.cpp -o /tmp/webp_ceiling -lwebp
#include <webp/decode.h>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  std::vector<std::vector<uint8_t>> files;
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    files.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  for (int round = 0; round < 3; ++round)
    for (int nofancy = 0; nofancy < 2; ++nofancy)
      for (int crop = 0; crop < 2; ++crop) {
        std::mt19937 rng(1);
        auto t0 = std::chrono::steady_clock::now();
        for (auto& d : files) {
          WebPDecoderConfig c;
          WebPInitDecoderConfig(&c);
          WebPGetFeatures(d.data(), d.size(), &c.input);
          int w = c.input.width, h = c.input.height;
          if (crop) {
            int cw = w * (30 + rng() % 70) / 100, ch = h * (30 + rng() % 70) / 100;
            c.options.use_cropping = 1;
            c.options.crop_left = (rng() % (w - cw + 1)) & ~1;
            c.options.crop_top = (rng() % (h - ch + 1)) & ~1;
            c.options.crop_width = cw;
            c.options.crop_height = ch;
          }
          c.options.no_fancy_upsampling = nofancy;
          c.output.colorspace = MODE_RGBA;
          if (WebPDecode(d.data(), d.size(), &c) != VP8_STATUS_OK) {
            std::printf("fail\n");
            return 1;
          }
          WebPFreeDecBuffer(&c.output);
        }
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("round %d nofancy %d crop %d: %.1f img/s\n", round, nofancy, crop,
                    files.size() / s);
      }
}
