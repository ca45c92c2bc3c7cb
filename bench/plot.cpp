#include "plot.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

extern char** environ;

namespace conveyor::bench {
namespace {

constexpr double kWidth = 1000, kHeight = 740;
constexpr const char* kFont = "DejaVu Sans, Helvetica, Arial, sans-serif";
// One colour per run, in table order; Conveyor's first.
constexpr const char* kRunColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
// The time split's stages.
struct Stage {
  const char* key;
  const char* label;
  const char* colour;
};
constexpr Stage kWorkerStages[] = {{"read", "read", "#9ecae1"},
                                   {"decode", "decode", "#3182bd"},
                                   {"transform", "resize, flip, layout", "#fd8d3c"},
                                   {"fill_other", "other fill work", "#bdbdbd"}};
constexpr Stage kConsumerStages[] = {{"copy_issue", "copy issue", "#74c476"},
                                     {"wait", "waiting for a batch", "#de2d26"},
                                     {"loop", "the loop's own work", "#d9d9d9"}};

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

// A tick label: no trailing zeros.
std::string tick_label(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", std::fabs(v) < 1e-12 ? 0.0 : v);
  return b;
}

// A "nice" step (1, 2 or 5 times a power of ten) giving about `ticks` intervals over [0, top].
double nice_step(double top, int ticks) {
  if (!(top > 0)) return 1;
  const double raw = top / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= m * p) return m * p;
  }
  return 10 * p;
}

class Svg {
 public:
  void text(double x, double y, const std::string& s, int size = 12, const char* anchor = "start",
            const char* weight = "normal", const char* colour = "#222222") {
    out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + std::to_string(size) +
            "\" text-anchor=\"" + anchor + "\" font-weight=\"" + weight + "\" fill=\"" + colour +
            "\">" + escape(s) + "</text>\n";
  }
  void line(double x1, double y1, double x2, double y2, const char* colour, double width = 1) {
    out_ += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" +
            num(y2) + "\" stroke=\"" + colour + "\" stroke-width=\"" + num(width) + "\"/>\n";
  }
  void rect(double x, double y, double w, double h, const char* fill, const char* stroke = "none") {
    out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(std::max(0.0, w)) +
            "\" height=\"" + num(std::max(0.0, h)) + "\" fill=\"" + fill + "\" stroke=\"" + stroke +
            "\"/>\n";
  }
  void polyline(const std::vector<std::pair<double, double>>& points, const char* colour,
                double width = 2) {
    if (points.empty()) return;
    out_ += "<polyline fill=\"none\" stroke=\"" + std::string(colour) + "\" stroke-width=\"" +
            num(width) + "\" stroke-linejoin=\"round\" points=\"";
    for (const auto& [x, y] : points) out_ += num(x) + "," + num(y) + " ";
    out_ += "\"/>\n";
  }
  std::string finish() {
    return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(kWidth) + "\" height=\"" +
           num(kHeight) + "\" viewBox=\"0 0 " + num(kWidth) + " " + num(kHeight) +
           "\" font-family=\"" + kFont + "\">\n<rect width=\"100%\" height=\"100%\" " +
           "fill=\"white\"/>\n" + out_ + "</svg>\n";
  }

 private:
  std::string out_;
};

// A plot area: data (0..x_top, 0..y_top) mapped into the box (left, top, width, height).
struct Axes {
  double left, top, width, height, x_top, y_top;
  double x(double v) const { return left + width * std::clamp(v / x_top, 0.0, 1.0); }
  double y(double v) const { return top + height * (1 - std::clamp(v / y_top, 0.0, 1.0)); }
};

Axes draw_axes(Svg& svg, double left, double top, double width, double height, double x_top,
               double y_top, const std::string& title, const std::string& x_name,
               const std::string& y_name) {
  const double x_step = nice_step(x_top, 6), y_step = nice_step(y_top, 5);
  Axes a{left,
         top,
         width,
         height,
         std::ceil(x_top / x_step - 1e-9) * x_step,
         std::ceil(y_top / y_step - 1e-9) * y_step};
  svg.text(left, top - 12, title, 14, "start", "bold");
  for (double v = 0; v <= a.y_top + 1e-9; v += y_step) {
    svg.line(left, a.y(v), left + width, a.y(v), "#e5e5e5");
    svg.text(left - 6, a.y(v) + 4, tick_label(v), 11, "end");
  }
  for (double v = 0; v <= a.x_top + 1e-9; v += x_step) {
    svg.line(a.x(v), top + height, a.x(v), top + height + 4, "#444444");
    svg.text(a.x(v), top + height + 17, tick_label(v), 11, "middle");
  }
  svg.line(left, top + height, left + width, top + height, "#444444");
  svg.line(left, top, left, top + height, "#444444");
  svg.text(left + width / 2, top + height + 34, x_name, 12, "middle");
  svg.text(left + 4, top + 12, y_name, 11, "start", "normal", "#555555");
  return a;
}

