#include "training/plot.h"

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "base/files.h"
#include "base/status_macros.h"

namespace kvl::training {
namespace {

namespace fs = std::filesystem;

// Runs a shell command, returning its exit status and combined output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  std::string output;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {-1, "popen failed"};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

std::string GnuplotString(const std::string& s) {
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\\", "\\\\"}, {"\"", "\\\""}}), "\"");
}

// pngcairo draws anti-aliased lines; Debian's gnuplot-nox has it, but fall
// back to libgd's png terminal if a build lacks cairo.
absl::StatusOr<std::string> PngTerminal() {
  static const absl::StatusOr<std::string>* terminal = [] {
    auto [rc, out] = RunCommand("gnuplot -e 'set terminal' < /dev/null");
    if (rc != 0) {
      return new absl::StatusOr<std::string>(absl::FailedPreconditionError(
          "gnuplot is not installed or does not run (scripts/setup.sh installs gnuplot-nox)"));
    }
    auto has = [&out = out](const std::string& name) {
      std::istringstream lines(out);
      std::string line;
      while (std::getline(lines, line)) {
        std::istringstream words(line);
        std::string first;
        if (words >> first && first == name) return true;
      }
      return false;
    };
    if (has("pngcairo")) return new absl::StatusOr<std::string>("pngcairo");
    if (has("png")) return new absl::StatusOr<std::string>("png");
    return new absl::StatusOr<std::string>(
        absl::FailedPreconditionError("gnuplot has neither the pngcairo nor the png terminal"));
  }();
  return *terminal;
}

}  // namespace

absl::Status PlotLines(const PlotSpec& spec, const std::string& png_path) {
  bool any = false;
  for (const PlotSeries& s : spec.series) any = any || !s.points.empty();
  if (!any) return absl::InvalidArgumentError(absl::StrCat(png_path, ": no points to plot"));
  absl::StatusOr<std::string> terminal = PngTerminal();
  if (!terminal.ok()) return terminal.status();

  const fs::path png(png_path);
  const fs::path data = fs::path(png).replace_extension(".dat");
  const fs::path script = fs::path(png).replace_extension(".gp");

  // One gnuplot data block per series, separated by two blank lines (index i).
  {
    std::string out;
    for (const PlotSeries& s : spec.series) {
      absl::StrAppend(&out, "# ", s.title, "\n");
      for (const auto& [x, y] : s.points) absl::StrAppendFormat(&out, "%.10g %.10g\n", x, y);
      if (s.points.empty()) out += "nan nan\n";  // keeps the block index of later series
      out += "\n\n";
    }
    KVL_RETURN_IF_ERROR(WriteTextFile(data.string(), out));
  }
  {
    std::string out = absl::StrCat(
        "set terminal ", *terminal, " size ", spec.width, ",", spec.height, "\n",
        "set output ", GnuplotString(png.string()), "\n",
        "set title ", GnuplotString(spec.title), " noenhanced\n",
        "set xlabel ", GnuplotString(spec.x_label), " noenhanced\n",
        "set ylabel ", GnuplotString(spec.y_label), " noenhanced\n",
        "set grid\nset key top right noenhanced\n");
    if (spec.log_y) out += "set logscale y\n";
    out += "plot ";
    for (size_t i = 0; i < spec.series.size(); ++i) {
      const PlotSeries& s = spec.series[i];
      absl::StrAppend(&out, i ? ", \\\n     " : "", GnuplotString(data.string()), " index ", i,
                      " using 1:2 with ", s.with_points ? "linespoints pt 7 ps 0.8" : "lines",
                      " lw 2 title ", GnuplotString(s.title));
    }
    out += "\n";
    KVL_RETURN_IF_ERROR(WriteTextFile(script.string(), out));
  }
  auto [rc, output] = RunCommand(absl::StrCat("gnuplot ", ShellQuote(script.string())));
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("gnuplot ", script.string(), " failed: ", output));
  }
  if (!fs::exists(png)) {
    return absl::InternalError(absl::StrCat("gnuplot wrote no ", png.string(), ": ", output));
  }
  return absl::OkStatus();
}

}  // namespace kvl::training