// Images done at time t, interpolated linearly between the timeline's points.
double images_at(const std::vector<std::pair<double, uint64_t>>& timeline, double t) {
  if (t <= timeline.front().first) return static_cast<double>(timeline.front().second);
  for (size_t i = 1; i < timeline.size(); ++i) {
    const auto& [t1, n1] = timeline[i];
    if (t <= t1) {
      const auto& [t0, n0] = timeline[i - 1];
      const double f = t1 > t0 ? (t - t0) / (t1 - t0) : 1.0;
      return static_cast<double>(n0) + f * (static_cast<double>(n1) - static_cast<double>(n0));
    }
  }
  return static_cast<double>(timeline.back().second);
}

// Images/s in consecutive windows of `window` seconds from the run's start to its end (the last
// window, if shorter than half a window, joins the one before), as steps: each window's rate at
// its start and at its end.
std::vector<std::pair<double, double>> rate_series(
    const std::vector<std::pair<double, uint64_t>>& timeline, double window) {
  std::vector<std::pair<double, double>> out;
  if (timeline.size() < 2 || !(timeline.back().first > 0)) return out;
  const double end = timeline.back().first;
  std::vector<double> edges{0.0};
  while (edges.back() + window < end) edges.push_back(edges.back() + window);
  if (edges.size() > 1 && end - edges.back() < window / 2) edges.pop_back();
  edges.push_back(end);
  for (size_t k = 0; k + 1 < edges.size(); ++k) {
    const double dt = edges[k + 1] - edges[k];
    const double rate = (images_at(timeline, edges[k + 1]) - images_at(timeline, edges[k])) / dt;
    out.emplace_back(edges[k], rate);
    out.emplace_back(edges[k + 1], rate);
  }
  return out;
}

void plot_rates(Svg& svg, const std::vector<RunResult>& runs) {
  double t_top = 0, r_top = 0;
  for (const auto& r : runs) {
    if (!r.timeline.empty()) t_top = std::max(t_top, r.timeline.back().first);
  }
  const double window = std::max(0.25, t_top / 40);
  std::vector<std::vector<std::pair<double, double>>> series;
  for (const auto& r : runs) {
    series.push_back(rate_series(r.timeline, window));
    for (const auto& [t, rate] : series.back()) r_top = std::max(r_top, rate);
  }
  const Axes a = draw_axes(
      svg, 80, 132, 640, 230, std::max(t_top, 0.1), std::max(r_top, 1.0),
      "Images/s over time (median round of each run; " + tick_label(window) + " s windows)",
      "seconds since the run's start", "images/s");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<std::pair<double, double>> points;
    for (const auto& [t, rate] : series[i]) points.emplace_back(a.x(t), a.y(rate));
    svg.polyline(points, kRunColours[i % std::size(kRunColours)]);
  }
  // The legend: each run's median images/s and its ratio.
  double y = 140;
  svg.text(745, y - 20, "run: images/s (Conveyor / run)", 12, "start", "bold");
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    svg.rect(745, y - 9, 14, 10, kRunColours[i % std::size(kRunColours)]);
    std::string label = r.name + ": " + num(r.images_per_s);
    if (i == 0) {
      label += " (1.00x)";
    } else if (!r.ratios.empty()) {
      std::vector<double> sorted = r.ratios;
      std::sort(sorted.begin(), sorted.end());
      const size_t n = sorted.size();
      const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
      char b[32];
      std::snprintf(b, sizeof b, " (%.2fx)", median);
      label += b;
    }
    svg.text(764, y, label, 12);
    y += 18;
  }
}

void plot_latency(Svg& svg, const std::vector<RunResult>& runs) {
  double ms_top = 0;
  bool any = false;
  for (const auto& r : runs) {
    if (r.batch_ms.empty()) continue;
    any = true;
    ms_top = std::max(ms_top, percentile(r.batch_ms, 0.995));
  }
  const Axes a = draw_axes(svg, 80, 452, 360, 230, std::max(ms_top, 1.0), 1.0,
                           "Per-batch latency (time between batches)",
                           "ms between consecutive batches", "share of batches at most x");
  if (!any) {
    svg.text(a.left + a.width / 2, a.top + a.height / 2, "no run delivered batches", 12, "middle");
    return;
  }
  double y = a.top + 30;  // the legend, top left: CDFs rise on the right
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<double> ms = runs[i].batch_ms;
    if (ms.empty()) continue;
    std::sort(ms.begin(), ms.end());
    std::vector<std::pair<double, double>> points;
    const size_t n = ms.size();
    for (size_t k = 0; k < n; ++k) {
      const double share = static_cast<double>(k + 1) / static_cast<double>(n);
      if (!points.empty()) points.emplace_back(a.x(ms[k]), points.back().second);  // steps
      points.emplace_back(a.x(ms[k]), a.y(share));
    }
    const char* colour = kRunColours[i % std::size(kRunColours)];
    svg.polyline(points, colour, 1.5);
    svg.text(a.left + 6, y,
             runs[i].name + ": p50 " + num(percentile(ms, 0.5)) + " ms, p99 " +
                 num(percentile(ms, 0.99)) + " ms",
             11, "start", "normal", colour);
    y += 16;
  }
}

void plot_split(Svg& svg, const std::vector<RunResult>& runs) {
  const double left = 520, top = 452, width = 440;
  svg.text(left, top - 12, "Where the time goes, per image (Conveyor runs)", 14, "start", "bold");
  std::vector<const RunResult*> split;
  for (const auto& r : runs) {
    if (!r.time_split.empty() && r.images > 0) split.push_back(&r);
  }
  if (split.empty()) {
    svg.text(left + width / 2, top + 120, "no Conveyor run on an image source", 12, "middle");
    return;
  }
  auto get = [](const RunResult& r, const char* key) {
    auto it = r.time_split.find(key);
    return it == r.time_split.end() ? 0.0 : it->second;
  };
  // Milliseconds per image; the consumer's "loop" is its wall time not spent in the other two.
  std::vector<std::vector<double>> worker_ms, consumer_ms;
  double top_ms = 0;
  for (const RunResult* r : split) {
    const double per = 1000.0 / static_cast<double>(r->images);
    std::vector<double> w, c;
    for (const auto& s : kWorkerStages) w.push_back(get(*r, s.key) * per);
    const double copy = get(*r, "copy_issue") * per, wait = get(*r, "wait") * per;
    c = {copy, wait, std::max(0.0, r->seconds * per - copy - wait)};
    double wsum = 0, csum = 0;
    for (double v : w) wsum += v;
    for (double v : c) csum += v;
    top_ms = std::max({top_ms, wsum, csum});
    worker_ms.push_back(w);
    consumer_ms.push_back(c);
  }
  const double bar_h = 20, label_w = 150, plot_w = width - label_w - 40;  // 40: the total
  const double scale = plot_w / (top_ms > 0 ? top_ms : 1);
  double y = top + 8;
  for (size_t i = 0; i < split.size(); ++i) {
    const RunResult& r = *split[i];
    svg.text(left, y + 13, r.name, 12, "start", "bold");
    y += 20;
    auto bar = [&](const std::string& label, const std::vector<double>& ms, const Stage* stages) {
      svg.text(left, y + 14, label, 11);
      double x = left + label_w;
      double sum = 0;
      for (size_t k = 0; k < ms.size(); ++k) {
        svg.rect(x, y, ms[k] * scale, bar_h, stages[k].colour);
        x += ms[k] * scale;
        sum += ms[k];
      }
      svg.text(x + 4, y + 14, num(sum), 11);
      y += bar_h + 6;
    };
    bar("workers (" + std::to_string(r.workers) + "), ms", worker_ms[i], kWorkerStages);
    bar("consumer, ms", consumer_ms[i], kConsumerStages);
    y += 6;
  }
  // The legend of the stages.
  y += 4;
  double x = left;
  for (const auto* group : {kWorkerStages, kConsumerStages}) {
    const size_t n = group == kWorkerStages ? std::size(kWorkerStages) : std::size(kConsumerStages);
    for (size_t k = 0; k < n; ++k) {
      const std::string label = group[k].label;
      const double w = 22 + 6.2 * static_cast<double>(label.size());
      if (x + w > left + width) {
        x = left;
        y += 16;
      }
      svg.rect(x, y - 9, 12, 10, group[k].colour);
      svg.text(x + 16, y, label, 11);
      x += w;
    }
  }
  svg.text(left, y + 20, "workers: summed over worker threads; consumer: the loop's thread", 10,
           "start", "normal", "#555555");
}

}  // namespace

std::string plot_svg(const std::vector<RunResult>& runs, const std::vector<std::string>& caption) {
  Svg svg;
  svg.text(30, 34, "conveyor-bench", 20, "start", "bold");
  double y = 56;
  for (const auto& line : caption) {
    svg.text(30, y, line, 12, "start", "normal", "#444444");
    y += 16;
  }
  plot_rates(svg, runs);
  plot_latency(svg, runs);
  plot_split(svg, runs);
  return svg.finish();
}

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("--plot: cannot write " + path);
}

// Runs rsvg-convert on `svg` into `png`; throws naming what went wrong.
void render_png(const std::string& svg, const std::string& png) {
  std::vector<std::string> args{"rsvg-convert", "--format", "png", "--output", png, svg};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, "rsvg-convert", nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    throw std::runtime_error("--plot " + png + ": cannot run rsvg-convert (" + std::strerror(err) +
                             "): install Debian's librsvg2-bin (scripts/setup does), or ask for "
                             "an .svg");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("--plot " + png + ": rsvg-convert failed (exit status " +
                             std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  }
}

}  // namespace

void write_plot(const std::string& path, const std::vector<RunResult>& runs,
                const std::vector<std::string>& caption) {
  const std::string svg = plot_svg(runs, caption);
  if (ends_with(path, ".svg")) {
    write_text(path, svg);
    return;
  }
  if (!ends_with(path, ".png")) {
    throw std::runtime_error("--plot " + path + ": the name must end in .svg or .png");
  }
  const std::string temporary = path + ".tmp.svg";
  write_text(temporary, svg);
  try {
    render_png(temporary, path);
  } catch (...) {
    std::filesystem::remove(temporary);
    throw;
  }
  std::filesystem::remove(temporary);
}

}  // namespace conveyor::bench
